"""What torch's early stop saves, against what the planner's tails predict it saves.

torch's checkpoint stops a recompute once it has rebuilt the last tensor its region saved for backward; the
operators after it in the region (its *tail*: in a transformer block the last projection and the residual sum) are
not run again. memsave's time model charges a segment's recompute its stages' forward time less its last stage's
tail (``planner::Stage::tail_time``, measured in the planner's timing steps). This benchmark checks that number
against the clock, per model of ``real_models.py`` (the frontier's sizes):

* ``eager``; ``torch blocks``: ``torch.utils.checkpoint`` around every block (early stop on, torch's default);
  ``torch blocks, no early stop``: the same under ``torch.utils.checkpoint.set_checkpoint_early_stop(False)``.
* ``saved``: measured (no early stop - early stop) as a fraction of eager's step, from medians of interleaved steps
  (A B C C B A ...); ``predicted``: the blocks' tails over eager's step, from one ``memsave.recompute.planning.
  profile`` of the model (the same profile a plan makes); the blocks' forward time beside it.

Usage::

    python3 benchmarks/early_stop.py                      # GPT-2, Llama, ViT-tiny, ResNet-50; a few minutes on 2 cores
    python3 benchmarks/early_stop.py --models gpt2 --repeats 5 --no-save

Writes ``benchmarks/results/early_stop_<device>.json`` and ``.md`` with the machine, commit and load.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import statistics
import sys
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:  # run as a script: make the `benchmarks` package importable
    sys.path.insert(0, str(HERE.parent))

from torch.utils.checkpoint import set_checkpoint_early_stop

from benchmarks.harness import (
    RunClock,
    commit_text,
    default_out,
    interleaved_times,
    load_text,
    run_record,
    write_results,
)
from benchmarks.real_models import MODELS, Case, build, torch_checkpoint_blocks
from memsave.recompute.planning import profile

VARIANTS = ("eager", "torch blocks", "torch blocks, no early stop")


def _predicted(case: Case, blocks: Sequence[str]) -> Dict[str, float]:
    """The blocks' forward time and tails over eager's step, from one profile of a copy of the model."""
    prof = profile(copy.deepcopy(case.model), *case.args, loss_fn=case.loss_fn, **case.kwargs)
    eager = prof.chain.eager_seconds()
    inside = [st for st, sm in zip(prof.chain.stages, prof.stages) if sm.modules and sm.modules[0] in blocks]
    return {
        "blocks_fwd": sum(st.fwd_time for st in inside) / eager,
        "predicted": sum(st.tail_time for st in inside) / eager,
    }


def bench_model(name: str, repeats: int) -> Dict[str, Any]:
    """One model's row: measured and predicted savings of early stop (see the module docstring)."""
    case = build(name)
    checkpointed = copy.deepcopy(case.model)
    blocks = torch_checkpoint_blocks(checkpointed)
    runs: Dict[str, Any] = {
        "eager": (case.model, contextlib.nullcontext),
        "torch blocks": (checkpointed, contextlib.nullcontext),
        "torch blocks, no early stop": (checkpointed, lambda: set_checkpoint_early_stop(False)),
    }

    def step(model: Any, context: Callable[[], Any]) -> Callable[[], None]:
        def run() -> None:
            for p in model.parameters():
                p.grad = None
            with context():
                case.loss_fn(model(*case.args, **case.kwargs)).backward()

        return run

    steps = {v: step(*runs[v]) for v in VARIANTS}
    for run in steps.values():
        run()  # warm-up
    times = interleaved_times(steps, repeats, "cpu")
    eager = statistics.median(times["eager"])
    ratio = {v: statistics.median(times[v]) / eager for v in VARIANTS}
    row = {"model": name, "blocks": len(blocks), "eager_step_s": eager, "time_ratio": ratio}
    row.update(_predicted(case, blocks))
    row["saved"] = ratio["torch blocks, no early stop"] - ratio["torch blocks"]
    return row


def markdown(meta: Dict[str, Any], rows: List[Dict[str, Any]]) -> str:
    """The results page."""
    lines = [
        "# What torch's early stop saves, measured and as the planner's tails predict it",
        "",
        f"`{meta['command']}` on {meta['cpu']} ({meta['threads']} threads), torch {meta['torch']}, memsave "
        f"{meta['memsave_version']} ({commit_text(meta)}), {meta['date']}; {load_text(meta['load_average_start'])} "
        f"at the start, {load_text(meta['load_average_end'])} at the end; {meta['minutes']:.1f} minutes, "
        f"{meta['repeats']} interleaved steps a variant. What is measured: the docstring of benchmarks/early_stop.py.",
        "",
        "Times over eager's median step. saved: no early stop - early stop (measured); predicted: the blocks' tails.",
        "",
        "| model | blocks | eager step s | torch blocks | no early stop | saved | predicted | blocks' forward |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        t = r["time_ratio"]
        lines.append(
            f"| {r['model']} | {r['blocks']} | {r['eager_step_s']:.3f} | {t['torch blocks']:.3f} | "
            f"{t['torch blocks, no early stop']:.3f} | {r['saved']:.3f} | {r['predicted']:.3f} | "
            f"{r['blocks_fwd']:.3f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the benchmark (see the module docstring); returns the exit status."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    p.add_argument("--repeats", type=int, default=11, help="interleaved steps per variant (default 11)")
    p.add_argument("--out", default=None, help="JSON path (default benchmarks/results/early_stop_cpu.json)")
    p.add_argument("--no-save", action="store_true")
    args = p.parse_args(argv)
    clock = RunClock()
    rows = [bench_model(name, args.repeats) for name in args.models]
    meta = run_record("early_stop", "cpu", argv, clock, repeats=args.repeats)
    text = markdown(meta, rows)
    print(text)
    if not args.no_save:
        write_results(args.out or default_out("early_stop", "cpu"), meta, {"results": rows}, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
