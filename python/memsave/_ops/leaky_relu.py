"""memsave::leaky_relu: LeakyReLU that keeps a 1-bit sign mask for backward instead of its input.

Fake kernels and autograd: ``_mask_autograd.register_mask_op`` (the scalar is ``negative_slope``);
``leaky_relu_`` (in place) has its autograd in C++ (csrc/ops/inplace_autograd.h).
"""
from __future__ import annotations

from ._mask_autograd import register_mask_op

register_mask_op("leaky_relu")
