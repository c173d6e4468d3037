"""Benchmark rows for memsave.plan: the sqrt(N) plan and the optimal plan at three budgets. Registers
``plan_range:<percent>`` when imported::

    python3 benchmarks/run.py --models unet gpt2 --size cpu --plugins benchmarks.strategies_plan \\
        --strategies eager plan:sqrt plan_range:25% plan_range:50% plan_range:75% \\
        torch_checkpoint_sequential:2 --name plan_cpu

Rows (:data:`PLAN_STRATEGIES`):

* ``plan:sqrt`` — memsave's own strategy: ``memsave.plan(model, *inputs, solver="sqrt")`` applied with
  ``memsave.wrap``.
* ``plan_range:25%``, ``50%``, ``75%`` — ``solver="optimal"`` with the budget that far along the feasible
  range: ``smallest + f * (eager - smallest)``, where ``smallest`` is the measured peak of the minimum-memory plan
  and ``eager`` the eager step's peak, both as ``plan()`` measures them. The feasible range, not a fraction of
  eager's peak, because how low a model can go differs widely: at the CPU sizes the UNet's smallest feasible peak
  is 0.91 of eager's (parameters, gradients and the decoder's workspace dominate), the GPT-like model's 0.45, so a
  fixed 40/60/80% would be infeasible for one and loose for the other.

Plans are made with the benchmark's loss (the strategy context carries it) on the fresh copy the harness passes in
(``plan()`` restores its gradients, buffers and RNG state), and ``wrap`` checkpoints the copy's own modules, so
gradients are read from the same parameters.
"""

from __future__ import annotations

from typing import Optional, Tuple

from torch import nn

from memsave.measurement.strategies import StrategyContext, register_strategy
from memsave.recompute import plan, wrap

__all__ = ["PLAN_RANGE_POINTS", "PLAN_STRATEGIES", "range_budget"]

#: Budgets of the optimal rows, as points along [smallest feasible peak, eager's peak].
PLAN_RANGE_POINTS: Tuple[float, ...] = (0.25, 0.5, 0.75)


def range_budget(smallest: int, eager: int, point: float) -> int:
    """The budget ``point`` of the way from ``smallest`` to ``eager`` bytes (rounded down).

    Examples:
        >>> range_budget(100, 200, 0.25)
        125
    """
    if not 0.0 <= point <= 1.0:
        raise ValueError(f"range_budget: point must be within [0, 1], got {point}")
    return smallest + int((eager - smallest) * point)


def _apply_plan_range(model: nn.Module, arg: Optional[str], ctx: StrategyContext) -> nn.Module:
    text = (arg or "").strip()
    if not text.endswith("%"):
        raise ValueError(f"plan_range:{arg}: give a percentage of the feasible range, e.g. plan_range:50%")
    point = float(text[:-1]) / 100.0
    least = plan(model, *ctx.inputs, loss_fn=ctx.loss_fn, solver="min_memory")
    assert least.measured_peak_bytes is not None  # plan() measures every plan it returns by default
    budget = range_budget(least.measured_peak_bytes, least.eager_peak_bytes, point)
    return wrap(model, plan(model, *ctx.inputs, loss_fn=ctx.loss_fn, solver="optimal", budget=budget))


register_strategy(
    "plan_range",
    "memsave.plan(solver='optimal') at <percent> of the way from the smallest feasible peak to eager's, + memsave.wrap",
    arg="<percent>",
    apply=_apply_plan_range,
    replace=True,
)

#: The plan rows, in table order: sqrt(N) (memsave's own plan:sqrt) and the optimal plan along the feasible range.
PLAN_STRATEGIES: Tuple[str, ...] = ("plan:sqrt",) + tuple(f"plan_range:{round(100 * p)}%" for p in PLAN_RANGE_POINTS)
