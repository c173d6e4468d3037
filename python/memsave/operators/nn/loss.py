"""Loss modules (the ``loss`` operator family): LinearCrossEntropy.

========================  ==============================================  =========================================
module                    torch keeps (Linear + CrossEntropyLoss)         memsave keeps
========================  ==============================================  =========================================
LinearCrossEntropy        the [rows, classes] logits' log-softmax          one log-sum-exp per row
                          (and builds logits and their gradient, each
                          as large)
========================  ==============================================  =========================================

State dict: ``weight`` and ``bias`` as nn.Linear's, so a language model's ``lm_head`` loads into it (and
:meth:`LinearCrossEntropy.from_linear` shares an existing head's parameters, tied embeddings included).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .. import functional as F
from ._base import LinearParamsBase

Tensor = torch.Tensor

__all__ = ["LinearCrossEntropy"]


class LinearCrossEntropy(LinearParamsBase):
    """A Linear head and cross-entropy loss in one: ``forward(hidden, target)`` returns the loss, never the logits.

    Equal to ``nn.CrossEntropyLoss(...)(nn.Linear(in_features, num_classes)(hidden), target)`` (class dimension
    last, rows flattened) computed by :func:`memsave.functional.linear_cross_entropy`: the logits exist only one
    tile at a time, and backward keeps one float per row instead of the logits' log-softmax. Use it where a model
    computes its logits only to feed them to the loss (a language model in training); keep an ``nn.Linear`` where
    the logits themselves are needed (generation). Parameters ``weight``/``bias`` are nn.Linear's (same
    initialization, same state_dict keys).

    Args:
        in_features: size of the last dimension of ``hidden``.
        num_classes: number of classes (the vocabulary size), the Linear's out_features.
        bias: give the Linear a bias (nn.Linear's default; language-model heads usually have none).
        ignore_index, label_smoothing, reduction: as for :class:`torch.nn.CrossEntropyLoss`.
        device, dtype: as for nn.Linear.

    Raises:
        ValueError: an unknown reduction or label_smoothing outside ``[0, 1]``.

    Examples:
        >>> head = memsave.nn.LinearCrossEntropy(768, 50257, bias=False)
        >>> head.load_state_dict(model.lm_head.state_dict())
        >>> loss = head(hidden_states[:, :-1], input_ids[:, 1:])
        >>> loss.backward()
    """

    num_classes: int

    def __init__(
        self,
        in_features: int,
        num_classes: int,
        bias: bool = True,
        ignore_index: int = -100,
        label_smoothing: float = 0.0,
        reduction: str = "mean",
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__("memsave.nn.LinearCrossEntropy", bias, in_features=in_features, num_classes=num_classes)
        self._set_loss_options(ignore_index, label_smoothing, reduction)  # before drawing the initial weights
        linear = nn.Linear(in_features, num_classes, bias=bias, device=device, dtype=dtype)
        self.take_linear(linear, out_name="num_classes")

    def _set_loss_options(self, ignore_index: int, label_smoothing: float, reduction: str) -> None:
        if reduction not in ("mean", "sum", "none"):
            raise ValueError(f"LinearCrossEntropy: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
        if not 0.0 <= float(label_smoothing) <= 1.0:
            raise ValueError(f"LinearCrossEntropy: label_smoothing must be in [0, 1], got {label_smoothing}")
        if isinstance(ignore_index, bool) or not isinstance(ignore_index, int):
            raise TypeError(f"LinearCrossEntropy: ignore_index must be an int (a class index), got {ignore_index!r}")
        self.ignore_index = int(ignore_index)
        self.label_smoothing = float(label_smoothing)
        self.reduction = reduction

    @classmethod
    def from_linear(
        cls, linear: nn.Linear, ignore_index: int = -100, label_smoothing: float = 0.0, reduction: str = "mean"
    ) -> "LinearCrossEntropy":
        """A LinearCrossEntropy sharing ``linear``'s parameters (a tied ``lm_head`` stays tied).

        Args:
            linear: the head whose logits went to the loss.
            ignore_index, label_smoothing, reduction: the loss's options (see the class).

        Returns:
            The module; ``linear`` keeps working for the logits (generation).

        Raises:
            TypeError: ``linear`` is not an nn.Linear.

        Examples:
            >>> loss_head = memsave.nn.LinearCrossEntropy.from_linear(model.lm_head)
        """
        head = cls._adopting(linear, "LinearCrossEntropy.from_linear expects", out_name="num_classes")
        head._set_loss_options(ignore_index, label_smoothing, reduction)
        return head

    def forward(self, hidden: Tensor, target: Tensor) -> Tensor:
        """The loss of ``hidden [..., in_features]`` against ``target [...]`` (see the class)."""
        return F.linear_cross_entropy(
            hidden,
            self.weight,
            target,
            self.bias,
            ignore_index=self.ignore_index,
            label_smoothing=self.label_smoothing,
            reduction=self.reduction,
        )

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, num_classes={self.num_classes}, bias={self.bias is not None}, "
            f"ignore_index={self.ignore_index}, label_smoothing={self.label_smoothing}, reduction={self.reduction!r}"
        )
