"""Functional forms of memsave's memory-efficient operators (``torch.ops.memsave.*`` with autograd).

Each function computes exactly what its ``torch.nn.functional`` namesake computes, but keeps less for backward:

=================  ===================================================  =============================================
function           memsave keeps for backward                           torch keeps
=================  ===================================================  =============================================
``relu``           1 bit per element                                    the output
``leaky_relu``     1 bit per element                                    the input (the output when in place)
``dropout``        1 bit per element                                    a mask of 1 byte (CPU: of the dtype) each
``max_pool2d``     1 byte per output element + the input's sizes        int64 indices (8 bytes) + the input
=================  ===================================================  =============================================

``inplace=True`` overwrites the input through a mutating operator (schema ``Tensor(a!)``) whose autograd re-bases
the input's history exactly as torch's in-place operators do, so it is safe wherever ``torch.relu_`` is; like
torch, it refuses a leaf tensor that requires grad.
"""
from __future__ import annotations

import operator
from typing import List, Optional, Sequence, Tuple, Union

import torch

from ._ops.max_pool2d import argmax_input_positions

__all__ = ["relu", "leaky_relu", "dropout", "max_pool2d"]

_IntOrPair = Union[int, Sequence[int]]


def _check_tensor(fn: str, input: object) -> torch.Tensor:
    if not isinstance(input, torch.Tensor):
        raise TypeError(f"memsave.functional.{fn} expects a torch.Tensor, got {type(input).__name__}")
    if not input.is_floating_point():
        raise TypeError(
            f"memsave.functional.{fn} expects a floating-point tensor (float32, float64, float16 or bfloat16), "
            f"got {input.dtype}; convert it with .float() or use torch.nn.functional.{fn}"
        )
    return input


def relu(input: torch.Tensor, inplace: bool = False) -> torch.Tensor:
    """ReLU that keeps a 1-bit mask for backward (``ceil(numel / 8)`` bytes) instead of its output.

    Outputs and gradients are bitwise equal to :func:`torch.nn.functional.relu` (``-0.0`` and NaN pass through
    unchanged; NaN passes its gradient, ``-0.0`` does not).

    Args:
        input: a floating-point tensor (float32, float64, float16 or bfloat16) on CPU or CUDA, any strides.
        inplace: overwrite ``input`` with the result (see the module docstring) and return it.

    Returns:
        ``relu(input)``: a new contiguous tensor, or ``input`` itself when ``inplace``.

    Example:
        >>> x = torch.randn(4, 8, requires_grad=True)
        >>> y = memsave.functional.relu(x)
        >>> y.sum().backward()   # x.grad == (x > 0)
    """
    _check_tensor("relu", input)
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

    Example:
        >>> y = memsave.functional.leaky_relu(torch.randn(4, 8, requires_grad=True), 0.2)
    """
    _check_tensor("leaky_relu", input)
    slope = float(negative_slope)
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

    Example:
        >>> torch.manual_seed(0)
        >>> y = memsave.functional.dropout(torch.ones(8), p=0.5)   # entries are 0.0 or 2.0
    """
    _check_tensor("dropout", input)
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


def _pool_pair(fn: str, name: str, value: _IntOrPair) -> List[int]:
    """An int or a 1-/2-sequence of ints as a list of two ints (torch's convention for pooling arguments)."""
    try:
        if isinstance(value, (tuple, list, torch.Size)):
            items = [operator.index(v) for v in value]
        else:
            items = [operator.index(value)]
    except TypeError:
        items = []
    if isinstance(value, bool) or len(items) not in (1, 2):
        raise TypeError(f"memsave.functional.{fn}: {name} must be an int or a tuple of one or two ints, got {value!r}")
    return items * 2 if len(items) == 1 else items


def _pool_params(
    kernel_size: _IntOrPair, stride: Optional[_IntOrPair], padding: _IntOrPair, dilation: _IntOrPair
) -> Tuple[List[int], List[int], List[int], List[int]]:
    k = _pool_pair("max_pool2d", "kernel_size", kernel_size)
    empty_stride = stride is None or (isinstance(stride, (tuple, list)) and len(stride) == 0)
    s = list(k) if empty_stride else _pool_pair("max_pool2d", "stride", stride)  # type: ignore[arg-type]
    pad = _pool_pair("max_pool2d", "padding", padding)
    d = _pool_pair("max_pool2d", "dilation", dilation)
    if min(k) <= 0 or min(s) <= 0 or min(d) <= 0:
        raise ValueError(
            f"memsave.functional.max_pool2d: kernel_size, stride and dilation must be positive, got kernel_size={k}, "
            f"stride={s}, dilation={d}"
        )
    if min(pad) < 0 or pad[0] > k[0] // 2 or pad[1] > k[1] // 2:
        raise ValueError(
            f"memsave.functional.max_pool2d: pad should be between 0 and half of kernel size, but got padding={pad} "
            f"and kernel_size={k}"
        )
    if k[0] * k[1] > 256:
        raise ValueError(
            f"memsave.functional.max_pool2d keeps the in-window argmax in one byte, so a window may hold at most 256 "
            f"positions (16x16), but kernel_size={k} has {k[0] * k[1]}; use torch.nn.functional.max_pool2d for it"
        )
    return k, s, pad, d


def _argmax_to_indices(
    argmax: torch.Tensor, input_hw: Tuple[int, int], k: List[int], s: List[int], pad: List[int], d: List[int]
) -> torch.Tensor:
    """torch-style int64 indices (``h * W + w`` within each plane) from the 1-byte in-window codes."""
    ih, iw = argmax_input_positions(argmax, k, s, pad, d)
    return ih * input_hw[1] + iw


def max_pool2d(
    input: torch.Tensor,
    kernel_size: _IntOrPair,
    stride: Optional[_IntOrPair] = None,
    padding: _IntOrPair = 0,
    dilation: _IntOrPair = 1,
    ceil_mode: bool = False,
    return_indices: bool = False,
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """2D max pooling that keeps the in-window argmax as 1 byte per output element (torch: int64 + its input).

    Takes :func:`torch.nn.functional.max_pool2d`'s arguments with its meaning; outputs and gradients are bitwise
    equal to torch's on CPU. The backward needs only the input's sizes, so the input is not kept alive by this op.

    Args:
        input: (N, C, H, W) or (C, H, W) floating-point tensor, any strides (N may be 0).
        kernel_size: window size, an int or (kH, kW); at most 256 positions (16x16).
        stride: window stride, an int or (sH, sW); default ``kernel_size``.
        padding: implicit -inf padding on each side, an int or (pH, pW), at most half the kernel size.
        dilation: spacing of window elements, an int or (dH, dW).
        ceil_mode: use ceil instead of floor for the output size, as torch.
        return_indices: also return torch-style int64 indices (``h * W + w`` within each plane), computed from
            the 1-byte codes, e.g. for ``max_unpool2d``; they are not kept for backward.

    Returns:
        The pooled tensor (contiguous), or ``(pooled, indices)`` when ``return_indices``.

    Raises:
        TypeError: non-floating input or malformed arguments. ValueError: arguments torch rejects, a window over
            256 positions, or an input that is not 3D/4D.

    Example:
        >>> y = memsave.functional.max_pool2d(torch.randn(2, 3, 8, 8, requires_grad=True), 2)
    """
    _check_tensor("max_pool2d", input)
    k, s, pad, d = _pool_params(kernel_size, stride, padding, dilation)
    if input.dim() not in (3, 4):
        raise ValueError(
            f"memsave.functional.max_pool2d: expected a 3D (C, H, W) or 4D (N, C, H, W) input, got shape "
            f"{tuple(input.shape)}"
        )
    out, argmax = torch.ops.memsave.max_pool2d(input, k, s, pad, d, bool(ceil_mode))
    if return_indices:
        return out, _argmax_to_indices(argmax, (input.shape[-2], input.shape[-1]), k, s, pad, d)
    return out


# The fused recompute-in-backward operators (memsave.nn.BatchNormAct2d, InPlaceABN2d, LayerNormLinear, ActLinear).
from ._fused_functional import (  # noqa: E402
    act_linear, batch_norm_act, batch_norm_act_conv2d, inplace_abn, layer_norm_linear,
)

__all__ += ["batch_norm_act", "batch_norm_act_conv2d", "inplace_abn", "layer_norm_linear", "act_linear"]
