"""memsave::act_linear: activation -> Linear keeping only the activation's input.

Registers the fake kernels of ``act_linear`` / ``act_linear_backward`` and the autograd formula, which saves the
activation's input (and the weight) instead of the activation's input *and* output.
"""
from __future__ import annotations

from typing import Any, Optional, Tuple

import torch

from ._fused_autograd import grads_or_none, register_backward_op_autograd

Tensor = torch.Tensor


@torch.library.register_fake("memsave::act_linear")
def _act_linear_fake(input: Tensor, weight: Tensor, bias: Optional[Tensor], act: str, act_param: float) -> Tensor:
    torch._check(
        weight.dim() == 2 and input.dim() >= 1 and weight.shape[1] == input.shape[-1],
        lambda: f"memsave.act_linear: weight {tuple(weight.shape)} does not fit input {tuple(input.shape)}",
    )
    return input.new_empty((*input.shape[:-1], weight.shape[0]), dtype=weight.dtype)


@torch.library.register_fake("memsave::act_linear_backward")
def _act_linear_backward_fake(
    grad_out: Tensor, input: Tensor, weight: Tensor, has_bias: bool, act: str, act_param: float
) -> Tuple[Tensor, Tensor, Tensor]:
    grad_bias = weight.new_empty((weight.shape[0] if has_bias else 0,))
    return input.new_empty(input.shape), weight.new_empty(weight.shape), grad_bias


def _setup_context(ctx: Any, inputs: Tuple[Any, ...], output: Tensor) -> None:
    input, weight, bias, act, act_param = inputs
    ctx.save_for_backward(input, weight)  # the memory win: the activation's input only
    ctx.has_bias = bias is not None
    ctx.act, ctx.act_param = act, act_param


def _backward(ctx: Any, grad_out: Tensor) -> tuple:
    input, weight = ctx.saved_tensors
    gi, gw, gb = torch.ops.memsave.act_linear_backward(grad_out, input, weight, ctx.has_bias, ctx.act, ctx.act_param)
    return grads_or_none(ctx.needs_input_grad, (gi, gw, gb, None, None))


torch.library.register_autograd("memsave::act_linear", _backward, setup_context=_setup_context)
register_backward_op_autograd("memsave::act_linear_backward")
