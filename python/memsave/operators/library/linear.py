"""Norm/activation -> Linear operators (csrc/ops/linear): layer_norm_linear (with its recompute kernel
layer_norm_apply) and act_linear.

Each registers its fake kernels and its autograd formula, which saves the Linear's *pre-normalization* or
*pre-activation* input (plus per-row statistics for layer_norm_linear) instead of the tensor the Linear consumes.
"""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

import torch

from .autograd import grads_or_none, linear_output_fake, register_backward_op_autograd, register_fake

# ----------------------------------------------------------------------------------------------------
# memsave::layer_norm_linear: LayerNorm -> Linear keeping the LayerNorm input plus per-row mean/rstd.
# ----------------------------------------------------------------------------------------------------
Tensor = torch.Tensor


def _compute_dtype(input: Tensor, ln_weight: Optional[Tensor]) -> torch.dtype:
    return torch.promote_types(input.dtype, ln_weight.dtype) if ln_weight is not None else input.dtype


@register_fake("memsave::layer_norm_linear")
def _layer_norm_linear_fake(
    input: Tensor,
    normalized_shape: List[int],
    ln_weight: Optional[Tensor],
    ln_bias: Optional[Tensor],
    eps: float,
    weight: Tensor,
    bias: Optional[Tensor],
) -> Tuple[Tensor, Tensor, Tensor]:
    nd = len(normalized_shape)
    torch._check(
        input.dim() >= nd and list(input.shape[input.dim() - nd :]) == list(normalized_shape),
        lambda: (
            f"memsave.layer_norm_linear: normalized_shape {normalized_shape} must equal the trailing dims of "
            f"the input, got {tuple(input.shape)}"
        ),
    )
    torch._check(weight.dim() == 2 and weight.shape[1] == input.shape[-1], lambda: "weight shape mismatch")
    out = input.new_empty((*input.shape[:-1], weight.shape[0]), dtype=weight.dtype)
    stat = torch.float64 if _compute_dtype(input, ln_weight) == torch.float64 else torch.float32
    mean = input.new_empty((*input.shape[: input.dim() - nd], *([1] * nd)), dtype=stat)
    return out, mean, torch.empty_like(mean)


@register_fake("memsave::layer_norm_linear_backward")
def _layer_norm_linear_backward_fake(
    grad_out: Tensor,
    input: Tensor,
    normalized_shape: List[int],
    mean: Tensor,
    rstd: Tensor,
    ln_weight: Optional[Tensor],
    ln_bias: Optional[Tensor],
    weight: Tensor,
    has_bias: bool,
) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    grad_input = input.new_empty(input.shape)
    grad_lw = torch.empty_like(ln_weight) if ln_weight is not None else input.new_empty((0,))
    grad_lb = torch.empty_like(ln_bias) if ln_bias is not None else input.new_empty((0,))
    grad_weight = weight.new_empty(weight.shape)
    grad_bias = weight.new_empty((weight.shape[0] if has_bias else 0,))
    return grad_input, grad_lw, grad_lb, grad_weight, grad_bias


@register_fake("memsave::layer_norm_apply")
def _layer_norm_apply_fake(
    input: Tensor,
    normalized_shape: List[int],
    mean: Tensor,
    rstd: Tensor,
    weight: Optional[Tensor],
    bias: Optional[Tensor],
    dtype: Optional[torch.dtype] = None,
) -> Tensor:
    return input.new_empty(input.shape, dtype=dtype if dtype is not None else input.dtype)


def _layer_norm_linear_setup_context(ctx: Any, inputs: Tuple[Any, ...], output: Tuple[Tensor, Tensor, Tensor]) -> None:
    input, normalized_shape, ln_weight, ln_bias, _eps, weight, bias = inputs
    _, mean, rstd = output
    # The memory win: the norm's input and two per-row scalars, not the normalized tensor.
    ctx.save_for_backward(input, mean, rstd, ln_weight, ln_bias, weight)
    ctx.normalized_shape = list(normalized_shape)
    ctx.has_bias = bias is not None
    ctx.mark_non_differentiable(mean, rstd)


def _layer_norm_linear_backward(ctx: Any, grad_out: Optional[Tensor], _grad_mean: Any, _grad_rstd: Any) -> tuple:
    input, mean, rstd, ln_weight, ln_bias, weight = ctx.saved_tensors
    needs = ctx.needs_input_grad  # input, normalized_shape, ln_weight, ln_bias, eps, weight, bias
    if grad_out is None:
        return (None,) * 7
    gi, glw, glb, gw, gb = torch.ops.memsave.layer_norm_linear_backward(
        grad_out, input, ctx.normalized_shape, mean, rstd, ln_weight, ln_bias, weight, ctx.has_bias
    )
    grads = grads_or_none(needs, (gi, None, glw, glb, None, gw, gb))
    return grads


torch.library.register_autograd(
    "memsave::layer_norm_linear", _layer_norm_linear_backward, setup_context=_layer_norm_linear_setup_context
)
register_backward_op_autograd("memsave::layer_norm_linear_backward")
register_backward_op_autograd("memsave::layer_norm_apply")


# ----------------------------------------------------------------------------------------------------
# memsave::act_linear: activation -> Linear keeping only the activation's input.
# ----------------------------------------------------------------------------------------------------


@register_fake("memsave::act_linear")
def _act_linear_fake(input: Tensor, weight: Tensor, bias: Optional[Tensor], act: str, act_param: float) -> Tensor:
    return linear_output_fake("act_linear", input, weight)


@register_fake("memsave::act_linear_backward")
def _act_linear_backward_fake(
    grad_out: Tensor, input: Tensor, weight: Tensor, has_bias: bool, act: str, act_param: float
) -> Tuple[Tensor, Tensor, Tensor]:
    grad_bias = weight.new_empty((weight.shape[0] if has_bias else 0,))
    return input.new_empty(input.shape), weight.new_empty(weight.shape), grad_bias


def _act_linear_setup_context(ctx: Any, inputs: Tuple[Any, ...], output: Tensor) -> None:
    input, weight, bias, act, act_param = inputs
    ctx.save_for_backward(input, weight)  # the memory win: the activation's input only
    ctx.has_bias = bias is not None
    ctx.act, ctx.act_param = act, act_param


def _act_linear_backward(ctx: Any, grad_out: Tensor) -> tuple:
    input, weight = ctx.saved_tensors
    gi, gw, gb = torch.ops.memsave.act_linear_backward(grad_out, input, weight, ctx.has_bias, ctx.act, ctx.act_param)
    return grads_or_none(ctx.needs_input_grad, (gi, gw, gb, None, None))


torch.library.register_autograd("memsave::act_linear", _act_linear_backward, setup_context=_act_linear_setup_context)
register_backward_op_autograd("memsave::act_linear_backward")
