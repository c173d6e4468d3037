"""What the functional forms of every family share: the input check, autocast's cast and the activation names of
the fused operators."""

from __future__ import annotations

from typing import Any, Optional, Tuple

import torch

Tensor = torch.Tensor


def check_tensor(fn: str, input: object) -> torch.Tensor:
    if not isinstance(input, torch.Tensor):
        raise TypeError(f"memsave.functional.{fn} expects a torch.Tensor, got {type(input).__name__}")
    if not input.is_floating_point():
        raise TypeError(
            f"memsave.functional.{fn} expects a floating-point tensor (float32, float64, float16 or bfloat16), "
            f"got {input.dtype}; convert it with .float() or use torch.nn.functional.{fn}"
        )
    return input


#: Activation names the fused operators accept.
ACTIVATIONS: Tuple[str, ...] = ("identity", "relu", "leaky_relu", "elu", "gelu", "gelu_tanh", "silu")
#: Activations :func:`inplace_abn` can invert (with a positive parameter).
INVERTIBLE_ACTIVATIONS: Tuple[str, ...] = ("identity", "leaky_relu", "elu")
_DEFAULT_PARAM = {"leaky_relu": 0.01, "elu": 1.0}


def check_number(where: str, name: str, value: object) -> float:
    """``value`` as a float when it is a real number (not a bool), else TypeError naming the argument.

    Examples:
        >>> check_number("memsave.functional.leaky_relu", "negative_slope", "a")
        Traceback (most recent call last):
        TypeError: memsave.functional.leaky_relu: negative_slope must be a number, got 'a'
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{where}: {name} must be a number, got {value!r}")
    return float(value)


def resolve_activation(act: str, act_param: Optional[float], invertible: bool = False) -> Tuple[str, float]:
    """Validate an activation name and fill in its default parameter.

    Args:
        act: one of :data:`ACTIVATIONS`.
        act_param: ``negative_slope`` for leaky_relu (default 0.01), ``alpha`` for elu (default 1.0); ignored
            (0.0) for the others.
        invertible: require an activation :func:`inplace_abn` can invert.

    Returns:
        ``(act, act_param)`` as the operators take them.

    Raises:
        ValueError: unknown name, or a non-invertible activation where one is required.

    Examples:
        >>> resolve_activation("leaky_relu", None)
        ('leaky_relu', 0.01)
    """
    if not isinstance(act, str) or act not in ACTIVATIONS:
        raise ValueError(f"unknown activation {act!r}; use one of {', '.join(ACTIVATIONS)}")
    default = _DEFAULT_PARAM.get(act, 0.0)
    param = check_number("activation", "act_param", act_param) if act_param is not None else default
    if invertible:
        if act not in INVERTIBLE_ACTIVATIONS:
            raise ValueError(
                f"activation {act!r} is not invertible, so In-Place ABN cannot recover its input from its output; "
                f"use one of {', '.join(INVERTIBLE_ACTIVATIONS)}, or memsave.nn.BatchNormAct2d for {act!r}"
            )
        if act != "identity" and param <= 0:
            raise ValueError(f"{act} needs a positive parameter (negative_slope / alpha) to be invertible, got {param}")
    return act, param


def autocast_cast(device_type: str, *tensors: Any) -> Tuple[Any, ...]:
    """Cast floating tensors to the autocast dtype when autocast is on for ``device_type`` (as autocast would for a
    Linear); the fused operators themselves are not autocast-aware."""
    if device_type not in ("cpu", "cuda") or not torch.is_autocast_enabled(device_type):
        return tensors
    dtype = torch.get_autocast_dtype(device_type)
    return tuple(t.to(dtype) if t is not None and t.is_floating_point() else t for t in tensors)
