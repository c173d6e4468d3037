"""Loss operators (csrc/ops/loss): linear_cross_entropy, with its tile kernels cross_entropy_tile_lse_ and
cross_entropy_tile_grad_.

``linear_cross_entropy`` is ``cross_entropy(linear(hidden, weight, bias), target)`` computed one tile of logits at a
time. Its autograd formula saves the inputs it already has (hidden, weight, bias, target) and one log-sum-exp per
row (float64), instead of the [rows x classes] logits and their log-softmax that torch's two operators keep; its
backward operator makes the logits again, tile by tile.

The module holds the family's Python face: the fake kernels and autograd formulas it records for
:func:`memsave.operators.ops.register`, and the functional forms that :mod:`memsave.functional` exports.
"""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

import torch

from ._common import Tensor, autocast_cast, check_number, check_tensor
from ._registration import Registrations, grads_or_none

#: What this family registers with torch.library, applied by memsave.operators.ops.register().
REGISTRATIONS = Registrations()


_REDUCTIONS = ("mean", "sum", "none")


def _check_args(
    op: str, hidden: Tensor, weight: Tensor, target: Tensor, bias: Optional[Tensor], reduction: str
) -> None:
    """The shape checks of the C++ kernels, for fake tensors."""
    torch._check(
        hidden.dim() >= 1 and weight.dim() == 2 and weight.shape[1] == hidden.shape[-1],
        lambda: f"memsave.{op}: weight must have shape [num_classes, {hidden.shape[-1]}], got {tuple(weight.shape)}",
    )
    torch._check(
        list(target.shape) == list(hidden.shape[:-1]),
        lambda: (
            f"memsave.{op}: target must have hidden's leading shape {tuple(hidden.shape[:-1])}, got "
            f"{tuple(target.shape)}"
        ),
    )
    torch._check(
        bias is None or (bias.dim() == 1 and bias.shape[0] == weight.shape[0]),
        lambda: f"memsave.{op}: bias must have shape [{weight.shape[0]}]",
    )
    torch._check(reduction in _REDUCTIONS, lambda: f"memsave.{op}: reduction must be 'mean', 'sum' or 'none'")
    for name, t in (("weight", weight), ("target", target), ("bias", bias)):
        if t is not None:
            device = t.device
            torch._check(
                device == hidden.device,
                lambda: f"memsave.{op}: {name} is on {device} but hidden is on {hidden.device}",
            )


@REGISTRATIONS.fake("memsave::linear_cross_entropy")
def _linear_cross_entropy_fake(
    hidden: Tensor,
    weight: Tensor,
    target: Tensor,
    bias: Optional[Tensor] = None,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    reduction: str = "mean",
    tile_rows: int = 0,
    tile_classes: int = 0,
) -> Tuple[Tensor, Tensor]:
    _check_args("linear_cross_entropy", hidden, weight, target, bias, reduction)
    loss_shape = tuple(target.shape) if reduction == "none" else ()
    loss = hidden.new_empty(loss_shape)
    lse = hidden.new_empty((target.numel(),), dtype=torch.float64)
    return loss, lse


@REGISTRATIONS.fake("memsave::linear_cross_entropy_backward")
def _linear_cross_entropy_backward_fake(
    grad_loss: Tensor,
    hidden: Tensor,
    weight: Tensor,
    target: Tensor,
    bias: Optional[Tensor],
    lse: Tensor,
    ignore_index: int,
    label_smoothing: float,
    reduction: str,
    output_mask: List[bool],
    tile_rows: int = 0,
    tile_classes: int = 0,
) -> Tuple[Tensor, Tensor, Tensor]:
    _check_args("linear_cross_entropy_backward", hidden, weight, target, bias, reduction)
    grad_hidden = hidden.new_empty(hidden.shape) if output_mask[0] else hidden.new_empty((0,))
    grad_weight = weight.new_empty(weight.shape) if output_mask[1] else weight.new_empty((0,))
    has_bias_grad = output_mask[2] and bias is not None
    grad_bias = weight.new_empty((weight.shape[0],)) if has_bias_grad else weight.new_empty((0,))
    return grad_hidden, grad_weight, grad_bias


REGISTRATIONS.no_output_fakes("memsave::cross_entropy_tile_lse_", "memsave::cross_entropy_tile_grad_")


def _linear_cross_entropy_setup_context(ctx: Any, inputs: Tuple[Any, ...], output: Tuple[Tensor, Tensor]) -> None:
    hidden, weight, target, bias, ignore_index, label_smoothing, reduction, tile_rows, tile_classes = inputs
    _, lse = output
    # The memory win: the inputs (alive anyway) and one float per row, not the logits and their log-softmax.
    ctx.save_for_backward(hidden, weight, target, bias, lse)
    ctx.ignore_index, ctx.label_smoothing, ctx.reduction = ignore_index, label_smoothing, reduction
    ctx.tile_rows, ctx.tile_classes = tile_rows, tile_classes
    ctx.mark_non_differentiable(lse)


def _linear_cross_entropy_backward(ctx: Any, grad_loss: Optional[Tensor], _grad_lse: Any) -> tuple:
    hidden, weight, target, bias, lse = ctx.saved_tensors
    # One flag per argument as the call passed them: torch leaves out trailing arguments equal to their defaults
    # (bias=None and the rest), so pad to the schema's nine.
    passed = tuple(ctx.needs_input_grad)
    needs = passed + (False,) * (9 - len(passed))  # hidden, weight, target, bias, then non-tensors
    if grad_loss is None:
        return (None,) * len(passed)
    gh, gw, gb = torch.ops.memsave.linear_cross_entropy_backward(
        grad_loss,
        hidden,
        weight,
        target,
        bias,
        lse,
        ctx.ignore_index,
        ctx.label_smoothing,
        ctx.reduction,
        [bool(needs[0]), bool(needs[1]), bool(needs[3])],
        ctx.tile_rows,
        ctx.tile_classes,
    )
    return grads_or_none(passed, (gh, gw, None, gb, None, None, None, None, None))


REGISTRATIONS.autograd(
    "memsave::linear_cross_entropy", _linear_cross_entropy_backward, setup_context=_linear_cross_entropy_setup_context
)
REGISTRATIONS.backward_op("memsave::linear_cross_entropy_backward")


# ----------------------------------------------------------------------------------------------------
# The functional forms (memsave.functional).
# ----------------------------------------------------------------------------------------------------
def linear_cross_entropy(
    hidden: Tensor,
    weight: Tensor,
    target: Tensor,
    bias: Optional[Tensor] = None,
    *,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    reduction: str = "mean",
) -> Tensor:
    """``cross_entropy(linear(hidden, weight, bias), target)`` without ever holding the logits.

    A language model's head and loss: torch's two operators build the ``[rows, num_classes]`` logits, keep their
    log-softmax for backward and make a gradient of the same size in backward -- the largest tensors of a training
    step at a large vocabulary. This computes the logits one tile at a time (no more of them than ``hidden`` has
    elements, and at most 4 Mi: 16 MiB in float32), folds each tile into a per-row log-sum-exp (an online
    log-sum-exp over the classes), and keeps only that log-sum-exp (one float per row) for backward, which makes the
    logits again tile by tile and accumulates the weight gradient in one buffer. Costs one more matmul of the
    logits' size than the eager composition; saves about ``3 x rows x num_classes`` floats of peak memory.

    The class dimension is the last one: ``hidden [..., in_features]`` and ``target [...]`` are flattened to rows
    (for 2-D hidden this is exactly ``F.cross_entropy(F.linear(hidden, weight, bias), target, ...)``; for more
    dimensions it is that on the flattened rows, which is what Hugging Face's causal-LM loss does). 16-bit inputs are
    computed in float32 (the log-sum-exp, the softmax and the gradients' accumulation across tiles) and the loss is
    returned in the input dtype. Under autocast the matmuls run in the autocast dtype, as ``F.linear`` would, and the
    loss is float32, as autocast's cross_entropy gives it.

    Args:
        hidden: ``[..., in_features]`` floating-point tensor (float32, float64, float16 or bfloat16).
        weight: ``[num_classes, in_features]`` tensor of hidden's dtype and device (an ``lm_head.weight``).
        target: ``[...]`` int64 class indices in ``[0, num_classes)`` or ``ignore_index``, hidden's leading shape.
        bias: ``[num_classes]`` or None.
        ignore_index: target value whose rows count for nothing (loss 0, gradient 0, not in the mean's count).
        label_smoothing: in ``[0, 1]``; as :func:`torch.nn.functional.cross_entropy`'s.
        reduction: ``"mean"`` (over the rows that are not ignored; NaN when all are, as torch), ``"sum"`` or
            ``"none"`` (one loss per row, target's shape).

    Returns:
        The loss: a scalar, or target's shape for ``reduction="none"``; hidden's dtype.

    Raises:
        TypeError: hidden is not floating-point, weight or bias has another dtype, target is not int64,
            ignore_index is not an int or label_smoothing not a number.
        ValueError: shapes that do not fit (naming the argument), label_smoothing outside ``[0, 1]``, an unknown
            reduction.
        IndexError: a target that is neither a class index nor ``ignore_index`` (checked in forward, one device
            sync).
        RuntimeError: weight, target or bias on another device than hidden.

    Examples:
        >>> hidden = model.transformer(input_ids).last_hidden_state[:, :-1]        # [batch, seq - 1, d]
        >>> loss = memsave.functional.linear_cross_entropy(hidden, model.lm_head.weight, input_ids[:, 1:])
        >>> loss.backward()
    """
    check_tensor("linear_cross_entropy", hidden)
    for name, value in (("weight", weight), ("target", target), ("bias", bias)):
        if value is not None and not isinstance(value, torch.Tensor):
            raise TypeError(
                f"memsave.functional.linear_cross_entropy: {name} must be a torch.Tensor, got {type(value).__name__}"
            )
    if reduction not in _REDUCTIONS:
        raise ValueError(
            f"memsave.functional.linear_cross_entropy: reduction must be 'mean', 'sum' or 'none', got {reduction!r}"
        )
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, int):
        raise TypeError(
            f"memsave.functional.linear_cross_entropy: ignore_index must be an int (a class index), got "
            f"{ignore_index!r}"
        )
    check_number("memsave.functional.linear_cross_entropy", "label_smoothing", label_smoothing)
    device_type = hidden.device.type
    autocast = device_type in ("cpu", "cuda") and torch.is_autocast_enabled(device_type)
    hidden, weight, bias = autocast_cast(device_type, hidden, weight, bias)
    loss, _lse = torch.ops.memsave.linear_cross_entropy(
        hidden, weight, target, bias, int(ignore_index), float(label_smoothing), reduction
    )
    # Autocast runs cross_entropy in float32 (the logits are cast up), so its loss is float32.
    return loss.float() if autocast else loss
