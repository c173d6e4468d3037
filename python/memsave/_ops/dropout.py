"""memsave::dropout: Dropout that keeps a 1-bit keep mask for backward (torch keeps at least a byte per element).

The bits are drawn from PyTorch's default generator of the tensor's device (see csrc/ops/dropout.cpp), so
``torch.manual_seed`` reproduces them and restoring the RNG state (as checkpoint recompute does) replays them.
``dropout_`` (in place) has its autograd in C++ (csrc/ops/inplace_autograd.h).
"""
from __future__ import annotations

from typing import Any, Tuple

import torch

from ._common import check_same_device, packed_mask_bytes


@torch.library.register_fake("memsave::dropout")
def _dropout_fake(x: torch.Tensor, p: float) -> Tuple[torch.Tensor, torch.Tensor]:
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    return out, x.new_empty((packed_mask_bytes(x.numel()),), dtype=torch.uint8)


@torch.library.register_fake("memsave::dropout_")
def _dropout_inplace_fake(x: torch.Tensor, p: float) -> torch.Tensor:
    return x.new_empty((packed_mask_bytes(x.numel()),), dtype=torch.uint8)


@torch.library.register_fake("memsave::dropout_backward")
def _dropout_backward_fake(grad_out: torch.Tensor, mask: torch.Tensor, p: float) -> torch.Tensor:
    check_same_device("dropout_backward", grad_out, mask)
    return torch.empty_like(grad_out, memory_format=torch.contiguous_format)


def _setup_context(ctx: Any, inputs: Tuple[Any, ...], output: Tuple[torch.Tensor, torch.Tensor]) -> None:
    _, p = inputs
    _, mask = output
    ctx.save_for_backward(mask)
    ctx.mark_non_differentiable(mask)
    ctx.p = p


def _backward(ctx: Any, grad_out: torch.Tensor, _grad_mask: Any) -> Tuple[torch.Tensor, None]:
    (mask,) = ctx.saved_tensors
    return torch.ops.memsave.dropout_backward(grad_out, mask, ctx.p), None


torch.library.register_autograd("memsave::dropout", _backward, setup_context=_setup_context)


# dropout_backward is linear in grad_out: its derivative is itself (double backward).
def _backward_setup_context(ctx: Any, inputs: Tuple[Any, ...], output: torch.Tensor) -> None:
    _, mask, p = inputs
    ctx.save_for_backward(mask)
    ctx.p = p


def _backward_backward(ctx: Any, grad_grad: torch.Tensor) -> Tuple[torch.Tensor, None, None]:
    (mask,) = ctx.saved_tensors
    return torch.ops.memsave.dropout_backward(grad_grad, mask, ctx.p), None, None


torch.library.register_autograd("memsave::dropout_backward", _backward_backward, setup_context=_backward_setup_context)
