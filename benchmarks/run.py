"""Benchmark harness: every model x every strategy, measured the same way, compared with eager from the same run.

Usage::

    python3 benchmarks/run.py --models vgg16 unet --size cpu
    python3 benchmarks/run.py --size full --device cuda          # the protocol sizes, on a GPU

Per row (benchmarks/README.md):

* ``peak_bytes`` -- :func:`memsave.measure.measure`: CUDA ``max_memory_allocated`` above the step's start, or on
  CPU the allocator-level peak from the profiler's allocation events;
* ``activation_bytes`` -- the live-tensor tracker: bytes of tensors created in forward and alive at its end;
* ``forward_alloc_bytes`` -- the same quantity at allocator level: bytes allocated minus freed during forward (CPU:
  profiler events; CUDA: ``memory_allocated`` after minus before);
* ``step_seconds`` / ``time_ratio`` -- median of ``steps`` step times of the strategy, and its ratio to the median
  of ``steps`` steps of an eager copy of the model taken alternately with them in this run (robust to load changing
  during the run);
* ``max_grad_diff`` -- max |grad - eager grad| over all parameters after one step from the same RNG seed.

Results go to ``<out-dir>/bench_<device>_<size>.json`` and ``.md`` with the device name, torch and CUDA versions.
Strategies are named as everywhere in memsave (:mod:`memsave.measurement.strategies`; ``strategies.py`` lists the
default rows); ``--plugins mod`` imports modules that register more kinds.
"""

from __future__ import annotations

import argparse
import copy
import gc
import importlib
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:  # run as a script: make the `benchmarks` package importable
    sys.path.insert(0, str(HERE.parent))

import torch

from benchmarks import strategies as bench_strategies
from benchmarks.harness import environment, max_grad_diff, sync
from memsave import models as bench_models
from memsave.measurement.allocator import cpu_memory_stats
from memsave.measurement.measuring import measure
from memsave.measurement.strategies import StrategyContext
from memsave.measurement.units import format_bytes

__all__ = ["main", "run", "environment", "to_markdown"]


# ------------------------------------------------------------------------------------------------------ environment


# ------------------------------------------------------------------------------------------------------------ a row


def _grad_step(runner: Any, model: torch.nn.Module, case: bench_models.BenchCase, seed: int, device: torch.device):
    """One step from a fixed RNG seed: allocator-level forward bytes, and the parameter gradients by name."""
    for p in model.parameters():
        p.grad = None
    torch.manual_seed(seed)
    if device.type == "cuda":
        torch.cuda.manual_seed_all(seed)
        sync(device)
        before = torch.cuda.memory_allocated(device)
        out = runner(*case.inputs)
        sync(device)
        forward_bytes = torch.cuda.memory_allocated(device) - before
    else:
        stats = cpu_memory_stats(lambda: runner(*case.inputs))
        out, forward_bytes = stats.result, stats.net_bytes
        del stats
    case.loss_fn(out).backward()
    del out
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    for p in model.parameters():
        p.grad = None
    return forward_bytes, grads


def _step_time(runner: Any, model: torch.nn.Module, case: bench_models.BenchCase, device: torch.device) -> float:
    for p in model.parameters():
        p.grad = None
    sync(device)
    t0 = time.perf_counter()
    case.loss_fn(runner(*case.inputs)).backward()
    sync(device)
    return time.perf_counter() - t0


def _interleaved_times(
    eager: Any,
    eager_model: torch.nn.Module,
    runner: Any,
    model: torch.nn.Module,
    case: bench_models.BenchCase,
    steps: int,
    device: torch.device,
):
    """Median step time of ``runner`` and of eager, the two stepped alternately ``steps`` times each.

    Alternating makes the ratio robust to load that drifts during a run (a shared CI machine): both medians see the
    same conditions. Both have been warmed up already.
    """
    te, ts = [], []
    for _ in range(steps):
        te.append(_step_time(eager, eager_model, case, device))
        ts.append(_step_time(runner, model, case, device))
    for m in (eager_model, model):
        for p in m.parameters():
            p.grad = None
    return statistics.median(ts), statistics.median(te)


def run_model(
    name: str,
    size: str,
    strategy_names: Sequence[str],
    device: torch.device,
    steps: int,
    warmup: int,
    seed: int = 0,
    log: Any = print,
) -> List[Dict[str, Any]]:
    """Measure every strategy on one model; returns one dict per row, eager first."""
    case = bench_models.build(name, size, str(device), seed)
    pristine = case.model
    # A plain copy stepped alternately with each strategy for the time ratio.
    eager_model = copy.deepcopy(pristine)
    for _ in range(max(warmup, 1)):
        _step_time(eager_model, eager_model, case, device)
    for p in eager_model.parameters():
        p.grad = None
    rows: List[Dict[str, Any]] = []
    eager: Optional[Dict[str, Any]] = None
    eager_grads: Dict[str, torch.Tensor] = {}
    for strat in bench_strategies.get(strategy_names):
        row: Dict[str, Any] = {
            "model": name,
            "size": size,
            "strategy": strat.name,
            "description": "; ".join(spec.description for spec, _ in strat.parts),
            "lossless": strat.lossless,
        }
        t0 = time.perf_counter()
        try:
            model = copy.deepcopy(pristine)
            runner = strat.prepare(model, StrategyContext(case.inputs, case.loss_fn, device))
            # Memory from measure (its own timing is not used: one step); time from the interleaved steps below.
            m = measure(runner, *case.inputs, loss_fn=case.loss_fn, steps=1, warmup=warmup)
            forward_bytes, grads = _grad_step(runner, model, case, seed, device)
            if strat.name == "eager":
                seconds = statistics.median(_step_time(runner, model, case, device) for _ in range(steps))
                ratio = 1.0
            else:
                seconds, eager_seconds = _interleaved_times(
                    eager_model, eager_model, runner, model, case, steps, device
                )
                ratio = seconds / eager_seconds
        except Exception as e:  # a failing strategy is a result row, not the end of the run
            row["error"] = f"{type(e).__name__}: {e}"
            rows.append(row)
            log(f"  {strat.name:<34} error: {row['error']}")
            continue
        finally:
            model = runner = None
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
        if strat.name == "eager":
            eager_grads = grads
        row.update(
            peak_bytes=m.peak_bytes,
            activation_bytes=m.activation_bytes,
            forward_alloc_bytes=int(forward_bytes),
            reserved_bytes=m.reserved_bytes,
            step_seconds=seconds,
            max_grad_diff=max_grad_diff(grads, eager_grads) if eager_grads else None,
            seconds_total=round(time.perf_counter() - t0, 2),
        )
        if strat.name == "eager":
            eager = row
        if eager is not None:
            row["time_ratio"] = ratio
            row["activation_ratio"] = m.activation_bytes / max(eager["activation_bytes"], 1)
            row["peak_ratio"] = m.peak_bytes / max(eager["peak_bytes"], 1)
        rows.append(row)
        log(
            f"  {strat.name:<34} peak {format_bytes(m.peak_bytes):>11}  act {format_bytes(m.activation_bytes):>11}"
            f"  x{row.get('time_ratio', float('nan')):.2f} time  grad diff {row['max_grad_diff']}"
            f"  ({row['seconds_total']} s)"
        )
    return rows


def run(
    models: Sequence[str],
    size: str,
    strategies: Sequence[str],
    device: torch.device,
    steps: int = 5,
    warmup: int = 1,
    seed: int = 0,
    log: Any = print,
) -> Dict[str, Any]:
    """Run the benchmark; returns ``{"environment": ..., "settings": ..., "rows": [...]}``."""
    t0 = time.perf_counter()
    rows: List[Dict[str, Any]] = []
    for name in models:
        log(f"{name} ({size}): {bench_models.SIZES[name][size]}")
        rows += run_model(name, size, strategies, device, steps, warmup, seed, log)
    return {
        "environment": environment(device),
        "settings": {
            "models": list(models),
            "size": size,
            "steps": steps,
            "warmup": warmup,
            "seed": seed,
            "sizes": {n: bench_models.SIZES[n][size] for n in models},
            "total_seconds": round(time.perf_counter() - t0, 1),
        },
        "rows": rows,
    }


# ---------------------------------------------------------------------------------------------------------- output
def _fmt_ratio(v: Optional[float]) -> str:
    return "-" if v is None else f"{v:.2f}"


def to_markdown(result: Dict[str, Any]) -> str:
    """The result as markdown: an environment header and one table per model."""
    env, st = result["environment"], result["settings"]
    ms = env.get("memsave")
    lines = [
        f"# memsave benchmark: {env['device_name']} ({env['device']}), size `{st['size']}`",
        "",
        f"torch {env['torch']}, CUDA {env['cuda'] or 'n/a'}, python {env['python']}, {env['cpu_threads']} CPU threads, "
        f"memsave {ms.get('version') if isinstance(ms, dict) else ms}, commit {env.get('git_commit')}, "
        f"{env['date_utc']} UTC. Median of {st['steps']} steps after {st['warmup']} warm-up; total "
        f"{st['total_seconds']} s"
        + (f", load average {env['load_average']} at the end" if env.get("load_average") else "")
        + ".",
        "",
        "Peak: "
        + (
            "`torch.cuda.max_memory_allocated` above the step's start"
            if env["device"].startswith("cuda")
            else "allocator-level, from the profiler's CPU allocation events (docs/design.md)"
        )
        + ". Activations: live-tensor tracker, bytes alive at the end of forward; 'fwd alloc' is the same at "
        "allocator level. Ratios are to eager in this run.",
    ]
    for name in st["models"]:
        lines += [
            "",
            f"## {name}: {json.dumps(st['sizes'][name])}",
            "",
            "| strategy | peak | activations | act / eager | fwd alloc | step time / eager | max abs grad diff |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for r in result["rows"]:
            if r["model"] != name:
                continue
            if "skipped" in r or "error" in r:
                lines.append(
                    f"| {r['strategy']} | {'skipped' if 'skipped' in r else 'error'}: "
                    f"{r.get('skipped') or r.get('error')} | | | | | |"
                )
                continue
            gd = r["max_grad_diff"]
            lines.append(
                f"| {r['strategy']} | {format_bytes(r['peak_bytes'])} | {format_bytes(r['activation_bytes'])} | "
                f"{_fmt_ratio(r.get('activation_ratio'))} | {format_bytes(r['forward_alloc_bytes'])} | "
                f"{_fmt_ratio(r.get('time_ratio'))} | {'-' if gd is None else f'{gd:.3g}'} |"
            )
    return "\n".join(lines) + "\n"


def save(result: Dict[str, Any], out_dir: Path, stem: Optional[str] = None) -> List[Path]:
    """Write ``<stem>.json`` and ``<stem>.md`` under ``out_dir``; returns the two paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    dev = result["environment"]["device"].split(":")[0]
    stem = stem or f"bench_{dev}_{result['settings']['size']}"
    paths = [out_dir / f"{stem}.json", out_dir / f"{stem}.md"]
    paths[0].write_text(json.dumps(result, indent=1) + "\n")
    paths[1].write_text(to_markdown(result))
    return paths


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """Command line entry point; returns the result dict."""
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--models", nargs="+", default=list(bench_models.MODELS), choices=bench_models.MODELS)
    p.add_argument(
        "--size",
        choices=("full", "cpu", "tiny"),
        default=None,
        help="model sizes (models.py); default: full on CUDA, cpu otherwise",
    )
    p.add_argument(
        "--strategies",
        nargs="+",
        default=list(bench_strategies.DEFAULT_STRATEGIES),
        help="strategy names (memsave.measurement.strategies; combine with '+')",
    )
    p.add_argument("--plugins", nargs="*", default=[], help="modules to import first (they register strategies)")
    p.add_argument("--device", default=None, help="cpu | cuda | cuda:N (default: cuda when available)")
    p.add_argument("--steps", type=int, default=5, help="timed steps; the median is reported")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--deterministic",
        action="store_true",
        help="torch.use_deterministic_algorithms(True) (CUDA: gradients comparable bitwise)",
    )
    p.add_argument("--out-dir", type=Path, default=HERE / "results")
    p.add_argument("--name", default=None, help="file stem of the results (default bench_<device>_<size>)")
    p.add_argument("--no-save", action="store_true")
    args = p.parse_args(argv)

    for mod in args.plugins:
        importlib.import_module(mod)
    names = args.strategies
    bench_strategies.get(names)  # unknown names fail before anything runs
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    size = args.size or ("full" if device.type == "cuda" else "cpu")
    if args.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
    result = run(args.models, size, names, device, args.steps, args.warmup, args.seed)
    print()
    print(to_markdown(result))
    if not args.no_save:
        for path in save(result, args.out_dir, args.name):
            print(f"wrote {path}")
    return result


if __name__ == "__main__":
    main()
