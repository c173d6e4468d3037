"""Peak memory and forward+backward time of memsave's transformer operators against the eager composition they
replace, at realistic shapes (4,096 rows x hidden 1,024; MLP widths 2,816 and 4,096).

Cases (``CASES``; eager = the Hugging Face Llama modules, written out as plain torch):

=====================  ==============================================  =============================================
case                   eager                                           memsave
=====================  ==============================================  =============================================
rms_norm               LlamaRMSNorm                                    memsave.nn.RMSNorm
rms_norm_qkv           LlamaRMSNorm -> q/k/v Linears (1024 -> 3 x 1024) fuse_rms_norm_linear (3 RMSNormLinear)
gated_mlp              LlamaMLP: down(act(gate(x)) * up(x))            memsave.nn.GatedMLP (same Linears)
=====================  ==============================================  =============================================

The rms_norm cases have a third variant, ``torch``: torch's own ``F.rms_norm`` (where this torch has it,
``memsave.common.compat.native_rms_norm``) with the same weight and eps, so that the line under each of them answers
whether memsave's peak is at or below torch's native op's and its time too (time ratios within ``TIME_TOLERANCE``,
0.02, for timing noise).

Per case and variant: ``peak`` = allocator-level peak of one forward+backward above its start (CPU: the profiler's
allocation events, memsave.measurement.allocator; CUDA: max_memory_allocated), ``kept`` = bytes forward leaves
allocated (what autograd keeps for backward, plus the output), ``time`` = median of ``--repeats`` steps; the
variants run interleaved (A B C, C B A, ...) so that load changing during the run hits all alike, and each is
reported as a ratio to eager. ``err`` = the largest max |variant - ref| / max |ref| of the output, the input's
gradient and each parameter's gradient, where ref is the eager module in float64 on a float64 copy of the input
(eager's own error is shown beside the others'). The input requires grad (as an activation inside a model does);
gradients are set to None before each step.

    python3 benchmarks/transformer_ops.py                       # CPU, float32 (+ rms_norm in bfloat16)
    python3 benchmarks/transformer_ops.py --device cuda         # on a GPU: float32 and bfloat16
    python3 benchmarks/transformer_ops.py --rows 512 --no-save  # a quick look

Writes ``benchmarks/results/transformer_ops_<device>.json`` with the machine, torch, memsave build, thread count and
load average.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
from pathlib import Path
from typing import Callable, Dict, List, Tuple

import torch
from torch import nn

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:  # run as a script: make the `benchmarks` package importable
    sys.path.insert(0, str(HERE.parent))

from tests.helpers.eager import LlamaMLP, LlamaRMSNorm

from benchmarks.harness import RunClock, cuda_missing, finish_run, interleaved_times, output_arguments, rel_diff
from memsave.common import compat
from memsave.measurement.allocator import cpu_memory_stats, step_peak_bytes
from memsave.nn import GatedMLP, RMSNorm, fuse_rms_norm_linear

Step = Callable[[], None]

#: Slack on the time-ratio comparison of memsave against torch's native op (timing noise of interleaved medians).
TIME_TOLERANCE = 0.02


class TorchRMSNorm(nn.Module):
    """torch's own ``F.rms_norm`` with a LlamaRMSNorm's weight (same key, ``weight``) and eps."""

    def __init__(self, eager: LlamaRMSNorm) -> None:
        super().__init__()
        self.weight = nn.Parameter(eager.weight.detach().clone())
        self.eps = eager.variance_epsilon
        self.fn = compat.native_rms_norm()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x, (x.shape[-1],), self.weight, self.eps)


class QKV(nn.Module):
    """input_layernorm -> q/k/v projections, as at the start of a Llama attention block (outputs summed to one loss)."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.norm = LlamaRMSNorm(hidden)
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(hidden, hidden, bias=False) for _ in range(3))

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        h = self.norm(x)
        return self.q_proj(h), self.k_proj(h), self.v_proj(h)


def fused_qkv(eager: QKV) -> nn.Module:
    """A deep copy of ``eager`` with the norm and the three projections fused (same parameters' values and keys)."""
    model = type(eager).__new__(type(eager))
    model.__dict__.update(copy.deepcopy(eager).__dict__)
    model.norm, (model.q_proj, model.k_proj, model.v_proj) = fuse_rms_norm_linear(
        model.norm, model.q_proj, model.k_proj, model.v_proj
    )
    return model


def cases(
    rows: int, hidden: int, dtype_names: List[str]
) -> Dict[str, Tuple[Callable[[], Tuple[nn.Module, ...]], Tuple[int, int], str]]:
    """name -> (builder of (eager module, memsave module[, torch's native module]), input shape, dtype name)."""
    out: Dict[str, Tuple[Callable[[], Tuple[nn.Module, ...]], Tuple[int, int], str]] = {}

    def norm() -> Tuple[nn.Module, ...]:
        eager = LlamaRMSNorm(hidden)
        ours = RMSNorm.from_module(copy.deepcopy(eager))
        return (eager, ours) if compat.native_rms_norm() is None else (eager, ours, TorchRMSNorm(eager))

    def qkv() -> Tuple[nn.Module, nn.Module]:
        eager = QKV(hidden)
        return eager, fused_qkv(eager)

    def mlp(width: int, act: str) -> Callable[[], Tuple[nn.Module, nn.Module]]:
        def build() -> Tuple[nn.Module, nn.Module]:
            eager = LlamaMLP(hidden, width, act)
            ours = copy.deepcopy(eager)
            return eager, GatedMLP.from_modules(ours.gate_proj, ours.up_proj, ours.down_proj, act=act)

        return build

    for dt in dtype_names:
        out[f"rms_norm {dt}"] = (norm, (rows, hidden), dt)
        out[f"rms_norm_qkv {dt}"] = (qkv, (rows, hidden), dt)
        out[f"gated_mlp silu 2816 {dt}"] = (mlp(2816, "silu"), (rows, hidden), dt)
        out[f"gated_mlp gelu_tanh 4096 {dt}"] = (mlp(4096, "gelu_tanh"), (rows, hidden), dt)
    return out


def _loss(out) -> torch.Tensor:
    outs = out if isinstance(out, tuple) else (out,)
    return sum(o.float().sum() for o in outs)


def make_step(model: nn.Module, x: torch.Tensor) -> Step:
    leaf = x.detach().clone().requires_grad_()

    def step() -> None:
        leaf.grad = None
        for p in model.parameters():
            p.grad = None
        _loss(model(leaf)).backward()

    return step


def kept_bytes(model: nn.Module, x: torch.Tensor, device: torch.device) -> int:
    """Bytes forward leaves allocated: autograd's saved tensors plus the output."""
    leaf = x.detach().clone().requires_grad_()
    if device.type == "cuda":
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        out = model(leaf)
        torch.cuda.synchronize()
        kept = torch.cuda.memory_allocated() - before
        del out
        return kept
    return cpu_memory_stats(lambda: model(leaf)).net_bytes


def forward_backward(model: nn.Module, x: torch.Tensor) -> Dict[str, torch.Tensor]:
    """One forward+backward: the outputs (``out0``, ...), the input's gradient (``input``) and the parameters'
    gradients (by name)."""
    leaf = x.detach().clone().requires_grad_()
    for q in model.parameters():
        q.grad = None
    out = model(leaf)
    outs = out if isinstance(out, tuple) else (out,)
    sum(o.double().sum() for o in outs).backward()
    got = {f"out{i}": o.detach() for i, o in enumerate(outs)}
    got["input"] = leaf.grad
    got.update((n, q.grad) for n, q in model.named_parameters())
    for q in model.parameters():
        q.grad = None
    return got


def max_rel_err(got: Dict[str, torch.Tensor], ref: Dict[str, torch.Tensor]) -> float:
    """The largest max |got - ref| / max |ref| over the outputs and gradients of :func:`forward_backward`.

    Raises:
        RuntimeError: ``got`` lacks one of ``ref``'s tensors (a parameter named otherwise, a missing gradient).
    """
    missing = sorted(k for k in ref if got.get(k) is None)
    if missing:
        raise RuntimeError(f"transformer_ops: no {missing[:5]} to compare with the float64 reference")
    return max(rel_diff(got[k], ref[k]) for k in ref)


def bench_case(build, shape, dtype: torch.dtype, device: torch.device, repeats: int) -> dict:
    torch.manual_seed(0)
    built = build()
    names = ("eager", "memsave", "torch")[: len(built)]
    x = torch.randn(shape, device=device, dtype=dtype)
    ref = forward_backward(copy.deepcopy(built[0]).to(device, torch.float64), x.double())
    models = {name: built[i].to(device, dtype) for i, name in enumerate(names)}
    steps = {name: make_step(m, x) for name, m in models.items()}
    row: dict = dict(variants=list(names))
    for name in names:
        row[f"{name}_err"] = max_rel_err(forward_backward(models[name], x), ref)
        steps[name]()  # warm-up (and first-call allocations)
        row[f"{name}_peak_bytes"] = step_peak_bytes(steps[name], device)
        row[f"{name}_kept_bytes"] = kept_bytes(models[name], x, device)
    del ref
    times = interleaved_times(steps, repeats, device)  # A B C, C B A, ...
    for name in names:
        row[f"{name}_s"] = statistics.median(times[name])
    row["peak_ratio"] = row["memsave_peak_bytes"] / row["eager_peak_bytes"]
    row["kept_ratio"] = row["memsave_kept_bytes"] / row["eager_kept_bytes"]
    row["time_ratio"] = row["memsave_s"] / row["eager_s"]
    if "torch" in names:
        row["torch_peak_ratio"] = row["torch_peak_bytes"] / row["eager_peak_bytes"]
        row["torch_kept_ratio"] = row["torch_kept_bytes"] / row["eager_kept_bytes"]
        row["torch_time_ratio"] = row["torch_s"] / row["eager_s"]
        row["verdict_time_tolerance"] = TIME_TOLERANCE
        row["verdict_peak_ok"] = row["memsave_peak_bytes"] <= row["torch_peak_bytes"]
        row["verdict_time_ok"] = row["time_ratio"] <= row["torch_time_ratio"] + TIME_TOLERANCE
        row["verdict"] = row["verdict_peak_ok"] and row["verdict_time_ok"]
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--rows", type=int, default=4096)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--repeats", type=int, default=6)
    p.add_argument("--dtypes", nargs="+", default=None, help="default: float32 on CPU, float32 bfloat16 on CUDA")
    p.add_argument("--cases", nargs="+", default=None, help="substrings of case names to run (default: all)")
    output_arguments(p, "transformer_ops", None)
    args = p.parse_args(argv)
    clock = RunClock()
    if cuda_missing("transformer_ops", args.device):
        return 2
    device = torch.device(args.device)
    dtypes = args.dtypes or (["float32"] if args.device == "cpu" else ["float32", "bfloat16"])
    all_cases = cases(args.rows, args.hidden, dtypes)
    if args.device == "cpu" and args.dtypes is None:
        all_cases["rms_norm bfloat16"] = (all_cases["rms_norm float32"][0], (args.rows, args.hidden), "bfloat16")
    if args.cases:
        all_cases = {k: v for k, v in all_cases.items() if any(s in k for s in args.cases)}
    rows = []
    print(
        f"forward+backward, {args.rows} rows x hidden {args.hidden} on {args.device} "
        f"({torch.get_num_threads()} threads), median of {args.repeats} interleaved steps; ratios memsave / eager"
    )
    print(
        f"{'case':<30} {'eager peak':>11} {'memsave':>9} {'ratio':>6} {'eager kept':>11} {'memsave':>9} {'ratio':>6} "
        f"{'eager ms':>9} {'memsave':>8} {'ratio':>6} {'eager err':>9} {'memsave':>8}"
    )
    mib = 2.0**20
    for name, (build, shape, dt) in all_cases.items():
        r = bench_case(build, shape, getattr(torch, dt), device, args.repeats)
        r = dict(case=name, rows=shape[0], hidden=shape[1], dtype=dt, **r)
        rows.append(r)
        print(
            f"{name:<30} {r['eager_peak_bytes'] / mib:>9.1f}Mi {r['memsave_peak_bytes'] / mib:>7.1f}Mi "
            f"{r['peak_ratio']:>6.2f} {r['eager_kept_bytes'] / mib:>9.1f}Mi {r['memsave_kept_bytes'] / mib:>7.1f}Mi "
            f"{r['kept_ratio']:>6.2f} {1e3 * r['eager_s']:>9.1f} {1e3 * r['memsave_s']:>8.1f} {r['time_ratio']:>6.2f} "
            f"{r['eager_err']:>9.1e} {r['memsave_err']:>8.1e}",
            flush=True,
        )
        if "torch" in r["variants"]:
            print(
                f"{'  torch F.rms_norm':<30} {'':>11} {r['torch_peak_bytes'] / mib:>7.1f}Mi "
                f"{r['torch_peak_ratio']:>6.2f} {'':>11} {r['torch_kept_bytes'] / mib:>7.1f}Mi "
                f"{r['torch_kept_ratio']:>6.2f} {'':>9} "
                f"{1e3 * r['torch_s']:>8.1f} {r['torch_time_ratio']:>6.2f} {'':>9} {r['torch_err']:>8.1e}\n"
                f"{'':<30} memsave at or below torch F.rms_norm (peak <=, time ratio <= +{TIME_TOLERANCE}): "
                f"{'yes' if r['verdict'] else 'no'} (peak {'<=' if r['verdict_peak_ok'] else '>'}, time "
                f"{r['time_ratio']:.2f} {'<=' if r['verdict_time_ok'] else '>'} {r['torch_time_ratio']:.2f})",
                flush=True,
            )
    finish_run("transformer_ops", args, argv, clock, dict(rows=rows), repeats=args.repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
