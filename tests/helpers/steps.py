"""One training step of a real model, as the plan tests take it: its gradients, its allocator-level peak, and the
one-thread fixture those modules run under (``from helpers.steps import one_thread`` makes it autouse there).

Steps call ``loss_fn(model(*args, **kwargs)).backward()``: keyword inputs as in training code (``input_ids=``,
``labels=``), any output ``loss_fn`` takes.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterator, Tuple

import pytest
import torch
from torch import nn

from memsave.measurement.allocator import step_peak_bytes

Args = Tuple[Any, ...]
Kwargs = Dict[str, Any]
LossFn = Callable[[Any], torch.Tensor]


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    """One intra-op thread for the module (restored afterwards): on the shared 2-core machines two threads competing
    with another process make each step several times slower, and bitwise comparisons never mix thread counts."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def generator(seed: int = 1) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def train_step(model: nn.Module, args: Args, kwargs: Kwargs, loss_fn: LossFn) -> Dict[str, torch.Tensor]:
    """One training step from a fixed RNG seed; the parameter gradients."""
    model.zero_grad(set_to_none=True)
    torch.manual_seed(1234)
    loss_fn(model(*args, **kwargs)).backward()
    return {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


def step_peak(model: nn.Module, args: Args, kwargs: Kwargs, loss_fn: LossFn) -> int:
    """memsave's allocator-level peak of one step (CPU: the profiler's allocation events), gradients cleared; the
    output stays alive during backward, as in a training loop, memsave.measure and memsave.plan."""
    model.zero_grad(set_to_none=True)

    def step() -> None:
        out = model(*args, **kwargs)
        loss_fn(out).backward()
        del out

    peak = step_peak_bytes(step, torch.device("cpu"))
    model.zero_grad(set_to_none=True)
    return peak


def assert_same_step(
    grads: Dict[str, torch.Tensor], grads_other: Dict[str, torch.Tensor], model: nn.Module, other: nn.Module
) -> None:
    """Two steps agree bitwise: the same (non-empty) set of parameter gradients, each equal, and ``other``'s buffers
    (BatchNorm statistics updated once) equal ``model``'s."""
    assert grads and grads.keys() == grads_other.keys()
    for name, grad in grads.items():
        assert torch.equal(grad, grads_other[name]), name
    buffers = dict(other.named_buffers())
    for name, buf in model.named_buffers():
        assert torch.equal(buf, buffers[name]), name
