"""Benchmark rows for memsave.plan (issue 3): the sqrt(N) plan and the optimal plan at three budgets.

Registered when imported:

    python3 benchmarks/run.py --models unet gpt2 --size cpu --plugins benchmarks.strategies_plan \\
        --strategies eager plan:sqrt plan:optimal@25% plan:optimal@50% plan:optimal@75% \\
        torch.checkpoint_sequential/2 --name plan_cpu

Rows:

* ``plan:sqrt`` — ``memsave.plan(model, *inputs, strategy="sqrt")`` applied with ``memsave.wrap``.
* ``plan:optimal@25%``, ``@50%``, ``@75%`` — ``strategy="optimal"`` with the budget that far along the feasible
  range: ``smallest + f * (eager - smallest)``, where ``smallest`` is the measured peak of the minimum-memory plan
  and ``eager`` the eager step's peak, both as ``plan()`` measures them. The feasible range, not a fraction of
  eager's peak, because how low a model can go differs widely: at the CPU sizes the UNet's smallest feasible peak
  is 0.91 of eager's (parameters, gradients and the decoder's workspace dominate), the GPT-like model's 0.45, so a
  fixed 40/60/80% would be infeasible for one and loose for the other.

``plan()`` measures with its default loss (``out.float().sum()``): the harness's ``prepare`` does not see the
benchmark's cross-entropy loss, so the budget can differ from the harness's eager row by the loss's few small
tensors. Plans are made on the fresh copy the harness passes in (``plan()`` restores its gradients, buffers and RNG
state), and ``wrap`` checkpoints the copy's own modules, so gradients are read from the same parameters.
"""

from __future__ import annotations

from typing import Any, Tuple

from torch import nn

from benchmarks.strategies import register

__all__ = ["PLAN_RANGE_POINTS", "PLAN_STRATEGIES", "range_budget"]

#: Budgets of the optimal rows, as points along [smallest feasible peak, eager's peak].
PLAN_RANGE_POINTS: Tuple[float, ...] = (0.25, 0.5, 0.75)

_REQUIRES = ("memsave.recompute:plan", "memsave.recompute:wrap")


def range_budget(smallest: int, eager: int, point: float) -> int:
    """The budget ``point`` of the way from ``smallest`` to ``eager`` bytes (rounded down).

    Example:
        >>> range_budget(100, 200, 0.25)
        125
    """
    if not 0.0 <= point <= 1.0:
        raise ValueError(f"range_budget: point must be within [0, 1], got {point}")
    return smallest + int((eager - smallest) * point)


def _planned(model: nn.Module, inputs: Tuple[Any, ...], **kwargs: Any) -> nn.Module:
    from memsave.recompute.planning import plan
    from memsave.recompute.wrapping import wrap

    return wrap(model, plan(model, *inputs, **kwargs))


@register("plan:sqrt", "memsave.plan(strategy='sqrt') (Chen et al. sqrt(N) segments) + memsave.wrap",
          requires=_REQUIRES)
def _plan_sqrt(model: nn.Module, inputs: Tuple[Any, ...]) -> nn.Module:
    return _planned(model, inputs, strategy="sqrt")


def _register_optimal(point: float) -> str:
    name = f"plan:optimal@{round(100 * point)}%"

    @register(name, f"memsave.plan(strategy='optimal') at {point:.0%} of the way from the smallest feasible peak to "
                    "eager's + memsave.wrap", requires=_REQUIRES)
    def _plan_optimal(model: nn.Module, inputs: Tuple[Any, ...]) -> nn.Module:
        from memsave.recompute.planning import plan

        least = plan(model, *inputs, strategy="min_memory")
        assert least.measured_peak_bytes is not None  # plan() measures every plan it returns by default
        budget = range_budget(least.measured_peak_bytes, least.eager_peak_bytes, point)
        return _planned(model, inputs, strategy="optimal", budget=budget)

    return name


#: The rows this module registers, in table order.
PLAN_STRATEGIES: Tuple[str, ...] = ("plan:sqrt",) + tuple(_register_optimal(f) for f in PLAN_RANGE_POINTS)
