"""The recompute part's strategies for :func:`memsave.compare`, :func:`memsave.estimate` and the command line.

* ``checkpoint:<policy>``: :func:`memsave.wrap` on the modules
  :func:`memsave.recompute.policies.resolve_checkpoint_policy` selects (``memsave.wrap(model, "<policy>")`` takes the
  same strings).
* ``plan:<budget>``: :func:`memsave.plan` at a budget (``4GiB``, ``50%``, ``0.5``; see
  :mod:`memsave.measurement.units`) or with a baseline (``sqrt``, ``uniform:K``, ``all``, ``none``,
  ``min_memory``), applied with :func:`memsave.wrap`.
* ``checkpoint_sequential:<segments>``: :func:`memsave.checkpoint_sequential` over the model's sequential view (an
  ``nn.Sequential`` model, or what its ``as_sequential()`` returns).
* Baselines to compare with: ``torch_checkpoint:<policy>`` (``torch.utils.checkpoint``, non-reentrant, around the
  same modules as ``checkpoint:<policy>``) and ``torch_checkpoint_sequential:<segments>``.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Dict, Optional

from torch import nn
from torch.utils import checkpoint as torch_checkpoint

from ..common.rng import RngState
from ..measurement.strategies import StrategyContext, register_strategy
from . import planning
from .policies import resolve_checkpoint_policy
from .region import checkpoint_sequential
from .wrapping import wrap

__all__ = ["SequentialSegments", "register_strategies", "resolve_checkpoint_policy", "sequential_view"]


def _apply_checkpoint(model: nn.Module, policy: Optional[str], ctx: StrategyContext) -> nn.Module:
    names = set(resolve_checkpoint_policy(model, policy or "blocks"))
    return wrap(model, lambda name, module: name in names)


_PLAN_BASELINES = ("sqrt", "all", "none", "min_memory")


def _apply_plan(model: nn.Module, arg: Optional[str], ctx: StrategyContext) -> nn.Module:
    if ctx.fake:
        raise ValueError(
            f"plan:{arg} cannot be estimated with fake tensors: memsave.plan profiles real steps. Plan on a real "
            "model, apply it with memsave.wrap(model, plan), and estimate the wrapped model with strategy='eager'"
        )
    text = (arg or "").strip()
    if text in _PLAN_BASELINES or re.fullmatch(r"uniform:[1-9][0-9]*", text):
        kwargs: Dict[str, Any] = {"solver": text}
    else:
        kwargs = {"budget": text}  # bytes with a unit, "50%" or "0.5" (memsave.measurement.units)
    rng = RngState()
    try:
        # progress=False: compare (or the CLI) shows one bar for the whole comparison, not one per plan inside it.
        p = planning.plan(model, *ctx.inputs, loss_fn=ctx.loss_fn, example_kwargs=ctx.kwargs, progress=False, **kwargs)
    finally:
        rng.restore()
    return wrap(model, p)


class _TorchCheckpointedForward:
    """Instance-level ``forward`` running the module's own forward under ``torch.utils.checkpoint`` (non-reentrant);
    a class, not a closure, so the model stays deep-copyable and picklable."""

    def __init__(self, forward: Callable[..., Any]) -> None:
        self.forward = forward

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return torch_checkpoint.checkpoint(self.forward, *args, use_reentrant=False, **kwargs)


def _apply_torch_checkpoint(model: nn.Module, policy: Optional[str], ctx: StrategyContext) -> nn.Module:
    for name in resolve_checkpoint_policy(model, policy or "blocks"):
        sub = model.get_submodule(name)
        sub.forward = _TorchCheckpointedForward(sub.forward)
    return model


def sequential_view(model: nn.Module) -> nn.Sequential:
    """The model as one ``nn.Sequential`` (itself, or what its ``as_sequential()`` returns) for the sequential
    strategies.

    Raises:
        ValueError: the model is neither an ``nn.Sequential`` nor has an ``as_sequential()`` method.

    Examples:
        >>> sequential_view(nn.Sequential(nn.Linear(2, 2))) is not None
        True
    """
    if isinstance(model, nn.Sequential):
        return model
    view = getattr(model, "as_sequential", None)
    if callable(view):
        seq = view()
        if isinstance(seq, nn.Sequential):
            return seq
    raise ValueError(
        f"{type(model).__name__} is not an nn.Sequential and has no as_sequential() method, so it has no "
        "sequential view to split into segments; use checkpoint:<policy> instead"
    )


class SequentialSegments(nn.Module):
    """Runs ``fn(seq, segments, x, **kwargs)`` (a ``checkpoint_sequential``) on a sequential view of a model; the
    view shares the model's modules, so gradients land on the model's parameters."""

    def __init__(self, seq: nn.Sequential, segments: int, fn: Callable[..., Any], **kwargs: Any) -> None:
        super().__init__()
        self.seq, self.segments, self._fn, self._kwargs = seq, segments, fn, kwargs

    def forward(self, x: Any) -> Any:
        return self._fn(self.seq, self.segments, x, **self._kwargs)


def _segments(arg: Optional[str], kind: str) -> int:
    if arg is None or not re.fullmatch(r"[1-9][0-9]*", arg.strip()):
        raise ValueError(f"{kind}:{arg}: the argument is the number of segments, an int >= 1 (e.g. '{kind}:2')")
    return int(arg)


def _apply_checkpoint_sequential(model: nn.Module, arg: Optional[str], ctx: StrategyContext) -> nn.Module:
    return SequentialSegments(sequential_view(model), _segments(arg, "checkpoint_sequential"), checkpoint_sequential)


def _apply_torch_checkpoint_sequential(model: nn.Module, arg: Optional[str], ctx: StrategyContext) -> nn.Module:
    return SequentialSegments(
        sequential_view(model),
        _segments(arg, "torch_checkpoint_sequential"),
        torch_checkpoint.checkpoint_sequential,
        use_reentrant=False,
    )


def register_strategies() -> None:
    """Register the ``checkpoint``, ``plan``, ``checkpoint_sequential`` and ``torch_checkpoint*`` strategies
    (called once by ``memsave/__init__.py``)."""
    register_strategy(
        "checkpoint",
        "memsave.wrap: recompute the selected modules in backward",
        arg="<policy>",
        apply=_apply_checkpoint,
    )
    register_strategy(
        "plan",
        "memsave.plan at a budget ('4GiB', '50%', 0.5) or with a baseline strategy (sqrt, "
        "uniform:K, all), applied with memsave.wrap",
        arg="<budget>",
        apply=_apply_plan,
    )
    register_strategy(
        "checkpoint_sequential",
        "memsave.checkpoint_sequential over the model's sequential view",
        arg="<segments>",
        apply=_apply_checkpoint_sequential,
    )
    register_strategy(
        "torch_checkpoint",
        "baseline: torch.utils.checkpoint (non-reentrant) around the modules checkpoint:<policy> selects",
        arg="<policy>",
        apply=_apply_torch_checkpoint,
    )
    register_strategy(
        "torch_checkpoint_sequential",
        "baseline: torch.utils.checkpoint.checkpoint_sequential (non-reentrant) over the model's sequential view",
        arg="<segments>",
        apply=_apply_torch_checkpoint_sequential,
    )
