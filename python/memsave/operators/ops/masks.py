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
RNG state (as checkpoint recompute does) replays them. It records, for all three, the fake kernels and
the autograd of the functional form and of the backward.

The module holds the family's Python face: the fake kernels and autograd formulas it records for
:func:`memsave.operators.ops.register`, and the functional forms that :mod:`memsave.functional` exports.
"""

from __future__ import annotations

from typing import Any, Sequence, Tuple

import torch

from . import _transforms
from ._common import check_number, check_tensor
from ._registration import Registrations, packed_mask_bytes, with_strides

#: What this family registers with torch.library, applied by memsave.operators.ops.register().
REGISTRATIONS = Registrations()


# ----------------------------------------------------------------------------------------------------
# Fake kernels and autograd shared by the bit-mask operators (relu, leaky_relu, dropout).
# ----------------------------------------------------------------------------------------------------
def record_mask_op(name: str) -> None:
    """Records the fake kernels of ``memsave::<name>``, ``<name>_`` and ``<name>_backward`` and the autograd of
    ``<name>`` and ``<name>_backward``.

    Args:
        name: the operator's name in the ``memsave`` namespace, e.g. ``"leaky_relu"``.

    Returns:
        None. The registrations live as long as the process.

    Examples:
        >>> record_mask_op("leaky_relu")  # doctest: +SKIP
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

    REGISTRATIONS.fake(qualname)(fake)
    REGISTRATIONS.fake(f"{qualname}_")(inplace_fake)
    REGISTRATIONS.fake(f"{qualname}_backward")(backward_fake)

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

    # The Jacobian is diagonal (the mask times the slope or scale), so the backward operator applied to the tangent is
    # the output's tangent, bitwise what eager's forward-mode formula gives.
    def jvp(run: Any, primals: Sequence[Any], tangents: Sequence[Any]) -> Tuple[torch.Tensor, torch.Tensor]:
        out, mask = run(*primals)
        tangent = backward_op(with_strides(tangents[0], out.stride()), mask, *primals[1:])
        return _transforms.with_tangent(out, tangent), mask

    REGISTRATIONS.autograd(qualname, backward, setup_context=setup_context, jvp=jvp)

    # <name>_backward is linear in grad_out, so its derivative is itself: double backward works.
    def backward_setup_context(ctx: Any, inputs: Tuple[Any, ...], output: torch.Tensor) -> None:
        ctx.save_for_backward(inputs[1])
        ctx.scalars = inputs[2:]
        ctx.strides = output.stride()

    def backward_backward(ctx: Any, grad_grad: torch.Tensor) -> Tuple[Any, ...]:
        (mask,) = ctx.saved_tensors
        grad_grad = with_strides(grad_grad, ctx.strides)
        return (backward_op(grad_grad, mask, *ctx.scalars), None) + (None,) * len(ctx.scalars)

    def backward_jvp(run: Any, primals: Sequence[Any], tangents: Sequence[Any]) -> torch.Tensor:
        grad_in = run(*primals)
        if tangents[0] is None:  # a tangent on the mask (uint8) cannot exist; on grad_out it is the linear part
            return grad_in
        tangent = backward_op(with_strides(tangents[0], grad_in.stride()), *primals[1:])
        return _transforms.with_tangent(grad_in, tangent)

    REGISTRATIONS.autograd(
        f"{qualname}_backward", backward_backward, setup_context=backward_setup_context, jvp=backward_jvp
    )


record_mask_op("relu")
record_mask_op("leaky_relu")
record_mask_op("dropout")


# ----------------------------------------------------------------------------------------------------
# The functional forms (memsave.functional).
# ----------------------------------------------------------------------------------------------------
def _run_mask_op(name: str, input: torch.Tensor, scalars: Tuple[float, ...], inplace: bool) -> torch.Tensor:
    """``memsave::<name>`` on checked arguments: its output, or ``input`` overwritten with it when ``inplace``."""
    if inplace and _transforms.needs_out_of_place(input):
        # <name>_'s C++ autograd has no forward mode nor torch.func support: compute out of place, then copy.
        return input.copy_(_run_mask_op(name, input, scalars, inplace=False))
    if inplace:
        getattr(torch.ops.memsave, f"{name}_")(input, *scalars)
        return input
    out, _mask = getattr(torch.ops.memsave, name)(input, *scalars)
    return out


def relu(input: torch.Tensor, inplace: bool = False) -> torch.Tensor:
    """ReLU that keeps a 1-bit mask for backward (``ceil(numel / 8)`` bytes) instead of its output.

    Outputs and gradients are bitwise equal to :func:`torch.nn.functional.relu` (``-0.0`` and NaN pass through
    unchanged; NaN passes its gradient, ``-0.0`` does not).

    Args:
        input: a floating-point tensor (float32, float64, float16 or bfloat16) on CPU or CUDA, any strides.
        inplace: overwrite ``input`` with the result (see the module docstring) and return it.

    Returns:
        ``relu(input)``: a new tensor in the memory format of ``input``, or ``input`` itself when ``inplace``.

    Examples:
        >>> x = torch.randn(4, 8, requires_grad=True)
        >>> y = memsave.functional.relu(x)
        >>> y.sum().backward()   # x.grad == (x > 0)
    """
    check_tensor("relu", input)
    return _run_mask_op("relu", input, (), inplace)


def leaky_relu(input: torch.Tensor, negative_slope: float = 0.01, inplace: bool = False) -> torch.Tensor:
    """LeakyReLU that keeps a 1-bit sign mask for backward instead of its input.

    Outputs and gradients are bitwise equal to :func:`torch.nn.functional.leaky_relu`. Unlike torch's in-place
    form, ``inplace=True`` works with any slope, negative ones included (the mask, not the output, drives backward).

    Args:
        input: a floating-point tensor (float32, float64, float16 or bfloat16) on CPU or CUDA, any strides.
        negative_slope: the slope for ``input <= 0``.
        inplace: overwrite ``input`` with the result and return it.

    Returns:
        ``input > 0 ? input : input * negative_slope``.

    Examples:
        >>> y = memsave.functional.leaky_relu(torch.randn(4, 8, requires_grad=True), 0.2)
    """
    check_tensor("leaky_relu", input)
    slope = check_number("memsave.functional.leaky_relu", "negative_slope", negative_slope)
    return _run_mask_op("leaky_relu", input, (slope,), inplace)


def dropout(input: torch.Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> torch.Tensor:
    """Dropout that keeps a 1-bit keep mask for backward.

    Each element is kept with probability ``1 - p`` and scaled by ``1 / (1 - p)`` (computed as torch's CPU
    dropout does); the gradient passes through the same mask and scale. The bits come from PyTorch's default
    generator of the tensor's device, so ``torch.manual_seed`` reproduces them and checkpoint recompute (which
    restores the RNG state) replays them. The stream differs from ``torch.nn.functional.dropout``'s: same
    distribution, other draws. ``p == 1`` gives exact zeros (torch gives ``input * 0``, which keeps NaN).

    Args:
        input: a floating-point tensor (float32, float64, float16 or bfloat16) on CPU or CUDA, any strides.
        p: probability of an element being zeroed, in ``[0, 1]``.
        training: apply dropout; when False, return ``input`` unchanged (as torch does).
        inplace: overwrite ``input`` with the result and return it.

    Returns:
        The dropped-out tensor (``input`` itself when not training, ``p == 0``, empty, or ``inplace``).

    Raises:
        ValueError: ``p`` outside ``[0, 1]`` (or NaN).
        TypeError: ``p`` is not a number.

    Examples:
        >>> torch.manual_seed(0)
        >>> y = memsave.functional.dropout(torch.ones(8), p=0.5)   # entries are 0.0 or 2.0
    """
    check_tensor("dropout", input)
    p = check_number("memsave.functional.dropout", "p", p)
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"memsave.functional.dropout: dropout probability has to be between 0 and 1, but got {p}")
    if not training or p == 0.0 or input.numel() == 0:
        return input
    return _run_mask_op("dropout", input, (p,), inplace)
