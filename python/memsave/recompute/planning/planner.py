"""The driver, steps 1-4 together: :func:`plan` profiles the model (:mod:`.trace`), builds the chain of stages
(:mod:`.chain`, :mod:`.operators`), searches it with the C++ planner (:mod:`.search`) while verifying each candidate
by measuring it, and returns a :class:`~.plan.Plan`.

How a plan is made:

1. **Profile** (a few forward+backward steps on the example inputs, state restored afterwards). One step runs
   under an allocation log (a ``TorchDispatchMode`` recording every new storage and, through a finalizer, its
   death) with forward hooks on every module and gradient hooks on module inputs and outputs. This gives the module
   call tree and, in order, every allocation and free of the step. On CPU it is the first step (the log is the same
   cold or warm); on CUDA and under compile a warm-up step comes first. Further steps time each module call.
2. **Chain**: the candidate *stages* are the module calls one level below the model (plain ``nn.Sequential``
   containers, and custom modules holding most of the memory, are opened up), in execution order, with the code
   between them (residual adds, concatenations, the loss) as *glue* stages that are never recomputed. A module
   working in place (``ReLU(inplace=True)``) joins the stage before it. From the allocation log, each tensor of the
   forward is classified by which stage made it and which stages used it: kept for backward inside its stage
   (``saved_bytes``), handed to the next stage (a boundary; *passing* when it is freed once read), or read further
   on (a skip connection: counted for as long as it lives). Parameter gradients are the backward's allocations that
   outlive the step. Working memory is fitted so that the model's predicted timeline of the eager step is never
   below the allocator-level one measured in the same step, and a remaining difference between the eager peak
   and the prediction, if positive, is added to all moments. On CPU the eager peak is the traced step's own
   allocator-level peak (the log neither allocates nor keeps tensors alive: the same number as a step without it);
   on CUDA, and of the compiled step, it is measured in a step of its own. What a checkpointed
   region itself holds (the saved RNG state, snapshots of module buffers) is part of the model. With
   ``selective`` (default), a few more forwards measure, per stage and operator class (matmul, every other matmul,
   conv, attention), the bytes of the outputs a selective region would keep and the time of the operators it would
   not recompute, and a few tiny runs measure what torch's selective-checkpoint dispatch mode costs per operator on
   the device, charged to each selective variant for every operator of its stage (:mod:`.operators`). The same
   forwards note when autograd last saves a tensor in each stage: the stage's *tail* after it is what a recompute
   ending there skips (torch's early stop), subtracted from a segment's recompute time.
3. **Search** with the C++ planner (``memsave._C.planner_solve``): the least recompute time whose predicted peak
   fits the budget (or a fixed solver such as ``sqrt``), each region recomputed whole or selectively. Several
   consecutive stages can share one checkpointed region only when they are consecutive children of one plain
   ``nn.Sequential``.
4. **Verify** (default): apply each candidate plan, measure one step's peak with the allocator-level measure, and
   move the solver's budget by the cost model's error (:func:`.search.search_optimal`). With ``compile=True`` the
   step measured is the compiled step with the plan's regions (dynamo captures the model once; each candidate is an
   inductor compile of that capture with the regions as recompute tags, :mod:`.capture`: the peak of
   ``torch.compile(memsave.wrap(model, plan))``), and eager's peak is the compiled plain model's: the budget is a
   promise for the compiled step, and where compile's peak is below the cost model's the search moves up into that
   room (less recompute). Where regions are still needed, torch's partitioner under a lower
   ``activation_memory_budget`` (no region) is measured too, and the faster compiled step that fits wins.

A plan found in the plan cache (:mod:`.cache`: keyed by the model's structure, the inputs' shapes, the loss, the
arguments, the versions and the device) is returned without any of this.

Budget = the peak memory of one training step (gradients set to None, forward, loss, backward) above what was
allocated before it: ``max_memory_allocated`` on CUDA, the profiler's allocation events on CPU.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import logging
import re
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Set, Tuple, Union

import torch
from torch import nn

from ...common import compat
from ...common.progress import progress_bar
from ...errors import InfeasibleBudgetError, MemsaveWarning
from ...measurement.allocator import step_peak_bytes
from ...measurement.measuring import (
    LossFn,
    SavedStepState,
    check_loss,
    resolve_device,
    resolve_loss_fn,
    tensors_in,
)
from ...measurement.timing import time_interleaved
from ...measurement.units import Budget, format_bytes, is_fraction, parse_budget
from ..selective import OPERATOR_CLASSES
from ..wrapping import is_wrapped, unwrap_module
from .cache import (
    PLAN_CACHE_ENV,
    CacheArg,
    NotKeyable,
    cache_directory,
    entry_path,
    load_plan,
    plan_key,
    store_plan,
)
from .capture import CapturedStep, region_tags
from .chain import Chain, StageModules, build_chain, split_into_stages
from .operators import (
    OperatorClassProfiler,
    selective_overhead_per_operator,
    selective_variants,
    split_operator_classes,
    stage_tails,
)
from .partitioner import compile_at
from .plan import Plan, apply_regions, fingerprint
from .search import SEARCH_ROUNDS, fastest, search_chains, search_partitioner, smallest_plan
from .trace import Trace, time_steps, trace_step

__all__ = ["Profile", "plan", "profile", "search"]

_SOLVERS = ("optimal", "sqrt", "none", "all", "min_memory")

logger = logging.getLogger(__name__)

#: Timed steps of a plan by default. Two, not three: the cost model's predictions move no more with 1, 2 or 3 (the
#: spread over repeated profiles is 0.01-0.03 of eager's step on the four frontier models, far below how much a
#: plan's measured time moves between runs; benchmarks/results/planning_time_cpu.md), and each step costs one
#: eager step of planning time.
TIMING_STEPS = 2


class _Progress:
    """:func:`plan`'s progress bar (or none): the steps done, and the stage it is in as the bar's postfix. With a
    ``label``, closing it logs the seconds each stage took (DEBUG, docs/output.md)."""

    def __init__(self, bar: Optional[Any] = None, label: str = "") -> None:
        self.bar, self.label = bar, label
        self.started: List[Tuple[str, float]] = []  # (stage, when it started)

    def stage(self, text: str) -> None:
        self.started.append((text, time.perf_counter()))
        if self.bar is not None:
            self.bar.set_postfix_str(text)

    def seconds(self) -> Dict[str, float]:
        """Seconds spent in each stage until now, in the order first entered (a stage entered again adds up)."""
        ends = [t for _, t in self.started[1:]] + [time.perf_counter()]
        spent: Dict[str, float] = {}
        for (text, t0), t1 in zip(self.started, ends):
            spent[text] = spent.get(text, 0.0) + t1 - t0
        return spent

    def tick(self, n: int = 1) -> None:
        if self.bar is not None:
            if self.bar.total is not None and self.bar.n + n > self.bar.total:
                self.bar.total = self.bar.n + n  # more candidates than foreseen
            self.bar.update(n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        if self.label and self.started:
            spent = self.seconds()
            where = ", ".join(f"{text} {t:.2f} s" for text, t in spent.items())
            logger.debug("memsave.plan(%s): %s", self.label, where, extra={"memsave_plan_stages": spent})


class _Stepper:
    """Runs steps of the model with gradients cleared first, and measures a step's allocator-level peak."""

    def __init__(
        self,
        model: nn.Module,
        inputs: Sequence[Any],
        kwargs: Dict[str, Any],
        loss_fn: LossFn,
        device: torch.device,
        state: SavedStepState,
        compiled: bool = False,
    ) -> None:
        self.model, self.inputs, self.kwargs, self.loss_fn = model, inputs, kwargs, loss_fn
        self.device, self.state, self.compiled = device, state, compiled
        self.progress = _Progress()
        self.programs: Dict[Tuple[Any, ...], Callable[..., Any]] = {}  # compiled programs (:meth:`program`)
        self.capture: Optional[CapturedStep] = None  # the programs' one dynamo capture (.capture)

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def step(self, run: Optional[Callable[..., Any]] = None) -> None:
        self.state.clear_grads()
        out = (self.model if run is None else run)(*self.inputs, **self.kwargs)  # compiled modules have no bool()
        loss = self.loss_fn(out)
        _check_loss(out, loss)
        loss.backward()

    def peak(self, plan: Optional[Plan] = None, partitioner: Optional[float] = None) -> int:
        """One step's peak with ``plan``'s regions (None: none). Eager: the regions installed on the model for the
        step and removed again. Under compile: the plan's compiled program (:meth:`program`), torch's partitioner at
        its default or at the ``partitioner`` budget."""
        if self.device.type not in ("cpu", "cuda"):
            raise ValueError(f"memsave.plan: device type {self.device.type!r} is not supported; use 'cpu' or 'cuda'")
        if self.compiled:
            run = self.program(plan, partitioner)
            self.state.clear_grads()
            return step_peak_bytes(lambda: self.step(run), self.device)
        changed = apply_regions(self.model, plan) if plan is not None else []
        try:
            self.state.clear_grads()
            return step_peak_bytes(self.step, self.device)
        finally:
            for m in changed:
                unwrap_module(m)

    def has_program(self, plan: Optional[Plan], partitioner: Optional[float]) -> bool:
        return _program_key(plan, partitioner) in self.programs

    def program(self, plan: Optional[Plan], partitioner: Optional[float]) -> Callable[..., Any]:
        """The compiled program of ``plan``'s regions (None: none) under torch's partitioner at ``partitioner``,
        its first step run (which compiles): the graphs dynamo captured once of a copy of the model sharing its
        parameters and buffers, compiled by inductor with the regions as recompute tags (:mod:`.capture`); for a
        region outside those graphs, ``torch.compile`` of a copy with the regions installed (a dynamo cache entry
        of its own: :class:`.partitioner.PartitionerBackend`). Compiled once per plan and partitioner budget and
        kept until planning ends, so that the finalists timed at the end are the programs already measured."""
        key = _program_key(plan, partitioner)
        if key not in self.programs:
            tags = region_tags(plan)
            if self.capture is None:  # the first program: dynamo captures the model's graphs in its step, once
                self.capture = CapturedStep(_sharing_copy(self.model))
            if not tags or self.capture.covers(tags):
                run = self.capture.program(tags, partitioner)
            else:  # a region outside the captured graphs: compiled from its own trace, as torch.compile would
                model = _sharing_copy(self.model)
                apply_regions(model, plan)  # type: ignore[arg-type]
                run = compile_at(model, partitioner)
            self.step(run)
            self.programs[key] = run
        return self.programs[key]

    def compiled_ratios(self, plans: Sequence[Plan], rounds: int = 6) -> List[float]:
        """Each plan's compiled step time over the first plan's, the median over rounds of one interleaved block of
        the plans' compiled programs (:meth:`program`, each under the plan's own partitioner budget), so that load
        changing during the block hits all alike. The programs ran when they were measured, so one untimed step
        each is warm-up enough, and a round is one window (several only for steps shorter than ``time_interleaved``'s
        round length): the median over rounds steadies the ratio, and three windows a round tripled the steps
        (14 s of GPT-2's compiled plan on a CPU)."""
        steps: Dict[str, Callable[[], None]] = {}
        try:
            for i, p in enumerate(plans):
                if not self.has_program(p, p.activation_memory_budget):
                    self.progress.stage(f"compiling finalist {i + 1}/{len(plans)}")
                steps[str(i)] = functools.partial(self.step, self.program(p, p.activation_memory_budget))
            self.progress.stage(f"timing {len(plans)} compiled finalists")
            timing = time_interleaved(steps, rounds=rounds, max_rounds=rounds, warmup=0, min_windows=1)
        finally:
            self.state.clear_grads()
        return [timing[str(i)].ratio for i in range(len(plans))]


def _program_key(plan: Optional[Plan], partitioner: Optional[float]) -> Tuple[Any, ...]:
    """What makes a compiled program: the plan's regions (none for None or a plan without one), what each keeps,
    and the partitioner budget."""
    if plan is None or not plan.regions():
        return ((), (), partitioner)
    return (tuple(plan.segments), tuple(plan.selective), partitioner)


def _sharing_copy(model: nn.Module) -> nn.Module:
    """A copy of ``model``'s module tree whose parameters and buffers are ``model``'s own (no new memory for them)."""
    memo: Dict[int, Any] = {id(t): t for t in [*model.parameters(), *model.buffers()]}
    return copy.deepcopy(model, memo)


def _check_loss(out: Any, loss: Any) -> None:
    """Raise a TypeError saying what is wrong when ``loss`` is not a scalar tensor one can backpropagate."""
    check_loss(out, loss, "memsave.plan")


def _same_in_every_step(loss_fn: LossFn) -> LossFn:
    """``loss_fn``, raising the documented ValueError (chained) when it fails in a profiling step after the first."""
    calls = [1]  # the first step has called it once

    def every_step(out: Any) -> Any:
        calls[0] += 1
        try:
            return loss_fn(out)
        except Exception as e:
            raise ValueError(
                f"memsave.plan: loss_fn failed in profiling step {calls[0]} ({type(e).__name__}: {e}) after working in "
                f"the first; plan runs several steps on the same example inputs, so loss_fn must give a loss every "
                f"time (no iterator of targets or state that runs out between calls)"
            ) from e

    return every_step


def _split_inputs(example_kwargs: Optional[Mapping[str, Any]], model_kwargs: Dict[str, Any]) -> Dict[str, Any]:
    """The model's keyword inputs: ``example_kwargs`` and the keywords :func:`plan` does not know, merged."""
    if example_kwargs is None:
        return dict(model_kwargs)
    if not isinstance(example_kwargs, Mapping) or not all(isinstance(k, str) for k in example_kwargs):
        raise TypeError(
            f"memsave.plan: example_kwargs must be a dict of keyword name -> value for the model, got "
            f"{type(example_kwargs).__name__}"
        )
    both = sorted(set(example_kwargs) & set(model_kwargs))
    if both:
        raise ValueError(
            f"memsave.plan: keyword input(s) {', '.join(both)} given both in example_kwargs and as keywords; give "
            f"each once"
        )
    return {**example_kwargs, **model_kwargs}


def _selective_classes(selective: Union[bool, Sequence[str]]) -> Tuple[str, ...]:
    """The operator classes :func:`plan` may keep in selective regions (empty: module-level plans only)."""
    if selective is True:
        return tuple(OPERATOR_CLASSES)
    if selective is False:
        return ()
    if not isinstance(selective, (list, tuple)) or not all(isinstance(c, str) for c in selective):
        raise TypeError(
            f"memsave.plan: selective must be True, False or a list of operator classes such as ['matmul'], got "
            f"{selective!r}"
        )
    unknown = [c for c in selective if c not in OPERATOR_CLASSES]
    if unknown or not selective:
        raise ValueError(
            f"memsave.plan: selective names {'no operator class' if not selective else repr(unknown[0])}; use "
            f"True, False or classes among {', '.join(OPERATOR_CLASSES)}"
        )
    return tuple(dict.fromkeys(selective))


@dataclass
class Profile:
    """What profiling a model taught the planner: the chain of stages (the cost model the solver searches), what
    each stage is in the model, the operator classes met in each, and eager's measured peak.

    The search (:func:`search`) reads only this, so tests and tools can give it costs of their own (edit
    ``chain``'s stage times) and get the plan those costs imply.

    Attributes:
        chain: the cost model (:class:`~.chain.Chain`), selective variants included when profiled.
        stages: per stage, the modules it runs (:class:`~.chain.StageModules`).
        classes_met: per stage, the operator classes its operators belong to.
        eager_peak_bytes: the measured peak of one step of the plain model (compiled when ``compiled``).
        model_class: the model's class name.
        fingerprint: the model's fingerprint (:func:`~.plan.fingerprint`).
        device: the device profiled on.
        compiled: eager's peak (and every candidate's, when verified) is that of ``torch.compile``.
    """

    chain: Chain
    stages: List[StageModules]
    classes_met: List[Set[str]] = field(default_factory=list)
    eager_peak_bytes: int = 0
    model_class: str = ""
    fingerprint: str = ""
    device: str = "cpu"
    compiled: bool = False

    def make_plan(self, res: Dict[str, Any], chain: Chain, solver: str, budget_bytes: Optional[int]) -> Plan:
        """The solver's answer ``res`` on ``chain`` (this profile's chain or its module-level one) as a
        :class:`Plan`, not measured yet.

        Examples:
            >>> prof.make_plan(prof.chain.solve(None, "sqrt", 2000), prof.chain, "sqrt", None)
        """
        return Plan(
            solver=solver,
            budget_bytes=budget_bytes,
            predicted_peak_bytes=int(res["predicted_peak_bytes"]),
            measured_peak_bytes=None,
            eager_peak_bytes=int(self.eager_peak_bytes),
            min_feasible_bytes=int(res["min_feasible_bytes"]),
            predicted_extra_seconds=float(res["predicted_extra_time"]),
            eager_step_seconds=self.chain.eager_seconds(),
            segments=[(int(s[0]), int(s[1]), bool(s[2])) for s in res["segments"]],
            stage_modules=self.stages,
            chain=chain,
            selective=[self._keeps(seg, k, chain) for seg, k in zip(res["segments"], res["segment_kept_classes"])],
            model_class=self.model_class,
            fingerprint=self.fingerprint,
            device=self.device,
            compiled=self.compiled,
        )

    def _keeps(self, segment: Sequence[Any], k: Optional[int], chain: Chain) -> Tuple[str, ...]:
        """The classes a selective region keeps: its variant's, less those none of its stages runs."""
        if k is None:
            return ()
        here: Set[str] = set().union(*self.classes_met[segment[0] : segment[1]]) if self.classes_met else set()
        return tuple(c for c in split_operator_classes(chain.operator_classes[k]) if c in here)


def _solver_argument(solver: Optional[str], strategy: Optional[str]) -> str:
    """``solver``, or the deprecated ``strategy`` keyword's value (with a DeprecationWarning), checked."""
    if strategy is not None:
        if solver is not None:
            raise ValueError("memsave.plan: give solver= only (strategy= is its deprecated old name), not both")
        warnings.warn(
            "memsave.plan: strategy= is deprecated; call it solver= (the same values)", DeprecationWarning, stacklevel=3
        )
        solver = strategy
    solver = "optimal" if solver is None else solver
    if not isinstance(solver, str) or not (solver in _SOLVERS or re.fullmatch(r"uniform:[1-9][0-9]*", solver)):
        raise ValueError(
            f"memsave.plan: unknown solver {solver!r}; use one of optimal, sqrt, uniform:K (K >= 1), "
            f"none, all, min_memory"
        )
    return solver


def _check_arguments(model: nn.Module, timing_steps: int, everything: Tuple[Any, Dict[str, Any]]) -> None:
    """Raise the documented errors for a model or input :func:`plan` cannot profile, before anything runs."""
    if isinstance(timing_steps, bool) or not isinstance(timing_steps, int) or timing_steps < 1:
        raise ValueError(
            f"memsave.plan: timing_steps must be an int >= 1 (the steps timed to estimate each stage's forward and "
            f"backward time), got {timing_steps!r}; leave it at its default {TIMING_STEPS}, or pass 1 for the "
            f"quickest plan"
        )
    wrapped = [n for n, m in model.named_modules() if is_wrapped(m)]
    if wrapped:
        raise ValueError(
            f"memsave.plan: the model already has checkpointed modules ({', '.join(wrapped[:3]) or '(root)'}); plan "
            f"profiles the plain model: call memsave.unwrap(model) first"
        )
    if not any(p.requires_grad for p in model.parameters()) and not any(
        t.requires_grad for t in tensors_in(everything)
    ):
        raise ValueError(
            f"memsave.plan: {type(model).__name__} has no parameter that requires grad and no example input "
            f"requires grad, so a training step has no backward to plan for"
        )


def _first_step(stepper: _Stepper, run: Callable[[], Any]) -> Any:
    """``run()``, the first step on the example inputs (lazy initialisation, allocator caches); a failure says what
    the model was given."""
    try:
        return run()
    except Exception as e:
        kwargs = stepper.kwargs
        given = f"{len(stepper.inputs)} positional input(s)" + (
            f" and the keyword input(s) {', '.join(kwargs)} (every keyword memsave.plan does not know goes to the "
            f"model)"
            if kwargs
            else ""
        )
        raise ValueError(
            f"memsave.plan: one training step of {type(stepper.model).__name__} on the example inputs failed "
            f"({type(e).__name__}: {e}); it was given {given}. Pass example inputs that "
            f"model(*inputs, **kwargs) accepts and a loss_fn that maps its output to a scalar"
        ) from e


def _peak_from_trace(stepper: _Stepper) -> bool:
    """Whether eager's peak is the traced step's own (CPU, eager) rather than measured in a step of its own."""
    return stepper.device.type == "cpu" and not stepper.compiled


def _traced_first_steps(stepper: _Stepper, progress: _Progress) -> Trace:
    """The traced step, after a warm-up step on CUDA (a first step there sets up library workspaces and allocator
    blocks the log would see). On a CPU the traced step is the first: its log and allocator peak are the same cold
    or warm (byte for byte on the frontier models), and the timing steps after it are warm; under compile the
    eager step is compiled and measured in steps of its own. Saves one step of the plan's handful."""
    model, inputs, kwargs = stepper.model, stepper.inputs, stepper.kwargs
    warm_up = stepper.device.type != "cpu"
    if warm_up:
        progress.stage("warming up")
        _first_step(stepper, stepper.step)
        progress.tick()
    progress.stage("profiling")
    stepper.state.clear_grads()
    loss_fn = _checking_loss(stepper.loss_fn)
    trace = _first_step(stepper, lambda: trace_step(model, inputs, loss_fn, stepper.device, kwargs))
    progress.tick(1 if warm_up else 2)  # the bar counts the warm-up step either way
    return trace


def _checking_loss(loss_fn: LossFn) -> LossFn:
    """``loss_fn``, raising the documented TypeError when its value is not a loss one can backpropagate."""

    def checked(out: Any) -> Any:
        loss = loss_fn(out)
        _check_loss(out, loss)
        return loss

    return checked


#: selective_overhead_per_operator per device, measured once per process: it times a toy block, so it says what the
#: machine costs, not the model (0.1-0.2 s of every plan before).
_SELECTIVE_OVERHEAD: Dict[str, float] = {}


def _classes_in_timing_steps(stepper: _Stepper) -> bool:
    """Whether the operator classes are recorded in the timing steps' forwards (CPU) rather than in forwards of their
    own (CUDA: timing a class's operators synchronizes the device around each, which would stall the timed steps'
    kernel queue; on a CPU the recorder adds a few microseconds an operator, within the timing's noise)."""
    return stepper.device.type != "cuda"


def _selective_overhead(stepper: _Stepper) -> float:
    key = str(stepper.device)
    if key not in _SELECTIVE_OVERHEAD:
        _SELECTIVE_OVERHEAD[key] = selective_overhead_per_operator(stepper.device, stepper.sync)
    return _SELECTIVE_OVERHEAD[key]


def _profile(stepper: _Stepper, classes: Tuple[str, ...], timing_steps: int, progress: _Progress) -> Profile:
    """Steps 1 and 2: trace and time the eager step, measure eager's peak, build the chain (see the module
    docstring)."""
    model, inputs, kwargs = stepper.model, stepper.inputs, stepper.kwargs
    trace = _traced_first_steps(stepper, progress)
    stepper.loss_fn = _same_in_every_step(stepper.loss_fn)
    # The classes (none with selective=False) and every stage's tail, recorded in the timing steps' forwards on a
    # CPU and in forwards of their own, after them, on CUDA.
    classes_seen = OperatorClassProfiler(model, split_into_stages(trace, model), classes, stepper.sync)
    record_in_timing = classes_seen.forward if _classes_in_timing_steps(stepper) else None
    progress.stage("timing stages")
    timing = time_steps(
        model,
        inputs,
        stepper.loss_fn,
        len(trace.calls),
        timing_steps,
        stepper.sync,
        kwargs,
        forward_context=record_in_timing,
    )
    progress.tick(timing_steps)
    if record_in_timing is None:
        progress.stage("profiling operator classes")
        for _ in range(timing_steps):
            with classes_seen.forward():
                model(*inputs, **kwargs)
    if _peak_from_trace(stepper):
        eager_peak = trace.cpu_step_peak()
    else:
        progress.stage("compiling eager" if stepper.compiled else "measuring eager's peak")
        eager_peak = stepper.peak()
        progress.tick()
    chain, stages = build_chain(trace, model, timing)
    met: List[Set[str]] = [set() for _ in stages]
    ops = classes_seen.result()
    stage_tails(chain, stages, ops)
    if classes:
        selective_variants(chain, stages, ops, _selective_overhead(stepper))
        met = [set(prof) for prof in ops.classes]
    # Allocator-level memory the log cannot see (eager's); under compile the search's measurements correct it.
    none_peak = chain.simulate([(0, len(stages), False)])["peak_bytes"]
    chain.base_bytes = max(0, eager_peak - none_peak)
    return Profile(
        chain=chain,
        stages=stages,
        classes_met=met,
        eager_peak_bytes=int(eager_peak),
        model_class=type(model).__name__,
        fingerprint=fingerprint(model),
        device=str(stepper.device),
        compiled=stepper.compiled,
    )


class _Measure:
    """A candidate plan's measured peak (:meth:`_Stepper.peak`: eager, its regions installed for one step; under
    compile, its compiled program); each distinct plan measured once, a plan without a region taken as eager.
    ``expected``: how many candidates the progress bar foresees (more are counted as they come)."""

    def __init__(self, stepper: _Stepper, eager_peak: int, expected: int = SEARCH_ROUNDS) -> None:
        self.stepper, self.eager_peak, self.expected = stepper, eager_peak, expected
        self.cache: Dict[Tuple[Any, ...], int] = {}
        self.measured = 0

    def __call__(self, p: Plan) -> int:
        key = _program_key(p, None)
        if key not in self.cache:
            if not p.regions():
                self.cache[key] = self.eager_peak
            else:
                self.measured += 1
                what = "compiling and measuring" if self.stepper.compiled else "verifying"
                self.stepper.progress.stage(f"{what} candidate {self.measured}/{max(self.measured, self.expected)}")
                self.cache[key] = self.stepper.peak(p)
                self.stepper.progress.tick()
        return self.cache[key]


#: dynamo's recompile limit while ``plan(compile=True)`` runs: a candidate whose regions the captured step does not
#: cover is compiled from its own trace, a cache entry on the model's code objects kept until planning ends (eager,
#: up to :data:`.search.SEARCH_ROUNDS` candidates per chain, the minimum-memory plans, up to
#: :data:`.search.PARTITIONER_PROBES` partitioner budgets), and dynamo runs a frame past its limit uncompiled.
COMPILED_PROGRAMS = 64


def _partitioner_plan(prof: Profile, stepper: _Stepper, budget_bytes: int, slots: int) -> Optional[Plan]:
    """No memsave region, torch's partitioner at the highest budget found to fit ``budget_bytes``
    (:func:`.search.search_partitioner`); None when none fits."""

    def peak_at(partitioner: float) -> int:
        stepper.progress.stage(f"compiling under torch's partitioner at {partitioner:g}")
        return stepper.peak(None, partitioner)

    found = search_partitioner(peak_at, budget_bytes)
    if found is None:
        return None
    p = prof.make_plan(prof.chain.solve(None, "none", slots), prof.chain, "optimal", budget_bytes)
    p.activation_memory_budget, p.measured_peak_bytes = found
    return p


def _fastest_compiled(stepper: _Stepper, plans: Sequence[Plan]) -> Plan:
    """The plan whose compiled step measured fastest, all timed in one interleaved block; of equal times the one
    with the lower measured peak (:func:`.search.fastest`)."""
    ratios = stepper.compiled_ratios(plans)
    ratio_of = {id(p): r for p, r in zip(plans, ratios)}
    return fastest(plans, seconds=lambda p: ratio_of[id(p)])


def _search_compiled(
    prof: Profile, stepper: _Stepper, budget_bytes: Optional[int], solver: str, measure: _Measure, slots: int
) -> Plan:
    """Step 4 under compile: memsave's regions (:func:`search`) and, when they recompute something, torch's
    partitioner as one more candidate (:func:`_partitioner_plan`); the faster compiled step of the two that fit."""
    if solver != "optimal" or budget_bytes is None:
        return search(prof, budget_bytes, solver, measure, slots, verify=True)
    try:
        regions = search(prof, budget_bytes, solver, measure, slots, verify=True)
    except InfeasibleBudgetError:
        alone = _partitioner_plan(prof, stepper, budget_bytes, slots)
        if alone is None:
            raise
        return alone
    if not regions.regions():
        return regions  # compile's own peak fits: nothing to recompute
    alone = _partitioner_plan(prof, stepper, budget_bytes, slots)
    return regions if alone is None else _fastest_compiled(stepper, (regions, alone))


def _compiled_anchor(prof: Profile) -> Tuple[int, int]:
    """Eager's peak as the cost model predicts it and as compile measured it: where the compiled search interpolates
    the model's error from (:func:`.search.search_optimal`)."""
    return int(prof.chain.simulate([(0, len(prof.stages), False)])["peak_bytes"]), int(prof.eager_peak_bytes)


def search(
    prof: Profile,
    budget_bytes: Optional[int],
    solver: str = "optimal",
    measure: Optional[Callable[[Plan], int]] = None,
    slots: int = 2000,
    verify: bool = True,
) -> Plan:
    """Steps 3 and 4: the plan of ``solver`` within ``budget_bytes`` on the profile's chain (then its module-level
    chain), each candidate verified with ``measure`` when given.

    Args:
        prof: the :class:`Profile` (from :func:`profile`, its costs possibly replaced).
        budget_bytes: the budget in bytes (None: none; not with ``solver="optimal"``).
        solver: ``optimal``, ``sqrt``, ``uniform:K``, ``none``, ``all`` or ``min_memory``.
        measure: a plan's measured peak (apply, measure, remove); None takes the cost model's peaks.
        slots: memory slots of the solver's dynamic program.
        verify: measure the optimal solver's candidates (fixed solvers' plans are measured when there is a budget
            to check or ``verify``; the minimum-memory plans that say the smallest budget, always).

    Returns:
        the :class:`Plan`.

    Raises:
        InfeasibleBudgetError: nothing fits; ``.min_bytes`` is the smallest measured (or, without ``measure``,
            predicted) peak of a minimum-memory plan: under compile, the compiled one.

    Examples:
        >>> prof = memsave.recompute.planning.planner.profile(model, x)
        >>> search(prof, budget_bytes=2**30).segments
    """
    chain = prof.chain
    chains = [chain, chain.module_level()] if chain.operator_classes else [chain]

    def make(res: Dict[str, Any], ch: Chain) -> Plan:
        return prof.make_plan(res, ch, solver, budget_bytes)

    if solver == "optimal" and budget_bytes is not None and budget_bytes >= prof.eager_peak_bytes:
        p = make(chain.solve(None, "none", slots), chain)  # eager itself fits: nothing to recompute
        p.measured_peak_bytes = prof.eager_peak_bytes if measure is not None else None
        return p
    checked = verify or (solver != "optimal" and budget_bytes is not None) or solver == "min_memory"
    anchor = _compiled_anchor(prof) if prof.compiled else None
    result = search_chains(chains, solver, budget_bytes, slots, make, measure if checked else None, anchor)
    if result is not None:
        return result
    smallest = smallest_plan(chains, slots, make, measure)
    min_bytes = int(smallest.measured_peak_bytes or 0)
    if budget_bytes is not None and min_bytes <= budget_bytes and solver == "optimal":
        return smallest
    under = " under torch.compile" if prof.compiled else ""
    how = "measured" if measure is not None else "predicted"
    # Say only what the search saw: the smallest peak it reached, not that no plan at all could fit.
    if solver != "optimal" and budget_bytes is not None and min_bytes <= budget_bytes:
        fix = "use solver='optimal', which searches for a plan within the budget"
    else:
        fix = f"raise the budget to at least {min_bytes} bytes, lower the batch size, or use memory-efficient modules"
        fix += " (memsave.convert)"
    raise InfeasibleBudgetError(
        f"memsave.plan: the search found no checkpoint plan of {prof.model_class} with solver '{solver}'{under} "
        f"within a budget of {format_bytes(budget_bytes)} ({budget_bytes} bytes); the smallest peak it reached is "
        f"{format_bytes(min_bytes)} ({min_bytes} bytes, {how}{under} with the minimum-memory plan; eager peaks at "
        f"{format_bytes(prof.eager_peak_bytes)}). To plan, {fix}.",
        min_bytes=min_bytes,
    )


def _floor_note(model: nn.Module) -> str:
    """What an infeasible budget's floor is made of, beyond activations: the parameter gradients (allocated in
    backward, so inside a step's peak) and what is outside the budget (parameters, optimizer state)."""
    params = {id(p): p for p in model.parameters()}.values()
    grads = sum(p.numel() * p.element_size() for p in params if p.requires_grad)
    weights = sum(p.numel() * p.element_size() for p in params)
    return (
        f"That floor holds the parameter gradients, {format_bytes(grads)} (one per trainable parameter, allocated "
        "in backward: only fewer trainable parameters, e.g. LoRA, or 16-bit parameters lower it), and the smallest "
        "activations and workspaces (a smaller batch or sequence lowers those). The parameters "
        f"({format_bytes(weights)}) and the optimizer's state (AdamW: twice the trainable parameters) exist before "
        "the step and are outside the budget; memsave.estimate(model, x, optimizer='adamw') shows the whole footprint."
    )


def _warn_if_empty(result: Plan, budget_bytes: Optional[int], eager_peak_bytes: int) -> None:
    """A budget at or above eager's peak gives a plan that recomputes nothing: say so instead of returning it
    silently (wrap(model, plan) would change nothing)."""
    if budget_bytes is None or result.regions() or getattr(result, "activation_memory_budget", None) is not None:
        return
    warnings.warn(
        f"memsave.plan: the budget {format_bytes(budget_bytes)} is at or above what the model needs without "
        f"recompute (eager peaks at {format_bytes(eager_peak_bytes)}), so the plan recomputes nothing and "
        "memsave.wrap(model, plan) changes nothing; give a budget below eager's peak (e.g. budget=0.6) to save memory",
        MemsaveWarning,
        stacklevel=3,
    )


@contextlib.contextmanager
def _planning_scope(stepper: _Stepper) -> Iterator[None]:
    """Around profiling and search: the model's state put back at the end; under compile, dynamo's recompile limit
    raised for the programs kept meanwhile (:meth:`_Stepper.program`), which are dropped at the end (they hold the
    model)."""
    with contextlib.ExitStack() as scope:
        if stepper.compiled:
            scope.enter_context(compat.dynamo_recompile_limit(COMPILED_PROGRAMS))
        try:
            yield
        finally:
            if stepper.compiled:
                torch._dynamo.reset()
            stepper.state.restore()


def profile(
    model: nn.Module,
    *example_inputs: Any,
    loss_fn: Optional[LossFn] = None,
    selective: Union[bool, Sequence[str]] = True,
    timing_steps: int = TIMING_STEPS,
    compile: bool = False,
    example_kwargs: Optional[Mapping[str, Any]] = None,
    **model_kwargs: Any,
) -> Profile:
    """Steps 1 and 2 of :func:`plan` alone: the :class:`Profile` its search reads (the model's state restored).

    Args:
        model, example_inputs, loss_fn, selective, timing_steps, compile, example_kwargs, model_kwargs: as for
            :func:`plan`.

    Returns:
        the :class:`Profile`.

    Raises:
        ValueError, TypeError: as :func:`plan` for these arguments.

    Examples:
        >>> prof = profile(model, x)
        >>> for st in prof.chain.stages: st.fwd_time, st.bwd_time, st.tail_time = 1.0, 2.0, 0.0  # injected costs
        >>> search(prof, budget_bytes=prof.eager_peak_bytes // 2)
    """
    args = _checked(model, example_inputs, loss_fn, selective, timing_steps, compile, example_kwargs, model_kwargs)
    stepper = _stepper(model, example_inputs, args, compile)
    with _planning_scope(stepper):
        return _profile(stepper, args.classes, timing_steps, _Progress())


@dataclass
class _Arguments:
    """:func:`plan`'s arguments once checked: operator classes, the model's keyword inputs, the loss, the device."""

    classes: Tuple[str, ...]
    kwargs: Dict[str, Any]
    loss_fn: LossFn
    device: torch.device


def _checked(
    model: nn.Module,
    example_inputs: Sequence[Any],
    loss_fn: Optional[LossFn],
    selective: Union[bool, Sequence[str]],
    timing_steps: int,
    compile: bool,
    example_kwargs: Optional[Mapping[str, Any]],
    model_kwargs: Dict[str, Any],
) -> _Arguments:
    """Raise the documented errors for bad arguments, before anything runs; the checked ones."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"memsave.plan: model must be an nn.Module, got {type(model).__name__}")
    if not isinstance(compile, bool):
        raise TypeError(f"memsave.plan: compile must be True or False, got {compile!r}")
    classes = _selective_classes(selective)
    kwargs = _split_inputs(example_kwargs, model_kwargs)
    everything = (tuple(example_inputs), kwargs)
    resolved = resolve_loss_fn(loss_fn, "memsave.plan")
    _check_arguments(model, timing_steps, everything)
    return _Arguments(classes, kwargs, resolved, resolve_device(model, everything, None))


def _stepper(model: nn.Module, example_inputs: Sequence[Any], args: _Arguments, compile: bool) -> _Stepper:
    """The :class:`_Stepper` of the checked arguments, the model's state saved in it (put back by the caller)."""
    state = SavedStepState(model, (tuple(example_inputs), args.kwargs))
    return _Stepper(model, example_inputs, args.kwargs, args.loss_fn, args.device, state, compile)


def _budget_key(budget: Optional[Budget]) -> Optional[List[Any]]:
    """The budget as the plan cache keys it: a fraction of eager's peak or bytes, however it was written."""
    if budget is None:
        return None
    if is_fraction(budget):
        return ["fraction", parse_budget(budget, eager_peak_bytes=10**15)]  # 0.5, "0.5" and "50%" alike
    return ["bytes", parse_budget(budget)]


def _cache_entry(
    cache: CacheArg,
    model: nn.Module,
    example_inputs: Sequence[Any],
    args: _Arguments,
    loss_fn: Optional[LossFn],
    settings: Dict[str, Any],
) -> Optional[Tuple[Path, Dict[str, Any]]]:
    """The plan cache entry of this call (its file and key), or None when the cache is off or the call cannot be
    keyed reliably (why: logged at DEBUG level)."""
    directory = cache_directory(cache)
    if directory is None:
        return None
    try:
        key = plan_key(model, tuple(example_inputs), args.kwargs, loss_fn, settings, args.device)
    except NotKeyable as e:
        logger.debug("memsave.plan: the plan cache is not used for this call: %s", e)
        return None
    return entry_path(directory, key), key


def _from_cache(entry: Optional[Tuple[Path, Dict[str, Any]]], model: nn.Module, start: float) -> Optional[Plan]:
    """The cached plan of ``entry`` (said on the ``memsave`` logger at INFO level), or None on a miss."""
    if entry is None:
        return None
    found = load_plan(entry[0], entry[1], model)
    if found is None:
        logger.debug("memsave.plan: no cached plan at %s; planning", entry[0])
        return None
    made_in, found.planning_seconds = found.planning_seconds, time.perf_counter() - start
    logger.info(
        "memsave.plan: %s: the plan came from the plan cache (%s; found in %.3f s, it took %.1f s to make); "
        "cache=False or %s=0 plans afresh",
        type(model).__name__,
        entry[0],
        found.planning_seconds,
        made_in,
        PLAN_CACHE_ENV,
    )
    return found


def plan(
    model: nn.Module,
    *example_inputs: Any,
    budget: Optional[Budget] = None,
    loss_fn: Optional[LossFn] = None,
    solver: Optional[str] = None,
    verbose: bool = False,
    verify: bool = True,
    slots: int = 2000,
    timing_steps: int = TIMING_STEPS,
    selective: Union[bool, Sequence[str]] = True,
    compile: bool = False,
    example_kwargs: Optional[Mapping[str, Any]] = None,
    strategy: Optional[str] = None,
    progress: Optional[bool] = None,
    cache: CacheArg = None,
    **model_kwargs: Any,
) -> Plan:
    """Choose what to recompute in backward so that a training step fits ``budget``, with the least recompute.

    Profiles a few steps of ``model`` on the example inputs (and puts back parameters' gradients, buffers such as
    BatchNorm statistics and the RNG state afterwards), builds the chain of candidate stages from the module tree,
    and searches it with memsave's C++ planner. Apply the result with ``memsave.wrap(model, plan)``.

    One profiled step is ``loss_fn(model(*example_inputs, **model_kwargs)).backward()``: keyword inputs work as in
    training code (a Hugging Face model's ``input_ids=..., attention_mask=..., labels=...``), and the output may be
    anything ``loss_fn`` takes (a tensor, tuples, dicts, a Hugging Face ``ModelOutput``). A Hugging Face model called
    with ``labels`` returns its loss first, which is what the default loss then takes. The model must make the same
    module calls in every step (no data-dependent branches between them).

    Args:
        model: the model (not wrapped: call :func:`memsave.unwrap` first).
        *example_inputs: positional arguments of ``model`` for one step, on the device to plan for.
        budget: peak bytes of one training step above what was allocated before it: an int, a string such as
            ``"512MiB"`` / ``"4GB"``, or a float fraction of the eager step's peak (the compiled eager step's with
            ``compile=True``). Required for ``solver="optimal"``; optional otherwise (then checked when given).
        loss_fn: maps the model's output to a scalar loss (``lambda out: out.loss``,
            ``lambda out: F.cross_entropy(out, y)``); default: ``out.float().sum()`` of the first floating-point
            tensor of the output that requires grad (:func:`memsave.measurement.default_loss`) -- for a Hugging
            Face model called with ``labels``, its loss.
        solver: the search method: ``"optimal"`` (default: least recompute within the budget), ``"sqrt"`` (Chen et
            al.), ``"uniform:K"``, ``"none"``, ``"all"`` (every stage its own region) or ``"min_memory"``.
        verbose: print the plan's summary and the planning time.
        verify: measure one step with each candidate plan applied and solve again with the solver's budget moved
            by the model's error (up to 4 plans measured): lower when the plan measured above the budget, higher
            when the model was pessimistic, so the plan returned has a measured peak within the budget and is the
            cheapest such plan found. Under compile the error is interpolated from the compiled eager step and the
            candidates measured, and a plan within 2% of the budget ends the search (each round is a compile).
        slots: memory slots of the solver's dynamic program (finer = closer to optimal, slower).
        timing_steps: steps timed to estimate each stage's forward and backward time (an int >= 1; default
            :data:`TIMING_STEPS`, 2).
        selective: let the planner choose, per region, between recomputing it whole and *selective* recompute
            (:func:`memsave.selective`: keep the outputs of its matrix products, convolutions and attention kernels,
            recompute only the cheap operators), and which of those classes to keep, by the bytes and time each
            class takes in each stage (profiled in a few extra forwards) and the per-operator cost of the selective
            contexts' dispatch mode (measured on the device). ``True`` (default): all classes
            (``"matmul"``, ``"alternate_matmul"``, ``"conv"``, ``"attention"``); a sequence of class names: only
            those; ``False``:
            module-level plans (every region recomputed whole). :meth:`Plan.summary` shows what each region keeps.
            A selective plan is never worse placed than a module-level one: the module-level chain is searched
            too before a budget is declared infeasible, so ``True`` fits every budget ``False`` fits.
        compile: plan for the compiled step, :meth:`Plan.compile` (``torch.compile(memsave.wrap(model, plan))``):
            eager's peak and every candidate's are measured under ``torch.compile`` (dynamo traces a copy of the
            model sharing its parameters once; each candidate is an inductor compile of that capture,
            :attr:`Plan.planning_seconds`), so the budget holds for the compiled step and the room compile leaves
            is used. When memsave's regions must recompute, torch's own partitioner at a lower
            ``activation_memory_budget`` (no region) is a candidate too, and the faster compiled step of the two
            that fit is returned (:attr:`Plan.activation_memory_budget`; timed, so the
            choice can vary from run to run). Forces ``verify``.
        example_kwargs: keyword inputs of ``model`` as a dict (``memsave.plan(model, example_kwargs=batch, ...)``);
            the way to pass a model keyword named like one of this function's own parameters.
        strategy: deprecated name of ``solver`` (DeprecationWarning).
        progress: a progress bar (stderr, erased at the end) while planning takes over a second, its stage
            (``profiling``, ``timing stages``, ``verifying candidate 2/4``, ...) beside it; None: unless the
            environment variable ``MEMSAVE_PROGRESS=0`` turns it off.
        cache: the plan cache (:mod:`memsave.recompute.planning.cache`): a plan made once is kept on disk, keyed by
            the model's structure, the example inputs' shapes and dtypes, the loss function, the arguments that
            change the plan, the torch and memsave versions and the device, and a later call with the same key
            returns it without profiling (:attr:`Plan.cached`, logged at INFO level on the ``memsave`` logger).
            None (default): on, unless ``MEMSAVE_PLAN_CACHE=0``; True: on; False: off; a directory: on, there.
            Default directory: ``$MEMSAVE_CACHE_DIR/plans``, else ``~/.cache/memsave/plans``. A ``loss_fn`` that
            is a lambda or closure cannot be keyed: such calls always plan (the reason logged at DEBUG level).
        **model_kwargs: every other keyword is a keyword input of ``model`` for the step.

    Returns:
        a :class:`Plan`.

    Raises:
        InfeasibleBudgetError: no plan fits the budget; ``.min_bytes`` is the smallest budget that does (measured
            under compile with ``compile=True``).
        ValueError: bad budget, unknown solver, both ``solver`` and ``strategy``, ``timing_steps < 1``, a wrapped
            model, no parameter or input needing gradients, the model or ``loss_fn`` failing on the example inputs
            (the message names the error and the keyword inputs given to the model; ``loss_fn`` in any profiling
            step), a keyword input given twice, or ``selective`` naming no or an unknown class.
        TypeError: ``model`` is not an ``nn.Module``, the budget, ``compile``, ``example_kwargs``, ``selective`` or
            ``cache`` has a wrong type.

    Examples:
        >>> p = memsave.plan(model, x, budget="2GiB")
        >>> print(p.summary())
        >>> memsave.wrap(model, p)
        >>> p = memsave.plan(gpt2, input_ids=ids, attention_mask=mask, labels=ids, budget=0.5)   # Hugging Face
        >>> p = memsave.plan(vit, images, budget="1GiB", loss_fn=lambda out: F.cross_entropy(out, targets))
        >>> p = memsave.plan(model, x, budget=0.5, selective=False)       # module-level: regions recomputed whole
        >>> p = memsave.plan(model, x, budget=0.5, compile=True); step_model = p.compile(model)
    """
    start = time.perf_counter()
    solver = _solver_argument(solver, strategy)
    if budget is None and solver == "optimal":
        raise ValueError("memsave.plan: solver='optimal' needs a budget, e.g. budget='4GiB' or budget=0.6")
    if budget is not None:
        parse_budget(budget, eager_peak_bytes=1)  # fail early on a bad budget, before profiling
    cache_directory(cache)  # a bad cache= fails here too
    args = _checked(model, example_inputs, loss_fn, selective, timing_steps, compile, example_kwargs, model_kwargs)
    settings = dict(
        budget=_budget_key(budget),
        solver=solver,
        verify=bool(verify) or compile,
        slots=slots,
        timing_steps=timing_steps,
        selective=list(args.classes),
        compile=compile,
    )
    entry = _cache_entry(cache, model, example_inputs, args, loss_fn, settings)
    result = _from_cache(entry, model, start)
    if result is None:
        try:
            result = _plan(model, example_inputs, args, budget, solver, verify, slots, timing_steps, compile, progress)
        except InfeasibleBudgetError as e:
            raise InfeasibleBudgetError(f"{e} {_floor_note(model)}", min_bytes=e.min_bytes) from None
        result.planning_seconds = time.perf_counter() - start
        if entry is not None and store_plan(entry[0], entry[1], result):
            logger.debug("memsave.plan: plan cached at %s", entry[0])
    _warn_if_empty(result, result.budget_bytes, result.eager_peak_bytes)
    if verbose:
        print(result.summary())
        how = " (from the plan cache)" if result.cached else " (compiled candidates)" if compile else ""
        print(f"planning took {result.planning_seconds:.1f} s{how}")
    return result


def _plan(
    model: nn.Module,
    example_inputs: Sequence[Any],
    args: _Arguments,
    budget: Optional[Budget],
    solver: str,
    verify: bool,
    slots: int,
    timing_steps: int,
    compile: bool,
    progress: Optional[bool],
) -> Plan:
    """Steps 1-4 of :func:`plan` on checked arguments: profile, search, verify (the model's state put back)."""
    stepper = _stepper(model, example_inputs, args, compile)
    steps = 4 + timing_steps + SEARCH_ROUNDS - _peak_from_trace(stepper)
    bar = progress_bar(steps, f"memsave.plan({type(model).__name__})", progress=progress)
    stepper.progress = _Progress(bar, label=type(model).__name__)
    with _planning_scope(stepper):
        try:
            prof = _profile(stepper, args.classes, timing_steps, stepper.progress)
            budget_bytes = parse_budget(budget, prof.eager_peak_bytes) if budget is not None else None
            measure = _Measure(stepper, prof.eager_peak_bytes, SEARCH_ROUNDS if solver == "optimal" else 1)
            stepper.progress.stage("solving")
            if compile:
                return _search_compiled(prof, stepper, budget_bytes, solver, measure, slots)
            return search(prof, budget_bytes, solver, measure, slots, verify=verify)
        finally:
            stepper.progress.close()
