"""linear_cross_entropy: a loss that never holds the [rows, classes] logits."""

from __future__ import annotations

from typing import Optional

import torch

from .common import Tensor, autocast_cast, check_tensor

_REDUCTIONS = ("mean", "sum", "none")


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
        TypeError: hidden is not floating-point, weight or bias has another dtype, target is not int64.
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
    device_type = hidden.device.type
    autocast = device_type in ("cpu", "cuda") and torch.is_autocast_enabled(device_type)
    hidden, weight, bias = autocast_cast(device_type, hidden, weight, bias)
    loss, _lse = torch.ops.memsave.linear_cross_entropy(
        hidden, weight, target, bias, int(ignore_index), float(label_smoothing), reduction
    )
    # Autocast runs cross_entropy in float32 (the logits are cast up), so its loss is float32.
    return loss.float() if autocast else loss
