"""Loss operators (csrc/ops/loss): linear_cross_entropy, with its tile kernels cross_entropy_tile_lse_ and
cross_entropy_tile_grad_.

``linear_cross_entropy`` is ``cross_entropy(linear(hidden, weight, bias), target)`` computed one tile of logits at a
time. Its autograd formula saves the inputs it already has (hidden, weight, bias, target) and one log-sum-exp per
row (float64), instead of the [rows x classes] logits and their log-softmax that torch's two operators keep; its
backward operator makes the logits again, tile by tile.
"""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

import torch

from .autograd import grads_or_none, register_backward_op_autograd, register_fake, register_no_output_fakes

Tensor = torch.Tensor

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


@register_fake("memsave::linear_cross_entropy")
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


@register_fake("memsave::linear_cross_entropy_backward")
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


register_no_output_fakes("memsave::cross_entropy_tile_lse_", "memsave::cross_entropy_tile_grad_")


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


torch.library.register_autograd(
    "memsave::linear_cross_entropy", _linear_cross_entropy_backward, setup_context=_linear_cross_entropy_setup_context
)
register_backward_op_autograd("memsave::linear_cross_entropy_backward")
