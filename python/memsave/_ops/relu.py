"""memsave::relu: ReLU that keeps a 1-bit mask (``ceil(numel / 8)`` bytes) for backward instead of its output.

``relu`` is functional and gets its fake kernels and autograd from ``_mask_autograd.register_mask_op`` (no scalars);
``relu_`` (in place, schema ``Tensor(a!)``) has its autograd in C++ (csrc/ops/inplace_autograd.h), because
``register_autograd`` accepts functional schemas only.
"""
from __future__ import annotations

from ._mask_autograd import register_mask_op

register_mask_op("relu")
