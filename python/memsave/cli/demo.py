"""``python -m memsave demo``: eager vs checkpointing on a built-in model, as a table.

The model is a small residual CNN (stem, residual blocks of Conv-BatchNorm-ReLU-Dropout, head) sized for a CPU, or a
larger one on CUDA. Each strategy runs on a fresh copy of the same seeded model:

* ``eager``: plain PyTorch;
* ``torch_checkpoint:Block``: every block under ``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)``;
* ``checkpoint:Block``: ``memsave.wrap(model, Block)``;
* ``checkpoint_sequential:2``: ``memsave.checkpoint_sequential(model, 2, x)``.

The rows are named and built by the strategy registry (:mod:`memsave.measurement.strategies`), as in
:func:`memsave.compare`, ``python -m memsave bench`` and ``benchmarks/run.py``.

Columns: peak memory of a training step (CUDA: ``max_memory_allocated``; CPU: allocator-level, from the profiler's
allocation events), activation memory (bytes alive at the end of forward, live-tensor tracker), step time as a ratio
to eager, the largest gradient difference from eager after a step from the same seed, and whether the BatchNorm
running statistics equal eager's after that step (``torch.utils.checkpoint`` updates them twice).
"""

from __future__ import annotations

import copy
import time
from typing import Dict, Optional, Sequence, Tuple

import torch
from torch import nn

from ..measurement.measuring import measure
from ..measurement.strategies import StrategyContext, parse_strategy
from ..measurement.units import format_bytes
from .usage import ArgumentParser, UsageError, add_traceback_flag, parse_device

__all__ = ["main", "DemoNet", "SIZES"]

#: batch, image side, width, number of residual blocks.
SIZES: Dict[str, Dict[str, int]] = {
    "cpu": dict(batch=16, image=64, width=32, blocks=8),
    "cuda": dict(batch=64, image=128, width=64, blocks=12),
    "tiny": dict(batch=2, image=16, width=8, blocks=3),
}


class Block(nn.Module):
    """x + Dropout(BN(Conv(ReLU(BN(Conv(x)))))), then ReLU."""

    def __init__(self, width: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(width, width, 3, padding=1, bias=False), nn.BatchNorm2d(width)
        self.conv2, self.bn2 = nn.Conv2d(width, width, 3, padding=1, bias=False), nn.BatchNorm2d(width)
        self.drop = nn.Dropout2d(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(x + self.drop(self.bn2(self.conv2(y))))


class DemoNet(nn.Sequential):
    """Stem (stride-2 conv, BN, ReLU), ``blocks`` residual :class:`Block`s, global pooling and a linear head."""

    def __init__(self, width: int = 32, blocks: int = 8, classes: int = 10) -> None:
        super().__init__(
            nn.Sequential(nn.Conv2d(3, width, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU()),
            *[Block(width) for _ in range(blocks)],
            nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(1), nn.Linear(width, classes)),
        )


#: The rows of the demo, as strategy names of :mod:`memsave.measurement.strategies` (the registry every driver uses).
STRATEGIES: Tuple[str, ...] = (
    "eager",
    "torch_checkpoint:Block",
    "checkpoint:Block",
    "checkpoint_sequential:2",
)


def _after_step(runner: nn.Module, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> Dict[str, torch.Tensor]:
    """Gradients and buffers after one step from a fixed seed."""
    model.zero_grad(set_to_none=True)
    torch.manual_seed(0)
    if x.is_cuda:
        torch.cuda.manual_seed_all(0)
    nn.functional.cross_entropy(runner(x), y).backward()
    out = {f"grad:{n}": p.grad.detach().clone() for n, p in model.named_parameters()}
    out.update({f"buf:{n}": b.detach().clone() for n, b in model.named_buffers()})
    model.zero_grad(set_to_none=True)
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the demo and print the table.

    Args:
        argv: command-line arguments (``--device``, ``--size``, ``--steps``); None reads ``sys.argv``.

    Returns:
        0, or 1 when on CPU a memsave strategy's gradients or buffers differ from eager's (they must not).

    Raises:
        UsageError: a wrong command line (``python -m memsave demo`` prints it as one line, exit code 2).

    Example:
        >>> from memsave.cli import demo
        >>> demo.main(["--size", "tiny", "--steps", "1"])
        0
    """
    p = ArgumentParser(prog="python -m memsave demo", description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default=None, help="cpu | cuda (default: cuda when available)")
    p.add_argument("--size", choices=tuple(SIZES), default=None, help="model size (default: cuda on CUDA, else cpu)")
    p.add_argument("--steps", type=int, default=5, help="timed steps; the median is used")
    add_traceback_flag(p)
    args = p.parse_args(argv)
    device = parse_device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda but CUDA is not available here; use --device cpu")
    if args.steps < 1:
        raise UsageError(f"--steps must be >= 1, got {args.steps}")
    cfg = SIZES[args.size or ("cuda" if device.type == "cuda" else "cpu")]

    t_start = time.perf_counter()
    torch.manual_seed(0)
    base = DemoNet(cfg["width"], cfg["blocks"]).to(device).train()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(cfg["batch"], 3, cfg["image"], cfg["image"], generator=g).to(device)
    y = torch.randint(0, 10, (cfg["batch"],), generator=g).to(device)
    loss_fn = lambda out: nn.functional.cross_entropy(out, y)  # noqa: E731
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(
        f"memsave demo: {cfg['blocks']} residual blocks (Conv-BN-ReLU-Conv-BN-Dropout), width {cfg['width']}, "
        f"input {tuple(x.shape)}, on {device} ({where}), torch {torch.__version__}"
    )

    rows = []
    ref: Dict[str, torch.Tensor] = {}
    eager_seconds = 1.0
    ctx = StrategyContext((x,), loss_fn, device)
    for name in STRATEGIES:
        strategy = parse_strategy(name)
        model = copy.deepcopy(base)
        runner = strategy.prepare(model, ctx)
        state = _after_step(runner, model, x, y)
        if name == "eager":
            ref = state
        m = measure(runner, x, loss_fn=loss_fn, steps=args.steps)
        if name == "eager":
            eager_seconds = m.step_seconds
        grad_diff = max(float((state[k].double() - ref[k].double()).abs().max()) for k in ref if k.startswith("grad:"))
        buffers_equal = all(torch.equal(state[k], ref[k]) for k in ref if k.startswith("buf:"))
        rows.append((name, m, m.step_seconds / eager_seconds, grad_diff, buffers_equal))

    header = ("strategy", "peak memory", "activations", "step time", "max |grad diff|", "BN stats == eager")
    table = [header] + [
        (
            n,
            format_bytes(m.peak_bytes),
            format_bytes(m.activation_bytes),
            f"{r:.2f}x",
            f"{d:.3g}",
            "yes" if be else "NO",
        )
        for n, m, r, d, be in rows
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    print()
    for i, row in enumerate(table):
        print("  ".join(c.ljust(w) if j == 0 else c.rjust(w) for j, (c, w) in enumerate(zip(row, widths))))
        if i == 0:
            print("  ".join("-" * w for w in widths))
    peak_how = "torch.cuda.max_memory_allocated" if device.type == "cuda" else "allocator-level (profiler CPU events)"
    print(
        f"\npeak: {peak_how}, one training step; activations: live tensors at the end of forward; step time: "
        f"median of {args.steps} steps, ratio to eager ({eager_seconds * 1e3:.1f} ms); gradients and BatchNorm "
        f"statistics after one step from the same seed. {time.perf_counter() - t_start:.1f} s in all."
    )
    bad = [n for n, _, _, d, be in rows if not n.startswith("torch") and (d != 0.0 or not be)]
    if bad and device.type == "cpu":
        print(f"ERROR: {', '.join(bad)} differ from eager on CPU; memsave's lossless strategies must not")
        return 1
    return 0
