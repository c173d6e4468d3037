"""Do memsave's timed comparisons agree with themselves? Eager against itself, and the demo run twice.

Two claims of the interleaved timing (:mod:`memsave.measurement.timing`) that depend on the machine, so they are
measured here and not asserted in the unit tests:

* ``compare`` of eager against an identical copy of eager (``{"eager_again": lambda m: m}``) gives a time ratio
  near 1.0 (the goal: within 0.9-1.1), with its IQR, also on a loaded machine;
* the demo's comparison (``python -m memsave demo``: its model, strategies and loss) run twice in one fresh process
  gives the same ratios (the goal: within 0.15 of each other), the first run included.

Usage::

    python3 benchmarks/timing_consistency.py                 # tiny sizes, 9 rounds; a few minutes on 2 CPU cores
    python3 benchmarks/timing_consistency.py --rounds 5 --demo-size tiny

Writes ``benchmarks/results/timing_consistency_<device>.json`` and ``.md`` with the load average at start and end.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

import torch

import memsave
from benchmarks.harness import RunClock, commit_text, default_out, load_text, run_record, write_results
from memsave import models
from memsave.cli import demo


def _rows(result: memsave.Comparison) -> List[Dict[str, Any]]:
    return [
        dict(
            strategy=r.strategy,
            time_ratio=r.time_ratio,
            time_ratio_iqr=r.time_ratio_iqr,
            step_seconds=r.step_seconds,
            step_iqr_seconds=r.step_iqr_seconds,
        )
        for r in result.rows
    ]


def eager_against_eager(names: Sequence[str], rounds: int, device: str) -> List[Dict[str, Any]]:
    """compare(eager, eager_again) on each built-in model at its tiny size, batch 16."""
    out = []
    for name in names:
        case = models.build(name, "tiny", device=device, batch=16)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            r = memsave.compare(
                case.model,
                *case.inputs,
                loss_fn=case.loss_fn,
                steps=rounds,
                strategies={"eager": "eager", "eager_again": lambda m: m},
            )
        again = r["eager_again"]
        out.append(
            dict(
                model=name,
                ratio=again.time_ratio,
                ratio_iqr=again.time_ratio_iqr,
                rounds=r.steps,
                within_0_9_1_1=0.9 <= again.time_ratio <= 1.1,
                spread_warned=any("spread widely" in str(w.message) for w in caught),
                rows=_rows(r),
            )
        )
    return out


def demo_twice(size: str, rounds: int, device: str) -> Dict[str, Any]:
    """The demo's comparison, twice in this process (the first is the process's first timed run)."""
    cfg = demo.SIZES[size]
    runs, timed = [], []
    for _ in range(2):
        torch.manual_seed(0)
        model = demo.DemoNet(cfg["width"], cfg["blocks"]).to(device).train()
        g = torch.Generator().manual_seed(1)
        x = torch.randn(cfg["batch"], 3, cfg["image"], cfg["image"], generator=g).to(device)
        y = torch.randint(0, 10, (cfg["batch"],), generator=g).to(device)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            r = memsave.compare(model, x, strategies=demo.STRATEGIES, loss_fn=demo._CrossEntropy(y), steps=rounds)
        runs.append({row.strategy: row.time_ratio for row in r.rows})
        timed.append(r.steps)
    diff = {n: abs(runs[0][n] - runs[1][n]) for n in runs[0]}
    return dict(size=size, first=runs[0], second=runs[1], abs_diff=diff, max_abs_diff=max(diff.values()), rounds=timed)


def to_markdown(meta: Dict[str, Any], eager: List[Dict[str, Any]], twice: Dict[str, Any]) -> str:
    lines = [
        "# Timing consistency",
        "",
        f"`{meta['command']}` on {meta['cpu']}, {meta['threads']} threads, {commit_text(meta)}, "
        f"load {load_text(meta['load_average_start'])} -> {load_text(meta['load_average_end'])}, "
        f"{meta['minutes']:.1f} minutes; at least {meta['rounds']} interleaved rounds "
        "(more while a median is uncertain).",
        "",
        "## Eager against eager (goal: ratio within 0.9-1.1)",
        "",
        "| model (tiny, batch 16) | time ratio | IQR | rounds | within 0.9-1.1 | spread warning |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for e in eager:
        lines.append(
            f"| {e['model']} | {e['ratio']:.3f} | {e['ratio_iqr']:.3f} | {e['rounds']} "
            f"| {'yes' if e['within_0_9_1_1'] else 'NO'} | {'yes' if e['spread_warned'] else 'no'} |"
        )
    lines += [
        "",
        f"## The demo ({twice['size']}) twice in one process (goal: every ratio within 0.15); "
        f"{' and '.join(str(n) for n in twice['rounds'])} rounds",
        "",
        "| strategy | first run | second run | difference |",
        "| --- | --- | --- | --- |",
    ]
    for n, d in twice["abs_diff"].items():
        lines.append(f"| {n} | {twice['first'][n]:.2f} | {twice['second'][n]:.2f} | {d:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=["unet", "gpt2"], choices=models.MODELS)
    p.add_argument("--rounds", type=int, default=9, help="interleaved timing rounds (default: %(default)s)")
    p.add_argument("--demo-size", choices=tuple(demo.SIZES), default="tiny")
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", default=None, help="JSON path (default: benchmarks/results/timing_consistency_<device>)")
    args = p.parse_args(argv)
    clock = RunClock()
    eager = eager_against_eager(args.models, args.rounds, args.device)
    twice = demo_twice(args.demo_size, args.rounds, args.device)
    meta = run_record("timing_consistency", args.device, argv, clock, rounds=args.rounds)
    out = args.out or default_out("timing_consistency", args.device)
    write_results(out, meta, {"eager_against_eager": eager, "demo_twice": twice}, to_markdown(meta, eager, twice))
    print(to_markdown(meta, eager, twice))
    return 0


if __name__ == "__main__":
    sys.exit(main())
