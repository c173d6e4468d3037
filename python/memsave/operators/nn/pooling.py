"""memsave.nn.MaxPool2d: a drop-in torch.nn.MaxPool2d that keeps a 1-byte in-window argmax for backward."""

from __future__ import annotations

from typing import Tuple, Union

import torch
from torch import nn

from .. import functional as F
from ._base import MemsaveModuleMixin

__all__ = ["MaxPool2d"]


class MaxPool2d(MemsaveModuleMixin, nn.MaxPool2d):
    """MaxPool2d that keeps 1 byte per output element for backward, and not its input.

    torch.nn.MaxPool2d keeps int64 indices (8 bytes per output element) and its input. Same constructor,
    ``extra_repr`` and (empty) state_dict as :class:`torch.nn.MaxPool2d`, of which it is a subclass; outputs and
    gradients are bitwise equal to torch's on CPU.

    Args:
        kernel_size: window size; at most 256 positions (16x16).
        stride: window stride. Default: ``kernel_size``.
        padding: implicit -inf padding, at most half the kernel size.
        dilation: spacing between window elements.
        return_indices: also return torch-style int64 indices (computed from the 1-byte codes; not kept for
            backward), e.g. for ``nn.MaxUnpool2d``.
        ceil_mode: ceil instead of floor for the output size.

    Raises:
        TypeError / ValueError: at construction, for arguments torch would reject or a window over 256 positions.

    Examples:
        >>> pool = memsave.nn.MaxPool2d(2)
        >>> y = pool(torch.randn(2, 3, 8, 8, requires_grad=True))
    """

    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, return_indices=False, ceil_mode=False):
        super().__init__(kernel_size, stride, padding, dilation, return_indices, ceil_mode)
        F.pool_params(self.kernel_size, self.stride, self.padding, self.dilation)  # fail at construction

    def forward(self, input: torch.Tensor) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
        return F.max_pool2d(
            input, self.kernel_size, self.stride, self.padding, self.dilation, self.ceil_mode, self.return_indices
        )
