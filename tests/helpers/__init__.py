"""Helpers shared by the test folders (importable from any of them: tests/conftest.py puts tests/ on sys.path).

- ``helpers.models``: small deterministic test models (MLPs, CNN, UNet-like, transformer).
- ``helpers.masks``: bitwise comparison with torch and special values, for the 1-bit-mask and pooling operators.
- ``helpers.fused``: unfused torch references and error measures, for the fused operators.
- here: the floating-point dtypes, the repository root, the autograd-engine probe and the gloo marker of the DDP
  tests.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist

#: The floating-point dtypes the operator tests run in.
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]

#: The repository root (benchmarks/, examples/ and the package sources are under it).
ROOT = Path(__file__).resolve().parents[2]

#: For the tests that start a gloo process group (2 CPU processes).
needs_gloo = pytest.mark.skipif(
    not dist.is_available() or not dist.is_gloo_available(), reason="needs torch.distributed gloo"
)


def in_backward() -> bool:
    """Whether the autograd engine is running a backward right now (a recompute, inside a checkpointed region)."""
    return torch._C._current_graph_task_id() != -1


def leaf(*shape: int, seed: int = 0) -> torch.Tensor:
    """A seeded random leaf tensor that requires grad."""
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).requires_grad_()


def grads(*tensors: torch.Tensor) -> list:
    """Copies of the tensors' gradients."""
    return [t.grad.clone() for t in tensors]


class Counter:
    """A callable region that counts how often it runs, and how often during a backward (recompute)."""

    def __init__(self, fn) -> None:
        self.fn = fn
        self.calls = 0
        self.in_backward = 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        self.in_backward += in_backward()
        return self.fn(*args, **kwargs)
