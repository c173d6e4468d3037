"""Bit-mask operators (csrc/ops/masks): relu, leaky_relu and dropout keep one bit per element for backward.

Each such operator ``memsave::<name>`` comes as three schemas, with the same trailing scalars (none for relu,
``negative_slope`` for leaky_relu, ``p`` for dropout)::

    <name>(Tensor x, *scalars) -> (Tensor out, Tensor mask)
    <name>_(Tensor(a!) x, *scalars) -> Tensor mask                 (autograd in C++, csrc/ops/masks/inplace_autograd.h)
    <name>_backward(Tensor grad_out, Tensor mask, *scalars) -> Tensor

``mask`` holds one bit per element in the memory order of the input (``ceil(numel / 8)`` bytes; outputs keep the
input's memory format, and the backward takes the gradient in the output's strides), which is all the backward keeps
(torch keeps the output of relu, the input of leaky_relu, a byte per element for dropout). Dropout's bits are drawn
from PyTorch's default generator of the tensor's device, so ``torch.manual_seed`` reproduces them and restoring the
RNG state (as checkpoint recompute does) replays them. This module registers, for all three, the fake kernels and
the autograd of the functional form and of the backward.
"""

from __future__ import annotations

from typing import Any, Tuple

import torch

from .autograd import packed_mask_bytes, register_fake, with_strides


# ----------------------------------------------------------------------------------------------------
# Fake kernels and autograd shared by the bit-mask operators (relu, leaky_relu, dropout).
# ----------------------------------------------------------------------------------------------------
def register_mask_op(name: str) -> None:
    """Registers the fake kernels of ``memsave::<name>``, ``<name>_`` and ``<name>_backward`` and the autograd of
    ``<name>`` and ``<name>_backward``.

    Args:
        name: the operator's name in the ``memsave`` namespace, e.g. ``"leaky_relu"``.

    Returns:
        None. The registrations live as long as the process.

    Examples:
        >>> register_mask_op("leaky_relu")  # doctest: +SKIP
    """
    qualname = f"memsave::{name}"

    def backward_op(grad: torch.Tensor, mask: torch.Tensor, *scalars: Any) -> torch.Tensor:
        return getattr(torch.ops.memsave, f"{name}_backward")(grad, mask, *scalars)

    def fake(x: torch.Tensor, *scalars: Any) -> Tuple[torch.Tensor, torch.Tensor]:
        out = torch.empty_like(x)  # the input's memory format, as the kernels give it
        return out, x.new_empty((packed_mask_bytes(x.numel()),), dtype=torch.uint8)

    def inplace_fake(x: torch.Tensor, *scalars: Any) -> torch.Tensor:
        return x.new_empty((packed_mask_bytes(x.numel()),), dtype=torch.uint8)

    def backward_fake(grad_out: torch.Tensor, mask: torch.Tensor, *scalars: Any) -> torch.Tensor:
        return torch.empty_like(grad_out)

    register_fake(qualname)(fake)
    register_fake(f"{qualname}_")(inplace_fake)
    register_fake(f"{qualname}_backward")(backward_fake)

    def setup_context(ctx: Any, inputs: Tuple[Any, ...], output: Tuple[torch.Tensor, torch.Tensor]) -> None:
        _, mask = output
        ctx.save_for_backward(mask)  # the whole memory win: a bit per element instead of the input or output
        ctx.mark_non_differentiable(mask)
        ctx.scalars = inputs[1:]
        ctx.strides = output[0].stride()  # the mask's element order is the output's memory order

    def backward(ctx: Any, grad_out: torch.Tensor, _grad_mask: Any) -> Tuple[Any, ...]:
        (mask,) = ctx.saved_tensors
        grad_out = with_strides(grad_out, ctx.strides)
        return (backward_op(grad_out, mask, *ctx.scalars),) + (None,) * len(ctx.scalars)

    torch.library.register_autograd(qualname, backward, setup_context=setup_context)

    # <name>_backward is linear in grad_out, so its derivative is itself: double backward works.
    def backward_setup_context(ctx: Any, inputs: Tuple[Any, ...], output: torch.Tensor) -> None:
        ctx.save_for_backward(inputs[1])
        ctx.scalars = inputs[2:]
        ctx.strides = output.stride()

    def backward_backward(ctx: Any, grad_grad: torch.Tensor) -> Tuple[Any, ...]:
        (mask,) = ctx.saved_tensors
        grad_grad = with_strides(grad_grad, ctx.strides)
        return (backward_op(grad_grad, mask, *ctx.scalars), None) + (None,) * len(ctx.scalars)

    torch.library.register_autograd(f"{qualname}_backward", backward_backward, setup_context=backward_setup_context)


register_mask_op("relu")
register_mask_op("leaky_relu")
register_mask_op("dropout")
