"""Helpers shared by the test folders (importable from any of them: tests/conftest.py puts tests/ on sys.path).

- ``helpers.models``: small deterministic test models (MLPs, CNN, UNet-like, transformer, a running-mean buffer).
- ``helpers.masks``: bitwise comparison with torch and special values, for the 1-bit-mask and pooling operators.
- ``helpers.fused``: unfused torch references and error measures, for the fused operators.
- ``helpers.checks``: a fused module against the eager one it replaces, and the refused double backward.
- ``helpers.steps``: one training step of a real model (gradients, peak) for the plan tests.
- ``helpers.hub``: Hugging Face transformers, timm and torchvision models at small configs with random weights
  (``LossOf``: a causal LM's loss as a module).
- ``helpers.eager``: Hugging Face's Llama RMSNorm and MLP in plain torch, what memsave's transformer operators
  replace, and half a Llama decoder layer around them (``pre_norm_layer``).
- ``helpers.hf_trainer``: Hugging Face Trainer scaffolding: token-id data, a short CPU run's arguments, a training
  run, its logged losses, and torch's checkpoint made to raise (the ``no_torch_checkpoint`` fixture of integrations/).
- here: the floating-point dtypes, the repository root, the autograd-engine probe, the gloo marker of the DDP
  tests and a script's ``main`` run in-process.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Callable, List, Tuple

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


def run_main(main: Callable[[List[str]], int], *argv: str) -> None:
    """A script's ``main(argv)`` returns 0; torch's intra-op thread count (a benchmark's ``--threads`` sets it) is
    restored afterwards."""
    threads = torch.get_num_threads()
    try:
        assert main(list(argv)) == 0
    finally:
        torch.set_num_threads(threads)


def in_backward() -> bool:
    """Whether the autograd engine is running a backward right now (a recompute, inside a checkpointed region)."""
    return torch._C._current_graph_task_id() != -1


def leaf(*shape: int, seed: int = 0) -> torch.Tensor:
    """A seeded random leaf tensor that requires grad."""
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).requires_grad_()


def grads(*tensors: torch.Tensor) -> list:
    """Copies of the tensors' gradients."""
    return [t.grad.clone() for t in tensors]


def eager_step(block: torch.nn.Module, x: torch.Tensor, seed: int = 2) -> Tuple[torch.nn.Module, list]:
    """Before a checkpointed step to compare with eager: a deep copy of ``block`` (for that step), and the input and
    parameter gradients of ``block(x).sum()`` from RNG seed ``seed``; ``x.grad`` is cleared and the seed set again."""
    ours = copy.deepcopy(block)
    torch.manual_seed(seed)
    block(x).sum().backward()
    expected = grads(x, *block.parameters())
    x.grad = None
    torch.manual_seed(seed)
    return ours, expected


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
