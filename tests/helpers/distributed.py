"""Run a function on a few gloo CPU processes and collect what each rank returns, robustly on a loaded machine.

A busy 2-core machine slows the rendezvous and the shutdown of gloo's threads; a rank that is killed by a signal while
the process group is torn down (SIGABRT, "terminate called without an active exception") says nothing about the
library under test. Such a run is retried on a fresh rendezvous; an exception raised by the function is not.
"""

from __future__ import annotations

import datetime
import os
from pathlib import Path
from typing import Any, Callable, List

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

RENDEZVOUS_TIMEOUT = datetime.timedelta(minutes=10)


def _worker(rank: int, fn: Callable[[int], Any], world: int, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world, timeout=RENDEZVOUS_TIMEOUT
    )
    try:
        torch.save(fn(rank), os.path.join(out_dir, f"rank{rank}.pt"))
        dist.barrier()  # no rank tears gloo down while another still talks to it
    finally:
        dist.destroy_process_group()


def run_ranks(fn: Callable[[int], Any], tmp_path: Path, world: int = 2, attempts: int = 3) -> List[Any]:
    """Run ``fn(rank)`` on ``world`` gloo processes; return each rank's result, in rank order.

    ``fn`` must be a module-level function (it is pickled into the spawned processes). A run in which a process dies
    from a signal is retried up to ``attempts`` times; an exception raised inside ``fn`` fails at once.
    """
    for attempt in range(attempts):
        run_dir = tmp_path / f"run{attempt}"
        run_dir.mkdir()
        try:
            mp.spawn(_worker, args=(fn, world, str(run_dir / "init"), str(run_dir)), nprocs=world, join=True)
        except mp.ProcessExitedException:
            if attempt == attempts - 1:
                raise
            continue
        return [torch.load(run_dir / f"rank{r}.pt") for r in range(world)]
    raise AssertionError("unreachable")


def sgd_steps(model: Callable[[torch.Tensor], torch.Tensor], params: Any, rank: int, steps: int) -> None:
    """``steps`` SGD steps (momentum 0.9) of ``model(x).pow(2).mean()`` on seeded random 4 x 3 x 8 x 8 images: data
    and dropout masks differ between ranks and are equal between two runs of the same rank."""
    opt = torch.optim.SGD(params, lr=0.05, momentum=0.9)
    data = torch.Generator().manual_seed(100 + rank)
    torch.manual_seed(200 + rank)
    for _ in range(steps):
        x = torch.randn(4, 3, 8, 8, generator=data)
        opt.zero_grad(set_to_none=True)
        model(x).pow(2).mean().backward()
        opt.step()
