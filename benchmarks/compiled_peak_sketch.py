"""Can a compiled program's peak be known without compiling it with inductor? Its peak against two cheaper guesses.

``memsave.plan(..., compile=True)`` measures every candidate's compiled peak (each an inductor compile, 15-40 s on
two CPU cores), which makes the compiled plan several compiles long. This benchmark asks whether something cheaper
than inductor would say the same peaks, program by program, on one model of ``real_models.py`` (the frontier's
sizes). The programs: eager; torch's partitioner at budgets 0.5, 0.25 and 0.125; memsave plans (module-level, solved
on one eager profile) at 0.9, 0.7 and 0.5 of eager's peak. Each is compiled from one dynamo capture
(:class:`memsave.recompute.planning.capture.CapturedStep`) twice:

* ``inductor``: what the planner compiles; its measured peak is the truth.
* ``sketch``: AOT autograd with inductor's decompositions, inductor's joint-graph passes and partitioner (so the same
  recompute tags, kept operators and partitioner budget decide what is saved), the forward and backward graphs run
  as they are, without inductor's fusion. Its measured peak, and the bytes its forward saves for backward (the
  backward graphs' inputs other than gradients) as a second guess (``inductor - saved``: constant if peaks moved
  with the saved bytes).

Each program's first step (its compile; eager's, the first, also dynamo's capture) is timed. Inductor's cache
directory is a fresh one (cold), so compile seconds are a first plan's.

Usage::

    python3 benchmarks/compiled_peak_sketch.py                 # GPT-2; about 5 minutes on 2 cores
    python3 benchmarks/compiled_peak_sketch.py --model vit --no-save

Writes ``benchmarks/results/compiled_peak_sketch_cpu.json`` and ``.md`` with the machine, commit and load.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:  # run as a script: make the `benchmarks` package importable
    sys.path.insert(0, str(HERE.parent))

import torch

from benchmarks.harness import RunClock, commit_text, finish_run, load_text
from benchmarks.real_models import MODELS, Case, prepare
from memsave.common import compat
from memsave.measurement.allocator import step_peak_bytes
from memsave.recompute.planning import profile
from memsave.recompute.planning.capture import CapturedStep, RegionTags, region_tags

MIB = 2**20
PARTITIONER_BUDGETS = (0.5, 0.25, 0.125)
PLAN_FRACTIONS = (0.9, 0.7, 0.5)


class Sketch:
    """The ``sketch`` backend: inductor's partition of the joint graph, its graphs run by PyTorch as they are. Notes
    the bytes each backward graph takes in that are not gradients (what the forward saved)."""

    def __init__(self) -> None:
        from functorch.compile import make_boxed_func
        from torch._dynamo.backends.common import aot_autograd
        from torch._inductor.compile_fx import partition_fn
        from torch._inductor.decomposition import select_decomp_table

        self.saved: List[int] = []

        def forward(gm: torch.fx.GraphModule, _: Any) -> Any:
            return make_boxed_func(gm.forward)

        def backward(gm: torch.fx.GraphModule, _: Any) -> Any:
            self.saved.append(_saved_bytes(gm))
            return make_boxed_func(gm.forward)

        self.compile = aot_autograd(
            fw_compiler=forward, bw_compiler=backward, partition_fn=partition_fn, decompositions=select_decomp_table()
        )

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        return self.compile(gm, example_inputs)


def _saved_bytes(backward: torch.fx.GraphModule) -> int:
    """The bytes of a backward graph's tensor inputs that are not incoming gradients (``tangents_*``); a dynamic
    shape (a graph dynamo traced again with dynamic sizes) counted at its example's size."""
    total = 0
    for node in backward.graph.nodes:
        val = node.meta.get("val")
        if node.op == "placeholder" and not node.name.startswith("tangents") and isinstance(val, torch.Tensor):
            nbytes = val.numel() * val.element_size()
            total += nbytes if isinstance(nbytes, int) else nbytes.node.hint  # a dynamic shape: its example's size
    return total


def programs(case: Case) -> List[Tuple[str, RegionTags, Optional[float]]]:
    """(name, region tags, partitioner budget) of every program, plans solved on one eager profile."""
    out: List[Tuple[str, RegionTags, Optional[float]]] = [("eager", (), None)]
    out += [(f"partitioner {b:g}", (), b) for b in PARTITIONER_BUDGETS]
    prof = profile(copy.deepcopy(case.model), *case.args, loss_fn=case.loss_fn, selective=False, **case.kwargs)
    for f in PLAN_FRACTIONS:
        budget = int(f * prof.eager_peak_bytes)
        res = prof.chain.solve(budget, "optimal", 2000)
        if res["feasible"]:
            p = prof.make_plan(res, prof.chain, "optimal", budget)
            out.append((f"plan @ {f:g} ({len(p.regions())} regions)", region_tags(p), None))
    return out


def _step(case: Case, run: Callable[..., Any], params: Sequence[torch.nn.Parameter]) -> None:
    for q in params:
        q.grad = None
    case.loss_fn(run(*case.args, **case.kwargs)).backward()


def measure(
    case: Case, model: torch.nn.Module, capture: CapturedStep, tags: RegionTags, budget: Optional[float]
) -> Dict[str, float]:
    """One program of ``capture`` (of ``model``): its first step's seconds (the compile) and the next step's peak."""
    run = capture.program(tags, budget)
    params = list(model.parameters())
    t0 = time.perf_counter()
    _step(case, run, params)
    seconds = time.perf_counter() - t0
    return dict(seconds=seconds, peak_bytes=step_peak_bytes(lambda: _step(case, run, params), torch.device("cpu")))


def bench(name: str) -> Dict[str, Any]:
    """Every program of one model under both backends (see the module docstring)."""
    case = prepare(name, torch.device("cpu"), quick=False)
    sketch = Sketch()
    other = copy.deepcopy(case.model)  # a module of its own: dynamo's cache entries for it are the sketch's
    captures = {"inductor": (case.model, CapturedStep(case.model)), "sketch": (other, CapturedStep(other, sketch))}
    rows = []
    with compat.dynamo_recompile_limit(64):
        for label, tags, budget in programs(case):
            row: Dict[str, Any] = dict(program=label)
            for backend, (model, capture) in captures.items():
                before = len(sketch.saved)
                row[backend] = measure(case, model, capture, tags, budget)
                if backend == "sketch":
                    row["saved_bytes"] = sum(sketch.saved[before:])
            rows.append(row)
            print(_line(row), flush=True)
        torch._dynamo.reset()
    return dict(model=name, rows=rows, **summary(rows))


def summary(rows: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """How well each guess tracks inductor's peak: the range of sketch / inductor, of inductor - saved, and the pairs
    of programs the sketch orders the other way round."""
    ratio = [r["sketch"]["peak_bytes"] / r["inductor"]["peak_bytes"] for r in rows]
    rest = [(r["inductor"]["peak_bytes"] - r["saved_bytes"]) / MIB for r in rows]
    swapped = sum(
        (a["inductor"]["peak_bytes"] - b["inductor"]["peak_bytes"])
        * (a["sketch"]["peak_bytes"] - b["sketch"]["peak_bytes"])
        < 0
        for a, b in itertools.combinations(rows, 2)
    )
    return dict(
        ratio_min=min(ratio),
        ratio_max=max(ratio),
        rest_min_mib=min(rest),
        rest_max_mib=max(rest),
        swapped_pairs=swapped,
        pairs=len(rows) * (len(rows) - 1) // 2,
    )


def _line(r: Dict[str, Any]) -> str:
    ind, sk = r["inductor"], r["sketch"]
    return (
        f"| {r['program']} | {ind['peak_bytes'] / MIB:.1f} | {sk['peak_bytes'] / MIB:.1f} | "
        f"{sk['peak_bytes'] / ind['peak_bytes']:.3f} | {r['saved_bytes'] / MIB:.1f} | "
        f"{(ind['peak_bytes'] - r['saved_bytes']) / MIB:.1f} | {ind['seconds']:.1f} | {sk['seconds']:.1f} |"
    )


def markdown(meta: Dict[str, Any], res: Dict[str, Any]) -> str:
    """The results page."""
    lines = [
        "# A compiled program's peak against two guesses that skip inductor",
        "",
        f"`{meta['command']}` on {meta['cpu']} ({meta['threads']} threads), torch {meta['torch']}, memsave "
        f"{meta['memsave_version']} ({commit_text(meta)}), {meta['date']}; {load_text(meta['load_average_start'])} "
        f"at the start, {load_text(meta['load_average_end'])} at the end; {meta['minutes']:.1f} minutes. What is "
        "measured: the docstring of benchmarks/compiled_peak_sketch.py.",
        "",
        f"{res['model']}. Peaks in MiB above the step's start; seconds: the program's first step (its compile, "
        "inductor's cache cold; eager's includes dynamo's capture).",
        "",
        "| program | inductor peak | sketch peak | sketch / inductor | saved | inductor - saved | inductor s | "
        "sketch s |",
        "|---|---|---|---|---|---|---|---|",
        *(_line(r) for r in res["rows"]),
        "",
        f"sketch / inductor from {res['ratio_min']:.3f} to {res['ratio_max']:.3f}; inductor - saved from "
        f"{res['rest_min_mib']:.1f} to {res['rest_max_mib']:.1f} MiB; the sketch orders {res['swapped_pairs']} of "
        f"{res['pairs']} pairs of programs the other way round from inductor.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the benchmark (see the module docstring); returns the exit status."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=MODELS, default="gpt2")
    p.add_argument("--out", default=None, help="JSON path (default benchmarks/results/compiled_peak_sketch_cpu.json)")
    p.add_argument("--no-save", action="store_true")
    args = p.parse_args(argv)
    clock = RunClock()
    with tempfile.TemporaryDirectory() as cache:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache  # cold: every compile's seconds are a first plan's
        res = bench(args.model)
    finish_run("compiled_peak_sketch", args, argv, clock, res, lambda meta: markdown(meta, res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
