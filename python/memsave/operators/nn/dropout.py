"""memsave.nn.Dropout: a drop-in torch.nn.Dropout that keeps a 1-bit keep mask for backward."""

from __future__ import annotations

import torch
from torch import nn

from .. import functional as F
from ..ops._common import check_number
from ._base import MemsaveModuleMixin, check_flag

__all__ = ["Dropout"]


class Dropout(MemsaveModuleMixin, nn.Dropout):
    """Dropout that keeps 1 bit per element for backward (torch keeps a mask of 1 byte on CUDA, of one element on CPU).

    Same constructor, ``extra_repr`` and (empty) state_dict as :class:`torch.nn.Dropout`, of which it is a
    subclass. Same keep probability and scaling as torch; the bits come from PyTorch's generator of the input's
    device, so ``torch.manual_seed`` reproduces them and checkpoint recompute replays them (the draws differ from
    torch.nn.Dropout's). Identity in eval mode.

    Args:
        p: probability of an element being zeroed. Default: 0.5.
        inplace: overwrite the input.

    Raises:
        TypeError: ``p`` is not a number or ``inplace`` not a bool. ValueError: ``p`` outside [0, 1] (or NaN).

    Examples:
        >>> drop = memsave.nn.Dropout(0.1)
        >>> y = drop(torch.randn(4, 8, requires_grad=True))
    """

    def __init__(self, p: float = 0.5, inplace: bool = False) -> None:
        prob = check_number("memsave.nn.Dropout", "p", p)
        if not 0.0 <= prob <= 1.0:  # NaN included
            raise ValueError(f"memsave.nn.Dropout: dropout probability has to be between 0 and 1, but got {p!r}")
        super().__init__(p, check_flag("memsave.nn.Dropout", "inplace", inplace))

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return F.dropout(input, self.p, self.training, self.inplace)
