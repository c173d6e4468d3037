"""Step 4, the driver: :func:`plan` profiles (:mod:`.trace`), builds the chain (:mod:`.chain`), solves it with the C++
planner, verifies the answer by measuring it, and returns a :class:`~.plan.Plan`.

How a plan is made:

1. **Profile** (a few forward+backward steps on the example inputs, state restored afterwards). One step runs
   under an allocation log (a ``TorchDispatchMode`` recording every new storage and, through a finalizer, its
   death) with forward hooks on every module and gradient hooks on module inputs and outputs. This gives the module
   call tree and, in order, every allocation and free of the step. Further steps time each module call.
2. **Chain**: the candidate *pieces* are the module calls one level below the model (plain ``nn.Sequential``
   containers, and custom modules holding most of the memory, are opened up), in execution order, with the code
   between them (residual adds, concatenations, the loss) as *glue* pieces that are never recomputed. A module
   working in place (``ReLU(inplace=True)``) joins the piece before it. From the allocation log, each tensor of the
   forward is classified by which piece made it and which pieces used it: kept for backward inside its piece
   (``saved_bytes``), handed to the next piece (a boundary; *passing* when it is freed once read), or read further
   on (a skip connection: counted for as long as it lives). Parameter gradients are the backward's allocations that
   outlive the step. Working memory is fitted so that the model's predicted timeline of the eager step is never
   below the allocator-level one measured in the same step, and a remaining difference between the eager peak
   (measured again without the log) and the prediction, if positive, is added to all moments. What a checkpointed
   region itself holds (the saved RNG state, snapshots of module buffers) is part of the model. With
   ``selective`` (default), a few more forwards measure, per piece and operator class (matmul, conv, attention), the
   bytes of the outputs a selective region would keep and the time of the operators it would not recompute, and a
   few tiny runs measure what torch's selective-checkpoint dispatch mode costs per operator on the device, charged
   to each selective variant for every operator of its piece (:mod:`.operators`): the chain's selective policies
   and each stage's variants.
3. **Solve** with the C++ planner (``memsave._C.planner_solve``): the least recompute time whose predicted peak fits
   the budget (or a baseline strategy), each region recomputed whole or selectively (keeping the outputs of one of
   the policies' operator classes). Several consecutive pieces can share one checkpointed region only when they
   are consecutive children of one plain ``nn.Sequential``.
4. **Verify** (default): apply the plan to the model, measure one step's peak with the allocator-level measure, and
   if it exceeds the budget tighten the solver's budget by the error and solve again. The returned plan's measured
   peak is in :attr:`Plan.measured_peak_bytes`. A selective search that finds nothing within the budget is followed
   by the module-level one (the chain without its selective variants) before the budget is declared infeasible.

Budget = the peak memory of one training step (gradients set to None, forward, loss, backward) above what was
allocated before it: ``max_memory_allocated`` on CUDA, the profiler's allocation events on CPU (DESIGN.md).
"""

from __future__ import annotations

import re
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple, Union

import torch
from torch import nn

from ...common.progress import progress_bar
from ...errors import InfeasibleBudgetError
from ...measurement.allocator import step_peak_bytes
from ...measurement.measuring import LossFn, SavedStepState, resolve_device, resolve_loss_fn, tensors_in
from ...measurement.units import Budget, format_bytes, parse_budget
from ..selective import OPERATOR_CLASSES
from ..wrapping import is_wrapped, unwrap_module
from .chain import Chain, build_chain
from .operators import policy_classes, profile_operator_classes, selective_overhead_per_operator, selective_variants
from .plan import Plan, apply_regions, fingerprint
from .trace import time_steps, trace_step

__all__ = ["plan", "search_optimal"]

_STRATEGIES = ("optimal", "sqrt", "none", "all", "min_memory")


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
    ) -> None:
        self.model, self.inputs, self.kwargs, self.loss_fn = model, inputs, kwargs, loss_fn
        self.device, self.state = device, state

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def step(self) -> None:
        self.state.clear_grads()
        out = self.model(*self.inputs, **self.kwargs)
        loss = self.loss_fn(out)
        _check_loss(out, loss)
        loss.backward()

    def peak(self) -> int:
        if self.device.type not in ("cpu", "cuda"):
            raise ValueError(f"memsave.plan: device type {self.device.type!r} is not supported; use 'cpu' or 'cuda'")
        self.state.clear_grads()
        return step_peak_bytes(self.step, self.device)


def _check_loss(out: Any, loss: Any) -> None:
    """Raise a TypeError saying what is wrong when ``loss`` is not a scalar tensor one can backpropagate."""
    if loss is None and getattr(out, "loss", 0) is None:
        raise TypeError(
            f"memsave.plan: the loss is None: the model returned a {type(out).__name__} whose .loss is None (a Hugging "
            f"Face model computes its loss only when called with labels=...); pass labels=... to memsave.plan, or a "
            f"loss_fn that maps the output to a scalar loss"
        )
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise TypeError(
            f"memsave.plan: loss_fn must return a scalar tensor, got "
            f"{type(loss).__name__ if not isinstance(loss, torch.Tensor) else tuple(loss.shape)}"
        )
    if not loss.requires_grad:
        raise TypeError(
            "memsave.plan: the loss does not require grad (computed without autograd, or from nothing that requires "
            "grad), so a training step has no backward to plan for"
        )


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
    if isinstance(selective, str) or not all(isinstance(c, str) for c in selective):
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


def search_optimal(
    solve: Callable[[Optional[int]], Dict[str, Any]],
    solve_min_memory: Callable[[], Dict[str, Any]],
    make: Callable[[Dict[str, Any]], "Plan"],
    measure: Optional[Callable[["Plan"], int]],
    budget_bytes: int,
    rounds: int = 4,
) -> Optional["Plan"]:
    """The optimal plan whose *measured* peak fits ``budget_bytes``, or None.

    The cost model's peak is off by a few allocations either way (allocator rounding, a temporary it does not see).
    Each round solves for a solver budget, measures that plan, and moves the solver budget by the error just
    observed (``budget - (measured - predicted)``): down when the model was optimistic, up when it was pessimistic,
    so a plan predicted a little above the budget but measured within it is found too (at a tight budget the
    model's own minimum can sit just above the measured peak of the plan that fits). Of the plans that fit, the
    one with the least predicted recompute wins. Without ``measure`` the solver's answer is taken as it is.
    """
    if measure is None:
        res = solve(budget_bytes)
        return make(res) if res["feasible"] else None
    best: Optional[Plan] = None
    seen: set = set()
    solver_budget = budget_bytes
    for _ in range(rounds):
        res = solve(solver_budget)
        if not res["feasible"]:
            if seen:
                break
            res = solve_min_memory()  # learn the model's error where it is tightest
        p = make(res)
        key = (tuple(p.segments), tuple(getattr(p, "selective", ())))
        if key in seen:
            break
        seen.add(key)
        p.measured_peak_bytes = measure(p)
        error = p.measured_peak_bytes - p.predicted_peak_bytes
        if p.measured_peak_bytes <= budget_bytes:
            if best is None or p.predicted_extra_seconds < best.predicted_extra_seconds:
                best = p
            if error >= 0:
                break  # the model was not pessimistic here: a larger solver budget would not fit
            solver_budget = max(solver_budget + 1, budget_bytes - error)
        else:
            solver_budget = min(solver_budget - 1, budget_bytes - error)
            if solver_budget < 0:
                break
    return best


def plan(
    model: nn.Module,
    *example_inputs: Any,
    budget: Optional[Budget] = None,
    loss_fn: Optional[LossFn] = None,
    strategy: str = "optimal",
    verbose: bool = False,
    verify: bool = True,
    slots: int = 2000,
    timing_steps: int = 3,
    selective: Union[bool, Sequence[str]] = True,
    example_kwargs: Optional[Mapping[str, Any]] = None,
    **model_kwargs: Any,
) -> Plan:
    """Choose what to recompute in backward so that a training step fits ``budget``, with the least recompute.

    Profiles a few steps of ``model`` on the example inputs (and puts back parameters' gradients, buffers such as
    BatchNorm statistics and the RNG state afterwards), builds the chain of candidate pieces from the module tree,
    and solves it with memsave's C++ planner. Apply the result with ``memsave.wrap(model, plan)``.

    One profiled step is ``loss_fn(model(*example_inputs, **model_kwargs)).backward()``: keyword inputs work as in
    training code (a Hugging Face model's ``input_ids=..., attention_mask=..., labels=...``), and the output may be
    anything ``loss_fn`` takes (a tensor, tuples, dicts, a Hugging Face ``ModelOutput``). A Hugging Face model called
    with ``labels`` returns its loss first, which is what the default loss then takes. The model must make the same
    module calls in every step (no data-dependent branches between them).

    Args:
        model: the model (not wrapped: call :func:`memsave.unwrap` first).
        *example_inputs: positional arguments of ``model`` for one step, on the device to plan for.
        budget: peak bytes of one training step above what was allocated before it (DESIGN.md): an int, a
            string such as ``"512MiB"`` / ``"4GB"``, or a float fraction of the eager step's peak. Required for
            ``strategy="optimal"``; optional otherwise (then checked when given).
        loss_fn: maps the model's output to a scalar loss (``lambda out: out.loss``,
            ``lambda out: F.cross_entropy(out, y)``); default: ``out.float().sum()`` of the first floating-point
            tensor of the output that requires grad (:func:`memsave.measurement.default_loss`) -- for a Hugging
            Face model called with ``labels``, its loss.
        strategy: ``"optimal"`` (least recompute within the budget), ``"sqrt"`` (Chen et al.), ``"uniform:K"``,
            ``"none"``, ``"all"`` (every piece its own region) or ``"min_memory"``.
        verbose: print the plan's summary.
        verify: measure one step with the plan applied and solve again with the solver's budget moved by the
            model's error (up to 4 plans measured): lower when the plan measured above the budget, higher when
            the model was pessimistic, so the plan returned has a measured peak within the budget and is the
            cheapest such plan found.
        slots: memory slots of the solver's dynamic program (finer = closer to optimal, slower).
        timing_steps: steps timed to estimate each piece's forward and backward time.
        selective: let the planner choose, per region, between recomputing it whole and *selective* recompute
            (:func:`memsave.selective`: keep the outputs of its matrix products, convolutions and attention kernels,
            recompute only the cheap operators), and which of those classes to keep, by the bytes and time each
            class takes in each piece (profiled in a few extra forwards) and the per-operator cost of the selective
            contexts' dispatch mode (measured on the device). ``True`` (default): all classes
            (``"matmul"``, ``"conv"``, ``"attention"``); a sequence of class names: only those; ``False``:
            module-level plans (every region recomputed whole). :meth:`Plan.summary` shows what each region keeps.
            A selective plan is never worse placed than a module-level one: the module-level chain is searched
            too before a budget is declared infeasible, so ``True`` fits every budget ``False`` fits.
        example_kwargs: keyword inputs of ``model`` as a dict (``memsave.plan(model, example_kwargs=batch, ...)``);
            the way to pass a model keyword named like one of this function's own parameters.
        **model_kwargs: every other keyword is a keyword input of ``model`` for the step.

    Returns:
        a :class:`Plan`.

    Raises:
        InfeasibleBudgetError: no plan fits the budget; ``.min_bytes`` is the smallest budget that does.
        ValueError: bad budget, unknown strategy, a wrapped model, no parameter or input needing gradients, the
            model or ``loss_fn`` failing on the example inputs (the message names the error and the keyword inputs
            given to the model), a keyword input given twice, or ``selective`` naming no or an unknown class.
        TypeError: ``model`` is not an ``nn.Module``, the budget, ``example_kwargs`` or ``selective`` has a wrong
            type.

    Example:
        >>> p = memsave.plan(model, x, budget="2GiB")
        >>> print(p.summary())
        >>> memsave.wrap(model, p)
        >>> p = memsave.plan(gpt2, input_ids=ids, attention_mask=mask, labels=ids, budget=0.5)   # Hugging Face
        >>> p = memsave.plan(vit, images, budget="1GiB", loss_fn=lambda out: F.cross_entropy(out, targets))
        >>> p = memsave.plan(model, x, budget=0.5, selective=False)       # module-level: regions recomputed whole
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"memsave.plan: model must be an nn.Module, got {type(model).__name__}")
    if not isinstance(strategy, str) or not (strategy in _STRATEGIES or re.fullmatch(r"uniform:[1-9][0-9]*", strategy)):
        raise ValueError(
            f"memsave.plan: unknown strategy {strategy!r}; use one of optimal, sqrt, uniform:K (K >= 1), none, all, "
            f"min_memory"
        )
    if budget is None and strategy == "optimal":
        raise ValueError("memsave.plan: strategy='optimal' needs a budget, e.g. budget='4GiB' or budget=0.6")
    if budget is not None:
        parse_budget(budget, eager_peak_bytes=1)  # fail early on a bad budget, before profiling
    classes = _selective_classes(selective)
    kwargs = _split_inputs(example_kwargs, model_kwargs)
    everything = (example_inputs, kwargs)
    loss_fn = resolve_loss_fn(loss_fn, "memsave.plan")
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
    device = resolve_device(model, everything, None)

    state = SavedStepState(model, everything)
    stepper = _Stepper(model, example_inputs, kwargs, loss_fn, device, state)
    bar = progress_bar(5 + timing_steps + bool(classes), f"memsave.plan({type(model).__name__})")

    def tick(n: int = 1) -> None:
        if bar is not None:
            bar.update(n)

    try:
        try:
            stepper.step()  # warm-up: lazy initialisation, allocator caches
        except Exception as e:
            given = f"{len(example_inputs)} positional input(s)" + (
                f" and the keyword input(s) {', '.join(kwargs)} (every keyword memsave.plan does not know goes to the "
                f"model)"
                if kwargs
                else ""
            )
            raise ValueError(
                f"memsave.plan: one training step of {type(model).__name__} on the example inputs failed "
                f"({type(e).__name__}: {e}); it was given {given}. Pass example inputs that "
                f"model(*inputs, **kwargs) accepts and a loss_fn that maps its output to a scalar"
            ) from e
        tick()
        state.clear_grads()
        trace = trace_step(model, example_inputs, loss_fn, device, kwargs)
        tick()
        timing = time_steps(model, example_inputs, loss_fn, len(trace.calls), timing_steps, stepper.sync, kwargs)
        tick(timing_steps)
        eager_peak = stepper.peak()
        tick()
        chain, pieces = build_chain(trace, model, timing)
        found: List[Set[str]] = [set() for _ in pieces]  # operator classes met in each piece
        if classes:
            profile = profile_operator_classes(
                lambda: model(*example_inputs, **kwargs), model, pieces, classes, timing_steps, stepper.sync
            )
            selective_variants(chain, pieces, profile, selective_overhead_per_operator(device, stepper.sync))
            found = [set(prof) for prof in profile.classes]
            tick()

        def keeps(segment: Tuple[int, int, bool], policy: Optional[int], ch: Chain) -> Tuple[str, ...]:
            """The classes a selective region keeps: its policy's, less those none of its pieces runs."""
            if policy is None:
                return ()
            here = set().union(*found[segment[0] : segment[1]])
            return tuple(c for c in policy_classes(ch.operator_classes[policy]) if c in here)

        n = len(pieces)
        none_peak = chain.simulate([(0, n, False)])["peak_bytes"]
        chain.base_bytes = max(0, eager_peak - none_peak)  # allocator-level memory the log cannot see
        eager_seconds = chain.eager_seconds()
        budget_bytes = parse_budget(budget, eager_peak) if budget is not None else None

        def make(res: Dict[str, Any], ch: Chain = chain) -> Plan:  # the solver's answer on ``ch``, not measured yet
            return Plan(
                strategy=strategy,
                budget_bytes=budget_bytes,
                predicted_peak_bytes=int(res["predicted_peak_bytes"]),
                measured_peak_bytes=None,
                eager_peak_bytes=int(eager_peak),
                min_feasible_bytes=int(res["min_feasible_bytes"]),
                predicted_extra_seconds=float(res["predicted_extra_time"]),
                eager_step_seconds=eager_seconds,
                segments=[tuple(s) for s in res["segments"]],
                pieces=pieces,
                chain=ch,
                selective=[keeps(seg, k, ch) for seg, k in zip(res["segments"], res["segment_policies"])],
                model_class=type(model).__name__,
                fingerprint=fingerprint(model),
                device=str(device),
            )

        measured_cache: Dict[Tuple, int] = {}

        def measure_plan(p: Plan) -> int:
            key = (tuple(p.segments), tuple(p.selective))
            if key not in measured_cache:
                if not any(r for _, _, r in p.segments):
                    measured_cache[key] = eager_peak
                else:
                    changed = apply_regions(model, p)
                    try:
                        measured_cache[key] = stepper.peak()
                    finally:
                        for m in changed:
                            unwrap_module(m)
                tick()
            return measured_cache[key]

        solver_strategy = strategy
        if strategy == "optimal" and budget_bytes is not None and budget_bytes >= eager_peak:
            solver_strategy = "none"  # eager itself fits: nothing to recompute
        result: Optional[Plan] = None
        # Module-level plans are a subset of selective ones, but at the tightest budgets the cost model can tie a
        # selective region with a whole one that measures a few allocations smaller, and a search on the selective
        # chain then never tries the whole one. So a selective plan also searches the module-level chain before
        # anything is declared infeasible: selective=True never fits fewer budgets than selective=False.
        chains = [chain, chain.module_level()] if chain.operator_classes else [chain]

        def smallest_plan() -> Plan:
            """The minimum-memory plan, of each chain's, with the smallest measured peak (which it carries)."""
            plans = [make(ch.solve(None, "min_memory", slots), ch) for ch in chains]
            for q in plans:
                q.measured_peak_bytes = measure_plan(q)
            return min(plans, key=lambda q: q.measured_peak_bytes)

        if solver_strategy == "min_memory" and len(chains) > 1:  # a choice to make: measure both
            p = smallest_plan()
            if budget_bytes is None or p.measured_peak_bytes <= budget_bytes:
                result = p
        elif solver_strategy != "optimal":
            res = chain.solve(budget_bytes, solver_strategy, slots)
            p = make(res)
            if verify or budget_bytes is not None:
                p.measured_peak_bytes = measure_plan(p)
            if budget_bytes is None or p.measured_peak_bytes is None or p.measured_peak_bytes <= budget_bytes:
                result = p
        else:
            assert budget_bytes is not None
            for ch in chains:
                result = search_optimal(
                    solve=lambda b, ch=ch: ch.solve(b, "optimal", slots),
                    solve_min_memory=lambda ch=ch: ch.solve(None, "min_memory", slots),
                    make=lambda res, ch=ch: make(res, ch),
                    measure=measure_plan if verify else None,
                    budget_bytes=budget_bytes,
                )
                if result is not None:
                    break
        if result is None:
            # Nothing fits: the smallest budget that does is the measured peak of the minimum-memory plan.
            smallest = smallest_plan()
            min_bytes = smallest.measured_peak_bytes
            if budget_bytes is not None and min_bytes <= budget_bytes and strategy == "optimal":
                result = smallest
            else:
                what = f"strategy '{strategy}'" if strategy != "optimal" else "any plan"
                raise InfeasibleBudgetError(
                    f"memsave.plan: no checkpoint plan of {type(model).__name__} fits a budget of "
                    f"{format_bytes(budget_bytes)} ({budget_bytes} bytes) with {what}; the smallest budget that fits "
                    f"is {format_bytes(min_bytes)} ({min_bytes} bytes, measured with the minimum-memory plan; eager "
                    f"peaks at {format_bytes(eager_peak)}). Raise the budget, lower the batch size, or use "
                    f"memory-efficient modules (memsave.convert).",
                    min_bytes=min_bytes,
                )
    finally:
        if bar is not None:
            bar.close()
        state.restore()
    if verbose:
        print(result.summary())
    return result
