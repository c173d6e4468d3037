"""torch's partitioner budget bound to a compiled module (``PartitionerBackend``, ``compile_at``).

A small MLP on CPU: the compiled copy at budget 0.5 has a lower peak than the one at torch's default, both alive
side by side (each backend keeps its own compiled program), its gradients are eager's within float32 rounding, and
the setting survives a dynamo reset (the recompile happens outside any configuration context). Bad arguments are
refused with a ValueError.
"""

from __future__ import annotations

import copy
from typing import Callable

import pytest
import torch
from torch import nn

from memsave.measurement.allocator import step_peak_bytes
from memsave.recompute.planning.partitioner import PartitionerBackend, compile_at


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    block = lambda: nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64), nn.Tanh())  # noqa: E731
    return nn.Sequential(*[block() for _ in range(4)])


X = torch.randn(256, 64, generator=torch.Generator().manual_seed(1))


def _step(model: nn.Module, run: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[], None]:
    def step() -> None:
        model.zero_grad(set_to_none=True)
        run(X).square().sum().backward()

    return step


def _peak(model: nn.Module, run: Callable[[torch.Tensor], torch.Tensor]) -> int:
    step = _step(model, run)
    step()  # compiles
    model.zero_grad(set_to_none=True)
    return step_peak_bytes(step, torch.device("cpu"))


@pytest.mark.slow  # compiles
def test_two_budgets_side_by_side_and_through_a_reset() -> None:
    base = _mlp()
    _step(base, base)()
    want = {n: p.grad.clone() for n, p in base.named_parameters()}
    default, low = copy.deepcopy(base), copy.deepcopy(base)
    torch._dynamo.reset()
    run_default, run_low = compile_at(default, None), compile_at(low, 0.5)
    peaks = (_peak(default, run_default), _peak(low, run_low))
    assert peaks[1] < peaks[0], peaks  # the second compile did not reuse the first one's program
    assert _peak(default, run_default) == peaks[0]  # nor the first the second's
    for name, p in low.named_parameters():
        assert torch.allclose(p.grad, want[name], rtol=1e-4, atol=1e-6), name
    torch._dynamo.reset()  # the next call recompiles, outside any configuration context
    try:
        assert _peak(low, run_low) == peaks[1]
    finally:
        torch._dynamo.reset()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(activation_memory_budget=1.5), "must be in \\[0, 1\\]"),
        (dict(activation_memory_budget=0.5, mode="default", options={}), "not both"),
    ],
)
def test_bad_arguments_are_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PartitionerBackend(**kwargs)
