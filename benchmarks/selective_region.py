"""What one selective region costs against a whole one (why CPU time follows FLOPs only partly):
one Hugging Face GPT-2 block (``real_models.py``'s GPT-2: d 256, 4 heads, 4 x 256 tokens, float32), stepped

* ``eager``: the block;
* ``whole``: ``memsave.checkpoint(block, x)``: everything recomputed in backward;
* ``selective``: ``memsave.checkpoint(block, x, context_fn=memsave.selective("matmul", "attention"))``: the matrix
  products' and attention's outputs kept, the rest (layer norms, GELU, dropout, residual adds, reshapes) recomputed.

Columns: the median of ``--repeats`` interleaved (A B C C B A ...) forward+backward steps and forward-only calls
(with grad on, so a region does its forward bookkeeping), as ratios to eager's; the aten operators of one forward;
the matmul/attention FLOPs backward recomputes (torch's FLOP formulas, ``compat.count_flops``).

    python3 benchmarks/selective_region.py                 # the committed CPU run (seconds)
    python3 benchmarks/selective_region.py --no-save

Writes ``benchmarks/results/selective_region_<device>.json`` and ``.md`` with the machine, versions, commit and load.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:  # run as a script: make the `benchmarks` package importable
    sys.path.insert(0, str(HERE.parent))

import memsave
from benchmarks.harness import cpu_model, git, load_average, load_text
from benchmarks.real_models import build
from memsave.common import compat
from memsave.recompute.planning.operators import count_operators

VARIANTS = ("eager", "whole", "selective")


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the benchmark (see the module docstring); returns the exit status."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=21, help="interleaved steps per variant (default 21)")
    p.add_argument("--out", default=None, help="JSON path (default benchmarks/results/selective_region_cpu.json)")
    p.add_argument("--no-save", action="store_true")
    args = p.parse_args(argv)
    load_start = load_average()
    case = build("gpt2")
    block = case.model.transformer.h[0]
    x = torch.randn(
        4, 256, block.ln_1.normalized_shape[0], generator=torch.Generator().manual_seed(2), requires_grad=True
    )
    calls: Dict[str, Callable[[], torch.Tensor]] = {
        "eager": lambda: block(x),
        "whole": lambda: memsave.checkpoint(block, x),
        "selective": lambda: memsave.checkpoint(block, x, context_fn=memsave.selective("matmul", "attention")),
    }

    def out(v: str) -> torch.Tensor:
        y = calls[v]()
        return y[0] if isinstance(y, tuple) else y

    def step(v: str) -> None:
        block.zero_grad(set_to_none=True)
        x.grad = None
        out(v).sum().backward()

    rows: Dict[str, Dict[str, Any]] = {v: {} for v in VARIANTS}
    for v in VARIANTS:
        step(v)  # warm-up
        y = out(v)
        with compat.count_flops() as flops:
            y.sum().backward()
        rows[v]["backward_flops"] = flops.total
        rows[v]["forward_ops"] = count_operators(lambda: out(v))
    steps: Dict[str, List[float]] = {v: [] for v in VARIANTS}
    forwards: Dict[str, List[float]] = {v: [] for v in VARIANTS}
    for i in range(args.repeats):
        for v in VARIANTS if i % 2 == 0 else VARIANTS[::-1]:
            t0 = time.perf_counter()
            step(v)
            steps[v].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            y = out(v)
            forwards[v].append(time.perf_counter() - t0)
            del y
    for v in VARIANTS:
        r = rows[v]
        r.update(
            step_s=statistics.median(steps[v]),
            forward_s=statistics.median(forwards[v]),
            step_ratio=statistics.median(steps[v]) / statistics.median(steps["eager"]),
            forward_ratio=statistics.median(forwards[v]) / statistics.median(forwards["eager"]),
            recompute_flops=r["backward_flops"] - rows["eager"]["backward_flops"],
        )
    load_end = load_average()
    lines = [f"{'variant':<10} {'step':>6} {'forward':>8} {'ops':>5} {'recompute GFLOP':>16}"]
    lines += [
        f"{v:<10} {r['step_ratio']:>6.2f} {r['forward_ratio']:>8.2f} {r['forward_ops']:>5} "
        f"{r['recompute_flops'] / 1e9:>16.3f}"
        for v, r in rows.items()
    ]
    print("\n".join(lines))
    print(f"load average at the start: {load_text(load_start)}, at the end: {load_text(load_end)}")
    if not args.no_save:
        path = args.out or str(HERE / "results" / "selective_region_cpu.json")
        meta = dict(
            torch=torch.__version__,
            memsave_version=memsave.__version__,
            cpu=cpu_model(),
            threads=torch.get_num_threads(),
            git_commit=git("rev-parse", "--short", "HEAD"),
            load_average_start=load_start,
            load_average_end=load_end,
            repeats=args.repeats,
            date=time.strftime("%Y-%m-%d %H:%M:%S"),
            block="GPT2Block of GPT2LMHeadModel(n_layer=6, n_embd=256, n_head=4), x: 4 x 256 x 256 float32",
        )
        with open(path, "w") as f:
            json.dump(dict(meta=meta, rows=rows), f, indent=2)
        md = [
            "# One selective region against a whole one (a GPT-2 block, CPU)",
            "",
            f"`python3 benchmarks/selective_region.py` on {meta['cpu']} ({meta['threads']} threads), torch "
            f"{meta['torch']}, memsave {meta['memsave_version']} (commit {meta['git_commit']}), {meta['date']}; load "
            f"average {load_text(load_start)} -> {load_text(load_end)}. {meta['block']}. Step: forward + backward; "
            f"forward: with grad on. Medians of {args.repeats} interleaved runs as ratios to eager's.",
            "",
            "| variant | step / eager | forward / eager | aten ops in forward | matmul/attention GFLOP recomputed |",
            "|---|---|---|---|---|",
            *(
                f"| {v} | {r['step_ratio']:.2f} | {r['forward_ratio']:.2f} | {r['forward_ops']} | "
                f"{r['recompute_flops'] / 1e9:.3f} |"
                for v, r in rows.items()
            ),
            "",
        ]
        with open(os.path.splitext(path)[0] + ".md", "w") as f:
            f.write("\n".join(md))
        print(f"wrote {path} and its .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
