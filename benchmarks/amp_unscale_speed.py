"""Speed of memsave's fused unscale-and-check against torch._amp_foreach_non_finite_check_and_unscale_.

Workload: 1,000 gradients of mixed sizes (log-uniform between ~10 and ~10^6 elements, scaled so that they hold
100M elements in all, 400 MB in float32; fixed seed), unscaled in place and checked for inf/NaN, as GradScaler does
once per step.

* CPU: the median time of memsave's operator over the median time of torch's, the two called alternately (so load
  that changes during the run hits both). The target is a ratio <= 1.0.
* CUDA (when a GPU is present): the same ratio, plus the effective bandwidth (bytes read + written / time) as a
  fraction of the bandwidth of a plain device-to-device copy of the same bytes (``dst.copy_(src)``). The target is
  >= 80% of the copy.

Both operators get their own copy of the gradients. The inverse scale alternates between 0.5 and 2.0, so repeated
calls multiply by exact powers of two and the values neither drift to denormals nor overflow.

Run::

    python3 benchmarks/amp_unscale_speed.py                      # CPU (and CUDA if present), 100M elements
    python3 benchmarks/amp_unscale_speed.py --elements 10000000  # a smaller documented size
    python3 benchmarks/amp_unscale_speed.py --no-save --reps 3   # a quick look

Writes ``benchmarks/results/amp_unscale_<device>.json`` and prints a table.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:  # run as a script: make the `benchmarks` package importable
    sys.path.insert(0, str(HERE.parent))

import torch

import memsave  # noqa: F401  (loads torch.ops.memsave)
from benchmarks.harness import environment

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def gradient_sizes(count: int, total: int, seed: int = 0) -> List[int]:
    """``count`` sizes, log-uniform over four decades, summing to exactly ``total``."""
    gen = torch.Generator().manual_seed(seed)
    weights = torch.exp(torch.rand(count, generator=gen, dtype=torch.float64) * math.log(1e5))
    sizes = [max(1, int(w)) for w in (weights / weights.sum() * total).tolist()]
    sizes[int(torch.tensor(sizes).argmax())] += total - sum(sizes)
    return sizes


def _make(sizes: Sequence[int], dtype: torch.dtype, device: str, seed: int) -> List[torch.Tensor]:
    gen = torch.Generator(device=device).manual_seed(seed)
    return [torch.randn(n, generator=gen, device=device, dtype=torch.float32).to(dtype) for n in sizes]


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _time(fn: Callable[[], None], device: str) -> float:
    if device == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def bench(device: str, elements: int, count: int, dtype: torch.dtype, reps: int, warmup: int) -> Dict[str, Any]:
    """Time both operators (alternately) and, on CUDA, a copy of the same bytes; return a result row."""
    sizes = gradient_sizes(count, elements)
    ours, theirs = _make(sizes, dtype, device, 1), _make(sizes, dtype, device, 1)
    found = torch.zeros((), device=device)
    invs = [torch.full((), 0.5, device=device), torch.full((), 2.0, device=device)]
    calls = {"i": 0}

    def run_ours() -> None:
        torch.ops.memsave.unscale_and_check_(ours, found, invs[calls["i"] % 2])

    def run_theirs() -> None:
        torch._amp_foreach_non_finite_check_and_unscale_(theirs, found, invs[calls["i"] % 2])

    t_ours: List[float] = []
    t_theirs: List[float] = []
    for rep in range(warmup + reps):
        # Alternate which goes first, so neither always runs on a cache the other warmed.
        pair = [(run_ours, t_ours), (run_theirs, t_theirs)]
        for fn, out in pair if rep % 2 == 0 else pair[::-1]:
            _sync(device)
            elapsed = _time(fn, device)
            if rep >= warmup:
                out.append(elapsed)
        calls["i"] += 1
    if found.item() != 0.0:
        raise RuntimeError("benchmark data overflowed: a non-finite value appeared")
    if not all(torch.equal(a, b) for a, b in zip(ours, theirs)):
        raise RuntimeError("memsave's and torch's unscaled gradients differ")

    moved = 2 * elements * torch.tensor([], dtype=dtype).element_size()  # read + write of every element
    row: Dict[str, Any] = {
        "device": device,
        "dtype": str(dtype).replace("torch.", ""),
        "tensors": count,
        "elements": elements,
        "min_size": min(sizes),
        "max_size": max(sizes),
        "reps": reps,
        "memsave_s": statistics.median(t_ours),
        "torch_s": statistics.median(t_theirs),
    }
    row["ratio"] = row["memsave_s"] / row["torch_s"]
    row["memsave_GBps"] = moved / row["memsave_s"] / 1e9
    row["torch_GBps"] = moved / row["torch_s"] / 1e9
    if device == "cuda":
        flat_src = torch.cat([t.reshape(-1) for t in ours])
        flat_dst = torch.empty_like(flat_src)
        t_copy = []
        for rep in range(warmup + reps):
            elapsed = _time(lambda: flat_dst.copy_(flat_src), device)
            if rep >= warmup:
                t_copy.append(elapsed)
        row["copy_s"] = statistics.median(t_copy)
        row["copy_GBps"] = moved / row["copy_s"] / 1e9
        row["fraction_of_copy_bandwidth"] = row["memsave_GBps"] / row["copy_GBps"]
    return row


def to_table(rows: Sequence[Dict[str, Any]]) -> str:
    lines = [
        "| device | dtype | tensors | elements | memsave | torch | memsave / torch | memsave GB/s | copy GB/s "
        "| of copy |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        copy = f"{r['copy_GBps']:.0f}" if "copy_GBps" in r else "-"
        frac = f"{100 * r['fraction_of_copy_bandwidth']:.0f}%" if "fraction_of_copy_bandwidth" in r else "-"
        lines.append(
            f"| {r['device']} | {r['dtype']} | {r['tensors']} | {r['elements'] / 1e6:.0f}M | "
            f"{1e3 * r['memsave_s']:.2f} ms | {1e3 * r['torch_s']:.2f} ms | {r['ratio']:.3f} | "
            f"{r['memsave_GBps']:.1f} | {copy} | {frac} |"
        )
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--devices", nargs="+", default=["cpu"] + (["cuda"] if torch.cuda.is_available() else []))
    parser.add_argument("--elements", type=int, default=100_000_000, help="total elements over all gradients")
    parser.add_argument("--tensors", type=int, default=1000)
    parser.add_argument("--dtypes", nargs="+", default=["float32"], choices=sorted(DTYPES))
    parser.add_argument("--reps", type=int, default=11, help="timed calls of each operator (median reported)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--out-dir", type=Path, default=HERE / "results")
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args(argv)

    results: Dict[str, Any] = {}
    for device in args.devices:
        rows = [bench(device, args.elements, args.tensors, DTYPES[d], args.reps, args.warmup) for d in args.dtypes]
        result = {"environment": environment(torch.device(device)), "rows": rows}
        results[device] = result
        print(f"\n{result['environment']['device_name']} ({torch.get_num_threads()} CPU threads)")
        print(to_table(rows))
        if not args.no_save:
            args.out_dir.mkdir(parents=True, exist_ok=True)
            path = args.out_dir / f"amp_unscale_{device}.json"
            path.write_text(json.dumps(result, indent=2) + "\n")
            print(f"wrote {path}")
    return results


if __name__ == "__main__":
    main()
