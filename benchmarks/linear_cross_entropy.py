"""Peak memory and forward+backward time of memsave.functional.linear_cross_entropy against the eager composition
``F.cross_entropy(F.linear(hidden, weight), target)`` at a language model's head.

Cases (``--cases``, each ``ROWSxHIDDENxCLASSES:DTYPE``; default ``DEFAULT_CASES``): the acceptance size
(1,024 x 256 x 32,000, float32) and its realistic shapes, 4,096 rows x hidden 1,024 with vocabularies of 32,000 and
128,000 (the 128,000 one at 2,048 rows on CPU: at 4,096 eager would peak near 6 GiB and take ~26 s a step on 2
cores), plus bfloat16.

Per case and variant: ``peak`` = allocator-level peak of one forward+backward above its start (CPU: the profiler's
allocation events, memsave.measurement.allocator; CUDA: max_memory_allocated), ``kept`` = bytes forward leaves
allocated (what autograd keeps for backward, plus the loss), ``time`` = median of ``--repeats`` steps; the two
variants run interleaved (A B B A ...) so that load changing during the run hits both alike, and each is reported as
a ratio to eager. ``loss diff`` and ``grad diff`` = max |memsave - eager| of the loss and of the hidden and weight
gradients (relative to eager's largest value). hidden and weight require grad; gradients are set to None before
each step; about 10% of the targets are ignore_index.

    python3 benchmarks/linear_cross_entropy.py                          # CPU, the default cases (~10 minutes)
    python3 benchmarks/linear_cross_entropy.py --cases 1024x256x32000:float32 --no-save   # the acceptance size
    python3 benchmarks/linear_cross_entropy.py --device cuda --cases 4096x1024x128000:bfloat16

    python3 benchmarks/linear_cross_entropy.py --markdown-from benchmarks/results/linear_cross_entropy_cpu.json

Writes ``benchmarks/results/linear_cross_entropy_<device>.json`` and ``.md`` with the machine, torch, memsave build,
thread count and load average (``--markdown-from`` writes the ``.md`` of an existing JSON again).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Callable, List, Tuple

import torch
import torch.nn.functional as TF

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:  # run as a script: make the `benchmarks` package importable
    sys.path.insert(0, str(HERE.parent))

import memsave.functional as MF
from benchmarks.harness import RunClock, early_exit, finish_run, interleaved_times, output_arguments, rel_diff
from memsave.measurement.allocator import cpu_memory_stats, step_peak_bytes

Step = Callable[[], None]

DEFAULT_CASES = {
    "cpu": [
        "1024x256x32000:float32",
        "4096x1024x32000:float32",
        "2048x1024x128000:float32",
        "4096x1024x32000:bfloat16",
    ],
    "cuda": [
        "1024x256x32000:float32",
        "4096x1024x32000:float32",
        "4096x1024x128000:float32",
        "4096x1024x32000:bfloat16",
        "4096x1024x128000:bfloat16",
        "16384x4096x128000:bfloat16",
    ],
}


def eager_loss(h: torch.Tensor, w: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """The composition linear_cross_entropy replaces."""
    return TF.cross_entropy(TF.linear(h, w), t)


def parse_case(spec: str) -> Tuple[int, int, int, torch.dtype]:
    """``"ROWSxHIDDENxCLASSES:DTYPE"`` -> (rows, hidden, classes, dtype)."""
    try:
        dims, dtype = spec.split(":")
        rows, hidden, classes = (int(v) for v in dims.split("x"))
        return rows, hidden, classes, getattr(torch, dtype)
    except (ValueError, AttributeError) as e:
        raise SystemExit(f"linear_cross_entropy: bad case {spec!r}, expected ROWSxHIDDENxCLASSES:DTYPE") from e


def make_inputs(rows: int, hidden: int, classes: int, dtype: torch.dtype, device: torch.device):
    g = torch.Generator().manual_seed(0)
    h = torch.randn(rows, hidden, generator=g).to(device, dtype).requires_grad_()
    w = (torch.randn(classes, hidden, generator=g) / hidden**0.5).to(device, dtype).requires_grad_()
    t = torch.randint(0, classes, (rows,), generator=g)
    t[torch.rand(rows, generator=g) < 0.1] = -100
    return h, w, t.to(device)


def make_step(fn, h: torch.Tensor, w: torch.Tensor, t: torch.Tensor) -> Step:
    def step() -> None:
        h.grad = w.grad = None
        fn(h, w, t).backward()

    return step


def kept_bytes(fn, h: torch.Tensor, w: torch.Tensor, t: torch.Tensor, device: torch.device) -> int:
    """Bytes forward leaves allocated: autograd's saved tensors plus the loss."""
    if device.type == "cuda":
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        loss = fn(h, w, t)
        torch.cuda.synchronize()
        kept = torch.cuda.memory_allocated() - before
        del loss
        return kept
    return cpu_memory_stats(lambda: fn(h, w, t)).net_bytes


def bench_case(
    rows: int,
    hidden: int,
    classes: int,
    dtype: torch.dtype,
    device: torch.device,
    repeats: int,
    log: Callable[[str], None],
) -> dict:
    h, w, t = make_inputs(rows, hidden, classes, dtype, device)
    fns = {"eager": eager_loss, "memsave": MF.linear_cross_entropy}
    steps = {name: make_step(fn, h, w, t) for name, fn in fns.items()}
    row: dict = {}
    results = {}
    for name, fn in fns.items():
        h.grad = w.grad = None
        loss = fn(h, w, t)
        loss.backward()  # warm-up (and first-call allocations), and the values compared below
        results[name] = (loss.detach(), h.grad.detach().clone(), w.grad.detach().clone())
        h.grad = w.grad = None
        row[f"{name}_peak_bytes"] = step_peak_bytes(steps[name], device)
        h.grad = w.grad = None
        row[f"{name}_kept_bytes"] = kept_bytes(fn, h, w, t, device)
        log(f"  {name}: peak {row[f'{name}_peak_bytes'] / 2**20:.1f} MiB")
    row["loss_rel_diff"] = rel_diff(results["memsave"][0], results["eager"][0])
    row["grad_hidden_rel_diff"] = rel_diff(results["memsave"][1], results["eager"][1])
    row["grad_weight_rel_diff"] = rel_diff(results["memsave"][2], results["eager"][2])
    del results
    times = interleaved_times(steps, repeats, device)  # A B B A ...
    h.grad = w.grad = None
    for name in ("eager", "memsave"):
        row[f"{name}_s"] = statistics.median(times[name])
        row[f"{name}_times_s"] = times[name]
    row["peak_ratio"] = row["memsave_peak_bytes"] / row["eager_peak_bytes"]
    row["kept_ratio"] = row["memsave_kept_bytes"] / row["eager_kept_bytes"]
    row["time_ratio"] = row["memsave_s"] / row["eager_s"]
    return row


HEADER = (
    f"{'case':<26} {'eager peak':>11} {'memsave':>10} {'ratio':>6} {'eager kept':>11} {'memsave':>10} "
    f"{'ratio':>7} {'eager s':>8} {'memsave':>8} {'ratio':>6} {'loss diff':>9} {'grad diff':>9}"
)


def format_row(r: dict) -> str:
    mib = 2.0**20
    return (
        f"{r['case']:<26} {r['eager_peak_bytes'] / mib:>9.1f}Mi {r['memsave_peak_bytes'] / mib:>8.1f}Mi "
        f"{r['peak_ratio']:>6.3f} {r['eager_kept_bytes'] / mib:>9.1f}Mi {r['memsave_kept_bytes'] / mib:>8.3f}Mi "
        f"{r['kept_ratio']:>7.5f} {r['eager_s']:>8.3f} {r['memsave_s']:>8.3f} {r['time_ratio']:>6.2f} "
        f"{r['loss_rel_diff']:>9.1e} {max(r['grad_hidden_rel_diff'], r['grad_weight_rel_diff']):>9.1e}"
    )


def markdown(meta: dict, rows: List[dict]) -> str:
    mib = 2.0**20
    lines = [
        "# linear_cross_entropy vs F.cross_entropy(F.linear(...)), forward+backward",
        "",
        f"`{meta['command']}` on {meta['device']} ({meta['cpu']}, {meta['threads']} threads), torch {meta['torch']}, "
        f"{meta['date']}; load average at the end {meta['load_average_end']}. Median of {meta['repeats']} "
        "interleaved steps. Peak: allocator-level, above the step's start. Kept: bytes alive after forward. "
        "Diffs: max |memsave - eager| / max |eager| of the loss and of the hidden/weight gradients; for bfloat16 they "
        "are mostly eager's own error (its logits and log-softmax are bfloat16, memsave computes them in float32; "
        "tests/operators/test_linear_cross_entropy.py holds both to a float64 reference). CPU: the 128,000-class case "
        "runs at 2,048 rows (at 4,096 eager would peak near 6 GiB and take ~26 s a step on 2 cores).",
        "",
        "| rows x hidden x classes, dtype | eager peak | memsave peak | ratio | eager kept | memsave kept | "
        "eager step s | memsave step s | time ratio | loss diff | grad diff |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['case']} | {r['eager_peak_bytes'] / mib:.1f} MiB | {r['memsave_peak_bytes'] / mib:.1f} MiB | "
            f"{r['peak_ratio']:.3f} | {r['eager_kept_bytes'] / mib:.1f} MiB | "
            f"{r['memsave_kept_bytes'] / 1024:.1f} KiB | "
            f"{r['eager_s']:.3f} | {r['memsave_s']:.3f} | {r['time_ratio']:.2f} | {r['loss_rel_diff']:.1e} | "
            f"{max(r['grad_hidden_rel_diff'], r['grad_weight_rel_diff']):.1e} |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--cases", nargs="+", default=None, help="ROWSxHIDDENxCLASSES:DTYPE ... (default: DEFAULT_CASES)")
    p.add_argument("--repeats", type=int, default=6)
    output_arguments(p, "linear_cross_entropy")
    args = p.parse_args(argv)
    clock = RunClock()
    status = early_exit("linear_cross_entropy", args, markdown, "rows")
    if status is not None:
        return status
    device = torch.device(args.device)
    specs = args.cases or DEFAULT_CASES[args.device]
    print(
        f"forward+backward of the loss head on {args.device} ({torch.get_num_threads()} threads), median of "
        f"{args.repeats} interleaved steps; ratios memsave / eager",
        flush=True,
    )
    rows = []
    for spec in specs:
        n, hdim, v, dtype = parse_case(spec)
        print(f"{spec} ...", flush=True)
        r = bench_case(n, hdim, v, dtype, device, args.repeats, log=lambda s: print(s, flush=True))
        rows.append(dict(case=spec, rows=n, hidden=hdim, classes=v, dtype=str(dtype).replace("torch.", ""), **r))
    print(HEADER)
    for r in rows:
        print(format_row(r))
    finish_run(
        "linear_cross_entropy", args, argv, clock, dict(rows=rows), lambda m: markdown(m, rows), repeats=args.repeats
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
