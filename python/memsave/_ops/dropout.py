"""memsave::dropout: Dropout that keeps a 1-bit keep mask for backward (torch keeps at least a byte per element).

The bits are drawn from PyTorch's default generator of the tensor's device (see csrc/ops/dropout.cpp), so
``torch.manual_seed`` reproduces them and restoring the RNG state (as checkpoint recompute does) replays them.
Fake kernels and autograd: ``_mask_autograd.register_mask_op`` (the scalar is ``p``); ``dropout_`` (in place) has
its autograd in C++ (csrc/ops/inplace_autograd.h).
"""
from __future__ import annotations

from ._mask_autograd import register_mask_op

register_mask_op("dropout")
