"""DistributedDataParallel (gloo, 2 CPU processes): memsave.wrap gives the same weights as the plain DDP run.

Each rank trains the same CNN (BatchNorm, Dropout with rank-specific randomness, rank-specific data) for 3 SGD
steps, once plainly and once with its blocks wrapped, with and without ``find_unused_parameters=True`` (the
latter with a parameter the forward never uses). Final parameters and buffers must be bitwise equal: each
rank's local gradients are bitwise equal to eager's (the exactness suite), and a 2-rank all-reduce is a single
floating-point addition, which is commutative, so the order in which buckets become ready cannot matter.
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict

import pytest
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from helpers import models, needs_gloo
from helpers.distributed import run_ranks, sgd_steps

WORLD = 2
STEPS = 3


class _Net(nn.Module):
    def __init__(self, with_unused: bool) -> None:
        super().__init__()
        self.features = models.cnn()
        self.unused = nn.Linear(4, 4) if with_unused else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.features(x)


def _train(rank: int, wrapped: bool, find_unused: bool) -> Dict[str, torch.Tensor]:
    from memsave.recompute.wrapping import wrap

    model = _Net(with_unused=find_unused)
    if wrapped:
        wrap(model, models.ConvBlock)
    ddp = DDP(model, find_unused_parameters=find_unused)
    sgd_steps(ddp, ddp.parameters(), rank, STEPS)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _all_runs(rank: int) -> dict:
    return {
        (find_unused, wrapped): _train(rank, wrapped, find_unused)
        for find_unused in (False, True)
        for wrapped in (False, True)
    }


@pytest.mark.slow
@needs_gloo
def test_ddp_weights_equal_plain_ddp(tmp_path: Path) -> None:
    ranks = run_ranks(_all_runs, tmp_path, world=WORLD)
    for find_unused in (False, True):
        for r in range(WORLD):
            plain, wrapped = ranks[r][(find_unused, False)], ranks[r][(find_unused, True)]
            assert list(plain) == list(wrapped)
            for key in plain:
                assert torch.equal(plain[key], wrapped[key]), (
                    f"find_unused_parameters={find_unused}, rank {r}: {key} differs from the plain DDP run"
                )
        # DDP keeps parameters in sync; buffers are broadcast before each forward, so they differ after the last
        # step's local BatchNorm update.
        params = dict(_Net(find_unused).named_parameters())
        for key in params:
            assert torch.equal(ranks[0][(find_unused, True)][key], ranks[1][(find_unused, True)][key]), key
        # The steps really changed the weights and the buffers.
        plain = ranks[0][(find_unused, False)]
        assert not torch.equal(plain["features.0.0.weight"], models.cnn().state_dict()["0.0.weight"])
        assert int(plain["features.0.1.num_batches_tracked"]) == STEPS
