"""memsave.nn.ReLU and memsave.nn.LeakyReLU: drop-in torch.nn modules that keep a 1-bit mask for backward; and
:func:`activation_spec`, which reads the activation a torch module computes (for the fused modules and convert)."""

from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
from torch import nn

from .. import functional as F
from ..ops._common import check_number
from ._base import MemsaveModuleMixin, check_flag

__all__ = ["ReLU", "LeakyReLU", "activation_spec"]


class ReLU(MemsaveModuleMixin, nn.ReLU):
    """ReLU that keeps 1 bit per element for backward instead of its output (torch.nn.ReLU keeps the output).

    Same constructor, ``extra_repr`` and (empty) state_dict as :class:`torch.nn.ReLU`, of which it is a subclass, so
    ``isinstance(m, torch.nn.ReLU)`` still holds. Outputs and gradients are bitwise equal to torch's.

    Whether the mask saves memory depends on the consumer of the output: a Linear/Conv after it keeps that output
    for its own backward anyway; a memsave MaxPool2d, an addition or a checkpointed region does not.

    Args:
        inplace: overwrite the input (through a mutating operator whose autograd is exact, as torch's relu_).

    Raises:
        TypeError: ``inplace`` is not a bool.

    Examples:
        >>> act = memsave.nn.ReLU()
        >>> y = act(torch.randn(4, 8, requires_grad=True))
    """

    def __init__(self, inplace: bool = False) -> None:
        super().__init__(check_flag("memsave.nn.ReLU", "inplace", inplace))

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return F.relu(input, inplace=self.inplace)


class LeakyReLU(MemsaveModuleMixin, nn.LeakyReLU):
    """LeakyReLU that keeps 1 bit per element (the sign) for backward instead of its input.

    Same constructor, ``extra_repr`` and (empty) state_dict as :class:`torch.nn.LeakyReLU`, of which it is a
    subclass. Outputs and gradients are bitwise equal to torch's; ``inplace=True`` works with any slope.

    Args:
        negative_slope: slope for inputs <= 0. Default: 1e-2.
        inplace: overwrite the input.

    Raises:
        TypeError: ``negative_slope`` is not a number or ``inplace`` not a bool. ValueError: a NaN or infinite slope.

    Examples:
        >>> act = memsave.nn.LeakyReLU(0.2)
        >>> y = act(torch.randn(4, 8, requires_grad=True))
    """

    def __init__(self, negative_slope: float = 1e-2, inplace: bool = False) -> None:
        slope = check_number("memsave.nn.LeakyReLU", "negative_slope", negative_slope)  # fail at construction
        if not math.isfinite(slope):
            raise ValueError(f"memsave.nn.LeakyReLU: negative_slope must be a finite number, got {negative_slope!r}")
        super().__init__(negative_slope, check_flag("memsave.nn.LeakyReLU", "inplace", inplace))

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return F.leaky_relu(input, self.negative_slope, self.inplace)


def activation_spec(module: nn.Module) -> Optional[Tuple[str, Optional[float]]]:
    """The fused-operator activation equivalent to ``module``, or None.

    Recognizes nn.ReLU, nn.LeakyReLU, nn.ELU (with scale 1), nn.GELU (both approximations), nn.SiLU, nn.Identity,
    and memsave.nn's ReLU / LeakyReLU.

    Args:
        module: an activation module.

    Returns:
        ``(act, act_param)`` for the fused operators, or None when ``module`` is not a recognized activation.

    Examples:
        >>> activation_spec(torch.nn.LeakyReLU(0.2))
        ('leaky_relu', 0.2)
    """
    if isinstance(module, nn.ReLU):
        return "relu", None
    if isinstance(module, nn.LeakyReLU):
        return "leaky_relu", float(module.negative_slope)
    if isinstance(module, nn.ELU):
        return "elu", float(module.alpha)
    if isinstance(module, nn.GELU):
        return ("gelu_tanh" if module.approximate == "tanh" else "gelu"), None
    if isinstance(module, nn.SiLU):
        return "silu", None
    if type(module) is nn.Identity:
        return "identity", None
    # memsave's own mask-saving activations (same math as torch's).
    if type(module).__module__.startswith("memsave.nn"):
        name = type(module).__name__
        if name == "ReLU":
            return "relu", None
        if name == "LeakyReLU":
            return "leaky_relu", float(getattr(module, "negative_slope", 0.01))
    return None
