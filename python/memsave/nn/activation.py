"""memsave.nn.ReLU and memsave.nn.LeakyReLU: drop-in torch.nn modules that keep a 1-bit mask for backward."""
from __future__ import annotations

import torch
from torch import nn

from .. import functional as F
from ._base import MemsaveModuleMixin

__all__ = ["ReLU", "LeakyReLU"]


class ReLU(MemsaveModuleMixin, nn.ReLU):
    """ReLU that keeps 1 bit per element for backward instead of its output (torch.nn.ReLU keeps the output).

    Same constructor, ``extra_repr`` and (empty) state_dict as :class:`torch.nn.ReLU`, of which it is a subclass, so
    ``isinstance(m, torch.nn.ReLU)`` still holds. Outputs and gradients are bitwise equal to torch's.

    Whether the mask saves memory depends on the consumer of the output: a Linear/Conv after it keeps that output
    for its own backward anyway; a memsave MaxPool2d, an addition or a checkpointed region does not.

    Args:
        inplace: overwrite the input (through a mutating operator whose autograd is exact, as torch's relu_).

    Example:
        >>> act = memsave.nn.ReLU()
        >>> y = act(torch.randn(4, 8, requires_grad=True))
    """

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return F.relu(input, inplace=self.inplace)


class LeakyReLU(MemsaveModuleMixin, nn.LeakyReLU):
    """LeakyReLU that keeps 1 bit per element (the sign) for backward instead of its input.

    Same constructor, ``extra_repr`` and (empty) state_dict as :class:`torch.nn.LeakyReLU`, of which it is a
    subclass. Outputs and gradients are bitwise equal to torch's; ``inplace=True`` works with any slope.

    Args:
        negative_slope: slope for inputs <= 0. Default: 1e-2.
        inplace: overwrite the input.

    Example:
        >>> act = memsave.nn.LeakyReLU(0.2)
        >>> y = act(torch.randn(4, 8, requires_grad=True))
    """

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return F.leaky_relu(input, self.negative_slope, self.inplace)
