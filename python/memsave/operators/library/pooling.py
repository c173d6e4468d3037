"""memsave::max_pool2d: max pooling that keeps the in-window argmax as one byte per output element for backward.

torch keeps int64 indices (8 bytes per output element) and its input; memsave keeps the 1-byte code and the input's
sizes only (the backward scatters into a zero tensor of those sizes, so it never reads the input).
"""

from __future__ import annotations

from typing import Any, List, Sequence, Tuple

import torch
from torch._prims_common import suggest_memory_format

from .autograd import register_fake


def pool_output_size(size: Any, kernel: int, pad: int, stride: int, dilation: int, ceil_mode: bool) -> Any:
    """torch's pooling output size; works on ints and SymInts (the last window starts inside input or padding)."""
    span = size + 2 * pad - dilation * (kernel - 1) - 1 + (stride - 1 if ceil_mode else 0)
    out = span // stride + 1
    if ceil_mode and (out - 1) * stride >= size + pad:
        out = out - 1
    return out


@register_fake("memsave::max_pool2d")
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


@register_fake("memsave::max_pool2d_backward")
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


torch.library.register_autograd("memsave::max_pool2d", _backward, setup_context=_setup_context)


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


torch.library.register_autograd(
    "memsave::max_pool2d_backward", _backward_backward, setup_context=_backward_setup_context
)
