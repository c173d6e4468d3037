"""max_pool2d: keeps a one-byte in-window argmax per output element for backward."""

from __future__ import annotations

import operator
from typing import List, Optional, Sequence, Tuple, Union, cast

import torch

from ..library.pooling import argmax_input_positions
from .common import check_tensor

_IntOrPair = Union[int, Sequence[int]]


def _pool_pair(fn: str, name: str, value: _IntOrPair) -> List[int]:
    """An int or a 1-/2-sequence of ints as a list of two ints (torch's convention for pooling arguments)."""
    try:
        if isinstance(value, (tuple, list, torch.Size)):
            items = [operator.index(v) for v in value]
        else:
            items = [operator.index(cast(int, value))]
    except TypeError:
        items = []
    if isinstance(value, bool) or len(items) not in (1, 2):
        raise TypeError(f"memsave.functional.{fn}: {name} must be an int or a tuple of one or two ints, got {value!r}")
    return items * 2 if len(items) == 1 else items


def pool_params(
    kernel_size: _IntOrPair, stride: Optional[_IntOrPair], padding: _IntOrPair, dilation: _IntOrPair
) -> Tuple[List[int], List[int], List[int], List[int]]:
    """``max_pool2d``'s arguments as four int pairs (stride defaults to the kernel), checked as the kernel needs them.

    Raises:
        TypeError, ValueError: a value that is not an int or pair of ints, not positive, or a window over 256
            positions (the 1-byte argmax's limit).

    Examples:
        >>> pool_params(2, None, 0, 1)
        ([2, 2], [2, 2], [0, 0], [1, 1])
    """
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
        The pooled tensor (in the input's memory format, as torch's), or ``(pooled, indices)`` when
        ``return_indices``.

    Raises:
        TypeError: non-floating input or malformed arguments. ValueError: arguments torch rejects, a window over
            256 positions, or an input that is not 3D/4D.

    Examples:
        >>> y = memsave.functional.max_pool2d(torch.randn(2, 3, 8, 8, requires_grad=True), 2)
    """
    check_tensor("max_pool2d", input)
    k, s, pad, d = pool_params(kernel_size, stride, padding, dilation)
    if input.dim() not in (3, 4):
        raise ValueError(
            f"memsave.functional.max_pool2d: expected a 3D (C, H, W) or 4D (N, C, H, W) input, got shape "
            f"{tuple(input.shape)}"
        )
    out, argmax = torch.ops.memsave.max_pool2d(input, k, s, pad, d, bool(ceil_mode))
    if return_indices:
        return out, _argmax_to_indices(argmax, (input.shape[-2], input.shape[-1]), k, s, pad, d)
    return out
