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
needs_gloo = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="needs torch.distributed gloo")


def in_backward() -> bool:
    """Whether the autograd engine is running a backward right now (a recompute, inside a checkpointed region)."""
    return torch._C._current_graph_task_id() != -1
