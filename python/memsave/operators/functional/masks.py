"""Bit-mask operators: relu, leaky_relu and dropout keep one bit per element for backward."""

from __future__ import annotations

import torch

from .common import check_number, check_tensor


def relu(input: torch.Tensor, inplace: bool = False) -> torch.Tensor:
    """ReLU that keeps a 1-bit mask for backward (``ceil(numel / 8)`` bytes) instead of its output.

    Outputs and gradients are bitwise equal to :func:`torch.nn.functional.relu` (``-0.0`` and NaN pass through
    unchanged; NaN passes its gradient, ``-0.0`` does not).

    Args:
        input: a floating-point tensor (float32, float64, float16 or bfloat16) on CPU or CUDA, any strides.
        inplace: overwrite ``input`` with the result (see the module docstring) and return it.

    Returns:
        ``relu(input)``: a new tensor in the memory format of ``input``, or ``input`` itself when ``inplace``.

    Examples:
        >>> x = torch.randn(4, 8, requires_grad=True)
        >>> y = memsave.functional.relu(x)
        >>> y.sum().backward()   # x.grad == (x > 0)
    """
    check_tensor("relu", input)
    if inplace:
        torch.ops.memsave.relu_(input)
        return input
    out, _mask = torch.ops.memsave.relu(input)
    return out


def leaky_relu(input: torch.Tensor, negative_slope: float = 0.01, inplace: bool = False) -> torch.Tensor:
    """LeakyReLU that keeps a 1-bit sign mask for backward instead of its input.

    Outputs and gradients are bitwise equal to :func:`torch.nn.functional.leaky_relu`. Unlike torch's in-place
    form, ``inplace=True`` works with any slope, negative ones included (the mask, not the output, drives backward).

    Args:
        input: a floating-point tensor (float32, float64, float16 or bfloat16) on CPU or CUDA, any strides.
        negative_slope: the slope for ``input <= 0``.
        inplace: overwrite ``input`` with the result and return it.

    Returns:
        ``input > 0 ? input : input * negative_slope``.

    Examples:
        >>> y = memsave.functional.leaky_relu(torch.randn(4, 8, requires_grad=True), 0.2)
    """
    check_tensor("leaky_relu", input)
    slope = check_number("memsave.functional.leaky_relu", "negative_slope", negative_slope)
    if inplace:
        torch.ops.memsave.leaky_relu_(input, slope)
        return input
    out, _mask = torch.ops.memsave.leaky_relu(input, slope)
    return out


def dropout(input: torch.Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> torch.Tensor:
    """Dropout that keeps a 1-bit keep mask for backward.

    Each element is kept with probability ``1 - p`` and scaled by ``1 / (1 - p)`` (computed as torch's CPU
    dropout does); the gradient passes through the same mask and scale. The bits come from PyTorch's default
    generator of the tensor's device, so ``torch.manual_seed`` reproduces them and checkpoint recompute (which
    restores the RNG state) replays them. The stream differs from ``torch.nn.functional.dropout``'s: same
    distribution, other draws. ``p == 1`` gives exact zeros (torch gives ``input * 0``, which keeps NaN).

    Args:
        input: a floating-point tensor (float32, float64, float16 or bfloat16) on CPU or CUDA, any strides.
        p: probability of an element being zeroed, in ``[0, 1]``.
        training: apply dropout; when False, return ``input`` unchanged (as torch does).
        inplace: overwrite ``input`` with the result and return it.

    Returns:
        The dropped-out tensor (``input`` itself when not training, ``p == 0``, empty, or ``inplace``).

    Raises:
        ValueError: ``p`` outside ``[0, 1]``.

    Examples:
        >>> torch.manual_seed(0)
        >>> y = memsave.functional.dropout(torch.ones(8), p=0.5)   # entries are 0.0 or 2.0
    """
    check_tensor("dropout", input)
    p = float(p)
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"memsave.functional.dropout: dropout probability has to be between 0 and 1, but got {p}")
    if not training or p == 0.0 or input.numel() == 0:
        return input
    if inplace:
        torch.ops.memsave.dropout_(input, p)
        return input
    out, _mask = torch.ops.memsave.dropout(input, p)
    return out
