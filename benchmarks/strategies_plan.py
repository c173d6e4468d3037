"""Benchmark rows for memsave.plan (issue 3): the sqrt(N) plan and the optimal plan at three budgets.

Registered when imported:

    python3 benchmarks/run.py --models unet gpt2 --size cpu --plugins benchmarks.strategies_plan \\
        --strategies eager plan:sqrt plan:40% plan:60% plan:80% torch.checkpoint_sequential/2 --name plan_cpu

Rows:

* ``plan:sqrt`` — ``memsave.plan(model, *inputs, strategy="sqrt")`` applied with ``memsave.wrap``.
* ``plan:40%``, ``plan:60%``, ``plan:80%`` — ``strategy="optimal"`` with ``budget=`` that fraction of eager's peak.
  The fraction is resolved by ``plan()`` against the eager peak it measures itself, with its default loss
  (``out.float().sum()``): the harness's ``prepare`` does not see the benchmark's cross-entropy loss, so the budget
  can differ from the harness's eager row by the loss's few small tensors. A budget below the smallest feasible
  peak makes ``plan()`` raise ``InfeasibleBudgetError``, which the harness reports as an error row.

Plans are made on the fresh copy the harness passes in (``plan()`` restores its gradients, buffers and RNG state),
and ``wrap`` checkpoints the copy's own modules, so gradients are read from the same parameters.
"""

from __future__ import annotations

from typing import Any, Tuple

from torch import nn

from benchmarks.strategies import register

__all__ = ["PLAN_FRACTIONS", "PLAN_STRATEGIES"]

#: Budgets of the optimal rows, as fractions of eager's peak.
PLAN_FRACTIONS: Tuple[float, ...] = (0.4, 0.6, 0.8)

_REQUIRES = ("memsave.planning:plan", "memsave.wrap:wrap")


def _planned(model: nn.Module, inputs: Tuple[Any, ...], **kwargs: Any) -> nn.Module:
    from memsave.planning import plan
    from memsave.wrap import wrap

    return wrap(model, plan(model, *inputs, **kwargs))


@register("plan:sqrt", "memsave.plan(strategy='sqrt') (Chen et al. sqrt(N) segments) + memsave.wrap",
          requires=_REQUIRES)
def _plan_sqrt(model: nn.Module, inputs: Tuple[Any, ...]) -> nn.Module:
    return _planned(model, inputs, strategy="sqrt")


def _register_optimal(fraction: float) -> str:
    name = f"plan:{round(100 * fraction)}%"

    @register(name, f"memsave.plan(strategy='optimal', budget={fraction}) of eager's peak + memsave.wrap",
              requires=_REQUIRES)
    def _plan_optimal(model: nn.Module, inputs: Tuple[Any, ...]) -> nn.Module:
        return _planned(model, inputs, strategy="optimal", budget=float(fraction))

    return name


#: The rows this module registers, in table order.
PLAN_STRATEGIES: Tuple[str, ...] = ("plan:sqrt",) + tuple(_register_optimal(f) for f in PLAN_FRACTIONS)
