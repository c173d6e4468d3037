"""memsave on real model definitions: Hugging Face GPT-2 and Llama, a timm ViT and torchvision's
ResNet-50, one training step each, eager against every recompute strategy a user would reach for.

Models (random weights from configs, seed 0, float32, training mode, dropout off so that ``torch.compile``'s rows
compare gradients without RNG; nothing is downloaded):

==========  =====================================================================================================
model       ``cpu`` size (the committed run; ``--quick``: a tiny config of the same architecture)
==========  =====================================================================================================
gpt2        transformers GPT2LMHeadModel: 6 layers, d 256, 4 heads, vocabulary 8,192, batch 4 x 256 tokens, labels
llama       transformers LlamaForCausalLM: 6 layers, hidden 256, MLP 688, 4 heads, vocabulary 8,192, 4 x 256, labels
vit         timm vit_tiny_patch16_224 at 64 x 64 images with 8 x 8 patches (65 tokens), 12 blocks, d 192, batch 32
resnet50    torchvision resnet50, batch 16, 3 x 128 x 128
==========  =====================================================================================================

The vocabulary is 8,192 rather than GPT-2's 50,257 so that the layers' activations, which recompute can free, and
not the logits at the end, dominate the step (``convert_zoo.py`` covers the logits). The losses are the model's own
(``labels``) for the language models and cross entropy over 10 classes for the vision models.

Variants:

* ``eager``.
* ``torch blocks``: ``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)`` around the forward of every
  block ``memsave.find_blocks(model)`` returns (what a user writes by hand around each layer).
* ``wrap``: ``memsave.wrap(model)`` -- the same blocks, memsave's regions.
* ``plan 25% / 50% / 75%``: ``memsave.plan(model, **inputs, budget=B)`` applied with ``memsave.wrap``, with ``B``
  25, 50 and 75% of the way from ``wrap``'s measured peak to eager's; the row says whether the measured peak is
  within ``B``.
* ``compile amb 0.5``: ``torch.compile(model)`` compiled under ``torch._functorch.config.activation_memory_budget =
  0.5`` (inductor's own min-cut recompute). Its first step compiles, with inductor's FX-graph and autograd caches
  off (its time is in the row; inductor's compiled C++ kernels may still come from its on-disk cache of an earlier
  run). Skipped, with the reason in the row, by ``--no-compile`` or when compiling fails.

Columns: ``peak`` = allocator-level peak of one step above its start (CPU: the profiler's allocation events,
``memsave.measurement.allocator``; CUDA: ``max_memory_allocated``); ``activations`` = the live-tensor tracker's bytes
created in forward and alive at its end (n/a for the compiled row: the tracker is a dispatch mode, under which dynamo
does not run the compiled graph); ``time`` = median of ``--repeats`` steps stepped interleaved (A B C ... C B A ...)
so that load changing during the run hits all alike, as a ratio to eager's median; ``grad err`` = max over
parameters of max |grad - eager's| / max |eager's| after one step from the same seed (0 = bitwise equal).

    python3 benchmarks/real_models.py                        # the committed CPU run (~7 minutes on 2 cores)
    python3 benchmarks/real_models.py --models gpt2 --no-compile --no-save
    python3 benchmarks/real_models.py --quick --no-compile   # tiny configs, seconds: a smoke test (not saved)
    python3 benchmarks/real_models.py --markdown-from benchmarks/results/real_models_cpu.json

Writes ``benchmarks/results/real_models_<device>.json`` and ``.md`` with the machine (CPU model, threads), torch,
transformers, timm, torchvision and memsave versions, the git commit (and whether the package sources differed from
it), and the load average at the start and the end.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch._dynamo.config
import torch._functorch.config
import torch._inductor.config
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:  # run as a script: make the `benchmarks` package importable
    sys.path.insert(0, str(HERE.parent))

from tests.helpers import hub

import memsave
from benchmarks import harness
from benchmarks.harness import RunClock, early_exit, finish_run, load_text, output_arguments
from memsave.measurement.allocator import step_peak_bytes
from memsave.measurement.tracker import LiveTensorTracker
from memsave.recompute.planning.partitioner import compile_at

MODELS = ("gpt2", "llama", "vit", "resnet50")
PLAN_FRACTIONS = (0.25, 0.5, 0.75)
COMPILE_BUDGET = 0.5
VARIANTS = (
    "eager",
    "torch blocks",
    "wrap",
    *(f"plan {int(f * 100)}%" for f in PLAN_FRACTIONS),
    f"compile amb {COMPILE_BUDGET}",
)
CLASSES = 10

LossFn = Callable[[Any], torch.Tensor]


@dataclass
class Case:
    """One model at one size: the module, its positional and keyword inputs, its loss, and a description."""

    model: nn.Module
    args: Tuple[Any, ...]
    kwargs: Dict[str, Any]
    loss_fn: LossFn
    description: str


# ------------------------------------------------------------------------------------------------------ models
def _transformers() -> Any:
    try:
        import transformers
    except ImportError as e:  # pragma: no cover - the test extras install it
        raise SystemExit("real_models: needs transformers (pip install transformers)") from e
    transformers.logging.set_verbosity_error()
    return transformers


def _lm_case(model: nn.Module, vocab: int, batch: int, seq: int, description: str) -> Case:
    ids = torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(1))
    return Case(model, (), {"input_ids": ids, "labels": ids}, _hf_loss, description)


def _hf_loss(out: Any) -> torch.Tensor:
    return out.loss


def _cross_entropy(out: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(out, targets)


def _classification_case(model: nn.Module, batch: int, size: int, description: str) -> Case:
    g = torch.Generator().manual_seed(1)
    images = torch.randn(batch, 3, size, size, generator=g)
    targets = torch.randint(0, CLASSES, (batch,), generator=g)
    # A partial of a module-level function, not a closure: memsave.plan's cache can key it (by the targets' shape).
    loss_fn = functools.partial(_cross_entropy, targets=targets)
    return Case(model, (images,), {}, loss_fn, description)


def build(name: str, quick: bool = False) -> Case:
    """The model ``name`` (one of :data:`MODELS`) at the CPU size, or a tiny config of it with ``quick``.

    Args:
        name: ``gpt2``, ``llama``, ``vit`` or ``resnet50``.
        quick: a tiny config of the same architecture (seconds per step on a CPU core).

    Returns:
        a :class:`Case` with seeded weights (seed 0) and inputs (seed 1).

    Raises:
        ValueError: an unknown name.

    Examples:
        >>> case = build("gpt2", quick=True)
        >>> case.loss_fn(case.model(*case.args, **case.kwargs)).backward()
    """
    torch.manual_seed(0)
    if name == "gpt2":
        _transformers()
        layers, d, vocab, batch, seq = (2, 32, 128, 2, 16) if quick else (6, 256, 8192, 4, 256)
        model = hub.gpt2(layers, d, heads=4, vocab=vocab, positions=seq)
        model.loss_type = None  # as the committed runs: transformers picks the causal-LM loss itself (and says so)
        return _lm_case(
            model,
            vocab,
            batch,
            seq,
            f"GPT2LMHeadModel, {layers} layers, d {d}, vocab {vocab:,}, {batch} x {seq} tokens",
        )
    if name == "llama":
        _transformers()
        layers, d, vocab, batch, seq = (2, 32, 128, 2, 16) if quick else (6, 256, 8192, 4, 256)
        tokens = {"bos_token_id": 0, "eos_token_id": 0}
        return _lm_case(
            hub.llama(layers, d, int(d * 2.6875), heads=4, kv_heads=4, vocab=vocab, positions=seq, **tokens),
            vocab,
            batch,
            seq,
            f"LlamaForCausalLM, {layers} layers, hidden {d}, vocab {vocab:,}, {batch} x {seq} tokens",
        )
    if name == "vit":
        depth, dim, heads, size, batch = (2, 32, 2, 32, 2) if quick else (12, 192, 3, 64, 32)
        model = hub.timm_vit(size=size, patch=8, dim=dim, depth=depth, heads=heads, classes=CLASSES)
        tokens = (size // 8) ** 2 + 1
        return _classification_case(
            model,
            batch,
            size,
            f"timm ViT-tiny, {depth} blocks, d {dim}, {size}x{size} / patch 8 ({tokens} tokens), batch {batch}",
        )
    if name == "resnet50":
        import torchvision

        batch, size = (2, 32) if quick else (16, 128)
        model = torchvision.models.resnet50(weights=None, num_classes=CLASSES)
        return _classification_case(model.train(), batch, size, f"torchvision ResNet-50, batch {batch}, {size}x{size}")
    raise ValueError(f"real_models: unknown model {name!r}; choose from {', '.join(MODELS)}")


# ---------------------------------------------------------------------------------------------------- variants
def torch_checkpoint_blocks(model: nn.Module, context_fn: Optional[Callable[[], Tuple[Any, Any]]] = None) -> List[str]:
    """Wrap, in place, the forward of every block ``memsave.find_blocks(model)`` names in
    ``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)`` (with ``context_fn``, a selective policy's
    contexts, when given); returns the block names."""
    blocks = memsave.find_blocks(model)
    options: Dict[str, Any] = {"use_reentrant": False}
    if context_fn is not None:
        options["context_fn"] = context_fn
    for name in blocks:
        block = model.get_submodule(name)
        forward = block.forward

        def checkpointed(*args: Any, _forward: Callable[..., Any] = forward, **kwargs: Any) -> Any:
            return torch.utils.checkpoint.checkpoint(_forward, *args, **options, **kwargs)

        block.forward = checkpointed  # type: ignore[method-assign]
    return blocks


class Runner:
    """One variant: a callable model and how to step it: gradients set to None, ``out = model(...)``,
    ``loss = loss_fn(out)``, ``loss.backward()`` -- with ``out`` alive during backward, as in a training loop and in
    ``memsave.measure`` and ``memsave.plan`` (a language model's logits count in the peak)."""

    def __init__(
        self,
        name: str,
        model: nn.Module,
        call: Callable[..., Any],
        case: Case,
        context: Optional[Callable[[], Any]] = None,
    ) -> None:
        self.name, self.model, self.call, self.case, self.context = name, model, call, case, context

    def step(self) -> torch.Tensor:
        self.model.zero_grad(set_to_none=True)
        with self.context() if self.context is not None else contextlib.nullcontext():
            out = self.call(*self.case.args, **self.case.kwargs)
            loss = self.case.loss_fn(out)
            loss.backward()
        del out
        return loss.detach()


def grad_error(model: nn.Module, reference: Dict[str, torch.Tensor]) -> Tuple[float, float]:
    """(max relative error, max absolute error) of ``model``'s gradients against ``reference``."""
    rel, absolute = 0.0, 0.0
    for n, p in model.named_parameters():
        ref = reference.get(n)
        if ref is None and p.grad is None:
            continue
        if ref is None or p.grad is None:
            return float("inf"), float("inf")
        diff = (p.grad.double() - ref.double()).abs().max().item()
        scale = ref.double().abs().max().item() or 1.0
        rel, absolute = max(rel, diff / scale), max(absolute, diff)
    return rel, absolute


def float64_error(case: Case, base: nn.Module, reference: Dict[str, torch.Tensor]) -> float:
    """Eager float32's gradient error against the same step in float64: the rounding floor a reordering variant
    (``torch.compile``) is judged against."""
    model = copy.deepcopy(base).double()

    def cast(v: Any) -> Any:
        return v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v

    case64 = Case(
        model,
        tuple(cast(a) for a in case.args),
        {k: cast(v) for k, v in case.kwargs.items()},
        case.loss_fn,
        case.description,
    )
    torch.manual_seed(5)
    Runner("float64", model, model, case64).step()
    return grad_error(model, reference)[0]  # eager float32's gradients (``reference``) against float64's


def activation_bytes(runner: Runner) -> int:
    """The live-tensor tracker's bytes created in ``runner``'s forward and alive at its end (then the backward)."""
    case = runner.case
    runner.model.zero_grad(set_to_none=True)
    with LiveTensorTracker() as tracker:
        out = runner.call(*case.args, **case.kwargs)
        live = tracker.live_bytes
    case.loss_fn(out).backward()
    del out
    runner.model.zero_grad(set_to_none=True)
    return int(live)


def peak_bytes(runner: Runner, device: torch.device) -> int:
    """The allocator-level peak of one of ``runner``'s steps above its start (gradients set to None before)."""
    runner.model.zero_grad(set_to_none=True)
    peak = step_peak_bytes(runner.step, device)
    runner.model.zero_grad(set_to_none=True)
    return int(peak)


def prepare(name: str, device: torch.device, quick: bool) -> Case:
    """:func:`build` the model and move it and its inputs to ``device``."""
    case = build(name, quick)
    case.model = case.model.to(device)
    case.args = tuple(a.to(device) if isinstance(a, torch.Tensor) else a for a in case.args)
    case.kwargs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in case.kwargs.items()}
    return case


def eager_reference(case: Case) -> Dict[str, torch.Tensor]:
    """One seeded eager step of ``case.model``: its parameters' gradients, which every variant is compared with."""
    torch.manual_seed(5)
    Runner("eager", case.model, case.model, case).step()
    return {n: p.grad.detach().clone() for n, p in case.model.named_parameters() if p.grad is not None}


def measure_variant(
    runner: Runner, reference: Dict[str, torch.Tensor], device: torch.device, log: Callable[[str], None], **extra: Any
) -> dict:
    """One variant's row: a seeded warm-up step (it compiles a compiled variant) whose gradients are compared with
    ``reference``, then the allocator-level peak and, unless compiled (``torch.compile``'s module), the tracker's
    activation bytes.

    Returns:
        ``{"grad_rel_err", "grad_abs_err", "first_step_s", "peak_bytes", "activation_bytes", **extra}``.
    """
    t0 = time.perf_counter()
    torch.manual_seed(5)
    runner.step()
    first = time.perf_counter() - t0
    rel, absolute = grad_error(runner.model, reference)
    row = dict(grad_rel_err=rel, grad_abs_err=absolute, first_step_s=first, **extra)
    row["peak_bytes"] = peak_bytes(runner, device)
    # The tracker is a dispatch mode: a compiled module runs eagerly under it, and dynamo then skips that forward's
    # code for every later compile too. Compiled rows are compared by their peak instead.
    compiled = isinstance(runner.call, torch._dynamo.eval_frame.OptimizedModule)
    row["activation_bytes"] = None if compiled else activation_bytes(runner)
    acts = row["activation_bytes"]
    log(
        f"  {runner.name}: peak {row['peak_bytes'] / 2**20:.1f} MiB, activations "
        f"{'n/a' if acts is None else f'{acts / 2**20:.1f} MiB'}, grad err {rel:.1e}"
    )
    return row


def compile_context(recompile_limit: int = 64) -> contextlib.ExitStack:
    """The configuration a compiled variant steps under: inductor's on-disk FX-graph and autograd caches off, so that
    a first step's time is a cold compile on every run, and room in dynamo's cache for ``recompile_limit`` compiled
    variants of one model side by side (each :func:`memsave.recompute.planning.partitioner.compile_at` backend keeps
    its own entries; past the limit dynamo would run a frame eagerly)."""
    stack = contextlib.ExitStack()
    stack.enter_context(torch._functorch.config.patch(enable_autograd_cache=False))
    stack.enter_context(torch._inductor.config.patch(fx_graph_cache=False))
    stack.enter_context(torch._dynamo.config.patch(recompile_limit=recompile_limit))
    return stack


def failure_reason(e: BaseException) -> str:
    """A one-line reason for a variant that could not run (inductor's failures vary by machine)."""
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]


def interleaved_times(runners: Dict[str, Runner], repeats: int, device: torch.device) -> Dict[str, List[float]]:
    """Step every runner ``repeats`` times, interleaved: A B C ... then ... C B A, so that load changing during the
    run hits all alike. Returns each runner's step times in seconds."""
    times = harness.interleaved_times({v: runner.step for v, runner in runners.items()}, repeats, device)
    for runner in runners.values():
        runner.model.zero_grad(set_to_none=True)
    return times


def bench_model(
    name: str, device: torch.device, repeats: int, quick: bool, run_compile: bool, log: Callable[[str], None]
) -> dict:
    """Every variant of one model: peak, activations, interleaved step time, gradient error.

    Returns:
        ``{"model", "description", "parameters", "blocks", "variants": {variant: row}}``; a row that could not run
        has ``skipped`` (the reason) instead of measurements.
    """
    case = prepare(name, device, quick)
    base = case.model
    blocks = memsave.find_blocks(base)
    rows: Dict[str, dict] = {}
    runners: Dict[str, Runner] = {}
    # eager first: the reference gradients and the peak the plan budgets are placed against.
    reference = eager_reference(case)

    def add(runner: Runner, **extra: Any) -> None:
        rows[runner.name] = measure_variant(runner, reference, device, log, **extra)
        runners[runner.name] = runner

    add(Runner("eager", base, base, case))
    rows["eager"]["float64_grad_rel_err"] = float64_error(case, base, reference)
    torch_model = copy.deepcopy(base)
    torch_checkpoint_blocks(torch_model)
    add(Runner("torch blocks", torch_model, torch_model, case))
    wrapped = memsave.wrap(copy.deepcopy(base))
    add(Runner("wrap", wrapped, wrapped, case))

    eager_peak, wrap_peak = rows["eager"]["peak_bytes"], rows["wrap"]["peak_bytes"]
    for frac in PLAN_FRACTIONS:
        key = f"plan {int(frac * 100)}%"
        budget = int(wrap_peak + frac * (eager_peak - wrap_peak))
        model = copy.deepcopy(base)
        t0 = time.perf_counter()
        try:
            p = memsave.plan(model, *case.args, budget=budget, loss_fn=case.loss_fn, example_kwargs=case.kwargs)
        except memsave.InfeasibleBudgetError as e:
            rows[key] = dict(skipped=f"no plan fits {budget} bytes (smallest: {e.min_bytes})", budget_bytes=budget)
            log(f"  {key}: {rows[key]['skipped']}")
            continue
        plan_s = time.perf_counter() - t0
        memsave.wrap(model, p)
        add(
            Runner(key, model, model, case),
            budget_bytes=budget,
            plan_seconds=plan_s,
            regions=len(p.regions()),
            stages=len(p.stage_modules),
            plan_measured_peak_bytes=p.measured_peak_bytes,
            predicted_overhead=p.predicted_overhead,
        )
        rows[key]["within_budget"] = rows[key]["peak_bytes"] <= budget

    key = VARIANTS[-1]
    if not run_compile:
        rows[key] = dict(skipped="not run (--no-compile)")
    else:
        compiled_base = copy.deepcopy(base)
        compiled = compile_at(compiled_base, COMPILE_BUDGET)
        try:
            add(Runner(key, compiled_base, compiled, case, context=compile_context))
            rows[key]["compile_seconds"] = rows[key]["first_step_s"]
        except Exception as e:
            rows[key] = dict(skipped=f"torch.compile failed on this machine ({failure_reason(e)})")
            log(f"  {key}: {rows[key]['skipped']}")

    times = interleaved_times({v: runners[v] for v in VARIANTS if v in runners}, repeats, device)
    eager_s = statistics.median(times["eager"])
    eager_acts = rows["eager"]["activation_bytes"]
    for v, ts in times.items():
        r = rows[v]
        r["step_s"] = statistics.median(ts)
        r["times_s"] = ts
        r["time_ratio"] = r["step_s"] / eager_s
        r["peak_ratio"] = r["peak_bytes"] / eager_peak
        acts = r["activation_bytes"]
        r["activation_ratio"] = None if acts is None else acts / eager_acts
    return dict(
        model=name,
        description=case.description,
        parameters=sum(p.numel() for p in base.parameters()),
        blocks=blocks,
        variants={v: rows[v] for v in VARIANTS if v in rows},
    )


# ------------------------------------------------------------------------------------------------------ output
def _note(v: str, r: dict) -> str:
    mib = 2.0**20
    if "skipped" in r:
        return r["skipped"]
    if v.startswith("plan"):
        ok = "within" if r["within_budget"] else "ABOVE"
        return (
            f"budget {r['budget_bytes'] / mib:.1f} MiB: {ok}; {r['regions']} regions of "
            f"{r.get('stages', r.get('pieces'))} stages; "
            f"planned in {r['plan_seconds']:.0f} s"
        )
    if v.startswith("compile"):
        return f"first step (compiling) {r['compile_seconds']:.0f} s"
    if v == "eager" and r.get("float64_grad_rel_err") is not None:
        return f"eager float32 vs float64: grad err {r['float64_grad_rel_err']:.1e}"
    return ""


def _fmt(x: Optional[float], spec: str) -> str:
    return "n/a" if x is None else format(x, spec)


#: The printed table's columns (a note follows them); its cells are the markdown table's (:func:`_row_cells`).
TITLES = ("model", "variant", "peak", "ratio", "activations", "ratio", "time", "grad err")
WIDTHS = (9, 16, 10, 6, 11, 6, 6, 9)
HEADER = harness.text_row(TITLES, WIDTHS, "note")
SKIPPED = ["-"] * 6  # a skipped row's cells


def format_rows(res: dict) -> List[str]:
    """The printed table's lines for one model."""
    return harness.text_rows(res, _row_cells, WIDTHS, SKIPPED, _note)


def provenance(meta: dict) -> str:
    """The sentence a results page opens with: the command, the machine, the versions, the commit, the load."""
    return (
        f"`{meta['command'].strip()}` on {meta['device']} ({meta['cpu']}, {meta['threads']} threads), torch "
        f"{meta['torch']}, transformers {meta['transformers']}, timm {meta['timm']}, torchvision "
        f"{meta['torchvision']}, memsave {meta['memsave_version']} ({harness.commit_text(meta)}), {meta['date']}; "
        f"load average (1 / 5 / 15 min) at the start {load_text(meta['load_average_start'])}, at the end "
        f"{load_text(meta['load_average_end'])}; {meta['minutes']:.1f} minutes."
    )


def _row_cells(v: str, r: dict) -> List[str]:
    """A measured row's cells of the printed and the markdown table, from peak to grad err."""
    mib, acts = 2.0**20, r["activation_bytes"]
    return [
        f"{r['peak_bytes'] / mib:.1f} MiB",
        f"{r['peak_ratio']:.2f}",
        "n/a" if acts is None else f"{acts / mib:.1f} MiB",
        _fmt(r["activation_ratio"], ".2f"),
        f"{r['time_ratio']:.2f}",
        f"{r['grad_rel_err']:.1e}",
    ]


def markdown(meta: dict, results: List[dict]) -> str:
    """The results as a markdown page (what ``--markdown-from`` writes again)."""
    lines = [
        "# memsave on real models: eager, torch per-block checkpoint, memsave.wrap, memsave.plan, torch.compile",
        "",
        provenance(meta),
        "",
        "One training step (gradients set to None, forward with the loss, backward), float32, random weights, "
        "dropout off. Peak: allocator-level, above the step's start. Activations: live-tensor tracker, bytes created "
        "in forward and alive at its end (n/a under torch.compile: the tracker is a dispatch mode). Time: median of "
        f"{meta['repeats']} interleaved steps, as a ratio to eager's. Grad err: max over parameters of "
        "max |grad - eager's| / max |eager's| (0 = bitwise); the eager row's note gives eager's own error against "
        "the same step in float64, the rounding floor for a variant that reorders floating-point sums "
        "(torch.compile). Plan budgets: 25 / 50 / 75% of the way from `wrap`'s "
        f"peak to eager's. Compile: `torch._functorch.config.activation_memory_budget = {COMPILE_BUDGET}`; its "
        "first step compiles with inductor's FX-graph and autograd caches off (compiled C++ kernels may come from "
        "inductor's on-disk cache).",
        "",
        "| model | variant | peak | peak / eager | activations | act. / eager | time / eager | grad err | note |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    lines += harness.variant_rows(results, lambda res: res["description"], _row_cells, SKIPPED, _note)
    return "\n".join(lines) + "\n"


def argument_parser(doc: Optional[str], script: str, rewritten: str) -> argparse.ArgumentParser:
    """The command line this benchmark and ``frontier.py`` share: device, models, repeats, quick, compile, threads,
    output. ``script`` names the default results file; ``rewritten`` says what ``--markdown-from`` writes again."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    p.add_argument(
        "--repeats", type=int, default=None, help="interleaved timed steps per variant (default 9; --quick: 2)"
    )
    p.add_argument("--quick", action="store_true", help="tiny configs, 2 repeats, not saved unless --out: a smoke run")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile rows (minutes of compiling)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    output_arguments(p, script, rewritten)
    return p


def start_run(args: argparse.Namespace) -> Tuple[int, bool, torch.device, RunClock]:
    """The start of a run this benchmark and ``frontier.py`` share: ``--threads`` set, and the run line printed.

    Returns:
        The timed steps per variant (``--repeats``; default 9, ``--quick`` 2), whether to save (not ``--no-save``, and
        a ``--quick`` run only with ``--out``), the device and the run's clock.
    """
    if args.threads:
        torch.set_num_threads(args.threads)
    repeats = args.repeats or (2 if args.quick else 9)
    save = not args.no_save and (args.out is not None or not args.quick)
    clock = RunClock()
    print(
        f"one training step on {args.device} ({torch.get_num_threads()} threads), median of {repeats} interleaved "
        f"steps; ratios to eager",
        flush=True,
    )
    return repeats, save, torch.device(args.device), clock


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the benchmark (see the module docstring); returns the exit status."""
    p = argument_parser(__doc__, "real_models", "the .md")
    args = p.parse_args(argv)
    status = early_exit("real_models", args, markdown)
    if status is not None:
        return status
    repeats, save, device, clock = start_run(args)
    results = []
    for name in args.models:
        print(f"{name} ...", flush=True)
        results.append(
            bench_model(name, device, repeats, args.quick, not args.no_compile, log=lambda s: print(s, flush=True))
        )
    print(HEADER)
    for res in results:
        print("\n".join(format_rows(res)))
    finish_run(
        "real_models",
        args,
        argv,
        clock,
        dict(results=results),
        lambda m: markdown(m, results),
        save=save,
        repeats=repeats,
        quick=args.quick,
        compile_activation_memory_budget=COMPILE_BUDGET,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
