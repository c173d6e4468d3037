"""Helpers shared by the operator registrations."""
from __future__ import annotations


def packed_mask_bytes(numel: int) -> int:
    """Bytes of a bit-packed mask over ``numel`` elements (element i is bit i % 8 of byte i // 8)."""
    return (numel + 7) // 8
