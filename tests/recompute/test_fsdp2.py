"""FSDP2 (``fully_shard``, gloo, 2 CPU processes): memsave.wrap composes with sharded training.

Each rank trains the same CNN (BatchNorm, Dropout with rank-specific randomness, rank-specific data) for 3 SGD steps
with every block and the root sharded by ``fully_shard``, once plainly and once with its blocks wrapped by
``memsave.wrap`` (wrapped before sharding, as a user would). The full (gathered) parameters and the buffers after the
steps must be bitwise equal between the two runs: each rank's local gradients are bitwise equal to eager's, and
FSDP2's reduce-scatter over 2 ranks is one floating-point addition per element, the same in both runs. The recompute
runs while FSDP2 has the block's parameters unsharded for its backward.
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict

import pytest
import torch

from helpers import models, needs_gloo
from helpers.distributed import run_ranks, sgd_steps

WORLD = 2
STEPS = 3

try:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
except ImportError:  # pragma: no cover - torch without FSDP2
    fully_shard = None


def _full(value: torch.Tensor) -> torch.Tensor:
    full = value.full_tensor() if hasattr(value, "full_tensor") else value
    return full.detach().clone()


def _train(rank: int, wrapped: bool) -> Dict[str, torch.Tensor]:
    from memsave.recompute.wrapping import is_wrapped, wrap

    mesh = init_device_mesh("cpu", (WORLD,))
    model = models.cnn()
    if wrapped:
        wrap(model, models.ConvBlock)
    for module in model.modules():
        if isinstance(module, models.ConvBlock):
            fully_shard(module, mesh=mesh)
    fully_shard(model, mesh=mesh)
    blocks = [m for m in model.modules() if isinstance(m, models.ConvBlock)]
    assert blocks and all(is_wrapped(m) == wrapped for m in blocks)  # fully_shard keeps memsave's forward
    sgd_steps(model, model.parameters(), rank, STEPS)
    return {k: _full(v) for k, v in model.state_dict().items()}


def _both_runs(rank: int) -> Dict[bool, Dict[str, torch.Tensor]]:
    return {wrapped: _train(rank, wrapped) for wrapped in (False, True)}


@pytest.mark.slow
@needs_gloo
@pytest.mark.skipif(fully_shard is None, reason="needs torch.distributed.fsdp.fully_shard (FSDP2)")
def test_fsdp2_weights_equal_plain_fsdp2(tmp_path: Path) -> None:
    ranks = run_ranks(_both_runs, tmp_path, world=WORLD)
    for r in range(WORLD):
        plain, wrapped = ranks[r][False], ranks[r][True]
        assert list(plain) == list(wrapped)
        for key in plain:
            assert torch.equal(plain[key], wrapped[key]), f"rank {r}: {key} differs from the plain FSDP2 run"
    # The gathered parameters are the same on both ranks, and the steps really changed them and the buffers.
    plain = ranks[0][False]
    for key, value in plain.items():
        if key.endswith("weight") or key.endswith("bias"):
            assert torch.equal(value, ranks[1][False][key]), key
    assert not torch.equal(plain["0.0.weight"], models.cnn().state_dict()["0.0.weight"])
    assert int(plain["0.1.num_batches_tracked"]) == STEPS
