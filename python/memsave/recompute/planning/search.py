"""Step 4, the search: the least-recompute plan whose peak, measured, fits the budget.

:func:`search_optimal` solves the chain for a solver budget, measures the plan, and moves the solver budget by the
cost model's error until a plan measures within the budget; :func:`search_chains` runs it (or a fixed solver such
as ``sqrt``) over the selective chain and then the module-level one, and :func:`smallest_plan` gives each chain's
minimum-memory plan with the smallest measured peak (the smallest budget that fits, when nothing else does);
:func:`search_partitioner` finds torch's own partitioner budget that fits, the candidate beside memsave's regions
under compile. The driver that profiles, builds the chain and calls these is
:func:`memsave.recompute.planning.planner.plan`.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .chain import Chain
from .plan import Plan

__all__ = [
    "COMPILED_ROOM",
    "PARTITIONER_PROBES",
    "SEARCH_ROUNDS",
    "fastest",
    "search_chains",
    "search_optimal",
    "search_partitioner",
    "smallest_plan",
]

#: Candidates :func:`search_optimal` measures at most on one chain.
SEARCH_ROUNDS = 4

#: Under compile (an inductor compile per round) the search stops once a plan that fits measures within this
#: fraction of the budget: the room left holds little more to keep.
COMPILED_ROOM = 0.02

#: Partitioner budgets :func:`search_partitioner`'s bisection measures at most (each an inductor compile): the last
#: step is 1/8.
PARTITIONER_PROBES = 3


def _peak(p: "Plan") -> int:
    """A candidate's peak: measured when it was, else predicted."""
    return p.measured_peak_bytes if p.measured_peak_bytes is not None else p.predicted_peak_bytes


def fastest(plans: Sequence["Plan"], seconds: Optional[Callable[["Plan"], float]] = None) -> "Plan":
    """The plan with the least time; of plans with equal time, the one with the least peak (the first of equals).

    The dominance rule of every choice the planner makes between candidates it evaluated: the plan it picks is
    never slower than another with a lower or equal peak, and never above another of the same time. Peaks are
    measured where the candidate was measured, else predicted.

    Args:
        plans: the candidates (at least one), all within the budget.
        seconds: a candidate's time; default its predicted recompute time (``predicted_extra_seconds``). Under
            compile, the measured step time.

    Returns:
        the chosen plan.

    Raises:
        ValueError: ``plans`` is empty.

    Examples:
        >>> fastest([a, b]) is b          # b: the same predicted time as a, a smaller peak
        True
        >>> fastest(plans, seconds=measured.__getitem__)
    """
    if not plans:
        raise ValueError("memsave.plan: fastest needs at least one candidate plan")
    time_of = seconds if seconds is not None else (lambda p: p.predicted_extra_seconds)
    return min(plans, key=lambda p: (time_of(p), _peak(p)))


def search_optimal(
    solve: Callable[[Optional[int]], Dict[str, Any]],
    solve_min_memory: Callable[[], Dict[str, Any]],
    make: Callable[[Dict[str, Any]], "Plan"],
    measure: Optional[Callable[["Plan"], int]],
    budget_bytes: int,
    rounds: int = SEARCH_ROUNDS,
    anchor: Optional[Tuple[int, int]] = None,
) -> Optional["Plan"]:
    """The optimal plan whose *measured* peak fits ``budget_bytes``, or None.

    The cost model's peak is off by a few allocations either way (allocator rounding, a temporary it does not see).
    Each round solves for a solver budget, measures that plan, and moves the solver budget by the error just
    observed (``budget - (measured - predicted)``): down when the model was optimistic, up when it was pessimistic,
    so a plan predicted a little above the budget but measured within it is found too (at a tight budget the
    model's own minimum can sit just above the measured peak of the plan that fits). Of the plans that fit, the
    one with the least predicted recompute wins, and of equal recompute the one with the least measured peak
    (:func:`fastest`). Without ``measure`` the solver's answer is taken as it is.

    With ``anchor`` (under compile: eager's predicted peak and its compiled peak) the next solver budget is
    interpolated instead: between the highest measured peak that fits and the lowest above the budget (the anchor
    among them), the predicted peak at which the measured one would meet the budget; with no point above or below,
    ``budget * predicted / measured``. Compile keeps a fraction of what eager keeps, not eager's bytes less a
    constant, so the additive correction would approach the budget by a fraction of the distance per round. Each
    round is then a compile, so the search also stops at a plan that fits within :data:`COMPILED_ROOM` of the budget.
    """
    if measure is None:
        res = solve(budget_bytes)
        return make(res) if res["feasible"] else None
    best: Optional[Plan] = None
    seen: set = set()
    points: List[Tuple[int, int]] = [anchor] if anchor is not None else []  # (predicted, measured) peaks
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
        points.append((p.predicted_peak_bytes, p.measured_peak_bytes))
        target = _next_solver_budget(points, budget_bytes, anchor is not None)
        if p.measured_peak_bytes <= budget_bytes:
            best = p if best is None else fastest([best, p])
            if p.measured_peak_bytes >= p.predicted_peak_bytes:
                break  # the model was not pessimistic here: a larger solver budget would not fit
            if anchor is not None and _within_room(p.measured_peak_bytes, budget_bytes):
                break  # under compile a round is a compile: too little room left to buy one
            solver_budget = max(solver_budget + 1, target)
        else:
            solver_budget = min(solver_budget - 1, target)
            if solver_budget < 0:
                break
    return best


def _within_room(peak: int, budget_bytes: int) -> bool:
    """Whether a fitting compiled peak is within :data:`COMPILED_ROOM` of the budget: not worth another compile."""
    return peak >= (1 - COMPILED_ROOM) * budget_bytes


def _next_solver_budget(points: Sequence[Tuple[int, int]], budget_bytes: int, interpolate: bool) -> int:
    """The solver budget at which a plan would measure ``budget_bytes``, from the (predicted, measured) peaks so
    far, the last one the latest candidate's: the budget less that candidate's error; ``interpolate``: between the
    nearest points on either side of the budget, else by the latest candidate's ratio."""
    predicted, measured = points[-1]
    if not interpolate:
        return budget_bytes - (measured - predicted)
    below = [pt for pt in points if pt[1] <= budget_bytes]
    above = [pt for pt in points if pt[1] > budget_bytes]
    if below and above:
        (p0, m0), (p1, m1) = max(below, key=lambda pt: pt[1]), min(above, key=lambda pt: pt[1])
        return int(p0 + (budget_bytes - m0) * (p1 - p0) / (m1 - m0))
    return int(budget_bytes * predicted / max(1, measured))


def search_partitioner(
    peak_at: Callable[[float], int], budget_bytes: int, probes: int = PARTITIONER_PROBES
) -> Optional[Tuple[float, int]]:
    """The highest partitioner budget found whose measured compiled peak fits ``budget_bytes``, with that peak.

    A bisection of torch's ``activation_memory_budget`` b over [0, 1]: 0.5, then 0.75 when it fitted or 0.25 when
    not, ..., ``probes`` budgets at most; a fit within :data:`COMPILED_ROOM` of the budget ends it (each probe is a
    compile). When none fitted, b = 0 (recompute all torch can) is the last probe. torch's peak is not monotonic in
    b, so this is the highest fitting budget among those measured, and b = 0 is not where it is lowest: on a 4-layer
    GPT-2 (tests/recompute/test_plan_compile.py) b = 0 peaked at 5.78 MiB, above torch's default 1.0 (4.79 MiB),
    and budgets from 1/16 to 3/4 at 3.50-4.00 MiB in no order, so neither a line nor b = 0 first would guide the
    search better.

    Args:
        peak_at: the compiled peak of the model at a partitioner budget (a compile and a step).
        budget_bytes: the budget.
        probes: the most budgets the bisection measures (>= 1).

    Returns:
        (partitioner budget, its measured peak), or None when nothing measured fits.

    Raises:
        whatever ``peak_at`` raises (a compile or a step that failed), before any later budget is measured.

    Examples:
        >>> search_partitioner(lambda b: int(100 + 50 * b), 130)
        (0.5, 125)
    """
    found: Optional[Tuple[float, int]] = None
    low, high = 0.0, 1.0
    for _ in range(probes):
        b = (low + high) / 2
        peak = peak_at(b)
        if peak > budget_bytes:
            high = b
            continue
        found, low = (b, peak), b
        if _within_room(peak, budget_bytes):
            break
    if found is None:
        peak = peak_at(0.0)
        found = (0.0, peak) if peak <= budget_bytes else None
    return found


def search_chains(
    chains: Sequence[Chain],
    solver: str,
    budget_bytes: Optional[int],
    slots: int,
    make: Callable[[Dict[str, Any], Chain], Plan],
    measure: Optional[Callable[[Plan], int]],
    anchor: Optional[Tuple[int, int]] = None,
) -> Optional[Plan]:
    """The plan of ``solver`` within ``budget_bytes`` on the first of ``chains`` that has one, or None.

    ``chains`` is the selective chain then its module-level one: at the tightest budgets the cost model can tie a
    selective region with a whole one that measures a few allocations smaller, and a search on the selective chain
    then never tries the whole one, so selective plans never fit fewer budgets than module-level ones.

    Args:
        chains: the cost models to search, in order.
        solver: ``optimal``, ``sqrt``, ``uniform:K``, ``none``, ``all`` or ``min_memory``.
        budget_bytes: the budget (None: no budget; then ``solver`` must not be ``optimal``).
        slots: memory slots of the solver's dynamic program.
        make: turns the solver's answer on a chain into a :class:`Plan` (not measured yet).
        measure: a plan's measured peak, or None to take the cost model's answers as they are.
        anchor: under compile, eager's predicted peak and its compiled peak: the optimal search interpolates the
            cost model's error (:func:`search_optimal`).

    Returns:
        the plan (its ``measured_peak_bytes`` set when measured), or None when none fits.

    Raises:
        ValueError: ``solver="optimal"`` without a budget.

    Examples:
        >>> search_chains([chain], "optimal", 2**30, 2000, make, measure)
    """
    if solver == "min_memory" and len(chains) > 1:  # a choice to make: measure both
        p = smallest_plan(chains, slots, make, measure)
        return p if budget_bytes is None or (p.measured_peak_bytes or 0) <= budget_bytes else None
    if solver != "optimal":
        p = make(chains[0].solve(budget_bytes, solver, slots), chains[0])
        if measure is not None:
            p.measured_peak_bytes = measure(p)
        fits = budget_bytes is None or p.measured_peak_bytes is None or p.measured_peak_bytes <= budget_bytes
        return p if fits else None
    if budget_bytes is None:
        raise ValueError("memsave.plan: solver='optimal' needs a budget, e.g. budget='4GiB' or budget=0.6")
    for ch in chains:
        result = search_optimal(
            solve=functools.partial(ch.solve, solver="optimal", slots=slots),
            solve_min_memory=functools.partial(ch.solve, None, "min_memory", slots),
            make=functools.partial(_make_on, make, ch),
            measure=measure,
            budget_bytes=budget_bytes,
            anchor=anchor,
        )
        if result is not None:
            return result
    return None


def _make_on(make: Callable[[Dict[str, Any], Chain], Plan], chain: Chain, res: Dict[str, Any]) -> Plan:
    return make(res, chain)


def smallest_plan(
    chains: Sequence[Chain],
    slots: int,
    make: Callable[[Dict[str, Any], Chain], Plan],
    measure: Optional[Callable[[Plan], int]],
) -> Plan:
    """Of each chain's minimum-memory plan, the one with the smallest measured peak (which it carries; the cost
    model's peak when ``measure`` is None); of equal peaks, the one with the least predicted recompute.

    Args:
        chains: the cost models.
        slots: memory slots of the solver's dynamic program.
        make: turns the solver's answer on a chain into a :class:`Plan`.
        measure: a plan's measured peak, or None.

    Returns:
        the plan.

    Raises:
        ValueError: ``chains`` is empty.

    Examples:
        >>> smallest_plan([chain, chain.module_level()], 2000, make, measure).measured_peak_bytes
    """
    if not chains:
        raise ValueError("memsave.plan: smallest_plan needs at least one chain")
    plans = [make(ch.solve(None, "min_memory", slots), ch) for ch in chains]
    for q in plans:
        q.measured_peak_bytes = measure(q) if measure is not None else q.predicted_peak_bytes
    return min(plans, key=lambda q: (q.measured_peak_bytes or 0, q.predicted_extra_seconds))
