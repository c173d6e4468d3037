"""memsave.accumulate under DistributedDataParallel (gloo, 2 CPU processes).

Each rank accumulates K micro-batches per step (two full windows, then a partial window of 2 stepped by flush(),
with memsave's GradScaler). A communication hook counts DDP's all-reduces: they must happen on the final micro-step
of each window only. The final weights must match plain DDP fed each rank's whole window as one batch (close in
float32: the micro-batch sums run in another order). The partial window's gradients never went through DDP's
all-reduce (it ran under no_sync), so this also checks that flush() averages them across ranks itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List

import pytest
import torch
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

from helpers import needs_gloo
from helpers.distributed import run_ranks
from helpers.models import gelu_mlp

WORLD, B, K = 2, 4, 3
WINDOWS = [K, K, 2]  # micro-batches per window; the last one is partial


def _run(rank: int) -> Dict[str, Any]:
    from memsave.amp import GradScaler, accumulate

    gen = torch.Generator().manual_seed(10 + rank)  # every rank has its own data
    data = [(torch.randn(n * B, 6, generator=gen), torch.randn(n * B, 3, generator=gen)) for n in WINDOWS]

    model = DDP(gelu_mlp())  # seeded: the same initial weights on every rank
    calls = {"n": 0}

    # No annotations: DDP checks them, and `from __future__ import annotations` would turn them into strings.
    def counting_hook(state, bucket):
        state["n"] += 1
        return default_hooks.allreduce_hook(None, bucket)

    model.register_comm_hook(calls, counting_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    acc = accumulate(model, opt, steps=K, scaler=GradScaler("cpu"))
    counts: List[int] = []
    stepped: List[bool] = []
    for (x, y), n in zip(data, WINDOWS):
        for i in range(n):
            s = slice(i * B, (i + 1) * B)
            stepped.append(acc.backward(nn.functional.mse_loss(model(x[s]), y[s])))
            counts.append(calls["n"])
    flushed = acc.flush()
    next_window_unsynced = not model.require_backward_grad_sync  # no_sync again, ready for the next window
    acc.close()

    ref = DDP(gelu_mlp())
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    for x, y in data:
        ref_opt.zero_grad()
        nn.functional.mse_loss(ref(x), y).backward()
        ref_opt.step()
    return {
        "counts": counts,
        "stepped": stepped,
        "flushed": flushed,
        "acc": [p.detach().clone() for p in model.parameters()],
        "ref": [p.detach().clone() for p in ref.parameters()],
        "next_window_unsynced": next_window_unsynced,
        "sync_restored": model.require_backward_grad_sync,
    }


@pytest.mark.slow
@needs_gloo
def test_accumulate_under_ddp(tmp_path: Path) -> None:
    results = run_ranks(_run, tmp_path, world=WORLD)
    for r, res in enumerate(results):
        # One bucket (a small model): one all-reduce on each window's final micro-step, none on the others.
        assert res["counts"] == [0, 0, 1, 1, 1, 2, 2, 2], f"rank {r}: all-reduce calls after each micro-step"
        assert res["stepped"] == [False, False, True, False, False, True, False, False]
        assert res["flushed"] is True and res["next_window_unsynced"] and res["sync_restored"] is True
        for p, q in zip(res["acc"], res["ref"]):
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    for p, q in zip(results[0]["acc"], results[1]["acc"]):
        assert torch.equal(p, q), "ranks diverged"
