"""The recompute part's strategies for :func:`memsave.compare`, :func:`memsave.estimate` and the command line.

* ``checkpoint:<policy>``: :func:`memsave.wrap` on the modules :func:`resolve_checkpoint_policy` selects.
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
from typing import Any, Callable, Dict, List, Optional

from torch import nn
from torch.utils import checkpoint as torch_checkpoint

from ..common.rng import RngState
from ..measurement.strategies import StrategyContext, register_strategy
from .blocks import find_blocks
from .planning import plan
from .region import checkpoint_sequential
from .wrapping import wrap

__all__ = ["SequentialSegments", "resolve_checkpoint_policy", "sequential_view"]


def _plain_container(m: nn.Module) -> bool:
    return isinstance(m, nn.ModuleList) or (isinstance(m, nn.Sequential) and type(m).forward is nn.Sequential.forward)


def resolve_checkpoint_policy(model: nn.Module, policy: str) -> List[str]:
    """The qualified names of the modules ``checkpoint:<policy>`` wraps in ``model``.

    * ``blocks``: the model's repeated blocks, :func:`memsave.find_blocks` (what ``memsave.wrap(model)`` with no
      policy checkpoints): ``model.checkpoint_blocks()`` when the model defines it (the benchmark models do), a
      Hugging Face model's ``_no_split_modules`` layers, else the largest family of same-class blocks held in a
      ``ModuleList``/``Sequential``/``ModuleDict`` (transformer layers, ResNet bottlenecks, ViT encoder blocks).
    * ``all``: every top-level stage: each direct child of ``model``, with plain ``nn.Sequential``/``nn.ModuleList``
      children replaced by their own children.
    * otherwise a comma-separated list whose items are qualified module names (``h.0``) or class names
      (``TransformerBlock``, or with the module path, ``mypkg.models.TransformerBlock``); a class name selects
      every module of that class not nested in another selected one.

    Args:
        model: the model.
        policy: as above.

    Returns:
        qualified names, outermost first; none nested in another.

    Raises:
        ValueError: the policy selects nothing, or ``blocks`` finds no repeated blocks (the message lists the
            model's module classes).

    Example:
        >>> resolve_checkpoint_policy(gpt, "blocks")[:2]
        ['h.0', 'h.1']
    """
    modules = dict(model.named_modules())
    names: List[str]
    if policy == "blocks":
        names = find_blocks(model)
        if not names:
            classes = sorted({type(m).__name__ for m in modules.values()})
            raise ValueError(
                f"checkpoint:blocks: found no repeated blocks in {type(model).__name__} (memsave.find_blocks looks for "
                "a Hugging Face _no_split_modules class, else a family of same-class modules with children held in a "
                "ModuleList/Sequential/ModuleDict); name the modules to checkpoint instead: a module class name (this "
                f"model has {', '.join(classes[:25])}{', ...' if len(classes) > 25 else ''}), comma-separated "
                "qualified module names, or 'all'"
            )
    elif policy == "all":
        names = []
        for n, c in model.named_children():
            if _plain_container(c):
                names += [f"{n}.{cn}" for cn, _ in c.named_children()]
            else:
                names.append(n)
    else:
        names, unmatched = [], []
        for item in (part.strip() for part in policy.split(",")):
            if not item:
                continue
            if item in modules and item != "":
                names.append(item)
                continue
            matched = [
                n
                for n, m in modules.items()
                if item in (type(m).__name__, f"{type(m).__module__}.{type(m).__qualname__}")
            ]
            if not matched:
                unmatched.append(item)
            names += matched
        if unmatched:
            classes = sorted({type(m).__name__ for m in modules.values()})
            raise ValueError(
                f"checkpoint:{policy}: {', '.join(map(repr, unmatched))} is neither a submodule name nor a module "
                f"class of {type(model).__name__}; use 'blocks', 'all', a module class name (this model has "
                f"{', '.join(classes[:25])}{', ...' if len(classes) > 25 else ''}) or comma-separated qualified "
                "module names"
            )
    # Keep the outermost of nested selections (a nested region keeps the inner arguments alive).
    names = list(dict.fromkeys(names))
    outer = [n for n in names if not any(n != o and (o == "" or n.startswith(o + ".")) for o in names)]
    if not outer:
        raise ValueError(f"checkpoint:{policy} selects no module of {type(model).__name__} (it has no children)")
    return outer


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
        kwargs: Dict[str, Any] = {"strategy": text}
    else:
        kwargs = {"budget": text}  # bytes with a unit, "50%" or "0.5" (memsave.measurement.units)
    rng = RngState()
    try:
        p = plan(model, *ctx.inputs, loss_fn=ctx.loss_fn, **kwargs)
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

    Example:
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


register_strategy(
    "checkpoint", "memsave.wrap: recompute the selected modules in backward", arg="<policy>", apply=_apply_checkpoint
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
