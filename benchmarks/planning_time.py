"""How long ``memsave.plan`` takes, where the time goes, and what fewer timing steps cost the time model.

For each model of ``real_models.py`` (the frontier's sizes, float32, random weights):

* **Planning time.** ``memsave.plan(model, ..., budget=0.6, cache=False)`` on a freshly built model (its traced step
  is the model's first step, as in a training script), then ``--plans - 1`` more times on the same model; each
  plan's wall time, that time in eager steps (over the median of ``--steps`` plain steps timed before), and the
  seconds of each stage (``profiling``, ``timing stages``, ``solving``, ``verifying candidate k/N``: the DEBUG
  record of :func:`memsave.plan`). The selective-overhead probe, measured once per process, is forgotten before each
  model's first plan, so that plan pays it as a fresh script's would.
* **Timing steps against prediction noise.** ``--rounds`` interleaved rounds (1 2 3 3 2 1 ...) of
  ``memsave.recompute.planning.planner.profile(..., timing_steps=k)`` for k = 1, 2, 3, and from each profile the
  predicted overhead (recompute time over eager's step) of the sqrt(N) plan and of the optimal plan at 0.6 of
  eager's peak, without measuring either: the median and IQR over rounds say how much the cost model's predictions
  move with k (the measured times of a plan move by 0.05-0.1 between runs on this project's CPU machine:
  benchmarks/README.md). Profile seconds are the median over rounds.
* **Under compile** (``--compile-models``): one ``torch.compile`` of a copy of the model and its first step, and
  ``memsave.plan(..., budget=--compile-budget, compile=True)``: its seconds, that time in compiles, and the seconds
  of each stage (dynamo captures the model once; every candidate and partitioner budget is one inductor compile of
  that capture; the finalists reuse theirs). Each runs in a fresh process with inductor's cache in a directory of
  its own: empty (``cold``: what a first run pays), then again as the cold run left it (``warm``: a script run
  again, its plan cache off).

    python3 benchmarks/planning_time.py --compile-models gpt2  # the committed CPU run
    python3 benchmarks/planning_time.py --models gpt2 --rounds 4 --no-save

Writes ``benchmarks/results/planning_time_<device>.json`` and ``.md`` with the machine, versions, commit and load.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence

import torch

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:  # run as a script: make the `benchmarks` package importable
    sys.path.insert(0, str(HERE.parent))

import memsave
from benchmarks import harness
from benchmarks.real_models import MODELS, Case, prepare
from memsave.recompute.planning import planner

SCRIPT = "planning_time"
TIMING_STEPS = (1, 2, 3)


class _StageRecords(logging.Handler):
    """Keeps the ``memsave_plan_stages`` dict of every DEBUG record ``memsave.plan`` logs."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.stages: List[Dict[str, float]] = []

    def emit(self, record: logging.LogRecord) -> None:
        spent = getattr(record, "memsave_plan_stages", None)
        if spent is not None:
            self.stages.append(dict(spent))


def eager_step_seconds(case: Case, steps: int) -> float:
    """The median of ``steps`` plain training steps of ``case.model`` after one untimed step."""
    times = []
    for i in range(steps + 1):
        case.model.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        case.loss_fn(case.model(*case.args, **case.kwargs)).backward()
        if i:
            times.append(time.perf_counter() - t0)
    case.model.zero_grad(set_to_none=True)
    return statistics.median(times)


@contextlib.contextmanager
def stage_records() -> Iterator[_StageRecords]:
    """The ``memsave`` logger at DEBUG for the block, its plans' stage seconds kept by the handler yielded."""
    records = _StageRecords()
    log = logging.getLogger("memsave")
    level = log.level
    log.addHandler(records)
    log.setLevel(logging.DEBUG)
    try:
        yield records
    finally:
        log.removeHandler(records)
        log.setLevel(level)


def planning_rows(name: str, plans: int, steps: int) -> Dict[str, Any]:
    """Part one for one model: each plan's seconds, eager steps and stage seconds (see the module docstring)."""
    case = prepare(name, torch.device("cpu"), quick=False)
    planner._SELECTIVE_OVERHEAD.clear()  # as in a fresh process: the first plan measures the probe
    seconds, segments = [], []
    with stage_records() as records:
        for _ in range(plans):
            t0 = time.perf_counter()
            p = memsave.plan(
                case.model,
                *case.args,
                budget=0.6,
                loss_fn=case.loss_fn,
                example_kwargs=case.kwargs,
                cache=False,
                progress=False,
            )
            seconds.append(time.perf_counter() - t0)
            segments.append(len(p.regions()))
    step_s = eager_step_seconds(case, steps)
    return dict(
        eager_step_s=step_s,
        plan_s=seconds,
        plan_steps=[s / step_s for s in seconds],
        stages_s=records.stages,
        regions=segments,
    )


def compiled_child(name: str, what: str, budget: float) -> Dict[str, Any]:
    """In a process of its own: one ``torch.compile`` of a copy of the model and its first step (``what="compile"``),
    or ``memsave.plan(..., budget=budget, compile=True)`` with its stage seconds (``"plan"``)."""
    case = prepare(name, torch.device("cpu"), quick=False)
    if what == "compile":
        compiled = torch.compile(copy.deepcopy(case.model))
        t0 = time.perf_counter()
        case.loss_fn(compiled(*case.args, **case.kwargs)).backward()
        return dict(seconds=time.perf_counter() - t0)
    with stage_records() as records:
        t0 = time.perf_counter()
        p = memsave.plan(
            case.model,
            *case.args,
            budget=budget,
            loss_fn=case.loss_fn,
            example_kwargs=case.kwargs,
            cache=False,
            progress=False,
            compile=True,
        )
        seconds = time.perf_counter() - t0
    return dict(
        seconds=seconds,
        stages_s=records.stages[-1],
        regions=len(p.regions()),
        activation_memory_budget=p.activation_memory_budget,
    )


def _child(name: str, what: str, budget: float, threads: int, cache_dir: str) -> Dict[str, Any]:
    """:func:`compiled_child` in a fresh Python process with inductor's cache at ``cache_dir`` (nothing kept in
    memory from an earlier compile)."""
    command = [sys.executable, str(Path(__file__).resolve()), "--compiled-child", name, what]
    command += ["--compile-budget", str(budget), "--threads", str(threads)]
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache_dir}
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"planning_time: {what} of {name} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def compiled_row(name: str, budget: float, threads: int) -> Dict[str, Any]:
    """Part three for one model: one compile and the compiled plan, each in a process of its own with inductor's
    cache of its own, first empty (``cold``), then as that first run left it (``warm``)."""
    row: Dict[str, Any] = dict(budget=budget)
    with tempfile.TemporaryDirectory() as compile_dir, tempfile.TemporaryDirectory() as plan_dir:
        for caches in ("cold", "warm"):
            compile_s = _child(name, "compile", budget, threads, compile_dir)["seconds"]
            planned = _child(name, "plan", budget, threads, plan_dir)
            row[caches] = dict(compile_s=compile_s, plan_s=planned["seconds"], **planned)
            row[caches]["plan_compiles"] = planned["seconds"] / compile_s
            del row[caches]["seconds"]
    return row


def _spread(values: Sequence[float]) -> Dict[str, float]:
    q1, _, q3 = statistics.quantiles(values, n=4) if len(values) > 1 else (values[0],) * 3
    return dict(median=statistics.median(values), iqr=q3 - q1, min=min(values), max=max(values))


def prediction_noise(name: str, rounds: int) -> Dict[str, Any]:
    """Part two for one model: per timing-step count, the profile's seconds and the predicted overheads' spread."""
    case = prepare(name, torch.device("cpu"), quick=False)
    seen: Dict[int, Dict[str, List[float]]] = {k: dict(profile_s=[], sqrt=[], optimal=[]) for k in TIMING_STEPS}
    for r in range(rounds):
        for k in TIMING_STEPS if r % 2 == 0 else TIMING_STEPS[::-1]:
            t0 = time.perf_counter()
            prof = planner.profile(
                case.model, *case.args, loss_fn=case.loss_fn, example_kwargs=case.kwargs, timing_steps=k
            )
            seen[k]["profile_s"].append(time.perf_counter() - t0)
            budget = int(0.6 * prof.eager_peak_bytes)
            seen[k]["sqrt"].append(planner.search(prof, None, solver="sqrt", verify=False).predicted_overhead)
            seen[k]["optimal"].append(planner.search(prof, budget, verify=False).predicted_overhead)
    return {
        str(k): dict(
            profile_s=statistics.median(d["profile_s"]), sqrt=_spread(d["sqrt"]), optimal=_spread(d["optimal"])
        )
        for k, d in seen.items()
    }


def text_lines(results: Dict[str, Dict[str, Any]]) -> List[str]:
    """The printed tables (the markdown page's, as plain text)."""
    lines = [f"{'model':<9} {'step s':>7} {'first plan':>18} {'later plans':>18}  stages of the first plan"]
    for name, r in _with(results, "plans"):
        first, later = r["plans"]["plan_s"][0], r["plans"]["plan_s"][1:]
        stages = _stages(r["plans"]["stages_s"][0], ", ")
        later_cell = f"{statistics.median(later):.2f} s ({statistics.median(r['plans']['plan_steps'][1:]):.1f} st)"
        lines.append(
            f"{name:<9} {r['plans']['eager_step_s']:>7.3f} {first:>7.2f} s ({r['plans']['plan_steps'][0]:.1f} st) "
            f"{later_cell if later else '-':>18}  {stages}"
        )
    lines += ["", f"{'model':<9} {'steps':>5} {'profile s':>9} {'sqrt: median (IQR)':>20} {'optimal@0.6':>16}"]
    for name, r in results.items():
        for k, d in r.get("noise", {}).items():
            lines.append(
                f"{name:<9} {k:>5} {d['profile_s']:>9.2f} {d['sqrt']['median']:>12.3f} ({d['sqrt']['iqr']:.3f}) "
                f"{d['optimal']['median']:>8.3f} ({d['optimal']['iqr']:.3f})"
            )
    for name, r in _with(results, "compiled"):
        for caches in ("cold", "warm"):
            c = r["compiled"][caches]
            lines += [
                "",
                f"{name}, {caches} caches: one torch.compile + first step {c['compile_s']:.1f} s; plan(compile=True, "
                f"budget={r['compiled']['budget']}) {c['plan_s']:.1f} s = {c['plan_compiles']:.1f} compiles: "
                f"{_stages(c['stages_s'], ', ')}",
            ]
    return lines


def _with(results: Dict[str, Dict[str, Any]], part: str) -> List[Any]:
    """The (model, result) pairs that have ``part`` (``plans``, ``noise``, ``compiled``)."""
    return [(name, r) for name, r in results.items() if part in r]


def _stages(spent: Dict[str, float], sep: str) -> str:
    return sep.join(f"{k} {v:.2f}" for k, v in spent.items())


def markdown(meta: Dict[str, Any], results: Dict[str, Dict[str, Any]]) -> str:
    """The results page."""
    plan_rows = []
    for name, r in _with(results, "plans"):
        p = r["plans"]
        stages = _stages(p["stages_s"][0], "; ")
        later = f"{statistics.median(p['plan_s'][1:]):.2f} ({statistics.median(p['plan_steps'][1:]):.1f})"
        plan_rows.append(
            f"| {name} | {p['eager_step_s']:.3f} | {p['plan_s'][0]:.2f} ({p['plan_steps'][0]:.1f}) | "
            f"{later if len(p['plan_s']) > 1 else '-'} | {stages} |"
        )
    noise_rows = [
        f"| {name} | {k} | {d['profile_s']:.2f} | {d['sqrt']['median']:.3f} ({d['sqrt']['iqr']:.3f}, "
        f"{d['sqrt']['max'] - d['sqrt']['min']:.3f}) | {d['optimal']['median']:.3f} ({d['optimal']['iqr']:.3f}, "
        f"{d['optimal']['max'] - d['optimal']['min']:.3f}) |"
        for name, r in _with(results, "noise")
        for k, d in r["noise"].items()
    ]
    compiled_rows = [
        f"| {name} | {r['compiled']['budget']} | {caches} | {c['compile_s']:.1f} | {c['plan_s']:.1f} "
        f"({c['plan_compiles']:.1f}) | {_stages(c['stages_s'], '; ')} |"
        for name, r in _with(results, "compiled")
        for caches, c in ((k, r["compiled"][k]) for k in ("cold", "warm"))
    ]
    compiled_part = [
        "## Under compile: `memsave.plan(..., compile=True)`",
        "",
        "One `torch.compile` of a copy of the model and its first step, and the compiled plan (in brackets: its "
        "time over that compile's), with the seconds of each stage; each in a fresh process with inductor's cache "
        "of its own, empty (cold), then as the cold run left it (warm).",
        "",
        "| model | budget | caches | one compile + first step s | plan s (compiles) | stages, s |",
        "|---|---|---|---|---|---|",
        *compiled_rows,
        "",
    ]
    return "\n".join(
        [
            "# How long `memsave.plan` takes (CPU)",
            "",
            f"`{meta['command']}` on {meta['cpu']} ({meta['threads']} threads), torch {meta['torch']}, memsave "
            f"{meta['memsave_version']} ({harness.commit_text(meta)}), {meta['date']}; load average "
            f"{harness.load_text(meta['load_average_start'])} at the start, "
            f"{harness.load_text(meta['load_average_end'])} at the end; {meta['minutes']:.1f} minutes. What is "
            "measured: the docstring of benchmarks/planning_time.py.",
            "",
            "## Planning time: `memsave.plan(..., budget=0.6, cache=False)`, default timing steps",
            "",
            "Seconds, and in brackets eager steps (over the median plain step). First plan: on the freshly built "
            f"model, the selective-overhead probe included; later plans: the median of {meta['plans'] - 1}.",
            "",
            "| model | eager step s | first plan s (steps) | later plans s (steps) | first plan's stages, s |",
            "|---|---|---|---|---|",
            *plan_rows,
            "",
            "## Timing steps against prediction noise",
            "",
            f"{meta['rounds']} interleaved rounds per timing-step count. Predicted overhead: recompute time over "
            "eager's step, as the cost model predicts it (not measured); median (IQR, max - min) over rounds.",
            "",
            "| model | timing steps | profile s | sqrt(N) plan | optimal plan @ 0.6 |",
            "|---|---|---|---|---|",
            *noise_rows,
            "",
            *(compiled_part if compiled_rows else []),
        ]
    )


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the benchmark (see the module docstring); returns the exit status."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    p.add_argument("--plans", type=int, default=3, help="plans per model (default 3; the first on a fresh model)")
    p.add_argument("--steps", type=int, default=7, help="plain steps timed for eager's step (default 7)")
    p.add_argument("--rounds", type=int, default=6, help="interleaved rounds per timing-step count (default 6)")
    p.add_argument("--threads", type=int, default=2, help="torch threads (default 2, as the frontier's run)")
    p.add_argument("--compile-models", nargs="*", default=[], choices=MODELS, help="also plan these with compile=True")
    p.add_argument("--compile-budget", type=float, default=0.8, help="their budget (default 0.8 of eager's peak)")
    p.add_argument("--compiled-child", nargs=2, metavar=("MODEL", "WHAT"), help=argparse.SUPPRESS)
    harness.output_arguments(p, SCRIPT, rewritten=None)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.compiled_child:
        print(json.dumps(compiled_child(*args.compiled_child, args.compile_budget)))
        return 0
    clock = harness.RunClock()
    results: Dict[str, Dict[str, Any]] = {}
    for name in args.models:
        results[name] = dict(plans=planning_rows(name, args.plans, args.steps))
        if args.rounds > 0:
            results[name]["noise"] = prediction_noise(name, args.rounds)
        print(f"{name} done after {clock.minutes():.1f} min", flush=True)
    for name in args.compile_models:
        results.setdefault(name, {})["compiled"] = compiled_row(name, args.compile_budget, args.threads)
        print(f"{name} compiled done after {clock.minutes():.1f} min", flush=True)
    print("\n".join(text_lines(results)))
    options = dict(plans=args.plans, steps=args.steps, rounds=args.rounds)
    harness.finish_run(SCRIPT, args, argv, clock, dict(results=results), lambda m: markdown(m, results), **options)
    return 0


if __name__ == "__main__":
    sys.exit(main())
