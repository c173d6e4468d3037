"""The frontier of peak memory against step time: every recompute strategy side by side on
Hugging Face GPT-2 and Llama, a timm ViT-tiny and torchvision's ResNet-50 -- the same models, sizes, inputs, losses
and measurements as ``real_models.py`` (random weights, float32, training mode, dropout off).

Variants (budgets ``B(f)`` at a fraction ``f`` of the way from ``wrap``'s measured peak to eager's, ``f`` in
``--fractions``, default 0 / 25 / 50 / 75%; ``f = 0`` is per-block checkpoint's memory):

* ``eager``; ``torch blocks`` (``torch.utils.checkpoint`` around every ``memsave.find_blocks`` block);
  ``torchtitan sac``: the same blocks under torchtitan's op-level selective policy (torch's
  ``create_selective_checkpoint_contexts``: each region saves the output of every other matrix product, the 1st,
  3rd, ..., and of every attention kernel, and recomputes the rest; :func:`torchtitan_context`), what large-model
  training runs without compile; ``wrap`` (``memsave.wrap(model)``, the same blocks as memsave regions); ``sqrt``
  (``memsave.plan(..., solver="sqrt")``, Chen et al.'s sqrt(N) segments of the planner's stages).
* ``module f``: ``memsave.plan(..., budget=B(f), selective=False)`` -- every region recomputed whole.
* ``selective f``: ``memsave.plan(..., budget=B(f))`` -- the planner may also recompute a region selectively
  (keep its matmul -- all or every other one -- / conv / attention outputs, recompute the cheap operators).
* ``selective @ torchtitan sac``: the same, planned for a budget of exactly the peak ``torchtitan sac`` reached:
  memsave's step time at torchtitan's peak (matched peak).
* ``torch blocks + compile``, ``wrap + compile``: ``torch.compile`` of the ``torch blocks`` and ``wrap`` models.
* ``plan + compile f``: ``plan.compile(model)`` for ``plan = memsave.plan(..., budget=B(f), compile=True)`` -- the
  plan made for the compiled step (its candidates measured as compile runs them, torch's partitioner among them;
  planning time in the note).
* ``plan + compile @ compile f``: the same, planned for a budget of exactly the peak that ``compile f`` reached:
  memsave's step time at torch's peak (matched peak).
* ``compile default``: ``torch.compile(model)`` as it comes (``activation_memory_budget`` 1.0).
* ``compile f``: ``torch.compile(model)`` under ``torch._functorch.config.activation_memory_budget = a(f)``, the
  budget matched as the fraction of eager's activation bytes that ``B(f)`` leaves room for:
  ``a(f) = (B(f) - (eager peak - eager activations)) / eager activations``, clamped to [0, 1]. Each compiled row
  compiles a program of its own (``compile_at``: a backend per row, its partitioner budget bound to it; its first
  step's time is in the row, inductor's FX-graph and autograd caches off), and all compiled rows of a model are
  timed together with eager in one interleaved block (memsave's ``time_interleaved``: each row's median per-round
  ratio to eager's, more rounds while a ratio is uncertain), so that they are compared under the same load. Off with
  ``--no-compile``; a failure is recorded with its reason, not dropped.

Columns: ``peak`` (allocator-level, one step above its start), ``time`` (median of ``--repeats`` interleaved steps,
A B C ... C B A, as a ratio to eager's median from the same interleaved block), ``recompute`` (the FLOPs backward runs
beyond eager's backward, by torch's FLOP formulas (``compat.count_flops``), as a fraction of eager's forward +
backward FLOPs: the deterministic cost that the noisy time measures; n/a under compile, whose kernels do not
dispatch), ``grad err`` (max |grad - eager's| / max |eager's|; 0 = bitwise), ``plan s`` (a planned row's
``memsave.plan`` wall time and, in brackets, that time in eager steps (over eager's median step); ``(cache)`` when
the plan came from the plan cache), ``again s`` (the same
``memsave.plan`` call made a second time: the plan cache's answer) and whether a plan's or compiled row's peak is
within its budget. ``*`` marks the rows on a model's frontier: no other row has both a lower-or-equal peak and a
lower-or-equal time. Plans are cached in a fresh temporary directory per run (``--plan-cache DIR``: that directory,
kept, so a second run's plans come from it), so the first plan of each row profiles and the second finds it.

    python3 benchmarks/frontier.py                          # the committed CPU run (~25 minutes on 2 cores)
    python3 benchmarks/frontier.py --models gpt2 --no-compile --no-save
    python3 benchmarks/frontier.py --quick                  # tiny configs, no compile, not saved: a smoke run
    python3 benchmarks/frontier.py --compile-only           # only the compiled rows, merged into the JSON
    python3 benchmarks/frontier.py --markdown-from benchmarks/results/frontier_cpu.json   # .md and .png again

Writes ``benchmarks/results/frontier_<device>.json``, ``.md`` and ``.png`` (peak against time and against recompute
FLOPs, one panel per model) with the machine, library versions, commit and the load average at start and end.
"""

from __future__ import annotations

import collections
import copy
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch._dynamo
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:  # run as a script: make the `benchmarks` package importable
    sys.path.insert(0, str(HERE.parent))

import memsave
from benchmarks import harness
from benchmarks.harness import cuda_missing, default_out, load_average, load_text, run_record
from benchmarks.real_models import (
    Case,
    Runner,
    argument_parser,
    compile_context,
    eager_reference,
    failure_reason,
    interleaved_times,
    measure_variant,
    prepare,
    provenance,
    start_run,
    torch_checkpoint_blocks,
)
from memsave.common import compat
from memsave.measurement.timing import Timing, time_interleaved
from memsave.recompute.planning.partitioner import compile_at

FRACTIONS = (0.0, 0.25, 0.5, 0.75)
KINDS = ("module", "selective", "compile", "plan + compile")
COMPILED = ("torch blocks + compile", "wrap + compile")
EAGER_ROWS = ("eager", "torch blocks", "torchtitan sac", "wrap", "sqrt")
SAC_MATCHED = "selective @ torchtitan sac"  # memsave's plan for exactly the peak torchtitan's policy reached


def _aten_ops(*names: str) -> frozenset:
    """The default overloads of the aten operators ``names`` this torch has."""
    ops = (getattr(torch.ops.aten, n, None) for n in names)
    return frozenset(op.default for op in ops if op is not None)


#: torchtitan's op-level selective policy, as its ``_op_sac_save_list`` and ``_get_custom_policy`` define it (read
#: from torchtitan, written here): matrix products (torchtitan names ``aten.mm``; these models' biased linears run
#: ``aten.addmm``, counted the same) are saved except every second one, attention kernels always, the rest recomputed.
SAC_MATMULS = _aten_ops("mm", "addmm")
SAC_ATTENTION = _aten_ops(
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_attention_math",
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_fused_attention_overrideable",
)


def torchtitan_policy() -> Callable[..., CheckpointPolicy]:
    """torchtitan's selective policy for one region call (a fresh count of matrix products): the 1st, 3rd, 5th ...
    matrix product and every attention kernel saved, the rest recomputed. The forward and the recompute count
    separately (``ctx.is_recompute``), as torchtitan does, so the recompute saves and replays the same ones.

    Examples:
        >>> policy = torchtitan_policy()
        >>> policy(ctx, torch.ops.aten.mm.default)
        <CheckpointPolicy.MUST_SAVE: 0>
    """
    counts: Dict[str, int] = collections.defaultdict(int)

    def policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        if op in SAC_MATMULS:
            mode = "recompute" if ctx.is_recompute else "forward"
            counts[mode] += 1
            return CheckpointPolicy.MUST_SAVE if counts[mode] % 2 == 1 else CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.MUST_SAVE if op in SAC_ATTENTION else CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def torchtitan_context() -> Tuple[Any, Any]:
    """A ``context_fn`` for ``torch.utils.checkpoint.checkpoint``: torch's selective-checkpoint contexts under
    :func:`torchtitan_policy`, a fresh one per region call.

    Examples:
        >>> torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False, context_fn=torchtitan_context)
    """
    return create_selective_checkpoint_contexts(torchtitan_policy())


def _pct(f: float) -> str:
    return f"{f * 100:g}%"


def step_flops(runner: Runner) -> Tuple[int, int]:
    """(forward FLOPs, backward FLOPs) of one seeded step of ``runner``, the backward's recompute included, counted
    by torch's FLOP formulas (``memsave.common.compat.count_flops``: matrix products, convolutions, attention;
    pointwise operators count 0)."""
    case = runner.case
    runner.model.zero_grad(set_to_none=True)
    torch.manual_seed(5)
    with compat.count_flops() as forward:
        out = runner.call(*case.args, **case.kwargs)
        loss = case.loss_fn(out)
    with compat.count_flops() as backward:
        loss.backward()
    del out
    runner.model.zero_grad(set_to_none=True)
    return forward.total, backward.total


def matched_activation_budget(budget: int, eager_peak: int, eager_activations: int) -> float:
    """The fraction of eager's activation bytes a step peak of ``budget`` leaves room for, in [0, 1]: what
    ``torch._functorch.config.activation_memory_budget`` is set to for a compiled row matched to ``budget``."""
    fixed = eager_peak - eager_activations  # parameters' gradients, the loss's temporaries: not activations
    return min(1.0, max(0.0, (budget - fixed) / eager_activations))


def plan_twice(model: torch.nn.Module, case: Case, budget: Optional[int], cache: str, **options: Any) -> dict:
    """``memsave.plan`` of ``model`` (not wrapped), then the same call again, both with the plan cache at ``cache``:
    the plan and the row's planning fields (``plan_seconds``, ``plan_cached``: the first call's wall time and whether
    its plan came from the cache; ``replan_seconds``, ``replan_cached``: the second call's).

    Raises:
        memsave.InfeasibleBudgetError: from the first call (nothing is cached then).
    """
    kwargs = dict(budget=budget, loss_fn=case.loss_fn, example_kwargs=case.kwargs, cache=cache, **options)
    t0 = time.perf_counter()
    p = memsave.plan(model, *case.args, **kwargs)
    t1 = time.perf_counter()
    again = memsave.plan(model, *case.args, **{**kwargs, "progress": False})
    t2 = time.perf_counter()
    return dict(plan=p, plan_seconds=t1 - t0, plan_cached=p.cached, replan_seconds=t2 - t1, replan_cached=again.cached)


def _plan_row_extra(p: memsave.Plan, budget: Optional[int], timing: dict) -> Dict[str, Any]:
    selective = [k for k in range(len(p.segments)) if p.keeps(k)]
    kept = sorted({"+".join(p.keeps(k)) for k in selective})
    return dict(
        budget_bytes=budget,
        **{k: v for k, v in timing.items() if k != "plan"},
        regions=len(p.regions()),
        stages=len(p.stage_modules),
        selective_regions=len(selective),
        keeps=kept,
        predicted_extra_seconds=p.predicted_extra_seconds,
        predicted_time_ratio=1.0 + p.predicted_overhead,
        plan_measured_peak_bytes=p.measured_peak_bytes,
        plan_activation_memory_budget=p.activation_memory_budget,
    )


def bench_model(
    name: str,
    device: torch.device,
    repeats: int,
    quick: bool,
    fractions: Sequence[float],
    run_compile: bool,
    log: Callable[[str], None],
    compile_only: bool = False,
    plan_cache: Optional[str] = None,
) -> dict:
    """Every variant of one model at every budget; plans cached at ``plan_cache`` (None: a temporary directory,
    removed afterwards).

    Returns:
        ``{"model", "description", "blocks", "eager_flops", "variants": {variant: row}}``; a row that could not run
        has ``skipped`` (the reason) instead of measurements.
    """
    if plan_cache is None:
        with tempfile.TemporaryDirectory(prefix="memsave-plans-") as fresh:
            return bench_model(name, device, repeats, quick, fractions, run_compile, log, compile_only, fresh)
    case: Case = prepare(name, device, quick)
    base = case.model
    reference = eager_reference(case)
    rows: Dict[str, dict] = {}
    runners: Dict[str, Runner] = {}

    def add(runner: Runner, kind: str, **extra: Any) -> None:
        row = measure_variant(runner, reference, device, log, kind=kind, **extra)
        if "compile" not in kind:  # compiled kernels do not dispatch: no FLOP count
            row["backward_flops"] = step_flops(runner)[1]
        rows[runner.name], runners[runner.name] = row, runner

    eager = Runner("eager", base, base, case)
    add(eager, "eager")
    forward_flops, backward_flops = step_flops(eager)
    torch_model = copy.deepcopy(base)
    torch_checkpoint_blocks(torch_model)
    add(Runner("torch blocks", torch_model, torch_model, case), "blocks")
    sac_model = copy.deepcopy(base)
    torch_checkpoint_blocks(sac_model, context_fn=torchtitan_context)
    add(Runner("torchtitan sac", sac_model, sac_model, case), "blocks sac")
    wrapped = memsave.wrap(copy.deepcopy(base))
    add(Runner("wrap", wrapped, wrapped, case), "blocks")

    def add_plan(key: str, kind: str, budget: Optional[int], **plan_kwargs: Any) -> None:
        model = copy.deepcopy(base)
        try:
            timing = plan_twice(model, case, budget, plan_cache, **plan_kwargs)
        except memsave.InfeasibleBudgetError as e:
            rows[key] = dict(
                kind=kind, budget_bytes=budget, skipped=f"no plan fits {budget:,} bytes (smallest: {e.min_bytes:,})"
            )
            log(f"  {key}: {rows[key]['skipped']}")
            return
        p = timing["plan"]
        extra = _plan_row_extra(p, budget, timing)
        memsave.wrap(model, p)
        add(Runner(key, model, model, case), kind, **extra)

    eager_peak, wrap_peak = rows["eager"]["peak_bytes"], rows["wrap"]["peak_bytes"]
    eager_acts = rows["eager"]["activation_bytes"]
    budgets = {f: int(wrap_peak + f * (eager_peak - wrap_peak)) for f in fractions}
    if not compile_only:
        add_plan("sqrt", "sqrt", None, solver="sqrt", selective=False)
        for f, budget in budgets.items():
            add_plan(f"module {_pct(f)}", "module", budget, selective=False)
            add_plan(f"selective {_pct(f)}", "selective", budget)
        add_plan(SAC_MATCHED, "selective", rows["torchtitan sac"]["peak_bytes"])

    times = interleaved_times(runners, repeats, device)
    eager_s = statistics.median(times["eager"])
    for v, ts in times.items():
        rows[v].update(step_s=statistics.median(ts), times_s=ts, time_ratio=statistics.median(ts) / eager_s)
        if "plan_seconds" in rows[v]:  # planning time in eager steps: what another machine would see, roughly
            rows[v]["plan_steps"] = rows[v]["plan_seconds"] / eager_s

    if run_compile:
        compiled_rows(case, base, budgets, eager, rows, add, log, repeats, device, eager_peak, eager_acts, plan_cache)
    else:
        for f, budget in budgets.items():
            rows[f"compile {_pct(f)}"] = dict(
                kind="compile",
                budget_bytes=budget,
                activation_memory_budget=matched_activation_budget(budget, eager_peak, eager_acts),
                skipped="not run (--no-compile or --quick)",
            )
    torch._dynamo.reset()

    eager_flops = forward_flops + backward_flops
    for r in rows.values():
        if "skipped" in r:
            continue
        r["peak_ratio"] = r["peak_bytes"] / eager_peak
        if r.get("budget_bytes") is not None:
            r["within_budget"] = r["peak_bytes"] <= r["budget_bytes"]
        if "backward_flops" in r:
            r["recompute_flops"] = r["backward_flops"] - backward_flops
            r["recompute_ratio"] = r["recompute_flops"] / eager_flops
    mark_frontier(rows)
    order = [*EAGER_ROWS, *COMPILED, "compile default"]
    order += [f"{kind} {_pct(f)}" for kind in KINDS for f in fractions]
    order += [v for v in rows if v not in order]  # the matched-peak plans, after the rows they match
    return dict(
        model=name,
        description=case.description,
        blocks=memsave.find_blocks(base),
        eager_flops=dict(forward=forward_flops, backward=backward_flops),
        budgets={_pct(f): b for f, b in budgets.items()},
        variants={v: rows[v] for v in order if v in rows},
    )


def compiled_rows(
    case: Case,
    base: torch.nn.Module,
    budgets: Dict[float, int],
    eager: Runner,
    rows: Dict[str, dict],
    add: Callable[..., None],
    log: Callable[[str], None],
    repeats: int,
    device: torch.device,
    eager_peak: int,
    eager_acts: int,
    plan_cache: str,
) -> None:
    """The rows run under ``torch.compile``: torch's per-block checkpoint and ``memsave.wrap`` compiled, torch's
    ``activation_memory_budget`` at its default and matched to each budget, and ``memsave.plan(..., compile=True)``
    at each budget and at the peak each of torch's matched rows reached (``plan + compile @ compile f``). Each row
    compiles a program of its own (:func:`compile_at`: no row reuses another's graphs, whatever its partitioner
    budget) and all are timed in one interleaved block with eager (:func:`compiled_block`)."""
    compiled: Dict[str, Runner] = {}

    def run(key: str, kind: str, model: torch.nn.Module, amb: Optional[float] = None, **extra: Any) -> None:
        runner = Runner(key, model, compile_at(model, amb), case, context=compile_context)
        try:
            add(runner, kind, **extra)
        except Exception as e:
            rows[key] = dict(kind=kind, **extra, skipped=f"torch.compile failed here ({failure_reason(e)})")
            log(f"  {key}: {rows[key]['skipped']}")
            return
        rows[key]["compile_seconds"] = rows[key]["first_step_s"]
        compiled[key] = runner

    def plan_row(key: str, budget: int) -> None:
        model = copy.deepcopy(base)
        try:  # planning resets dynamo: the rows compiled so far compile again on their next step, as they were
            timing = plan_twice(model, case, budget, plan_cache, compile=True)
        except memsave.InfeasibleBudgetError as e:
            rows[key] = dict(kind="plan + compile", budget_bytes=budget, skipped=f"no plan fits ({e.min_bytes:,})")
            log(f"  {key}: {rows[key]['skipped']}")
            return
        p = timing["plan"]
        extra = _plan_row_extra(p, budget, timing)
        run(key, "plan + compile", memsave.wrap(model, p), p.activation_memory_budget, **extra)  # as p.compile

    blocks = copy.deepcopy(base)
    torch_checkpoint_blocks(blocks)
    run("torch blocks + compile", "blocks + compile", blocks)
    run("wrap + compile", "blocks + compile", memsave.wrap(copy.deepcopy(base)))
    run("compile default", "compile", copy.deepcopy(base), None, activation_memory_budget=1.0)
    for f, budget in budgets.items():
        amb = matched_activation_budget(budget, eager_peak, eager_acts)
        run(
            f"compile {_pct(f)}", "compile", copy.deepcopy(base), amb, budget_bytes=budget, activation_memory_budget=amb
        )
    for f, budget in budgets.items():
        plan_row(f"plan + compile {_pct(f)}", budget)
    for f in budgets:  # matched peak: a plan for exactly the peak torch's partitioner reached
        torch_row = rows.get(f"compile {_pct(f)}", {})
        if "peak_bytes" in torch_row:
            plan_row(f"plan + compile @ compile {_pct(f)}", int(torch_row["peak_bytes"]))
    for key, timing in compiled_block(eager, compiled, repeats).items():
        rows[key].update(
            step_s=timing.median_seconds,
            times_s=list(timing.times),
            time_ratio=timing.ratio,
            time_ratio_iqr=timing.ratio_iqr,
            timed_rounds=timing.rounds,
        )


def compiled_block(eager: Runner, compiled: Dict[str, Runner], repeats: int) -> Dict[str, Timing]:
    """Eager and every compiled row timed in one interleaved block (:func:`memsave.measurement.timing
    .time_interleaved`: ``repeats`` rounds or more, up to 4x while a ratio is uncertain; each round A B C ... then
    ... C B A; each row's time as the median of its per-round ratio to eager's in the same round), so that compiled
    rows are compared with each other under the same load. Returns the compiled rows' timings."""
    steps = {"eager": eager.step, **{key: runner.step for key, runner in compiled.items()}}
    if len(steps) == 1:
        return {}
    with compile_context():  # rows a plan's dynamo reset dropped compile again in the warm-up
        timing = time_interleaved(steps, rounds=repeats, min_windows=1, max_windows=1, reference="eager")
    for runner in (eager, *compiled.values()):
        runner.model.zero_grad(set_to_none=True)
    return {key: timing[key] for key in compiled}


def merge_compiled(path: str, meta: dict, results: List[dict]) -> Tuple[dict, List[dict]]:
    """The results JSON at ``path`` with its compiled rows replaced by (or added from) ``results``, a
    ``--compile-only`` run; the frontier marked again. Its meta stays, with this run's under ``compiled_rows_run``.
    Models not in ``results`` keep their rows."""
    with open(path) as f:
        old = json.load(f)
    by_model = {res["model"]: res for res in results}
    for res in old["results"]:
        new = by_model.get(res["model"])
        if new is None:
            continue
        compiled = {v: r for v, r in new["variants"].items() if "compile" in r.get("kind", "")}
        rows = {v: r for v, r in res["variants"].items() if "compile" not in r.get("kind", "")}
        rows.update(compiled)
        for r in rows.values():
            r.pop("on_frontier", None)
        mark_frontier(rows)
        order = [*EAGER_ROWS, *COMPILED]
        order += [f"{kind} {pct}" for kind in KINDS for pct in res["budgets"]]
        res["variants"] = {v: rows[v] for v in order + [v for v in rows if v not in order] if v in rows}
    old["meta"]["compiled_rows_run"] = meta
    return old["meta"], old["results"]


def mark_frontier(rows: Dict[str, dict]) -> None:
    """Set ``on_frontier`` on every measured row: True when no other row has a lower-or-equal peak and a
    lower-or-equal time with at least one of them lower (the Pareto frontier of peak against time)."""
    measured = {v: r for v, r in rows.items() if "skipped" not in r and "time_ratio" in r}
    for v, r in measured.items():
        r["on_frontier"] = not any(
            o["peak_bytes"] <= r["peak_bytes"]
            and o["time_ratio"] <= r["time_ratio"]
            and (o["peak_bytes"] < r["peak_bytes"] or o["time_ratio"] < r["time_ratio"])
            for w, o in measured.items()
            if w != v
        )


# ------------------------------------------------------------------------------------------------------ output
CLEAR = 0.05  # a time ratio this much lower (5% of eager's step) counts as clearly lower on these noisy machines


def verdict(res: dict) -> List[str]:
    """What the rows say about selective plans against per-block checkpoint and module-level plans, in words: a
    time is called lower only when it is lower by :data:`CLEAR` or more."""
    rows = res["variants"]
    out = []
    wrap, sel0 = rows.get("wrap"), rows.get("selective 0%")
    if wrap and sel0 and "skipped" not in sel0:
        gain = wrap["time_ratio"] - sel0["time_ratio"]
        when = (
            "at a clearly lower step time"
            if gain >= CLEAR
            else "at a higher step time"
            if gain <= -CLEAR
            else "at the same step time within the noise"
        )
        if sel0["peak_bytes"] > wrap["peak_bytes"]:
            how = "stays above per-block checkpoint's peak"
        elif not sel0["selective_regions"]:
            how = (
                "reaches per-block checkpoint's memory with no selective region (no kept operator output fits "
                f"there: the plan is module-level), {when}"
            )
        else:
            how = f"reaches per-block checkpoint's memory {when}"
        out.append(
            f"selective plan at wrap's peak {how}: {sel0['peak_ratio']:.2f} of eager's peak at "
            f"{sel0['time_ratio']:.2f} of its time (recompute {sel0['recompute_ratio']:.3f} of eager's FLOPs, "
            f"{sel0['selective_regions']} of {sel0['regions']} regions selective) against wrap's "
            f"{wrap['peak_ratio']:.2f} at {wrap['time_ratio']:.2f} (recompute {wrap['recompute_ratio']:.3f})"
        )
    out += torch_eager_points(rows)
    out += matched_peak(rows)
    for key, r in rows.items():
        if not key.startswith("selective ") or "skipped" in r:
            continue
        m = rows.get("module " + key.split(" ", 1)[1])
        if not m or "skipped" in m:
            continue
        out.append(
            f"at {key.split(' ', 1)[1]}: selective {r['peak_ratio']:.2f} peak / {r['time_ratio']:.2f} time / "
            f"{r['recompute_ratio']:.3f} recompute, module-level {m['peak_ratio']:.2f} / "
            f"{m['time_ratio']:.2f} / {m['recompute_ratio']:.3f}"
        )
    return out


def _note(r: dict) -> str:
    if "skipped" in r:
        return r["skipped"]
    parts = []
    if r.get("budget_bytes") is not None:
        parts.append(f"budget {r['budget_bytes'] / 2**20:.1f} MiB: {'within' if r['within_budget'] else 'ABOVE'}")
    if "regions" in r:
        sel = f", {r['selective_regions']} selective (keep {', '.join(r['keeps'])})" if r["selective_regions"] else ""
        predicted = f", predicted time {r['predicted_time_ratio']:.2f}" if "predicted_time_ratio" in r else ""
        parts.append(f"{r['regions']} regions{sel}{predicted}")
    if "activation_memory_budget" in r:
        parts.append(f"activation_memory_budget {r['activation_memory_budget']:.2f}")
    if r.get("plan_activation_memory_budget") is not None:
        parts.append(f"torch's partitioner at {r['plan_activation_memory_budget']:.2f}")
    if "compile_seconds" in r:
        parts.append(f"first step (compiling) {r['compile_seconds']:.0f} s")
    if "time_ratio_iqr" in r:
        parts.append(f"time IQR {r['time_ratio_iqr']:.2f} over {r['timed_rounds']} rounds")
    return "; ".join(parts)


def _cells(r: dict) -> Tuple[str, str, str, str, str]:
    rec = r.get("recompute_ratio")
    return (
        f"{r['peak_bytes'] / 2**20:.1f}",
        f"{r['peak_ratio']:.2f}",
        f"{r['time_ratio']:.2f}",
        "n/a" if rec is None else f"{rec:.3f}",
        f"{r['grad_rel_err']:.1e}",
    )


def plan_cells(r: dict) -> Tuple[str, str]:
    """A planned row's planning times: the first ``memsave.plan`` call's (with its eager steps, that time over eager's
    median step; ``(cache)`` when its plan came from the plan cache) and the second call's (``(not cached)`` when
    that one planned again); ``-`` for other rows and for results written before these were recorded.

    Examples:
        >>> plan_cells(dict(plan_seconds=2.31, plan_cached=False, replan_seconds=0.004, replan_cached=True))
        ('2.3', '0.004')
        >>> plan_cells(dict(plan_seconds=2.31, plan_steps=5.43, replan_seconds=0.004, replan_cached=True))
        ('2.3 (5.4 steps)', '0.004')
    """
    if "plan_seconds" not in r:
        return "-", "-"
    steps = f" ({r['plan_steps']:.1f} steps)" if "plan_steps" in r else ""
    first = f"{r['plan_seconds']:.1f}{steps}{' (cache)' if r.get('plan_cached') else ''}"
    if "replan_seconds" not in r:
        return first, "-"
    return first, f"{r['replan_seconds']:.3f}{'' if r.get('replan_cached') else ' (not cached)'}"


def format_rows(res: dict) -> List[str]:
    """The printed table's lines for one model."""
    return harness.text_rows(res, _row_cells, WIDTHS, SKIPPED, lambda v, r: _note(r))


#: The printed table's columns (a note follows them; ``*``: on the frontier); its cells are the markdown table's.
TITLES = ("model", "variant", "peak", "ratio", "time", "recompute", "grad err", "plan s", "again s", "*")
WIDTHS = (9, 22, 10, 6, 6, 9, 8, 22, 18, 1)
HEADER = harness.text_row(TITLES, WIDTHS)
SKIPPED = ["-"] * 7 + [""]  # a skipped row's cells


def _row_cells(v: str, r: dict) -> List[str]:
    """A measured row's cells of the printed and the markdown table, from peak to the frontier mark."""
    peak, ratio, t, rec, err = _cells(r)
    return [f"{peak} MiB", ratio, t, rec, err, *plan_cells(r), "*" if r.get("on_frontier") else ""]


def markdown(meta: dict, results: List[dict], plot_name: Optional[str]) -> str:
    """The results as a markdown page (what ``--markdown-from`` writes again)."""
    lines = [
        "# The memory / time frontier: eager, per-block checkpoint, sqrt(N), module-level and selective plans, "
        "torch.compile",
        "",
        provenance(meta),
        "",
        "One training step (gradients set to None, forward with the loss, backward), float32, random weights, "
        "dropout off; the models, sizes and losses of `real_models.py`. Budgets: 0 / 25 / 50 / 75% of the way from "
        "`wrap`'s peak to eager's (0% = per-block checkpoint's memory). `module`: `memsave.plan(..., "
        "selective=False)`; `selective`: `memsave.plan(...)` (selective regions allowed); `... + compile`: "
        "`torch.compile` of that model; `plan + compile`: `memsave.plan(..., compile=True)` applied, compiled; "
        "`compile`: "
        "`torch.compile` under `activation_memory_budget` matched to the budget (the fraction of eager's activation "
        "bytes the budget leaves room for); `torchtitan sac`: the blocks of `torch blocks` under torchtitan's "
        "selective policy (save every other matrix product's output and every attention output, recompute the rest). "
        "Plan s: the planned row's `memsave.plan` wall time (in brackets, that time over eager's median step; "
        "`(cache)`: it came from the plan cache); again s: the "
        "same call made again, answered by the plan cache. Peak: allocator-level, above the step's start. "
        "Time: median of "
        f"{meta['repeats']} interleaved steps as a ratio to eager's median in the same interleaved block (the "
        "compiled rows of a model all in one block with eager: the median over rounds of each row's time over "
        "eager's in the same round; the IQR of that ratio and the rounds timed in the note). "
        "Recompute: FLOPs backward runs beyond eager's "
        "backward (torch's FLOP formulas) over eager's forward + backward FLOPs. Grad err: max |grad - eager's| / "
        "max |eager's| (0 = bitwise). `*`: on the model's frontier (no row has a lower-or-equal peak and time).",
        "",
    ]
    if plot_name:
        lines += [f"![frontier]({plot_name})", ""]
    lines += [
        "| model | variant | peak | peak / eager | time / eager | recompute | grad err | plan s | again s | frontier "
        "| note |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    lines += harness.variant_rows(results, lambda res: res["model"], _row_cells, SKIPPED, lambda v, r: _note(r))
    lines += ["", "Models: " + "; ".join(f"{res['model']}: {res['description']}" for res in results) + ".", ""]
    lines += ["## What the rows say", ""]
    for res in results:
        for sentence in verdict(res):
            lines.append(f"- {res['model']}: {sentence}.")
    return "\n".join(lines) + "\n"


STYLE = {  # variant kind -> (marker, colour, label)
    "eager": ("*", "black", "eager"),
    "blocks": ("x", "grey", "per-block checkpoint (torch, memsave)"),
    "blocks sac": ("h", "tab:brown", "per-block + torchtitan's selective policy"),
    "sqrt": ("s", "tab:purple", "sqrt(N)"),
    "module": ("o", "tab:blue", "module-level plans"),
    "selective": ("D", "tab:red", "selective plans"),
    "compile": ("^", "tab:green", "torch.compile, matched budget"),
    "blocks + compile": ("P", "tab:olive", "per-block checkpoint + compile (torch, memsave)"),
    "plan + compile": ("v", "tab:orange", "memsave.plan(compile=True) + compile"),
}


def plot(results: List[dict], path: str) -> bool:
    """Peak against time (top) and against recompute FLOPs (bottom), one column per model, as a PNG at ``path``.
    Returns False (and writes nothing) when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(2, len(results), figsize=(4.2 * len(results), 7.5), squeeze=False)
    for col, res in enumerate(results):
        rows = {v: r for v, r in res["variants"].items() if "skipped" not in r}
        for row_i, (field, label) in enumerate(
            (("time_ratio", "step time / eager"), ("recompute_ratio", "recompute FLOPs / eager step FLOPs"))
        ):
            ax = axes[row_i][col]
            for kind, (marker, colour, name) in STYLE.items():
                pts = sorted(
                    (r["peak_ratio"], r[field], v)
                    for v, r in rows.items()
                    if r["kind"] == kind and r.get(field) is not None
                )
                if not pts:
                    continue
                xs, ys = [p[0] for p in pts], [p[1] for p in pts]
                line = "-" if kind in ("module", "selective", "plan + compile") else ""
                ax.plot(xs, ys, marker=marker, linestyle=line, color=colour, label=name, alpha=0.85)
            ax.set_xlabel("peak / eager")
            ax.set_ylabel(label)
            ax.grid(alpha=0.3)
            if row_i == 0:
                ax.set_title(res["model"])
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(STYLE), fontsize=8)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write_outputs(meta: dict, results: List[dict], json_path: str) -> None:
    """Write the JSON (unless it is where the data came from), the PNG beside it and the markdown page."""
    stem = os.path.splitext(json_path)[0]
    png = stem + ".png"
    plotted = plot(results, png)
    with open(stem + ".md", "w") as f:
        f.write(markdown(meta, results, os.path.basename(png) if plotted else None))


MEMSAVE_COMPILED = ("wrap + compile", "plan + compile")  # memsave's compiled rows: wrap's, and plans'


def matched_peak(rows: Dict[str, dict]) -> List[str]:
    """At each of torch's ``compile f`` rows (``activation_memory_budget``) that was measured, memsave's fastest
    compiled row (``wrap + compile`` or a ``plan + compile``) at the same or a lower peak: its step time minus
    torch's, as a fraction of eager's step (a gain where negative). Noted ``within +0.05`` when memsave's time is
    at most torch's + :data:`CLEAR`.

    Examples:
        >>> matched_peak({"compile 50%": dict(kind="compile", peak_bytes=10, time_ratio=0.9),
        ...               "plan + compile 50%": dict(kind="plan + compile", peak_bytes=9, time_ratio=0.92)})[0][-35:]
        "+0.02 of eager's step, within +0.05"
    """
    ours = [
        (v, r) for v, r in rows.items() if "skipped" not in r and "time_ratio" in r and v.startswith(MEMSAVE_COMPILED)
    ]
    torchs = [(key, t) for key, t in rows.items() if t.get("kind") == "compile"]
    return _fastest_at_torchs_peaks(torchs, ours, "compiled", CLEAR)


def _fastest_at_torchs_peaks(
    torchs: List[Tuple[str, Optional[dict]]], ours: List[Tuple[str, dict]], what: str, allowed: float
) -> List[str]:
    """One line per measured row of ``torchs``: the fastest of ``ours`` at the same or a lower peak, its step time
    minus torch's (a fraction of eager's step), ``within`` when at most ``allowed`` more; ``what`` names ours."""
    out = []
    for key, t in torchs:
        if t is None or "skipped" in t or "time_ratio" not in t:
            continue
        fits = [(v, r) for v, r in ours if r["peak_bytes"] <= t["peak_bytes"]]
        if not fits:
            out.append(f"at {key}'s peak ({t['peak_bytes'] / 2**20:.1f} MiB) no memsave {what} row fits")
            continue
        v, r = min(fits, key=lambda vr: vr[1]["time_ratio"])
        gap = r["time_ratio"] - t["time_ratio"]
        out.append(
            f"at {key}'s peak ({t['peak_bytes'] / 2**20:.1f} MiB, time {t['time_ratio']:.2f}) memsave's fastest "
            f"{what} row at or below it is {v} ({r['peak_bytes'] / 2**20:.1f} MiB, time {r['time_ratio']:.2f}): "
            f"{gap:+.2f} of eager's step, {'within' if gap <= allowed else 'NOT within'} +{allowed:.2f}"
        )
    return out


#: The noise allowed when memsave's eager rows are compared with torch's eager choices: +0.02 of eager's step.
EAGER_NOISE = 0.02
MEMSAVE_EAGER = ("wrap", "sqrt", "module ", "selective ")  # memsave's eager rows: wrap's, and plans'
TORCH_EAGER = ("torch blocks", "torchtitan sac")  # torch's eager choices: per-block, per-block + torchtitan's policy


def torch_eager_points(rows: Dict[str, dict]) -> List[str]:
    """At each of torch's eager rows (:data:`TORCH_EAGER`) that was measured, memsave's fastest eager row (``wrap``,
    ``sqrt`` or a plan, not compiled) at the same or a lower peak: its step time minus torch's, as a fraction of
    eager's step (a gain where negative); ``within +0.02`` when at most torch's + 0.02.

    Examples:
        >>> torch_eager_points({"torch blocks": dict(peak_bytes=10, time_ratio=1.3),
        ...                     "selective 0%": dict(kind="selective", peak_bytes=9, time_ratio=1.25)})[0][-35:]
        "-0.05 of eager's step, within +0.02"
    """
    ours = [
        (v, r)
        for v, r in rows.items()
        if "skipped" not in r and "time_ratio" in r and v.startswith(MEMSAVE_EAGER) and "compile" not in v
    ]
    return _fastest_at_torchs_peaks([(key, rows.get(key)) for key in TORCH_EAGER], ours, "eager", EAGER_NOISE)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the benchmark (see the module docstring); returns the exit status."""
    p = argument_parser(__doc__, "frontier", "the .md and .png")
    p.add_argument(
        "--fractions",
        nargs="+",
        type=float,
        default=list(FRACTIONS),
        help="budgets as fractions of the way from wrap's peak to eager's (default 0 0.25 0.5 0.75)",
    )
    p.add_argument(
        "--plan-cache",
        default=None,
        metavar="DIR",
        help="the plan cache directory memsave.plan uses (kept; a second run's plans come from it); default: a fresh "
        "temporary directory per model, so every row's first plan profiles",
    )
    p.add_argument(
        "--compile-only",
        action="store_true",
        help="run only the compiled rows (and eager, torch blocks, wrap for the budgets) and merge them into the "
        "existing results JSON (--out or the default), leaving its other rows as they are",
    )
    args = p.parse_args(argv)
    if args.markdown_from:
        with open(args.markdown_from) as f:
            data = json.load(f)
        write_outputs(data["meta"], data["results"], args.markdown_from)
        return 0
    if any(not 0.0 <= f <= 1.0 for f in args.fractions):
        p.error("--fractions: each must be within [0, 1] (0 = wrap's peak, 1 = eager's)")
    if cuda_missing("frontier", args.device):
        return 2
    repeats, save, device, clock = start_run(args)
    run_compile = not (args.no_compile or args.quick)
    results = []
    for name in args.models:
        print(f"{name} ...", flush=True)
        results.append(
            bench_model(
                name,
                device,
                repeats,
                args.quick,
                sorted(set(args.fractions)),
                run_compile,
                log=lambda s: print(s, flush=True),
                compile_only=args.compile_only,
                plan_cache=args.plan_cache,
            )
        )
    print(HEADER)
    for res in results:
        print("\n".join(format_rows(res)))
        for sentence in verdict(res):
            print(f"  {res['model']}: {sentence}")
    print(f"load average at the start: {load_text(clock.load_start)}, at the end: {load_text(load_average())}")
    if save:
        out = args.out or default_out("frontier", args.device)
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        meta = run_record(
            "frontier",
            args.device,
            argv,
            clock,
            repeats=repeats,
            quick=args.quick,
            fractions=sorted(set(args.fractions)),
        )
        if args.compile_only:
            meta, results = merge_compiled(out, meta, results)
        with open(out, "w") as f:
            json.dump(dict(meta=meta, results=results), f, indent=2)
        write_outputs(meta, results, out)
        print(f"wrote {out} and its .md and .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
