"""How close memsave.estimate (fake tensors, nothing allocated) comes to the measured peak of a real training step.

For each model x strategy x batch size: ``memsave.estimate`` on the device's allocator model, then one real step
measured the documented way -- ``torch.cuda.max_memory_allocated`` on CUDA (synchronize, reset, step, read), the
allocator-level profiler peak on the CPU -- and, on any device, the live-tensor tracker's peak for the tensor-level
figure (``Estimate.tensor_peak_bytes``)::

    python3 benchmarks/estimate_accuracy.py --device cpu --size cpu                  # the committed CPU run
    python3 benchmarks/estimate_accuracy.py --device cuda --size full \\
        --models resnet50 gpt2 --batches 32 64 --strategies eager checkpoint:blocks  # the GPU acceptance run

Results go to ``benchmarks/results/estimate_<device>_<size>.json`` and ``.md`` (``--no-save`` prints only).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

import torch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import memsave
from benchmarks.harness import environment
from memsave import models as bench_models
from memsave.measurement.allocator import step_peak_bytes
from memsave.measurement.strategies import StrategyContext, parse_strategy
from memsave.measurement.tracker import LiveTensorTracker
from memsave.measurement.units import format_bytes


def measure_peak(runner: torch.nn.Module, inputs: Any, loss_fn: Any, dev: torch.device) -> Dict[str, int]:
    """One warm-up step, then the measured step (allocator peak) with the tracker on (tensor peak)."""

    def step() -> None:
        loss_fn(runner(*inputs)).backward()

    def clear() -> None:
        for p in runner.parameters():
            p.grad = None

    step()
    clear()
    with LiveTensorTracker() as tracker:
        peak = step_peak_bytes(step, dev)
    clear()
    return {"measured": int(peak), "tracker": int(tracker.peak_bytes)}


def run(
    models: List[str], size: str, batches: List[Optional[int]], strategies: List[str], dev: torch.device, seed: int
) -> List[Dict[str, Any]]:
    rows = []
    for name in models:
        for batch in batches:
            saved = bench_models.SIZES[name][size]
            if batch is not None:
                bench_models.SIZES[name][size] = dict(saved, batch=batch)
            try:
                case = bench_models.build(name, size, device=str(dev), seed=seed)
            finally:
                bench_models.SIZES[name][size] = saved
            for strategy in strategies:
                est = memsave.estimate(case.model, *case.inputs, device=dev, strategy=strategy, loss_fn=case.loss_fn)
                work = copy.deepcopy(case.model)
                runner = parse_strategy(strategy).prepare(work, StrategyContext(case.inputs, case.loss_fn, dev))
                m = measure_peak(runner, case.inputs, case.loss_fn, dev)
                del runner, work
                row = {
                    "model": name,
                    "batch": case.config["batch"],
                    "strategy": est.strategy,
                    "estimate": est.peak_bytes,
                    "estimate_tensors": est.tensor_peak_bytes,
                    "measured": m["measured"],
                    "tracker": m["tracker"],
                    "error": est.peak_bytes / m["measured"] - 1.0,
                    "tensor_error": est.tensor_peak_bytes / m["tracker"] - 1.0,
                    "emulated": est.emulated,
                }
                rows.append(row)
                print(
                    f"{name:9s} b{row['batch']:<4d} {row['strategy']:22s} estimate {format_bytes(row['estimate']):>11s}"
                    f"  measured {format_bytes(row['measured']):>11s}  {100 * row['error']:+6.2f}%"
                    f"  (tensors {100 * row['tensor_error']:+.2f}%)",
                    flush=True,
                )
            del case
    return rows


def markdown(rows: List[Dict[str, Any]], env: Dict[str, Any], dev: torch.device, size: str) -> str:
    how = (
        "`torch.cuda.max_memory_allocated` of one step above what was allocated before it"
        if dev.type == "cuda"
        else "the allocator-level CPU peak from the profiler's allocation events (docs/design.md)"
    )
    lines = [
        f"# memsave.estimate vs measured peak ({dev.type}, size `{size}`)",
        "",
        f"Measured: {how}. Tensors: the live-tensor tracker's peak of the same step vs `Estimate.tensor_peak_bytes`.",
        f"Environment: {', '.join(f'{k} {v}' for k, v in env.items())}.",
        "",
        "| model | batch | strategy | estimate | measured | error | tensor error |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['batch']} | `{r['strategy']}` | {format_bytes(r['estimate'])} | "
            f"{format_bytes(r['measured'])} | {100 * r['error']:+.2f}% | {100 * r['tensor_error']:+.2f}% |"
        )
    worst = max(abs(r["error"]) for r in rows)
    lines += ["", f"Largest error: {100 * worst:.2f}%."]
    return "\n".join(lines) + "\n"


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--size", default=None, help="tiny | cpu | full (default: full on CUDA, cpu otherwise)")
    p.add_argument("--models", nargs="+", default=list(bench_models.MODELS))
    p.add_argument("--batches", nargs="+", type=int, default=None, help="batch sizes (default: the size's own)")
    p.add_argument("--strategies", nargs="+", default=["eager", "checkpoint:blocks", "convert"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-dir", default=str(ROOT / "benchmarks" / "results"))
    p.add_argument("--no-save", action="store_true")
    args = p.parse_args(argv)
    dev = torch.device(args.device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    size = args.size or ("full" if dev.type == "cuda" else "cpu")
    rows = run(args.models, size, args.batches or [None], args.strategies, dev, args.seed)
    env = environment(dev)
    if not args.no_save:
        out = Path(args.out_dir)
        out.mkdir(parents=True, exist_ok=True)
        stem = out / f"estimate_{dev.type}_{size}"
        stem.with_suffix(".json").write_text(
            json.dumps({"device": str(dev), "size": size, "environment": env, "rows": rows}, indent=2) + "\n"
        )
        stem.with_suffix(".md").write_text(markdown(rows, env, dev, size))
        print(f"wrote {stem}.json and {stem}.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
