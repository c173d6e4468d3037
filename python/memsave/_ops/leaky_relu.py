"""memsave::leaky_relu: LeakyReLU that keeps a 1-bit sign mask for backward instead of its input.

``leaky_relu_`` (in place) has its autograd in C++ (csrc/ops/inplace_autograd.h).
"""
from __future__ import annotations

from typing import Any, Tuple

import torch

from ._common import check_same_device, packed_mask_bytes


@torch.library.register_fake("memsave::leaky_relu")
def _leaky_relu_fake(x: torch.Tensor, negative_slope: float) -> Tuple[torch.Tensor, torch.Tensor]:
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    return out, x.new_empty((packed_mask_bytes(x.numel()),), dtype=torch.uint8)


@torch.library.register_fake("memsave::leaky_relu_")
def _leaky_relu_inplace_fake(x: torch.Tensor, negative_slope: float) -> torch.Tensor:
    return x.new_empty((packed_mask_bytes(x.numel()),), dtype=torch.uint8)


@torch.library.register_fake("memsave::leaky_relu_backward")
def _leaky_relu_backward_fake(grad_out: torch.Tensor, mask: torch.Tensor, negative_slope: float) -> torch.Tensor:
    check_same_device("leaky_relu_backward", grad_out, mask)
    return torch.empty_like(grad_out, memory_format=torch.contiguous_format)


def _setup_context(ctx: Any, inputs: Tuple[Any, ...], output: Tuple[torch.Tensor, torch.Tensor]) -> None:
    _, negative_slope = inputs
    _, mask = output
    ctx.save_for_backward(mask)  # a bit per element instead of the input
    ctx.mark_non_differentiable(mask)
    ctx.negative_slope = negative_slope


def _backward(ctx: Any, grad_out: torch.Tensor, _grad_mask: Any) -> Tuple[torch.Tensor, None]:
    (mask,) = ctx.saved_tensors
    return torch.ops.memsave.leaky_relu_backward(grad_out, mask, ctx.negative_slope), None


torch.library.register_autograd("memsave::leaky_relu", _backward, setup_context=_setup_context)


# leaky_relu_backward is linear in grad_out: its derivative is itself (double backward).
def _backward_setup_context(ctx: Any, inputs: Tuple[Any, ...], output: torch.Tensor) -> None:
    _, mask, negative_slope = inputs
    ctx.save_for_backward(mask)
    ctx.negative_slope = negative_slope


def _backward_backward(ctx: Any, grad_grad: torch.Tensor) -> Tuple[torch.Tensor, None, None]:
    (mask,) = ctx.saved_tensors
    return torch.ops.memsave.leaky_relu_backward(grad_grad, mask, ctx.negative_slope), None, None


torch.library.register_autograd(
    "memsave::leaky_relu_backward", _backward_backward, setup_context=_backward_setup_context
)
