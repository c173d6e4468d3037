"""``python -m memsave demo``: eager vs checkpointing on a built-in model, as a table.

The model is a small residual CNN (stem, residual blocks of Conv-BatchNorm-ReLU-Dropout, head) at one of the sizes
every subcommand knows (``tiny``, ``cpu``, ``full``). It runs :func:`memsave.compare` with these strategies (named
and built by the strategy registry, :mod:`memsave.measurement.strategies`, as in ``python -m memsave bench`` and
``benchmarks/run.py``):

* ``eager``: plain PyTorch;
* ``torch_checkpoint:Block``: every block under ``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)``;
* ``checkpoint:Block``: ``memsave.wrap(model, Block)``;
* ``checkpoint_sequential:2``: ``memsave.checkpoint_sequential(model, 2, x)``.

Columns: peak memory of a training step (CUDA: ``max_memory_allocated``; CPU: allocator-level, from the profiler's
allocation events), activation memory (bytes alive at the end of forward, live-tensor tracker), the step time and
its ratio to eager (all strategies timed together, interleaved over rounds: median and IQR), the largest gradient
difference from eager after a step from the same seed, and whether the BatchNorm running statistics equal eager's
after that step (``torch.utils.checkpoint`` updates them twice).
"""

from __future__ import annotations

import time
from typing import Any, Dict, Optional, Sequence, Tuple

import torch
from torch import nn

from ..measurement.comparison import compare
from ..measurement.units import format_bytes
from .options import add_common_args, default_size, parser, print_table, resolve_device
from .usage import UsageError

__all__ = ["main", "DemoNet", "SIZES"]

#: batch, image side, width, number of residual blocks, per size (the size names of every subcommand).
SIZES: Dict[str, Dict[str, int]] = {
    "tiny": dict(batch=2, image=16, width=8, blocks=3),
    "cpu": dict(batch=16, image=64, width=32, blocks=8),
    "full": dict(batch=64, image=128, width=64, blocks=12),
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


class _CrossEntropy:
    """Cross-entropy against fixed class targets (a class, not a closure: compare deep-copies nothing of it)."""

    def __init__(self, target: torch.Tensor) -> None:
        self.target = target

    def __call__(self, out: Any) -> torch.Tensor:
        return nn.functional.cross_entropy(out, self.target)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the demo and print the table.

    Args:
        argv: command-line arguments (``--device``, ``--size``, ``--steps``, ``--no-progress``); None reads
            ``sys.argv``.

    Returns:
        0, or 1 when on CPU a memsave strategy's gradients or buffers differ from eager's (they must not).

    Raises:
        UsageError: a wrong command line (``python -m memsave demo`` prints it as one line, exit code 2).

    Examples:
        >>> from memsave.cli import demo
        >>> demo.main(["--size", "tiny", "--steps", "3"])
        0
    """
    p = parser("python -m memsave demo", __doc__.split("\n\n")[0], models_epilog=False)
    add_common_args(p)
    p.add_argument("--steps", type=int, default=5, help="interleaved timing rounds (default: %(default)s)")
    args = p.parse_args(argv)
    if args.steps < 1:
        raise UsageError(f"--steps must be >= 1, got {args.steps}")
    device = resolve_device(args.device)
    cfg = SIZES[args.size or default_size(device)]
    torch.manual_seed(args.seed)
    model = DemoNet(cfg["width"], cfg["blocks"]).to(device).train()
    g = torch.Generator().manual_seed(args.seed + 1)
    x = torch.randn(cfg["batch"], 3, cfg["image"], cfg["image"], generator=g).to(device)
    y = torch.randint(0, 10, (cfg["batch"],), generator=g).to(device)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(
        f"memsave demo: {cfg['blocks']} residual blocks (Conv-BN-ReLU-Conv-BN-Dropout), width {cfg['width']}, "
        f"input {tuple(x.shape)}, on {device} ({where}), torch {torch.__version__}"
    )
    start = time.perf_counter()
    result = compare(
        model,
        x,
        strategies=STRATEGIES,
        loss_fn=_CrossEntropy(y),
        steps=args.steps,
        progress=False if args.no_progress else None,
    )
    body = [
        [
            r.strategy,
            format_bytes(r.peak_bytes),
            format_bytes(r.activation_bytes),
            f"{r.step_seconds * 1e3:.1f} ms ({r.step_iqr_seconds * 1e3:.1f})",
            f"{r.time_ratio:.2f}x ({r.time_ratio_iqr:.2f})",
            f"{r.max_grad_diff:.3g}",
            "yes" if r.buffers_equal else "NO",
        ]
        for r in result.rows
    ]
    print()
    print_table(
        ["strategy", "peak memory", "activations", "step (IQR)", "time x (IQR)", "max |grad diff|", "BN == eager"], body
    )
    peak_how = "torch.cuda.max_memory_allocated" if device.type == "cuda" else "allocator-level (profiler CPU events)"
    print(
        f"\npeak: {peak_how}, one training step; activations: live tensors at the end of forward; step time: median "
        f"(IQR) over {result.steps} rounds timing every strategy in turn (order reversed every other round), time x: "
        f"median of the per-round ratios to eager; gradients and BatchNorm statistics after one step from the same "
        f"seed. {time.perf_counter() - start:.1f} s in all."
    )
    bad = [r.strategy for r in result.rows if r.lossless and not r.strategy.startswith("torch")]
    bad = [n for n in bad if result[n].max_grad_diff != 0.0 or not result[n].buffers_equal]
    if bad and device.type == "cpu":
        print(f"ERROR: {', '.join(bad)} differ from eager on CPU; memsave's lossless strategies must not")
        return 1
    return 0
