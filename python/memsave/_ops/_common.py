"""Helpers shared by the operator registrations."""
from __future__ import annotations

import torch


def packed_mask_bytes(numel: int) -> int:
    """Bytes of a bit-packed mask over ``numel`` elements (element i is bit i % 8 of byte i // 8)."""
    return (numel + 7) // 8


def check_same_device(op: str, grad: torch.Tensor, saved: torch.Tensor) -> None:
    """Fake kernels check what the real ones check: a backward's saved tensor lives on the gradient's device."""
    torch._check(
        saved.device == grad.device,
        lambda: f"memsave.{op}: the saved tensor is on {saved.device} but the gradient is on {grad.device}",
    )
