"""Peak memory, forward+backward time and gradient error of memsave.functional.linear_cross_entropy against the eager
composition ``F.cross_entropy(F.linear(hidden, weight), target)`` and against torch's own fused
``F.linear_cross_entropy`` (torch >= 2.15), at a language model's head.

Variants (``VARIANTS``), each ``loss(hidden, weight, target)`` with mean reduction and ignore_index -100:

=================  ===============================================================================================
eager              ``F.cross_entropy(F.linear(h, w), t)``: builds the ``[rows, classes]`` logits and keeps them
memsave            ``memsave.functional.linear_cross_entropy(h, w, t)``
torch              ``F.linear_cross_entropy(h, w, t, ignore_index=-100)`` (``options=None``: torch's reference path)
torch chunked      the same with ``options=torch.nn.LinearCrossEntropyOptions()``: torch's chunked path, which never
                   builds the whole logits (it computes the gradients in forward, by row chunks)
=================  ===============================================================================================

The two torch variants appear only where this torch has ``F.linear_cross_entropy``
(``memsave.common.compat.native_linear_cross_entropy``).

Cases (``--cases``, each ``ROWSxHIDDENxCLASSES:DTYPE``; default ``DEFAULT_CASES``): the acceptance size
(1,024 x 256 x 32,000) and two large-vocabulary heads, 4,096 x 512 x 128,000 and 8,192 x 1,024 x 128,000, all
float32 on CPU (eager peaks near 12 GiB at the last one and takes roughly a minute a step on 2 cores); on CUDA also in
bfloat16, and 16,384 x 4,096 x 128,000 in bfloat16.

Per case and variant: ``peak`` = allocator-level peak of one forward+backward above its start (CPU: the profiler's
allocation events, memsave.measurement.allocator; CUDA: max_memory_allocated), ``kept`` = bytes forward leaves
allocated (what autograd keeps for backward, plus the loss), ``time`` = median of ``--repeats`` steps; all variants
run interleaved (A B C D, D C B A, ...) so that load changing during the run hits all alike, and each is reported as
a ratio to eager. ``loss err``, ``dh err``, ``dW err`` = max |variant - ref| / max |ref| of the loss and of the
hidden and weight gradients, where ref is the eager composition in float64 on float64 copies of the inputs, computed
once per case (by row chunks, so that its float64 logits stay under 256 MiB; the sum over the chunks divided by the
number of targets that are not ignored is the mean cross entropy). Eager has an error too: the column shows each
variant's error beside PyTorch's own eager op. hidden and weight require grad; gradients are set to None before each
step; about 10% of the targets are ignore_index. The first call of each variant (warm-up) gives the errors, and the
warnings it raised are recorded (torch's chunked path warns when it falls back to its reference path).

Verdict per case: memsave's peak <= torch chunked's peak AND memsave's time ratio <= torch chunked's time ratio +
``TIME_TOLERANCE`` (0.02, for timing noise: the ratios are medians of interleaved steps on a shared machine).

    python3 benchmarks/linear_cross_entropy.py                          # CPU, the default cases (~45 minutes)
    python3 benchmarks/linear_cross_entropy.py --cases 1024x256x32000:float32 --no-save   # the acceptance size
    python3 benchmarks/linear_cross_entropy.py --device cuda --cases 8192x1024x128000:bfloat16

    python3 benchmarks/linear_cross_entropy.py --markdown-from benchmarks/results/linear_cross_entropy_cpu.json

Writes ``benchmarks/results/linear_cross_entropy_<device>.json`` and ``.md`` with the machine, torch, memsave build,
thread count and load average at the start and the end (``--markdown-from`` writes the ``.md`` of an existing JSON
again).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import warnings
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as TF

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:  # run as a script: make the `benchmarks` package importable
    sys.path.insert(0, str(HERE.parent))

import memsave.functional as MF
from benchmarks.harness import (
    RunClock,
    early_exit,
    finish_run,
    interleaved_times,
    load_text,
    output_arguments,
    rel_diff,
)
from memsave.common import compat
from memsave.measurement.allocator import cpu_memory_stats, step_peak_bytes

Step = Callable[[], None]
Loss = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]

IGNORE_INDEX = -100
#: Slack on the time-ratio comparison of the verdict (timing noise of interleaved medians).
TIME_TOLERANCE = 0.02
#: Variant key (in the JSON) -> its name in the tables, in the order they run.
VARIANTS = {"eager": "eager", "memsave": "memsave", "torch": "torch", "torch_chunked": "torch chunked"}
#: Largest float64 logits chunk of the reference.
REFERENCE_CHUNK_BYTES = 2**28

DEFAULT_CASES = {
    "cpu": [
        "1024x256x32000:float32",
        "4096x512x128000:float32",
        "8192x1024x128000:float32",
    ],
    "cuda": [
        "1024x256x32000:float32",
        "4096x512x128000:float32",
        "8192x1024x128000:float32",
        "4096x512x128000:bfloat16",
        "8192x1024x128000:bfloat16",
        "16384x4096x128000:bfloat16",
    ],
}


def eager_loss(h: torch.Tensor, w: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """The composition linear_cross_entropy replaces."""
    return TF.cross_entropy(TF.linear(h, w), t, ignore_index=IGNORE_INDEX)


def memsave_loss(h: torch.Tensor, w: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    return MF.linear_cross_entropy(h, w, t, ignore_index=IGNORE_INDEX)


def variant_losses(only: Optional[Sequence[str]] = None) -> Dict[str, Loss]:
    """The variants this torch has, by key of :data:`VARIANTS`: eager and memsave always, torch's two where it has
    ``F.linear_cross_entropy`` (and, for the chunked one, ``torch.nn.LinearCrossEntropyOptions``); with ``only``,
    just those and eager (the ratios' denominator)."""
    fns: Dict[str, Loss] = {"eager": eager_loss, "memsave": memsave_loss}
    native = compat.native_linear_cross_entropy()
    if native is not None:
        fns["torch"] = lambda h, w, t: native(h, w, t, ignore_index=IGNORE_INDEX)
        options_cls = getattr(torch.nn, "LinearCrossEntropyOptions", None)
        if options_cls is not None:
            options = options_cls()
            fns["torch_chunked"] = lambda h, w, t: native(h, w, t, ignore_index=IGNORE_INDEX, options=options)
    if only is None:
        return fns
    return {name: fn for name, fn in fns.items() if name == "eager" or name in only}


def chunked_options_text(rows: int, hidden: int, classes: int, dtype: torch.dtype, device: torch.device) -> str:
    """What ``LinearCrossEntropyOptions()`` resolves to at this case (chunk rows, accumulation policy and dtype), for
    the record; it reads the options' private ``_adjust``, so any failure gives ``"n/a"``."""
    try:
        o = torch.nn.LinearCrossEntropyOptions()._adjust(rows, hidden, classes, dtype, device)
        return f"batch_chunk_size={o.batch_chunk_size}, acc_policy={o.acc_policy}, acc_dtype={o.acc_dtype}"
    except Exception:  # informational only: a torch whose private _adjust differs
        return "n/a"


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
    t[torch.rand(rows, generator=g) < 0.1] = IGNORE_INDEX
    return h, w, t.to(device)


def reference(h: torch.Tensor, w: torch.Tensor, t: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The eager composition in float64 on float64 copies of the inputs: (loss, hidden grad, weight grad).

    Row chunks whose float64 logits fit :data:`REFERENCE_CHUNK_BYTES`; each adds its summed loss divided by the number
    of targets that are not ignored (the mean cross entropy's divisor), so the sum is the mean and the gradients
    accumulate to the whole batch's.
    """
    h64 = h.detach().double().requires_grad_()
    w64 = w.detach().double().requires_grad_()
    count = int((t != IGNORE_INDEX).sum())
    step = max(1, REFERENCE_CHUNK_BYTES // (w.shape[0] * 8))
    total = torch.zeros((), dtype=torch.float64, device=h.device)
    for i in range(0, h.shape[0], step):
        part = TF.cross_entropy(
            TF.linear(h64[i : i + step], w64), t[i : i + step], ignore_index=IGNORE_INDEX, reduction="sum"
        ) / max(count, 1)
        part.backward()
        total += part.detach()
    return total, h64.grad, w64.grad


def make_step(fn: Loss, h: torch.Tensor, w: torch.Tensor, t: torch.Tensor) -> Step:
    def step() -> None:
        h.grad = w.grad = None
        fn(h, w, t).backward()

    return step


def kept_bytes(fn: Loss, h: torch.Tensor, w: torch.Tensor, t: torch.Tensor, device: torch.device) -> int:
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


def verdict(row: dict) -> None:
    """Add the verdict fields to ``row``: is memsave's peak <= torch chunked's and its time ratio <= torch
    chunked's + :data:`TIME_TOLERANCE`? (None where this torch has no chunked variant.)"""
    row["verdict_time_tolerance"] = TIME_TOLERANCE
    if "torch_chunked" not in row["variants"]:
        row["verdict_peak_ok"] = row["verdict_time_ok"] = row["verdict"] = None
        return
    row["verdict_peak_ok"] = row["memsave_peak_bytes"] <= row["torch_chunked_peak_bytes"]
    row["verdict_time_ok"] = row["memsave_time_ratio"] <= row["torch_chunked_time_ratio"] + TIME_TOLERANCE
    row["verdict"] = row["verdict_peak_ok"] and row["verdict_time_ok"]


def bench_case(
    rows: int,
    hidden: int,
    classes: int,
    dtype: torch.dtype,
    device: torch.device,
    repeats: int,
    log: Callable[[str], None],
    only: Optional[Sequence[str]] = None,
) -> dict:
    h, w, t = make_inputs(rows, hidden, classes, dtype, device)
    ref_loss, ref_h, ref_w = reference(h, w, t)
    fns = variant_losses(only)
    steps = {name: make_step(fn, h, w, t) for name, fn in fns.items()}
    row: dict = dict(variants=list(fns))
    if "torch_chunked" in fns:
        row["torch_chunked_options"] = chunked_options_text(rows, hidden, classes, dtype, device)
    for name, fn in fns.items():
        h.grad = w.grad = None
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loss = fn(h, w, t)
            loss.backward()  # warm-up (and first-call allocations), and the errors below
        row[f"{name}_warnings"] = sorted({f"{c.category.__name__}: {c.message}" for c in caught})
        row[f"{name}_loss_err"] = rel_diff(loss, ref_loss)
        row[f"{name}_grad_hidden_err"] = rel_diff(h.grad, ref_h)
        row[f"{name}_grad_weight_err"] = rel_diff(w.grad, ref_w)
        del loss
        h.grad = w.grad = None
        row[f"{name}_peak_bytes"] = step_peak_bytes(steps[name], device)
        h.grad = w.grad = None
        row[f"{name}_kept_bytes"] = kept_bytes(fn, h, w, t, device)
        log(
            f"  {VARIANTS[name]}: peak {row[f'{name}_peak_bytes'] / 2**20:.1f} MiB, errors "
            f"{row[f'{name}_loss_err']:.1e} / {row[f'{name}_grad_hidden_err']:.1e} / "
            f"{row[f'{name}_grad_weight_err']:.1e}" + "".join(f"\n    warning: {m}" for m in row[f"{name}_warnings"])
        )
    del ref_loss, ref_h, ref_w
    times = interleaved_times(steps, repeats, device)  # A B C D, D C B A, ...
    h.grad = w.grad = None
    for name in fns:
        row[f"{name}_s"] = statistics.median(times[name])
        row[f"{name}_times_s"] = times[name]
    for name in fns:
        row[f"{name}_peak_ratio"] = row[f"{name}_peak_bytes"] / row["eager_peak_bytes"]
        row[f"{name}_time_ratio"] = row[f"{name}_s"] / row["eager_s"]
    verdict(row)
    return row


def fmt_bytes(n: Optional[float]) -> str:
    if n is None:
        return "n/a"
    return f"{n / 2**20:.1f} MiB" if abs(n) >= 2**20 else f"{n / 1024:.1f} KiB"


def verdict_text(r: dict) -> str:
    """The verdict of a row in words."""
    if r.get("verdict") is None:
        return "no torch chunked variant in this torch"
    peak = "<=" if r["verdict_peak_ok"] else ">"
    time = "<=" if r["verdict_time_ok"] else ">"
    answer = "yes" if r["verdict"] else "no"
    return (
        f"{answer}: memsave peak {fmt_bytes(r['memsave_peak_bytes'])} {peak} torch chunked "
        f"{fmt_bytes(r['torch_chunked_peak_bytes'])}; time ratio {r['memsave_time_ratio']:.2f} {time} "
        f"{r['torch_chunked_time_ratio']:.2f} + {r['verdict_time_tolerance']:.2f}"
    )


HEADER = (
    f"{'case':<26} {'variant':<14} {'peak':>11} {'/eager':>7} {'kept':>11} {'step s':>8} {'/eager':>7} "
    f"{'loss err':>9} {'dh err':>9} {'dW err':>9}"
)


def format_rows(r: dict) -> List[str]:
    """The printed lines of one case: a line per variant, then the verdict."""
    lines = []
    for i, name in enumerate(r["variants"]):
        lines.append(
            f"{r['case'] if i == 0 else '':<26} {VARIANTS[name]:<14} {fmt_bytes(r[f'{name}_peak_bytes']):>11} "
            f"{r[f'{name}_peak_ratio']:>7.3f} {fmt_bytes(r[f'{name}_kept_bytes']):>11} {r[f'{name}_s']:>8.3f} "
            f"{r[f'{name}_time_ratio']:>7.2f} {r[f'{name}_loss_err']:>9.1e} {r[f'{name}_grad_hidden_err']:>9.1e} "
            f"{r[f'{name}_grad_weight_err']:>9.1e}"
        )
    lines.append(f"{'':<26} verdict: {verdict_text(r)}")
    if r.get("torch_chunked_options"):
        lines.append(f"{'':<26} torch chunked resolved to {r['torch_chunked_options']}")
    return lines


def markdown(meta: dict, rows: List[dict]) -> str:
    lines = [
        "# linear_cross_entropy: memsave vs eager F.cross_entropy(F.linear(...)) vs torch's F.linear_cross_entropy, "
        "forward+backward",
        "",
        f"`{meta['command']}` on {meta['device']} ({meta.get('gpu', meta['cpu'])}, {meta['threads']} threads), torch "
        f"{meta['torch']}, {meta['date']}; load average (1 / 5 / 15 min) at the start "
        f"{load_text(meta.get('load_average_start'))}, at the end {load_text(meta.get('load_average_end'))}. Median "
        f"of {meta['repeats']} interleaved steps (all variants, A B C D, D C B A, ...). Peak: allocator-level, above "
        "the step's start. Kept: bytes alive after forward. Errors: max |variant - ref| / max |ref| of the loss and of "
        "the hidden (dh) and weight (dW) gradients, ref = the eager composition in float64 on float64 copies of the "
        "inputs. torch = `F.linear_cross_entropy(..., ignore_index=-100)` (options=None, its reference path); torch "
        "chunked = the same with `options=torch.nn.LinearCrossEntropyOptions()`.",
        "",
        "| rows x hidden x classes, dtype | variant | peak | peak / eager | kept | step s | time / eager | loss err | "
        "dh err | dW err |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        for name in r.get("variants", []):
            lines.append(
                f"| {r['case']} | {VARIANTS.get(name, name)} | {fmt_bytes(r[f'{name}_peak_bytes'])} | "
                f"{r[f'{name}_peak_ratio']:.3f} | {fmt_bytes(r[f'{name}_kept_bytes'])} | {r[f'{name}_s']:.3f} | "
                f"{r[f'{name}_time_ratio']:.2f} | {r[f'{name}_loss_err']:.1e} | {r[f'{name}_grad_hidden_err']:.1e} | "
                f"{r[f'{name}_grad_weight_err']:.1e} |"
            )
    lines += [
        "",
        f"Verdict: is memsave's peak <= torch chunked's peak AND memsave's time ratio <= torch chunked's time ratio + "
        f"{TIME_TOLERANCE:.2f} (the slack is for timing noise)?",
        "",
        "| rows x hidden x classes, dtype | verdict | torch chunked resolved to | warnings |",
        "|---|---|---|---|",
    ]
    for r in rows:
        warned = "; ".join(
            f"{VARIANTS.get(name, name)}: {m}" for name in r.get("variants", []) for m in r.get(f"{name}_warnings", [])
        )
        lines.append(
            f"| {r['case']} | {verdict_text(r)} | {r.get('torch_chunked_options', 'n/a')} | {warned or 'none'} |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--cases", nargs="+", default=None, help="ROWSxHIDDENxCLASSES:DTYPE ... (default: DEFAULT_CASES)")
    p.add_argument("--repeats", type=int, default=6)
    p.add_argument(
        "--variants",
        nargs="+",
        choices=[k for k in VARIANTS if k != "eager"],
        default=None,
        help="only these variants beside eager (default: all this torch has)",
    )
    output_arguments(p, "linear_cross_entropy")
    args = p.parse_args(argv)
    clock = RunClock()
    status = early_exit("linear_cross_entropy", args, markdown, "rows")
    if status is not None:
        return status
    device = torch.device(args.device)
    specs = args.cases or DEFAULT_CASES[args.device]
    names = ", ".join(VARIANTS[k] for k in variant_losses(args.variants))
    print(
        f"forward+backward of the loss head on {args.device} ({torch.get_num_threads()} threads, load average "
        f"{load_text(clock.load_start)}), torch {torch.__version__}; variants {names}; median of {args.repeats} "
        "interleaved steps; ratios to eager; errors against a float64 reference",
        flush=True,
    )
    rows = []
    for spec in specs:
        n, hdim, v, dtype = parse_case(spec)
        print(f"{spec} ...", flush=True)
        r = bench_case(n, hdim, v, dtype, device, args.repeats, log=lambda s: print(s, flush=True), only=args.variants)
        rows.append(dict(case=spec, rows=n, hidden=hdim, classes=v, dtype=str(dtype).replace("torch.", ""), **r))
    print(HEADER)
    for r in rows:
        for line in format_rows(r):
            print(line)
    finish_run(
        "linear_cross_entropy", args, argv, clock, dict(rows=rows), lambda m: markdown(m, rows), repeats=args.repeats
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
