"""memsave::inplace_abn: In-Place Activated BatchNorm, keeping only its output (written over its input).

Registers the fake kernels of ``inplace_abn`` / ``inplace_abn_backward`` and the Autograd kernel: an
``autograd.Function`` that marks the input dirty (autograd then treats the op as in place: version counters, views,
leaf checks all apply) and saves that output with the per-channel inverse standard deviation. Backward inverts the
activation to recover the normalized input.
"""
from __future__ import annotations

from typing import Any, Optional, Tuple

import torch

from ._fused_autograd import grads_or_none, register_backward_op_autograd, register_mutating_autograd
from .batch_norm_act import bn_backward_fake, stat_dtype

Tensor = torch.Tensor


@torch.library.register_fake("memsave::inplace_abn")
def _inplace_abn_fake(
    self: Tensor,
    weight: Optional[Tensor],
    bias: Optional[Tensor],
    running_mean: Optional[Tensor],
    running_var: Optional[Tensor],
    training: bool,
    momentum: float,
    eps: float,
    act: str,
    act_param: float,
) -> Tuple[Tensor, Tensor]:
    torch._check(self.dim() >= 2, lambda: f"memsave.inplace_abn: expected [N, C, ...] input, got {self.dim()}-D")
    mean = self.new_empty((self.shape[1],), dtype=stat_dtype(self))
    return mean, torch.empty_like(mean)


@torch.library.register_fake("memsave::inplace_abn_backward")
def _inplace_abn_backward_fake(
    grad_out: Tensor,
    output: Tensor,
    weight: Optional[Tensor],
    bias: Optional[Tensor],
    invstd: Tensor,
    training: bool,
    act: str,
    act_param: float,
) -> Tuple[Tensor, Tensor, Tensor]:
    return bn_backward_fake(output, weight)


class _InPlaceABNFunction(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        redispatch: Any,
        x: Tensor,
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
        mean, invstd = redispatch(x, weight, bias, running_mean, running_var, training, momentum, eps, act, act_param)
        ctx.mark_dirty(x)
        # The memory win: x now holds the output, which backward inverts; nothing else of full size is kept.
        ctx.save_for_backward(x, weight, bias, invstd)
        ctx.training, ctx.act, ctx.act_param = training, act, act_param
        ctx.mark_non_differentiable(mean, invstd)
        return x, mean, invstd

    @staticmethod
    def backward(ctx: Any, grad_out: Optional[Tensor], _grad_mean: Any, _grad_invstd: Any) -> tuple:
        output, weight, bias, invstd = ctx.saved_tensors
        needs = ctx.needs_input_grad
        if grad_out is None or not any(needs[1:4]):
            return (None,) * 11
        grad_input, grad_weight, grad_bias = torch.ops.memsave.inplace_abn_backward(
            grad_out, output, weight, bias, invstd, ctx.training, ctx.act, ctx.act_param
        )
        return (None,) + grads_or_none(needs[1:4], (grad_input, grad_weight, grad_bias)) + (None,) * 7


# The schema returns (mean, invstd); the Function also returns the mutated input so autograd rebases its history.
register_mutating_autograd("memsave::inplace_abn", _InPlaceABNFunction, unpack=lambda result: result[1:])
register_backward_op_autograd("memsave::inplace_abn_backward")
