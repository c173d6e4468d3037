"""memsave::relu: ReLU that keeps a 1-bit mask (``ceil(numel / 8)`` bytes) for backward instead of its output.

``relu`` is functional and gets its autograd here; ``relu_`` (in place, schema ``Tensor(a!)``) has its autograd in
C++ (csrc/ops/inplace_autograd.h), because ``register_autograd`` accepts functional schemas only.
"""
from __future__ import annotations

from typing import Any, Tuple

import torch

from ._common import check_same_device, packed_mask_bytes


@torch.library.register_fake("memsave::relu")
def _relu_fake(x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    mask = x.new_empty((packed_mask_bytes(x.numel()),), dtype=torch.uint8)
    return out, mask


@torch.library.register_fake("memsave::relu_")
def _relu_inplace_fake(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty((packed_mask_bytes(x.numel()),), dtype=torch.uint8)


@torch.library.register_fake("memsave::relu_backward")
def _relu_backward_fake(grad_out: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    check_same_device("relu_backward", grad_out, mask)
    return torch.empty_like(grad_out, memory_format=torch.contiguous_format)


def _relu_setup_context(ctx: Any, inputs: Tuple[Any, ...], output: Tuple[torch.Tensor, torch.Tensor]) -> None:
    _, mask = output
    ctx.save_for_backward(mask)  # the whole memory win: a bit per element instead of the output
    ctx.mark_non_differentiable(mask)


def _relu_backward(ctx: Any, grad_out: torch.Tensor, _grad_mask: Any) -> torch.Tensor:
    (mask,) = ctx.saved_tensors
    return torch.ops.memsave.relu_backward(grad_out, mask)


torch.library.register_autograd("memsave::relu", _relu_backward, setup_context=_relu_setup_context)


# relu_backward is linear in grad_out, so its own derivative is itself: double backward works.
def _relu_backward_setup_context(ctx: Any, inputs: Tuple[Any, ...], output: torch.Tensor) -> None:
    _, mask = inputs
    ctx.save_for_backward(mask)


def _relu_backward_backward(ctx: Any, grad_grad: torch.Tensor) -> Tuple[torch.Tensor, None]:
    (mask,) = ctx.saved_tensors
    return torch.ops.memsave.relu_backward(grad_grad, mask), None


torch.library.register_autograd(
    "memsave::relu_backward", _relu_backward_backward, setup_context=_relu_backward_setup_context
)
