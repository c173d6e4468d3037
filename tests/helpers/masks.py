"""Helpers of the 1-bit-mask and pooling operator tests (operators/test_relu, test_masks, test_max_pool2d): special
values, strided views, bitwise comparison with torch and the saved-tensor byte counter."""

from __future__ import annotations

import math

import torch


def special_values(n: int, dtype: torch.dtype, device: str = "cpu", seed: int = 0) -> torch.Tensor:
    """Random values with -0.0, +0.0, NaN, +-inf and tiny negatives sprinkled in."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g, dtype=torch.float64)
    specials = torch.tensor([-0.0, 0.0, math.nan, math.inf, -math.inf, -1e-30, 1e-30], dtype=torch.float64)
    idx = torch.randint(0, n, (max(1, n // 10),), generator=g)
    x[idx] = specials[torch.randint(0, len(specials), idx.shape, generator=g)]
    return x.to(dtype=dtype, device=device)


def strided_views(x: torch.Tensor):
    """x itself and non-contiguous views over the same values: transposed, sliced with a step, expanded copy."""
    yield "contiguous", x
    if x.dim() >= 2:
        yield "transposed", x.transpose(0, 1)
    yield "stepped", x.reshape(-1)[::3]
    if x.dim() >= 1:
        yield "flipped-permuted", x.flip(0).permute(*reversed(range(x.dim())))


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality that also holds for NaN and tells -0.0 from +0.0.

    bfloat16 NaN payloads are not compared: torch's own bfloat16 kernels give 0xFFFF or 0x7FC0 for the same NaN
    depending on whether an element takes their vectorized or their scalar path.
    """
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    view = {
        torch.float32: torch.int32,
        torch.float64: torch.int64,
        torch.float16: torch.int16,
        torch.bfloat16: torch.int16,
    }[a.dtype]
    a, b = a.contiguous(), b.contiguous()
    if a.dtype == torch.bfloat16:
        both_nan = a.isnan() & b.isnan()
        a = torch.where(both_nan, torch.zeros((), dtype=a.dtype, device=a.device), a)
        b = torch.where(both_nan, torch.zeros((), dtype=b.dtype, device=b.device), b)
    return torch.equal(a.view(view), b.view(view))


def assert_matches_torch(ours, ref, x: torch.Tensor, grad, label: object = "") -> None:
    """Runs ``ours`` and the torch reference ``ref`` on copies of x (strides kept), backward with ``grad`` (a tensor,
    or a function of the output that makes one), and asserts bitwise equal outputs and input gradients."""
    a = x.detach().clone().requires_grad_()
    b = x.detach().clone().requires_grad_()
    ya, yb = ours(a), ref(b)
    assert bits_equal(ya, yb), label
    g = grad(yb) if callable(grad) else grad
    ya.backward(g)
    yb.backward(g)
    assert bits_equal(a.grad, b.grad), label


def saved_bytes(fn, *args) -> int:
    """Bytes of every tensor autograd saves while ``fn(*args)`` runs (each saved tensor's whole storage)."""
    total = 0

    def pack(t):
        nonlocal total
        total += t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(*args)
    return total
