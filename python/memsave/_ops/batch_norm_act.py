"""memsave::batch_norm_act: batch norm + activation keeping only the batch-norm input and per-channel statistics.

Registers the fake kernels of ``batch_norm_act`` / ``batch_norm_act_backward`` and the Autograd kernel, which saves
the input, the affine parameters and the two per-channel statistics; the fused backward kernel recomputes the
normalization and the activation's derivative.
"""
from __future__ import annotations

from typing import Any, Optional, Tuple

import torch

from ._fused_autograd import grads_or_none, register_backward_op_autograd, register_mutating_autograd

Tensor = torch.Tensor


def kernel_memory_format(x: Tensor) -> torch.memory_format:
    """The layout the C++ kernels use for ``x`` (mirrors ``bn_memory_format`` in csrc/ops/bn_act_common.h)."""
    if x.is_contiguous():
        return torch.contiguous_format
    if x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last):
        return torch.channels_last
    if x.dim() == 5 and x.is_contiguous(memory_format=torch.channels_last_3d):
        return torch.channels_last_3d
    return torch.contiguous_format


def stat_dtype(x: Tensor) -> torch.dtype:
    """Per-channel statistics are float32, or float64 for float64 inputs."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def empty_in_kernel_layout(x: Tensor) -> Tensor:
    return torch.empty_like(x.contiguous(memory_format=kernel_memory_format(x)))


def bn_backward_fake(x: Tensor, weight: Optional[Tensor]) -> Tuple[Tensor, Tensor, Tensor]:
    """Fake (grad_input, grad_weight, grad_bias) of the fused batch-norm backward kernels for the saved tensor ``x``:
    the parameter gradients take the weight's dtype, or the statistics dtype without affine parameters."""
    param_dtype = weight.dtype if weight is not None else stat_dtype(x)
    grad_weight = x.new_empty((x.shape[1],), dtype=param_dtype)
    return empty_in_kernel_layout(x), grad_weight, torch.empty_like(grad_weight)


@torch.library.register_fake("memsave::batch_norm_act")
def _batch_norm_act_fake(
    input: Tensor,
    weight: Optional[Tensor],
    bias: Optional[Tensor],
    running_mean: Optional[Tensor],
    running_var: Optional[Tensor],
    training: bool,
    momentum: float,
    eps: float,
    act: str,
    act_param: float,
) -> Tuple[Tensor, Tensor, Tensor]:
    torch._check(input.dim() >= 2, lambda: f"memsave.batch_norm_act: expected [N, C, ...] input, got {input.dim()}-D")
    channels = input.shape[1]
    mean = input.new_empty((channels,), dtype=stat_dtype(input))
    return empty_in_kernel_layout(input), mean, torch.empty_like(mean)


@torch.library.register_fake("memsave::batch_norm_act_backward")
def _batch_norm_act_backward_fake(
    grad_out: Tensor,
    input: Tensor,
    weight: Optional[Tensor],
    bias: Optional[Tensor],
    mean: Tensor,
    invstd: Tensor,
    training: bool,
    act: str,
    act_param: float,
) -> Tuple[Tensor, Tensor, Tensor]:
    return bn_backward_fake(input, weight)


class _BatchNormActFunction(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        redispatch: Any,
        input: Tensor,
        weight: Optional[Tensor],
        bias: Optional[Tensor],
        running_mean: Optional[Tensor],
        running_var: Optional[Tensor],
        training: bool,
        momentum: float,
        eps: float,
        act: str,
        act_param: float,
    ) -> Tuple[Tensor, Tensor, Tensor]:
        out, mean, invstd = redispatch(
            input, weight, bias, running_mean, running_var, training, momentum, eps, act, act_param
        )
        # The memory win: the input and two per-channel vectors, not the normalized tensor or activation input.
        ctx.save_for_backward(input, weight, bias, mean, invstd)
        ctx.training, ctx.act, ctx.act_param = training, act, act_param
        ctx.mark_non_differentiable(mean, invstd)
        return out, mean, invstd

    @staticmethod
    def backward(ctx: Any, grad_out: Optional[Tensor], _grad_mean: Any, _grad_invstd: Any) -> tuple:
        input, weight, bias, mean, invstd = ctx.saved_tensors
        needs = ctx.needs_input_grad
        if grad_out is None or not any(needs[1:4]):
            return (None,) * 11
        grad_input, grad_weight, grad_bias = torch.ops.memsave.batch_norm_act_backward(
            grad_out, input, weight, bias, mean, invstd, ctx.training, ctx.act, ctx.act_param
        )
        return (None,) + grads_or_none(needs[1:4], (grad_input, grad_weight, grad_bias)) + (None,) * 7


register_mutating_autograd("memsave::batch_norm_act", _BatchNormActFunction)
register_backward_op_autograd("memsave::batch_norm_act_backward")
