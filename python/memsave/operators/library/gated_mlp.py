"""Gated-MLP operators (csrc/ops/gated_mlp): gated_act (``act(gate) * up``) and gated_act_linear (the down
projection applied to it).

Fake kernels and autograd formulas. Both save ``gate`` and ``up`` only (plus the down projection's weight): torch's
composition also keeps ``act(gate)`` and, for the down projection, the product.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

import torch

from .autograd import grads_or_none, linear_output_fake, register_backward_op_autograd, register_fake

Tensor = torch.Tensor


def _check_gate_up(op: str, gate: Tensor, up: Tensor) -> None:
    torch._check(
        gate.shape == up.shape,
        lambda: f"memsave.{op}: up must have gate's shape {tuple(gate.shape)}, got {tuple(up.shape)}",
    )


# ----------------------------------------------------------------------------------------------------
# memsave::gated_act: act(gate) * up keeping gate and up.
# ----------------------------------------------------------------------------------------------------
@register_fake("memsave::gated_act")
def _gated_act_fake(gate: Tensor, up: Tensor, act: str) -> Tensor:
    _check_gate_up("gated_act", gate, up)
    return gate.new_empty(gate.shape)


@register_fake("memsave::gated_act_backward")
def _gated_act_backward_fake(grad: Tensor, gate: Tensor, up: Tensor, act: str) -> Tuple[Tensor, Tensor]:
    _check_gate_up("gated_act_backward", gate, up)
    return gate.new_empty(gate.shape), gate.new_empty(gate.shape)


def _gated_act_setup_context(ctx: Any, inputs: Tuple[Any, ...], output: Tensor) -> None:
    gate, up, act = inputs
    ctx.save_for_backward(gate, up)  # the memory win: not act(gate)
    ctx.act = act


def _gated_act_backward(ctx: Any, grad: Tensor) -> tuple:
    gate, up = ctx.saved_tensors
    grad_gate, grad_up = torch.ops.memsave.gated_act_backward(grad, gate, up, ctx.act)
    return grads_or_none(ctx.needs_input_grad, (grad_gate, grad_up, None))


torch.library.register_autograd("memsave::gated_act", _gated_act_backward, setup_context=_gated_act_setup_context)
register_backward_op_autograd("memsave::gated_act_backward")


# ----------------------------------------------------------------------------------------------------
# memsave::gated_act_linear: linear(act(gate) * up) keeping gate and up.
# ----------------------------------------------------------------------------------------------------
@register_fake("memsave::gated_act_linear")
def _gated_act_linear_fake(gate: Tensor, up: Tensor, weight: Tensor, bias: Optional[Tensor], act: str) -> Tensor:
    _check_gate_up("gated_act_linear", gate, up)
    return linear_output_fake("gated_act_linear", gate, weight, "gate")


@register_fake("memsave::gated_act_linear_backward")
def _gated_act_linear_backward_fake(
    grad_out: Tensor, gate: Tensor, up: Tensor, weight: Tensor, has_bias: bool, act: str
) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    grad_bias = weight.new_empty((weight.shape[0] if has_bias else 0,))
    return gate.new_empty(gate.shape), gate.new_empty(gate.shape), weight.new_empty(weight.shape), grad_bias


def _gated_act_linear_setup_context(ctx: Any, inputs: Tuple[Any, ...], output: Tensor) -> None:
    gate, up, weight, bias, act = inputs
    ctx.save_for_backward(gate, up, weight)  # the memory win: not act(gate), not the product
    ctx.has_bias = bias is not None
    ctx.act = act


def _gated_act_linear_backward(ctx: Any, grad_out: Tensor) -> tuple:
    gate, up, weight = ctx.saved_tensors
    gg, gu, gw, gb = torch.ops.memsave.gated_act_linear_backward(grad_out, gate, up, weight, ctx.has_bias, ctx.act)
    return grads_or_none(ctx.needs_input_grad, (gg, gu, gw, gb, None))


torch.library.register_autograd(
    "memsave::gated_act_linear", _gated_act_linear_backward, setup_context=_gated_act_linear_setup_context
)
register_backward_op_autograd("memsave::gated_act_linear_backward")
