"""The longest sequence whose training step fits a fixed memory cap, on CPU.

A Llama-style causal language model (Hugging Face ``LlamaForCausalLM``: hidden 256, intermediate 688, 4 layers,
4 heads, vocabulary 32,000, batch 1, random weights, SDPA attention) trained one step at a time on random token ids.
For each variant, the longest sequence (a multiple of 64 tokens) whose measured training-step peak stays within the
cap, and that variant's step time per token at its own longest sequence:

* ``eager``: the plain model, ``model(input_ids, labels=input_ids).loss`` (float32 logits and cross-entropy).
* ``torch blocks``: ``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)`` around every decoder layer.
* ``torch blocks + lce``: the same, with the loss taken by :func:`memsave.functional.linear_cross_entropy` from the
  last hidden state and ``lm_head``'s weight (the logits are never built).
* ``memsave``: ``memsave.convert(model, fuse=True, mlp_chunks="auto")`` (fused RMSNorm -> projections, a fused gated
  MLP run slice by slice along the sequence, the loss without logits) and ``memsave.wrap(model)`` (every decoder
  layer a region).

**Cap**: 128 MiB. The parameters' gradients alone take about 70 MiB (the 32,000-word embedding and head), and
eager's float32 logits fill the rest at a few hundred tokens, so 128 MiB is the smallest round cap at which every
variant fits the 256-token start, and the longest lengths stay near 6,000 tokens (the committed run took 39 minutes
on 2 cores shared at load 9-15; the search's peaks do not depend on the load, only its time does).
**Peak**: one step (gradients set to None, forward, loss, backward) under the allocator-level CPU measure
``memsave.measure`` uses (``memsave.measurement.allocator.step_peak_bytes``: the profiler's allocation events, kernel
temporaries included), relative to what was allocated before the step; parameter gradients count, parameters do not.
**Search**: lengths grow from 256 tokens (at most doubling, guided by the line through the last two peaks) until one
exceeds the cap, then the bracket shrinks (interpolated, every other step bisected) until it is at most
``max(64, longest / 32)`` tokens wide: the longest length is exact to that resolution. **Time**: each variant's step at
its longest length, ``--repeats`` times interleaved across the variants (A B C D, then D C B A, ...), the median
divided by the length; the ratio is to eager's time per token (at eager's own, shorter, length).

Usage::

    python3 benchmarks/long_context.py                 # the full run (cap 128 MiB), results/long_context_cpu.*
    python3 benchmarks/long_context.py --quick         # a tiny model and cap: a smoke run, not saved unless --out
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:  # run as a script: make the `benchmarks` package importable
    sys.path.insert(0, str(HERE.parent))

import memsave
from benchmarks.harness import (
    RunClock,
    commit_text,
    default_out,
    load_text,
    max_grad_diff,
    run_record,
    write_results,
)
from benchmarks.real_models import torch_checkpoint_blocks
from memsave.measurement.allocator import step_peak_bytes

VARIANTS = ("eager", "torch blocks", "torch blocks + lce", "memsave")
MIB = 2**20
FULL = dict(hidden=256, intermediate=688, layers=4, heads=4, vocab=32000, cap_mib=128, start=256, resolution=16)
QUICK = dict(hidden=64, intermediate=172, layers=2, heads=4, vocab=2000, cap_mib=6, start=64, resolution=8)
MAX_LENGTH = 65536


@dataclass
class Variant:
    """One variant: its model and one training step on a sequence of a given length."""

    name: str
    model: nn.Module
    loss: Callable[[torch.Tensor], torch.Tensor]

    def step(self, length: int, vocab: int) -> None:
        ids = torch.randint(0, vocab, (1, length), generator=torch.Generator().manual_seed(length))
        self.model.zero_grad(set_to_none=True)
        self.loss(ids).backward()


def llama(size: Dict[str, int]) -> nn.Module:
    """The benchmark's ``LlamaForCausalLM`` with random weights (seed 0)."""
    import transformers

    transformers.logging.set_verbosity_error()
    config = transformers.LlamaConfig(
        hidden_size=size["hidden"],
        intermediate_size=size["intermediate"],
        num_hidden_layers=size["layers"],
        num_attention_heads=size["heads"],
        num_key_value_heads=size["heads"],
        vocab_size=size["vocab"],
        max_position_embeddings=MAX_LENGTH,
        bos_token_id=0,
        eos_token_id=1,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).train()
    model.loss_type = "ForCausalLM"
    return model


def variants(base: nn.Module) -> List[Variant]:
    """The four variants, each on its own copy of ``base``."""

    def hf_loss(model: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
        return lambda ids: model(input_ids=ids, labels=ids, use_cache=False).loss

    eager = copy.deepcopy(base)
    blocks = copy.deepcopy(base)
    torch_checkpoint_blocks(blocks)
    lce = copy.deepcopy(base)
    torch_checkpoint_blocks(lce)

    def lce_loss(ids: torch.Tensor) -> torch.Tensor:
        hidden = lce.model(input_ids=ids, use_cache=False).last_hidden_state
        h = hidden[:, :-1].reshape(-1, hidden.shape[-1])
        return memsave.functional.linear_cross_entropy(h, lce.lm_head.weight, ids[:, 1:].reshape(-1))

    full = memsave.wrap(memsave.convert(copy.deepcopy(base), fuse=True, mlp_chunks="auto"))
    return [
        Variant("eager", eager, hf_loss(eager)),
        Variant("torch blocks", blocks, hf_loss(blocks)),
        Variant("torch blocks + lce", lce, lce_loss),
        Variant("memsave", full, hf_loss(full)),
    ]


def step_peak(variant: Variant, length: int, vocab: int) -> int:
    """The allocator-level peak of one training step at ``length`` tokens, in bytes."""
    gc.collect()
    variant.model.zero_grad(set_to_none=True)
    return step_peak_bytes(lambda: variant.step(length, vocab), torch.device("cpu"))


def _next_length(probes: Dict[int, int], lo: int, hi: Optional[int], cap: int, bisect: bool) -> int:
    """The next length to probe: growing (``hi`` None) or inside the bracket ``(lo, hi)``, a multiple of 64."""
    if hi is None:
        known = sorted(probes)
        guess = 2 * lo
        if len(known) >= 2 and probes[known[-1]] > probes[known[-2]]:
            a, b = known[-2], known[-1]
            slope = (probes[b] - probes[a]) / (b - a)
            guess = min(2 * lo, int(lo + (cap - probes[lo]) / slope))
        return max(lo + 64, guess // 64 * 64)
    guess = (lo + hi) // 2
    if not bisect:
        guess = int(lo + (cap - probes[lo]) * (hi - lo) / max(1, probes[hi] - probes[lo]))
    return min(hi - 64, max(lo + 64, guess // 64 * 64))


def longest_within(
    peak_of: Callable[[int], int], cap: int, start: int, log: Callable[[str], None], resolution: int = 32
) -> Tuple[int, Dict[int, int]]:
    """The longest length (multiple of 64, to ``max(64, length / resolution)``) whose peak is at most ``cap``.

    Returns:
        ``(length, {length: peak bytes})``: 0 when even ``start`` tokens exceed the cap.
    """
    probes: Dict[int, int] = {}

    def probe(length: int) -> bool:
        probes[length] = peak_of(length)
        log(f"    {length:6d} tokens: {probes[length] / MIB:8.1f} MiB{'  over' if probes[length] > cap else ''}")
        return probes[length] <= cap

    if not probe(start):
        return 0, probes
    lo, hi, k = start, None, 0
    while hi is None or hi - lo > max(64, lo // resolution):
        if hi is None and lo >= MAX_LENGTH:
            break
        length = min(MAX_LENGTH, _next_length(probes, lo, hi, cap, bisect=k % 2 == 1))
        if hi is not None:
            k += 1
        if probe(length):
            lo = length
        else:
            hi = length
    return lo, probes


def time_per_token(found: Dict[str, Tuple[Variant, int]], repeats: int, vocab: int) -> Dict[str, List[float]]:
    """Each variant's step seconds per token at its own length, ``repeats`` rounds interleaved (A B .. then .. B A)."""
    order = list(found)
    times: Dict[str, List[float]] = {v: [] for v in order}
    for v in order:  # one untimed step at the length each
        found[v][0].step(found[v][1], vocab)
    for i in range(repeats):
        for v in order if i % 2 == 0 else reversed(order):
            variant, length = found[v]
            t0 = time.perf_counter()
            variant.step(length, vocab)
            times[v].append((time.perf_counter() - t0) / length)
    return times


def gradient_errors(all_variants: List[Variant], length: int, vocab: int) -> Dict[str, float]:
    """Each variant's largest parameter-gradient difference from eager's at ``length`` tokens, relative to scale."""
    grads = {}
    for v in all_variants:
        v.step(length, vocab)
        grads[v.name] = {n: p.grad.detach().clone() for n, p in v.model.named_parameters() if p.grad is not None}
        v.model.zero_grad(set_to_none=True)
    ref = grads["eager"]
    scale = max(float(g.abs().max()) for g in ref.values())
    return {name: max_grad_diff(g, ref) / scale for name, g in grads.items()}


def run(size: Dict[str, int], repeats: int, log: Callable[[str], None]) -> Dict[str, Any]:
    """Measure every variant (see the module docstring); returns the results of the JSON."""
    base = llama(size)
    all_variants = variants(base)
    cap = size["cap_mib"] * MIB
    errors = gradient_errors(all_variants, size["start"], size["vocab"])
    rows: Dict[str, Dict[str, Any]] = {}
    found: Dict[str, Tuple[Variant, int]] = {}
    for v in all_variants:
        log(f"  {v.name}")
        v.step(size["start"], size["vocab"])  # warm-up: lazy initialisation
        t0 = time.perf_counter()
        length, probes = longest_within(
            lambda n, v=v: step_peak(v, n, size["vocab"]), cap, size["start"], log, size["resolution"]
        )
        rows[v.name] = dict(
            longest_tokens=length,
            peak_bytes_at_longest=probes.get(length),
            probes={str(k): probes[k] for k in sorted(probes)},
            search_seconds=time.perf_counter() - t0,
            grad_rel_err_vs_eager=errors[v.name],
        )
        if length:
            found[v.name] = (v, length)
    times = time_per_token(found, repeats, size["vocab"])
    eager_per_token = statistics.median(times["eager"]) if times.get("eager") else None
    for name, ts in times.items():
        med = statistics.median(ts)
        rows[name].update(
            seconds_per_token=med,
            seconds_per_token_all=ts,
            time_per_token_vs_eager=med / eager_per_token if eager_per_token else None,
        )
    eager_len = rows["eager"]["longest_tokens"]
    for row in rows.values():
        row["longest_vs_eager"] = row["longest_tokens"] / eager_len if eager_len else None
    return dict(size=size, cap_bytes=cap, rows=rows)


def markdown(meta: Dict[str, Any], results: Dict[str, Any]) -> str:
    """The results page."""
    size, rows = results["size"], results["rows"]
    lce = rows["torch blocks + lce"]["longest_tokens"]
    lines = [
        "# Longest sequence within a memory cap (CPU)",
        "",
        f"Llama-style `LlamaForCausalLM`: hidden {size['hidden']}, intermediate {size['intermediate']}, "
        f"{size['layers']} layers, {size['heads']} heads, vocabulary {size['vocab']:,}, batch 1, float32. Cap: "
        f"**{size['cap_mib']} MiB** of allocator-level training-step peak (parameters not counted, their gradients "
        f"counted). Longest length: a multiple of 64 tokens, exact to max(64, length / {size['resolution']}) tokens. "
        f"Time: median of "
        f"{meta.get('repeats')} interleaved steps at each variant's own longest length, per token.",
        "",
        "| variant | longest sequence | x eager | x torch blocks + lce | peak at it | step time per token | "
        "time per token / eager's | gradient vs eager (rel.) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name in VARIANTS:
        r = rows[name]
        peak = r["peak_bytes_at_longest"]
        spt = r.get("seconds_per_token")
        lines.append(
            f"| {name} | {r['longest_tokens']:,} | {r['longest_vs_eager'] or 0:.2f} | "
            f"{r['longest_tokens'] / lce if lce else 0:.2f} | {peak / MIB if peak else 0:.1f} MiB | "
            f"{spt * 1e3 if spt else float('nan'):.2f} ms | {r.get('time_per_token_vs_eager') or float('nan'):.2f} | "
            f"{r['grad_rel_err_vs_eager']:.1e} |"
        )
    lines += [
        "",
        f"Gradients compared with eager's at {size['start']} tokens (float32; memsave's fused operators and chunked "
        f"MLPs are float rounding away, torch's checkpoint is bitwise).",
        "",
        f"Machine: {meta.get('cpu')}, {meta.get('threads')} threads; torch {meta.get('torch')}, transformers "
        f"{meta.get('transformers')}; {commit_text(meta)}; "
        f"{meta.get('minutes', 0):.1f} minutes; {load_text(meta.get('load_average_start'))} -> "
        f"{load_text(meta.get('load_average_end'))}.",
        "",
        f"Command: `{meta.get('command')}`",
        "",
    ]
    return "\n".join(lines)


def plot(out: str, results: Dict[str, Any]) -> None:
    """A PNG beside the JSON: each variant's longest sequence, annotated with its time per token."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = results["rows"]
    names = list(VARIANTS)
    lengths = [rows[n]["longest_tokens"] for n in names]
    fig, ax = plt.subplots(figsize=(7, 3.6))
    bars = ax.barh(names, lengths, color=["#888888", "#4c72b0", "#55a868", "#c44e52"])
    for bar, n in zip(bars, names):
        spt = rows[n].get("seconds_per_token")
        label = f" {rows[n]['longest_tokens']:,} tokens" + (f", {spt * 1e3:.2f} ms/token" if spt else "")
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, label, va="center", fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(f"longest sequence within {results['size']['cap_mib']} MiB (training step, batch 1)")
    ax.set_xlim(0, max(lengths) * 1.45 if max(lengths) else 1)
    ax.set_title("Llama-style model on CPU: longest sequence at a fixed memory cap", fontsize=10)
    fig.tight_layout()
    fig.savefig(os.path.splitext(out)[0] + ".png", dpi=110)
    plt.close(fig)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the benchmark; returns the exit status."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a tiny model and cap: a smoke run, not saved unless --out")
    p.add_argument("--cap-mib", type=int, default=None, help="the memory cap in MiB (default 128; --quick: 6)")
    p.add_argument("--repeats", type=int, default=None, help="interleaved timed steps per variant (default 3; quick 1)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    p.add_argument("--out", default=None, help="JSON path (default benchmarks/results/long_context_cpu.json)")
    p.add_argument("--markdown-from", default=None, help="only write the .md and .png of this results JSON again")
    args = p.parse_args(argv)
    if args.markdown_from:
        with open(args.markdown_from) as f:
            data = json.load(f)
        write_results(
            args.markdown_from,
            data["meta"],
            {"results": data["results"]},
            markdown(data["meta"], data["results"]),
            plot,
        )
        return 0
    if args.threads:
        torch.set_num_threads(args.threads)
    size = dict(QUICK if args.quick else FULL)
    if args.cap_mib:
        size["cap_mib"] = args.cap_mib
    repeats = args.repeats or (1 if args.quick else 3)
    clock = RunClock()
    results = run(size, repeats, lambda s: print(s, flush=True))
    meta = run_record("long_context", "cpu", argv, clock, repeats=repeats, cap_mib=size["cap_mib"])
    text = markdown(meta, results)
    print(text)
    out = args.out or (None if args.quick else default_out("long_context", "cpu"))
    if out:
        write_results(out, meta, {"results": results}, text, lambda path: plot(path, results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
