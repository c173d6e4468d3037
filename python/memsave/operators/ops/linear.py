"""Norm/activation -> Linear operators (csrc/ops/linear): layer_norm_linear (with its recompute kernel
layer_norm_apply) and act_linear.

Each registers its fake kernels and its autograd formula, which saves the Linear's *pre-normalization* or
*pre-activation* input (plus per-row statistics for layer_norm_linear) instead of the tensor the Linear consumes.

The module holds the family's Python face: the fake kernels and autograd formulas it records for
:func:`memsave.operators.ops.register`, and the functional forms that :mod:`memsave.functional` exports.
"""

from __future__ import annotations

import math
from typing import Any, List, Optional, Sequence, Tuple, Union

import torch

from ._common import Tensor, autocast_cast, check_number, check_tensor, resolve_activation
from ._registration import Registrations, grads_or_none, linear_output_fake

#: What this family registers with torch.library, applied by memsave.operators.ops.register().
REGISTRATIONS = Registrations()

# ----------------------------------------------------------------------------------------------------
# memsave::layer_norm_linear: LayerNorm -> Linear keeping the LayerNorm input plus per-row mean/rstd.
# ----------------------------------------------------------------------------------------------------


def _compute_dtype(input: Tensor, ln_weight: Optional[Tensor]) -> torch.dtype:
    return torch.promote_types(input.dtype, ln_weight.dtype) if ln_weight is not None else input.dtype


@REGISTRATIONS.fake("memsave::layer_norm_linear")
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


@REGISTRATIONS.fake("memsave::layer_norm_linear_backward")
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


@REGISTRATIONS.fake("memsave::layer_norm_apply")
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


REGISTRATIONS.autograd(
    "memsave::layer_norm_linear", _layer_norm_linear_backward, setup_context=_layer_norm_linear_setup_context
)
REGISTRATIONS.backward_op("memsave::layer_norm_linear_backward")
REGISTRATIONS.backward_op("memsave::layer_norm_apply")


# ----------------------------------------------------------------------------------------------------
# memsave::act_linear: activation -> Linear keeping only the activation's input.
# ----------------------------------------------------------------------------------------------------


@REGISTRATIONS.fake("memsave::act_linear")
def _act_linear_fake(input: Tensor, weight: Tensor, bias: Optional[Tensor], act: str, act_param: float) -> Tensor:
    return linear_output_fake("act_linear", input, weight)


@REGISTRATIONS.fake("memsave::act_linear_backward")
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


REGISTRATIONS.autograd("memsave::act_linear", _act_linear_backward, setup_context=_act_linear_setup_context)
REGISTRATIONS.backward_op("memsave::act_linear_backward")


# ----------------------------------------------------------------------------------------------------
# The functional forms (memsave.functional).
# ----------------------------------------------------------------------------------------------------
def layer_norm_linear(
    input: Tensor,
    normalized_shape: Union[int, Sequence[int]],
    ln_weight: Optional[Tensor],
    ln_bias: Optional[Tensor],
    weight: Tensor,
    bias: Optional[Tensor] = None,
    eps: float = 1e-5,
) -> Tensor:
    """``linear(layer_norm(input), weight, bias)`` keeping ``input`` and per-row mean/rstd, not the normalized tensor.

    Under autocast the Linear runs in the autocast dtype and the norm in ``promote(input, ln_weight)``, as with the
    two torch ops (torch's CUDA autocast runs layer_norm in float32).

    Args:
        input: ``[..., *normalized_shape]`` tensor; the Linear acts on the last dimension.
        normalized_shape: the trailing shape to normalize over (an int for the last dimension).
        ln_weight, ln_bias: the norm's affine parameters (shape ``normalized_shape``) or None.
        weight: ``[out_features, input.shape[-1]]``; bias: ``[out_features]`` or None.
        eps: added to the variance.

    Returns:
        ``[..., out_features]`` tensor.

    Raises:
        TypeError: ``input`` is not a floating-point tensor or ``eps`` not a number.
        ValueError: ``eps`` negative or not finite, or shapes that do not fit (naming the argument).

    Examples:
        >>> ln, fc = torch.nn.LayerNorm(64), torch.nn.Linear(64, 256)
        >>> y = memsave.functional.layer_norm_linear(x, 64, ln.weight, ln.bias, fc.weight, fc.bias)
    """
    check_tensor("layer_norm_linear", input)
    eps = check_number("memsave.functional.layer_norm_linear", "eps", eps)
    if not (math.isfinite(eps) and eps >= 0.0):  # a negative eps can make the variance + eps negative: NaN outputs
        raise ValueError(f"memsave.functional.layer_norm_linear: eps must be a finite number >= 0, got {eps!r}")
    shape = [int(normalized_shape)] if isinstance(normalized_shape, int) else [int(s) for s in normalized_shape]
    weight, bias = autocast_cast(input.device.type, weight, bias)
    out, _mean, _rstd = torch.ops.memsave.layer_norm_linear(input, shape, ln_weight, ln_bias, float(eps), weight, bias)
    return out


def act_linear(
    input: Tensor,
    weight: Tensor,
    bias: Optional[Tensor] = None,
    act: str = "gelu",
    act_param: Optional[float] = None,
) -> Tensor:
    """``linear(act(input), weight, bias)`` keeping only ``input`` for backward.

    torch keeps both the activation's input and its output here (for gelu, silu, leaky_relu, elu); this keeps one
    tensor. For relu there is no gain (torch's relu and linear share relu's output), but it is accepted.

    Args:
        input: ``[..., in_features]`` tensor.
        weight: ``[out_features, in_features]``; bias: ``[out_features]`` or None.
        act: one of :data:`ACTIVATIONS` (``"gelu_tanh"`` is ``nn.GELU(approximate="tanh")``).
        act_param: leaky_relu's negative_slope (0.01) or elu's alpha (1.0).

    Returns:
        ``[..., out_features]`` tensor.

    Examples:
        >>> h = fc1(x)
        >>> y = memsave.functional.act_linear(h, fc2.weight, fc2.bias, act="gelu")
    """
    check_tensor("act_linear", input)
    act, param = resolve_activation(act, act_param)
    # The activation runs in input's dtype and its result is cast to the weight's, as autocast does for act -> Linear.
    weight, bias = autocast_cast(input.device.type, weight, bias)
    return torch.ops.memsave.act_linear(input, weight, bias, act, param)
