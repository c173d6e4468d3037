"""memsave::max_pool2d: max pooling that keeps the in-window argmax as one byte per output element for backward.

torch keeps int64 indices (8 bytes per output element) and its input; memsave keeps the 1-byte code and the input's
sizes only (the backward scatters into a zero tensor of those sizes, so it never reads the input).

The module holds the family's Python face: the fake kernels and autograd formulas it records for
:func:`memsave.operators.ops.register`, and the functional forms that :mod:`memsave.functional` exports.
"""

from __future__ import annotations

import operator
from typing import Any, List, Optional, Sequence, Tuple, Union, cast

import torch
from torch._prims_common import suggest_memory_format

from . import _transforms
from ._common import check_tensor
from ._registration import Registrations

#: What this family registers with torch.library, applied by memsave.operators.ops.register().
REGISTRATIONS = Registrations()


def pool_output_size(size: Any, kernel: int, pad: int, stride: int, dilation: int, ceil_mode: bool) -> Any:
    """torch's pooling output size; works on ints and SymInts (the last window starts inside input or padding)."""
    span = size + 2 * pad - dilation * (kernel - 1) - 1 + (stride - 1 if ceil_mode else 0)
    out = span // stride + 1
    if ceil_mode and (out - 1) * stride >= size + pad:
        out = out - 1
    return out


@REGISTRATIONS.fake("memsave::max_pool2d")
def _max_pool2d_fake(
    x: torch.Tensor,
    kernel_size: Sequence[int],
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    ceil_mode: bool,
) -> Tuple[torch.Tensor, torch.Tensor]:
    torch._check(x.dim() in (3, 4), lambda: f"memsave.max_pool2d: expected a 3D or 4D input, got {x.dim()}D")
    oh = pool_output_size(x.shape[-2], kernel_size[0], padding[0], stride[0], dilation[0], ceil_mode)
    ow = pool_output_size(x.shape[-1], kernel_size[1], padding[1], stride[1], dilation[1], ceil_mode)
    sizes = (*x.shape[:-2], oh, ow)
    fmt = suggest_memory_format(x)  # the kernels keep the input's memory format, as torch's max_pool2d does
    out = torch.empty(sizes, dtype=x.dtype, device=x.device, memory_format=fmt)
    return out, torch.empty(sizes, dtype=torch.uint8, device=x.device, memory_format=fmt)


@REGISTRATIONS.fake("memsave::max_pool2d_backward")
def _max_pool2d_backward_fake(
    grad_out: torch.Tensor,
    argmax: torch.Tensor,
    input_size: Sequence[int],
    kernel_size: Sequence[int],
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
) -> torch.Tensor:
    fmt = suggest_memory_format(grad_out)
    return torch.empty(tuple(input_size), dtype=grad_out.dtype, device=grad_out.device, memory_format=fmt)


def _setup_context(ctx: Any, inputs: Tuple[Any, ...], output: Tuple[torch.Tensor, torch.Tensor]) -> None:
    x, kernel_size, stride, padding, dilation, _ceil_mode = inputs
    _, argmax = output
    ctx.save_for_backward(argmax)  # 1 byte per output element; the input is not kept, only its sizes
    ctx.mark_non_differentiable(argmax)
    ctx.input_size = tuple(x.shape)
    ctx.memory_format = suggest_memory_format(x)
    ctx.params = (list(kernel_size), list(stride), list(padding), list(dilation))


def _backward(ctx: Any, grad_out: torch.Tensor, _grad_argmax: Any) -> Tuple[Any, ...]:
    (argmax,) = ctx.saved_tensors
    # The input gradient takes grad_out's memory format: the input's, whatever layout the gradient arrived in.
    grad_out = grad_out.contiguous(memory_format=ctx.memory_format)
    grad_in = torch.ops.memsave.max_pool2d_backward(grad_out, argmax, list(ctx.input_size), *ctx.params)
    return grad_in, None, None, None, None, None


def _jvp(run: Any, primals: Sequence[Any], tangents: Sequence[Any]) -> Tuple[torch.Tensor, torch.Tensor]:
    """Forward mode: each output element is one input element (its window's maximum), so its tangent is the input's
    tangent there."""
    out, argmax = run(*primals)
    kernel_size, stride, padding, dilation = (list(p) for p in primals[1:5])
    tangent = gather_at_argmax(tangents[0], argmax, kernel_size, stride, padding, dilation)
    return _transforms.with_tangent(out, tangent.contiguous(memory_format=suggest_memory_format(out))), argmax


REGISTRATIONS.autograd("memsave::max_pool2d", _backward, setup_context=_setup_context, jvp=_jvp)


def argmax_input_positions(
    argmax: torch.Tensor,
    kernel_size: Sequence[int],
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
) -> Tuple[torch.Tensor, torch.Tensor]:
    """The input row and column each output element's 1-byte argmax code (``kh * kW + kw``, see
    csrc/ops/pooling/pool_math.h) points at, both shaped like ``argmax``. They fall outside the input only for a
    window that holds no input element."""
    oh_n, ow_n = argmax.shape[-2], argmax.shape[-1]
    code = argmax.long()
    oh = torch.arange(oh_n, device=argmax.device).view(oh_n, 1)
    ow = torch.arange(ow_n, device=argmax.device).view(1, ow_n)
    ih = oh * stride[0] - padding[0] + (code // kernel_size[1]) * dilation[0]
    iw = ow * stride[1] - padding[1] + (code % kernel_size[1]) * dilation[1]
    return ih, iw


def gather_at_argmax(
    values: torch.Tensor,
    argmax: torch.Tensor,
    kernel_size: List[int],
    stride: List[int],
    padding: List[int],
    dilation: List[int],
) -> torch.Tensor:
    """Read ``values`` (input-shaped) at each output element's argmax: the adjoint of max_pool2d_backward."""
    h, w = values.shape[-2], values.shape[-1]
    ih, iw = argmax_input_positions(argmax, kernel_size, stride, padding, dilation)
    inside = (ih >= 0) & (ih < h) & (iw >= 0) & (iw < w)
    flat = (ih.clamp(0, h - 1) * w + iw.clamp(0, w - 1)).flatten(-2)
    picked = values.flatten(-2).gather(-1, flat).view(argmax.shape)
    return torch.where(inside, picked, torch.zeros((), dtype=values.dtype, device=values.device))


# Double backward: max_pool2d_backward is linear in grad_out; its adjoint gathers at the argmax.
def _backward_setup_context(ctx: Any, inputs: Tuple[Any, ...], output: torch.Tensor) -> None:
    _, argmax, _input_size, kernel_size, stride, padding, dilation = inputs
    ctx.save_for_backward(argmax)
    ctx.params = (list(kernel_size), list(stride), list(padding), list(dilation))


def _backward_backward(ctx: Any, grad_grad: torch.Tensor) -> Tuple[Any, ...]:
    (argmax,) = ctx.saved_tensors
    return (gather_at_argmax(grad_grad, argmax, *ctx.params), None, None, None, None, None, None)


def _backward_jvp(run: Any, primals: Sequence[Any], tangents: Sequence[Any]) -> torch.Tensor:
    """Forward mode of max_pool2d_backward: linear in grad_out, so its tangent is itself applied to grad_out's."""
    grad_in = run(*primals)
    if tangents[0] is None:
        return grad_in
    return _transforms.with_tangent(grad_in, torch.ops.memsave.max_pool2d_backward(tangents[0], *primals[1:]))


REGISTRATIONS.autograd(
    "memsave::max_pool2d_backward", _backward_backward, setup_context=_backward_setup_context, jvp=_backward_jvp
)


# ----------------------------------------------------------------------------------------------------
# The functional forms (memsave.functional).
# ----------------------------------------------------------------------------------------------------
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
