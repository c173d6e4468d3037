"""memsave.accumulate: k micro-batches of size b step like one batch of k*b (single process; DDP in
test_accumulate_ddp.py).

Gradients are captured at optimizer.step by a recording optimizer and compared with those of the large batch
(close in float32: the sums run in another order) on a BatchNorm-free model.
"""

from __future__ import annotations

import math
from typing import List

import pytest
import torch
from torch import nn

import memsave
from helpers.models import gelu_mlp
from memsave.amp import GradScaler, accumulate

B, K, D_IN, D_OUT = 4, 3, 6, 3  # D_IN, D_OUT: the widths of gelu_mlp()


class Recording(torch.optim.SGD):
    """SGD that records the gradients it was stepped with."""

    def __init__(self, params, lr: float = 0.1) -> None:
        super().__init__(params, lr=lr)
        self.seen: List[List[torch.Tensor]] = []

    def step(self, closure=None):  # type: ignore[override]
        self.seen.append([p.grad.detach().clone() for g in self.param_groups for p in g["params"]])
        return super().step(closure)


def _data(n: int, seed: int = 1):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, D_IN, generator=gen), torch.randn(n, D_OUT, generator=gen)


def _loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(model(x), y)


def _big_batch_grads(x: torch.Tensor, y: torch.Tensor) -> List[torch.Tensor]:
    model = gelu_mlp()
    _loss(model, x, y).backward()
    return [p.grad.detach().clone() for p in model.parameters()]


def _assert_close(got: List[torch.Tensor], want: List[torch.Tensor]) -> None:
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("use_scaler", [False, True])
def test_k_micro_batches_give_the_large_batch_gradients(use_scaler: bool) -> None:
    x, y = _data(B * K)
    model = gelu_mlp()
    opt = Recording(model.parameters())
    scaler = GradScaler("cpu", init_scale=2.0**12) if use_scaler else None
    acc = accumulate(model, opt, steps=K, scaler=scaler)
    stepped = [acc.backward(_loss(model, x[i * B : (i + 1) * B], y[i * B : (i + 1) * B])) for i in range(K)]
    assert stepped == [False] * (K - 1) + [True]
    assert len(opt.seen) == 1
    _assert_close(opt.seen[0], _big_batch_grads(x, y))
    assert all(p.grad is None for p in model.parameters())  # zeroed after the step
    assert acc.micro_step == 0 and acc.last_skipped is False
    if use_scaler:
        assert scaler._get_growth_tracker() == 1  # updated once per window, not per micro-batch


def test_two_windows_match_two_large_batch_steps() -> None:
    x, y = _data(2 * B * K, seed=4)
    model, ref = gelu_mlp(), gelu_mlp()
    opt, ref_opt = torch.optim.SGD(model.parameters(), lr=0.1), torch.optim.SGD(ref.parameters(), lr=0.1)
    acc = accumulate(model, opt, steps=K)
    for w in range(2):
        for i in range(K):
            s = slice((w * K + i) * B, (w * K + i + 1) * B)
            acc.backward(_loss(model, x[s], y[s]))
        ref_opt.zero_grad()
        s = slice(w * K * B, (w + 1) * K * B)
        _loss(ref, x[s], y[s]).backward()
        ref_opt.step()
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_clipping_acts_on_unscaled_gradients() -> None:
    x, y = _data(B * K, seed=2)
    want = _big_batch_grads(x, y)
    total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in want]))
    max_norm = float(total) / 4
    model = gelu_mlp()
    opt = Recording(model.parameters())
    acc = accumulate(model, opt, steps=K, scaler=GradScaler("cpu", init_scale=2.0**14), clip_grad_norm=max_norm)
    for i in range(K):
        acc.backward(_loss(model, x[i * B : (i + 1) * B], y[i * B : (i + 1) * B]))
    clip = max_norm / (float(total) + 1e-6)
    _assert_close(opt.seen[0], [g * clip for g in want])


@pytest.mark.parametrize("use_scaler", [False, True])
def test_flush_steps_a_partial_window_with_the_right_normalization(use_scaler: bool) -> None:
    k = 2
    x, y = _data(B * k, seed=3)
    model = gelu_mlp()
    opt = Recording(model.parameters())
    acc = accumulate(model, opt, steps=5, scaler=GradScaler("cpu") if use_scaler else None)
    assert acc.flush() is False  # nothing to step
    for i in range(k):
        assert acc.backward(_loss(model, x[i * B : (i + 1) * B], y[i * B : (i + 1) * B])) is False
    assert acc.flush() is True
    assert acc.micro_step == 0 and len(opt.seen) == 1
    _assert_close(opt.seen[0], _big_batch_grads(x, y))  # the mean over the k micro-batches, not k/5 of it


def test_overflow_in_a_window_skips_the_step() -> None:
    x, y = _data(B * 2, seed=5)
    model = gelu_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = GradScaler("cpu")
    acc = accumulate(model, opt, steps=2, scaler=scaler)
    acc.backward(_loss(model, x[:B], y[:B]))
    model[0].weight.grad[0, 0] = math.inf
    before = [p.detach().clone() for p in model.parameters()]
    assert acc.backward(_loss(model, x[B:], y[B:])) is True
    assert acc.last_skipped is True
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert scaler.get_scale() == 2.0**15
    assert all(p.grad is None for p in model.parameters())


def test_torch_grad_scaler_and_steps_one_work() -> None:
    x, y = _data(B * 2, seed=6)
    model = gelu_mlp()
    opt = Recording(model.parameters())
    acc = accumulate(model, opt, steps=1, scaler=torch.amp.GradScaler("cpu"))
    assert acc.backward(_loss(model, x[:B], y[:B])) is True
    assert acc.last_skipped is None  # torch's scaler does not report skips
    _assert_close(opt.seen[0], _big_batch_grads(x[:B], y[:B]))


def test_bad_arguments_raise() -> None:
    model = gelu_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="steps must be an int >= 1"):
        accumulate(model, opt, steps=0)
    with pytest.raises(ValueError, match="steps must be an int >= 1"):
        accumulate(model, opt, steps=2.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="clip_grad_norm"):
        accumulate(model, opt, steps=2, clip_grad_norm=-1.0)
    with pytest.raises(TypeError, match="torch.optim.Optimizer"):
        accumulate(model, model, steps=2)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="loss tensor"):
        accumulate(model, opt, steps=2).backward(1.0)  # type: ignore[arg-type]


def test_public_names() -> None:
    assert memsave.accumulate is accumulate
    assert memsave.amp.GradScaler is GradScaler
