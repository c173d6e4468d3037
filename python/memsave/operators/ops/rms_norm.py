"""RMSNorm operators (csrc/ops/rms_norm): rms_norm and rms_norm_linear.

Fake kernels and autograd formulas. ``rms_norm`` saves its input and one float per row (the reciprocal RMS);
``rms_norm_linear`` saves only the norm's input (its backward recomputes the normalized tensor and the statistic,
the forward's values exactly) and calls the operators' own ``*_backward``.

The module holds the family's Python face: the fake kernels and autograd formulas it records for
:func:`memsave.operators.ops.register`, and the functional forms that :mod:`memsave.functional` exports.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple, Union

import torch

from ._common import Tensor, autocast_cast, check_number, check_tensor
from ._registration import Registrations, grads_or_none, is_dense

#: What this family registers with torch.library, applied by memsave.operators.ops.register().
REGISTRATIONS = Registrations()


def stat_dtype(input: Tensor) -> torch.dtype:
    """The dtype of rms_norm's per-row statistic: float64 for a float64 input, float32 otherwise."""
    return torch.float64 if input.dtype == torch.float64 else torch.float32


def out_dtype(input: Tensor, weight: Optional[Tensor]) -> torch.dtype:
    """rms_norm's output dtype: promote(input, weight), as Hugging Face's ``weight * hidden.to(input_dtype)``."""
    return torch.promote_types(input.dtype, weight.dtype) if weight is not None else input.dtype


def rstd_strides(input: Tensor) -> Tuple[int, ...]:
    """Strides of rms_norm's per-row statistic (mirrors ``rms_rows`` in csrc/ops/rms_norm/rms_norm.h): a dense input
    whose last dimension is contiguous is read in place, one value per row in its row order; any other gives a
    contiguous statistic."""
    cols = input.shape[-1]
    if is_dense(input) and input.stride(-1) == 1 and cols > 0:
        return tuple(s // cols for s in input.stride()[:-1])
    return torch.empty(input.shape[:-1], device="meta").stride()


def _check_norm_weight(op: str, input: Tensor, weight: Optional[Tensor], name: str) -> None:
    torch._check(input.dim() >= 1, lambda: f"memsave.{op}: input must have at least one dimension")
    if weight is not None:
        torch._check(
            weight.dim() == 1 and weight.shape[0] == input.shape[-1],
            lambda: f"memsave.{op}: {name} must have shape [{input.shape[-1]}], got {tuple(weight.shape)}",
        )


# ----------------------------------------------------------------------------------------------------
# memsave::rms_norm: keeps the input and the per-row reciprocal RMS.
# ----------------------------------------------------------------------------------------------------
@REGISTRATIONS.fake("memsave::rms_norm")
def _rms_norm_fake(input: Tensor, weight: Optional[Tensor], eps: float) -> Tuple[Tensor, Tensor]:
    _check_norm_weight("rms_norm", input, weight, "weight")
    out = torch.empty_like(input, dtype=out_dtype(input, weight))  # the kernels keep the input's layout
    rstd = torch.empty_strided(input.shape[:-1], rstd_strides(input), dtype=stat_dtype(input), device=input.device)
    return out, rstd


@REGISTRATIONS.fake("memsave::rms_norm_backward")
def _rms_norm_backward_fake(
    grad_out: Tensor, input: Tensor, rstd: Tensor, weight: Optional[Tensor], output_mask: List[bool]
) -> Tuple[Tensor, Tensor]:
    grad_input = torch.empty_like(input) if output_mask[0] else input.new_empty((0,))
    grad_weight = weight.new_empty(weight.shape) if output_mask[1] and weight is not None else input.new_empty((0,))
    return grad_input, grad_weight


def _rms_norm_setup_context(ctx: Any, inputs: Tuple[Any, ...], output: Tuple[Tensor, Tensor]) -> None:
    input, weight, _eps = inputs
    ctx.save_for_backward(input, output[1], weight)  # the memory win: the input and one float per row
    ctx.mark_non_differentiable(output[1])


def _rms_norm_backward(ctx: Any, grad_out: Optional[Tensor], _grad_rstd: Any) -> tuple:
    input, rstd, weight = ctx.saved_tensors
    needs = ctx.needs_input_grad  # input, weight, eps
    if grad_out is None:
        return None, None, None
    gi, gw = torch.ops.memsave.rms_norm_backward(grad_out, input, rstd, weight, [needs[0], needs[1]])
    return grads_or_none(needs, (gi, gw, None))


REGISTRATIONS.autograd("memsave::rms_norm", _rms_norm_backward, setup_context=_rms_norm_setup_context)
REGISTRATIONS.backward_op("memsave::rms_norm_backward")


# ----------------------------------------------------------------------------------------------------
# memsave::rms_norm_linear: RMSNorm -> one or more Linears, keeping the norm's input only.
# ----------------------------------------------------------------------------------------------------
@REGISTRATIONS.fake("memsave::rms_norm_linear")
def _rms_norm_linear_fake(
    input: Tensor, norm_weight: Optional[Tensor], eps: float, weights: List[Tensor], biases: List[Optional[Tensor]]
) -> List[Tensor]:
    _check_norm_weight("rms_norm_linear", input, norm_weight, "norm_weight")
    torch._check(len(weights) >= 1, lambda: "memsave.rms_norm_linear: weights must hold at least one Linear weight")
    torch._check(len(biases) == len(weights), lambda: "memsave.rms_norm_linear: one bias (or None) per weight")
    for i, w in enumerate(weights):
        torch._check(
            w.dim() == 2 and w.shape[1] == input.shape[-1],
            lambda: (
                f"memsave.rms_norm_linear: weights[{i}] must have shape [out_features, {input.shape[-1]}], "
                f"got {tuple(w.shape)}"
            ),
        )
    return [input.new_empty((*input.shape[:-1], w.shape[0]), dtype=w.dtype) for w in weights]


@REGISTRATIONS.fake("memsave::rms_norm_linear_backward")
def _rms_norm_linear_backward_fake(
    grad_outs: List[Optional[Tensor]],
    input: Tensor,
    norm_weight: Optional[Tensor],
    eps: float,
    weights: List[Tensor],
    has_bias: List[bool],
) -> Tuple[Tensor, Tensor, List[Tensor], List[Tensor]]:
    grad_norm_weight = norm_weight.new_empty(norm_weight.shape) if norm_weight is not None else input.new_empty((0,))
    grad_weights = [w.new_empty(w.shape) for w in weights]
    grad_biases = [w.new_empty((w.shape[0] if b else 0,)) for w, b in zip(weights, has_bias)]
    return input.new_empty(input.shape), grad_norm_weight, grad_weights, grad_biases


def _rms_norm_linear_setup_context(ctx: Any, inputs: Tuple[Any, ...], output: List[Tensor]) -> None:
    input, norm_weight, eps, weights, biases = inputs
    ctx.save_for_backward(input, norm_weight, *weights)  # the memory win: the norm's input, not the normalized tensor
    ctx.eps = eps
    ctx.has_bias = [b is not None for b in biases]


def _rms_norm_linear_backward(ctx: Any, grad_outs: Sequence[Optional[Tensor]]) -> tuple:
    input, norm_weight, *weights = ctx.saved_tensors
    needs = ctx.needs_input_grad  # input, norm_weight, eps, [weights], [biases] or one flag for a list of Nones
    gi, gnw, gws, gbs = torch.ops.memsave.rms_norm_linear_backward(
        list(grad_outs), input, norm_weight, ctx.eps, weights, ctx.has_bias
    )
    grad_weights = [g if n else None for g, n in zip(gws, needs[3])]
    # A list of biases that are all None reaches autograd as one non-tensor argument (its gradient: one None).
    grad_biases = [g if n else None for g, n in zip(gbs, needs[4])] if isinstance(needs[4], list) else None
    return (gi if needs[0] else None, gnw if needs[1] else None, None, grad_weights, grad_biases)


REGISTRATIONS.autograd(
    "memsave::rms_norm_linear", _rms_norm_linear_backward, setup_context=_rms_norm_linear_setup_context
)
REGISTRATIONS.backward_op("memsave::rms_norm_linear_backward")


# ----------------------------------------------------------------------------------------------------
# The functional forms (memsave.functional).
# ----------------------------------------------------------------------------------------------------
def _rms_eps(input: Tensor, eps: Optional[float]) -> float:
    # eps=None is torch.nn.RMSNorm's default: the machine epsilon of the input's dtype.
    if eps is None:
        return float(torch.finfo(input.dtype).eps)
    return check_number("memsave.functional.rms_norm", "eps", eps)


def _check_weight(fn: str, name: str, weight: Any) -> None:
    if weight is not None and not isinstance(weight, Tensor):
        raise TypeError(f"memsave.functional.{fn}: {name} must be a tensor or None, got {type(weight).__name__}")


def rms_norm(input: Tensor, weight: Optional[Tensor] = None, eps: Optional[float] = 1e-6) -> Tensor:
    """RMSNorm over the last dimension, keeping ``input`` and one float per row for backward.

    Computes Hugging Face's ``LlamaRMSNorm`` value for value: the mean of squares and the normalization in float32
    (float64 for float64 input), the normalized tensor rounded to the input dtype, then multiplied by ``weight``; the
    result has ``promote(input.dtype, weight.dtype)``. Eager LlamaRMSNorm keeps a float32 copy of a 16-bit input, the
    float32 normalized tensor and its rounded copy for backward; this keeps the input and the per-row reciprocal RMS.

    Args:
        input: ``[..., hidden]`` floating-point tensor (float32, float64, float16 or bfloat16), any strides.
        weight: ``[hidden]`` scale, or None.
        eps: added to the mean of squares; None means ``torch.finfo(input.dtype).eps`` (torch.nn.RMSNorm's default).

    Returns:
        The normalized tensor, ``input``'s shape.

    Raises:
        TypeError: ``input`` is not a floating-point tensor, ``weight`` not a tensor or None, ``eps`` not a number.
        ValueError: ``weight`` does not have shape ``[hidden]``, or eps < 0.
        RuntimeError: ``weight`` is on another device than ``input``.

    Examples:
        >>> norm = transformers_model.model.layers[0].input_layernorm          # a LlamaRMSNorm
        >>> y = memsave.functional.rms_norm(x, norm.weight, norm.variance_epsilon)
    """
    check_tensor("rms_norm", input)
    _check_weight("rms_norm", "weight", weight)
    out, _rstd = torch.ops.memsave.rms_norm(input, weight, _rms_eps(input, eps))
    return out


def rms_norm_linear(
    input: Tensor,
    norm_weight: Optional[Tensor],
    weight: Union[Tensor, Sequence[Tensor]],
    bias: Union[Tensor, Sequence[Optional[Tensor]], None] = None,
    eps: Optional[float] = 1e-6,
) -> Union[Tensor, Tuple[Tensor, ...]]:
    """``linear(rms_norm(input), weight, bias)`` for one or several Linears, keeping only ``input`` for backward.

    The normalized tensor that the Linears read (and that torch would keep for their weight gradients) is
    recomputed in backward, together with the per-row statistic. Several Linears that read the same norm -- a Llama
    block's q/k/v or gate/up projections -- share one normalized tensor in forward and one recompute in backward.
    Under autocast the Linears run in the autocast dtype and the norm in the input's, as with the torch ops.

    Args:
        input: ``[..., hidden]`` floating-point tensor.
        norm_weight: the RMSNorm's ``[hidden]`` weight, or None.
        weight: a ``[out_features, hidden]`` Linear weight, or a sequence of them.
        bias: None, a ``[out_features]`` bias (one weight), or a sequence with one bias per weight: all tensors or
            all None.
        eps: the RMSNorm's eps (None: ``torch.finfo(input.dtype).eps``).

    Returns:
        ``[..., out_features]`` tensor, or a tuple with one per weight when ``weight`` is a sequence.

    Raises:
        TypeError: ``input`` is not a floating-point tensor.
        ValueError: shapes that do not chain, a bias list of another length or mixing tensors and None.
        RuntimeError: parameters on another device than ``input``.

    Examples:
        >>> attn = block.self_attn
        >>> q, k, v = memsave.functional.rms_norm_linear(
        ...     x, block.input_layernorm.weight, [attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])
    """
    check_tensor("rms_norm_linear", input)
    single = isinstance(weight, Tensor)
    weights = [weight] if single else list(weight)
    if bias is None or isinstance(bias, Tensor):
        biases: List[Optional[Tensor]] = [bias] if single else [None] * len(weights)
        if not single and bias is not None:
            raise ValueError(
                "memsave.functional.rms_norm_linear: give one bias per weight (a list) for several weights"
            )
    else:
        biases = list(bias)
    if len(biases) != len(weights):
        raise ValueError(
            f"memsave.functional.rms_norm_linear: {len(biases)} biases for {len(weights)} weights; give one per weight"
        )
    if any(b is None for b in biases) and any(b is not None for b in biases):
        raise ValueError(
            "memsave.functional.rms_norm_linear: the biases must be all tensors or all None (autograd sees a list "
            "mixing the two as one constant); give zero biases to the Linears without one"
        )
    cast = autocast_cast(input.device.type, *weights, *biases)
    weights, biases = list(cast[: len(weights)]), list(cast[len(weights) :])
    outs = torch.ops.memsave.rms_norm_linear(input, norm_weight, _rms_eps(input, eps), weights, biases)
    return outs[0] if single else tuple(outs)
