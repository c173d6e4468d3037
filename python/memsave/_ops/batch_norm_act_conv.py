"""memsave::batch_norm_act_conv2d: BatchNorm2d -> activation -> Conv2d keeping only the batch-norm input and two
per-channel vectors (the convolution's input, the activation output, is recomputed in backward).

Registers the fake kernels of ``batch_norm_act_conv2d``, its backward and ``batch_norm_act_apply`` (the recompute
kernel), and the Autograd kernel (the operator updates the running statistics, so it is built like
batch_norm_act's).
"""
from __future__ import annotations

from typing import Any, List, Optional, Tuple

import torch

from ._fused_autograd import grads_or_none, register_backward_op_autograd, register_mutating_autograd
from .batch_norm_act import bn_backward_fake, empty_in_kernel_layout, kernel_memory_format, stat_dtype

Tensor = torch.Tensor


def conv2d_output_shape(
    input: Tensor, weight: Tensor, stride: List[int], padding: List[int], dilation: List[int]
) -> Tuple[int, int, int, int]:
    """Shape of ``conv2d(input, weight)`` with zero padding."""
    n, _, h, w = input.shape
    kh, kw = weight.shape[2], weight.shape[3]
    ho = (h + 2 * padding[0] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    wo = (w + 2 * padding[1] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    return n, weight.shape[0], ho, wo


@torch.library.register_fake("memsave::batch_norm_act_apply")
def _batch_norm_act_apply_fake(
    input: Tensor, mean: Tensor, invstd: Tensor, weight: Optional[Tensor], bias: Optional[Tensor], act: str,
    act_param: float,
) -> Tensor:
    return empty_in_kernel_layout(input)


@torch.library.register_fake("memsave::batch_norm_act_conv2d")
def _batch_norm_act_conv2d_fake(
    input: Tensor, bn_weight: Optional[Tensor], bn_bias: Optional[Tensor], running_mean: Optional[Tensor],
    running_var: Optional[Tensor], training: bool, momentum: float, eps: float, act: str, act_param: float,
    weight: Tensor, bias: Optional[Tensor], stride: List[int], padding: List[int], dilation: List[int], groups: int,
) -> Tuple[Tensor, Tensor, Tensor]:
    torch._check(input.dim() == 4, lambda: f"memsave.batch_norm_act_conv2d: expected 4-D input, got {input.dim()}-D")
    shape = conv2d_output_shape(input, weight, stride, padding, dilation)
    out = input.new_empty(shape, dtype=weight.dtype).contiguous(memory_format=kernel_memory_format(input))
    mean = input.new_empty((input.shape[1],), dtype=stat_dtype(input))
    return out, mean, torch.empty_like(mean)


@torch.library.register_fake("memsave::batch_norm_act_conv2d_backward")
def _batch_norm_act_conv2d_backward_fake(
    grad_out: Tensor, input: Tensor, bn_weight: Optional[Tensor], bn_bias: Optional[Tensor], mean: Tensor,
    invstd: Tensor, training: bool, act: str, act_param: float, weight: Tensor, has_bias: bool, stride: List[int],
    padding: List[int], dilation: List[int], groups: int,
) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    grad_input, grad_bn_weight, grad_bn_bias = bn_backward_fake(input, bn_weight)
    grad_weight = torch.empty_like(weight).contiguous(memory_format=kernel_memory_format(weight))
    grad_bias = weight.new_empty((weight.shape[0] if has_bias else 0,))
    return grad_input, grad_bn_weight, grad_bn_bias, grad_weight, grad_bias


class _BatchNormActConv2dFunction(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, redispatch: Any, input: Tensor, bn_weight: Optional[Tensor], bn_bias: Optional[Tensor],
        running_mean: Optional[Tensor], running_var: Optional[Tensor], training: bool, momentum: float, eps: float,
        act: str, act_param: float, weight: Tensor, bias: Optional[Tensor], stride: List[int], padding: List[int],
        dilation: List[int], groups: int,
    ) -> Tuple[Tensor, Tensor, Tensor]:
        out, mean, invstd = redispatch(input, bn_weight, bn_bias, running_mean, running_var, training, momentum, eps,
                                       act, act_param, weight, bias, stride, padding, dilation, groups)
        # The memory win: the batch-norm input and two per-channel vectors; not the convolution's input.
        ctx.save_for_backward(input, bn_weight, bn_bias, mean, invstd, weight)
        ctx.training, ctx.act, ctx.act_param = training, act, act_param
        ctx.conv = (bias is not None, list(stride), list(padding), list(dilation), groups)
        ctx.mark_non_differentiable(mean, invstd)
        return out, mean, invstd

    @staticmethod
    def backward(ctx: Any, grad_out: Optional[Tensor], _grad_mean: Any, _grad_invstd: Any) -> tuple:
        input, bn_weight, bn_bias, mean, invstd, weight = ctx.saved_tensors
        needs = ctx.needs_input_grad
        if grad_out is None:
            return (None,) * 17
        has_bias, stride, padding, dilation, groups = ctx.conv
        gi, gbw, gbb, gw, gb = torch.ops.memsave.batch_norm_act_conv2d_backward(
            grad_out, input, bn_weight, bn_bias, mean, invstd, ctx.training, ctx.act, ctx.act_param, weight,
            has_bias, stride, padding, dilation, groups,
        )
        head = grads_or_none(needs[1:4], (gi, gbw, gbb))
        tail = grads_or_none(needs[11:13], (gw, gb))
        return (None,) + head + (None,) * 7 + tail + (None,) * 4


register_mutating_autograd("memsave::batch_norm_act_conv2d", _BatchNormActConv2dFunction)
register_backward_op_autograd("memsave::batch_norm_act_conv2d_backward")
register_backward_op_autograd("memsave::batch_norm_act_apply")
