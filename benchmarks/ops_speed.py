"""Speed of memsave's mask operators (relu, leaky_relu, dropout, max_pool2d) against torch's, forward+backward.

CPU (always): 16M float32 elements; the ratio memsave time / torch time, median of --repeats steps after a warm-up,
the two measured alternately so that load changing during the run hits both alike. Target: <= 1.5.

CUDA (when a GPU is present): 256M float32 elements; the minimal bytes each operator must move (read its inputs,
write its outputs, once) divided by its time, as a fraction of the device's copy bandwidth (``y.copy_(x)`` of the
same size: 2 x 4 bytes per element over its time). Target: >= 0.8.

    python3 benchmarks/ops_speed.py                 # prints a table, writes benchmarks/results/ops_speed_cpu.json
    python3 benchmarks/ops_speed.py --device cuda   # writes benchmarks/results/ops_speed_cuda.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Tuple

import torch
import torch.nn.functional as TF

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:  # run as a script: make the `benchmarks` package importable
    sys.path.insert(0, str(HERE.parent))

import memsave.functional as MF
from benchmarks.harness import RunClock, cuda_missing, default_out, output_arguments, run_record, sync, write_results

Step = Callable[[], None]


def _time(step: Step, device: str) -> float:
    sync(device)
    t0 = time.perf_counter()
    step()
    sync(device)
    return time.perf_counter() - t0


def fwd_bwd(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, seed: int = 0) -> Step:
    """One forward+backward of fn on a leaf copy of x, with a fixed upstream gradient."""
    leaf = x.detach().clone().requires_grad_()
    with torch.no_grad():
        grad = torch.ones_like(fn(x.detach()))

    def step() -> None:
        leaf.grad = None
        torch.manual_seed(seed)
        y = fn(leaf)
        y.backward(grad)

    return step


def cases(n: int) -> Dict[str, Tuple[Callable, Callable, Tuple[int, ...], Callable[[int], int]]]:
    """name -> (memsave fn, torch fn, input shape, minimal bytes moved by forward+backward for n elements).

    Minimal bytes (float32): a mask op reads x and writes y plus n/8 mask bytes in forward, reads the gradient and
    the mask and writes the input gradient in backward. max_pool2d 2x2/2 reads x, writes n/4 outputs and n/4 argmax
    bytes in forward, reads n/4 gradients and argmax bytes and writes the n-element input gradient in backward.
    """
    side = round((n // 64) ** 0.5)
    pool_shape = (1, 64, side, side)
    mask_bytes = lambda m: 16 * m + 2 * ((m + 7) // 8)  # noqa: E731
    pool_bytes = lambda m: 4 * m + 4 * (m // 4) + (m // 4) + 4 * (m // 4) + (m // 4) + 4 * m  # noqa: E731
    return {
        "relu": (MF.relu, torch.relu, (n,), mask_bytes),
        "leaky_relu": (lambda t: MF.leaky_relu(t, 0.01), lambda t: TF.leaky_relu(t, 0.01), (n,), mask_bytes),
        "dropout": (lambda t: MF.dropout(t, 0.5), lambda t: TF.dropout(t, 0.5), (n,), mask_bytes),
        "max_pool2d": (lambda t: MF.max_pool2d(t, 2), lambda t: TF.max_pool2d(t, 2), pool_shape, pool_bytes),
    }


def bench_cpu(n: int, repeats: int) -> List[dict]:
    rows = []
    for name, (ours, ref, shape, _) in cases(n).items():
        x = torch.randn(shape)
        steps = {"memsave": fwd_bwd(ours, x), "torch": fwd_bwd(ref, x)}
        for s in steps.values():  # warm-up
            s()
        times: Dict[str, List[float]] = {"memsave": [], "torch": []}
        for _ in range(repeats):
            for k, s in steps.items():
                times[k].append(_time(s, "cpu"))
        med = {k: statistics.median(v) for k, v in times.items()}
        rows.append(
            dict(
                op=name,
                elements=x.numel(),
                memsave_s=med["memsave"],
                torch_s=med["torch"],
                ratio=med["memsave"] / med["torch"],
            )
        )
    return rows


def bench_cuda(n: int, repeats: int) -> List[dict]:
    x = torch.randn(n, device="cuda")
    y = torch.empty_like(x)
    copy_t = statistics.median(_time(lambda: y.copy_(x), "cuda") for _ in range(repeats + 2))
    copy_bw = 2 * 4 * n / copy_t
    rows = []
    for name, (ours, ref, shape, min_bytes) in cases(n).items():
        xs = x.view(shape)
        entry = dict(op=name, elements=n, copy_GBps=copy_bw / 1e9)
        for label, fn in (("memsave", ours), ("torch", ref)):
            step = fwd_bwd(fn, xs)
            step()
            t = statistics.median(_time(step, "cuda") for _ in range(repeats))
            entry[f"{label}_s"] = t
            entry[f"{label}_bw_fraction"] = min_bytes(n) / t / copy_bw
            torch.cuda.empty_cache()
        entry["ratio"] = entry["memsave_s"] / entry["torch_s"]
        rows.append(entry)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--elements", type=int, default=None, help="default: 16M on CPU, 256M on CUDA")
    p.add_argument("--repeats", type=int, default=7)
    output_arguments(p, "ops_speed", None)
    args = p.parse_args(argv)
    clock = RunClock()
    if cuda_missing("ops_speed", args.device):
        return 2
    n = args.elements or (16 * 2**20 if args.device == "cpu" else 256 * 2**20)
    rows = bench_cpu(n, args.repeats) if args.device == "cpu" else bench_cuda(n, args.repeats)

    if args.device == "cpu":
        print(
            f"forward+backward, {n / 2**20:.0f}M float32 elements, {torch.get_num_threads()} threads, "
            f"median of {args.repeats}"
        )
        print(f"{'op':<12} {'memsave ms':>11} {'torch ms':>9} {'ratio':>6}  target <= 1.5")
        for r in rows:
            ok = "ok" if r["ratio"] <= 1.5 else "SLOW"
            print(f"{r['op']:<12} {1e3 * r['memsave_s']:>11.1f} {1e3 * r['torch_s']:>9.1f} {r['ratio']:>6.2f}  {ok}")
    else:
        print(
            f"forward+backward, {n / 2**20:.0f}M float32 elements on {torch.cuda.get_device_name()}, copy "
            f"bandwidth {rows[0]['copy_GBps']:.0f} GB/s"
        )
        print(f"{'op':<12} {'memsave ms':>11} {'bw frac':>8} {'torch ms':>9} {'bw frac':>8}  target >= 0.8")
        for r in rows:
            print(
                f"{r['op']:<12} {1e3 * r['memsave_s']:>11.2f} {r['memsave_bw_fraction']:>8.2f} "
                f"{1e3 * r['torch_s']:>9.2f} {r['torch_bw_fraction']:>8.2f}"
            )

    if not args.no_save:
        out = args.out or default_out("ops_speed", args.device)
        meta = run_record("ops_speed", args.device, argv, clock, elements=n, repeats=args.repeats)
        write_results(out, meta, dict(rows=rows), None)
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
