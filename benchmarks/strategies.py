"""The strategy registry of the benchmark harness.

A strategy turns a fresh copy of a benchmark model into the module a training step calls. The harness
(``benchmarks/run.py``) measures every selected strategy the same way and compares it with "eager" from the same
run, so adding a row is adding a registration, never editing the loop::

    from benchmarks.strategies import register

    @register("plan:50%", "memsave.plan at half of eager's peak", requires=("memsave.recompute:plan",))
    def _plan_half(model, inputs):
        from memsave.recompute.planning import plan
        from memsave.recompute.wrapping import wrap
        return wrap(model, plan(model, *inputs, budget=0.5))

``prepare(model, inputs)`` receives a deep copy of the seeded model (in training mode) and the inputs; it may change
the model in place and returns the module to call as ``runner(*inputs)``. The harness reads the gradients from the
*copy's* parameters, so a returned wrapper must share them (as ``nn.Sequential(*model.children())`` does).
Strategies that another module registers must be imported before the harness selects them (run.py imports the
modules named by ``--plugins``, e.g. ``--plugins benchmarks.planner_rows``).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from torch import nn
from torch.utils import checkpoint as torch_checkpoint

__all__ = ["Strategy", "STRATEGIES", "DEFAULT_STRATEGIES", "register", "get"]

Prepare = Callable[[nn.Module, Tuple[Any, ...]], nn.Module]


@dataclass(frozen=True)
class Strategy:
    """One row kind of the benchmark table.

    Attributes:
        name: short unique name, shown in the table.
        description: one line saying what it does.
        prepare: (fresh model copy, inputs) -> module to step.
        lossless: gradients must equal eager's bitwise on CPU float32 (the tests hold the lossless rows to 0).
        requires: ``"module:attribute"`` entries the strategy needs (``"memsave.recompute:wrap"``); one that does not
            import skips the row with the reason.
    """

    name: str
    description: str
    prepare: Prepare
    lossless: bool = True
    requires: Tuple[str, ...] = ()

    def unavailable_reason(self) -> Optional[str]:
        """None when the strategy can run here, otherwise why not."""
        for req in self.requires:
            mod_name, _, attr = req.partition(":")
            try:
                mod = importlib.import_module(mod_name)
            except ImportError as e:
                return f"cannot import {mod_name}: {e}"
            if attr and not hasattr(mod, attr):
                return f"{mod_name}.{attr} is not available in this build"
        return None


STRATEGIES: Dict[str, Strategy] = {}


def register(name: str, description: str, *, lossless: bool = True, requires: Sequence[str] = ()) -> Callable[[Prepare], Prepare]:
    """Decorator adding ``prepare`` to :data:`STRATEGIES` under ``name``.

    Args:
        name: unique row name. description: what it does. lossless: see :class:`Strategy`.
        requires: ``"module:attribute"`` entries, e.g. ``("memsave.recompute:wrap",)``.

    Returns:
        the decorator; it returns ``prepare`` unchanged.

    Raises:
        ValueError: ``name`` is already registered.
    """

    def deco(prepare: Prepare) -> Prepare:
        if name in STRATEGIES:
            raise ValueError(f"benchmark strategy {name!r} is already registered; pick another name")
        STRATEGIES[name] = Strategy(name, description, prepare, lossless, tuple(requires))
        return prepare

    return deco


def get(names: Sequence[str]) -> List[Strategy]:
    """The strategies called ``names``, in that order; "eager" is put first when missing (ratios need it).

    Raises:
        ValueError: an unknown name (the message lists the registered ones).
    """
    unknown = [n for n in names if n not in STRATEGIES]
    if unknown:
        raise ValueError(f"unknown strategies {unknown}; registered: {', '.join(STRATEGIES)}")
    names = list(dict.fromkeys(names))
    if "eager" not in names:
        names.insert(0, "eager")
    return [STRATEGIES[n] for n in names]


# ---------------------------------------------------------------------------------------------------------- helpers
class _TorchCheckpointed:
    """Replacement ``forward`` that runs the module's own forward under non-reentrant torch.utils.checkpoint."""

    def __init__(self, forward: Callable[..., Any]) -> None:
        self.forward = forward

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return torch_checkpoint.checkpoint(self.forward, *args, use_reentrant=False, **kwargs)


def torch_checkpoint_blocks(model: nn.Module, names: Sequence[str]) -> nn.Module:
    """Make each named submodule run under ``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)``.

    The instance's ``forward`` is replaced, so parameter names and the state_dict do not change.
    """
    for name in names:
        sub = model.get_submodule(name)
        sub.forward = _TorchCheckpointed(sub.forward)
    return model


class SequentialRunner(nn.Module):
    """Calls ``fn(seq, segments, x)`` (a ``checkpoint_sequential``) on the model's sequential view."""

    def __init__(self, seq: nn.Sequential, segments: int, fn: Callable[..., Any], **kwargs: Any) -> None:
        super().__init__()
        self.seq, self.segments, self._fn, self._kwargs = seq, segments, fn, kwargs

    def forward(self, x: Any) -> Any:
        return self._fn(self.seq, self.segments, x, **self._kwargs)


def _blocks(model: nn.Module) -> List[str]:
    return list(model.checkpoint_blocks())  # type: ignore[operator]


# ------------------------------------------------------------------------------------------------ issue-2 strategies
@register("eager", "plain PyTorch, nothing recomputed")
def _eager(model: nn.Module, inputs: Tuple[Any, ...]) -> nn.Module:
    return model


@register("torch.checkpoint/block", "torch.utils.checkpoint (non-reentrant) around every block")
def _torch_per_block(model: nn.Module, inputs: Tuple[Any, ...]) -> nn.Module:
    return torch_checkpoint_blocks(model, _blocks(model))


@register("torch.checkpoint_sequential/2", "torch.utils.checkpoint.checkpoint_sequential, 2 segments (non-reentrant)")
def _torch_sequential(model: nn.Module, inputs: Tuple[Any, ...]) -> nn.Module:
    seq = model.as_sequential()  # type: ignore[operator]
    return SequentialRunner(seq, 2, torch_checkpoint.checkpoint_sequential, use_reentrant=False)


# memsave is imported from its submodules: that works whether or not the package re-exports the names.
@register("memsave.checkpoint/block", "memsave.wrap(model, <every block>)", requires=("memsave.recompute:wrap",))
def _memsave_per_block(model: nn.Module, inputs: Tuple[Any, ...]) -> nn.Module:
    from memsave.recompute.wrapping import wrap

    names = set(_blocks(model))
    return wrap(model, lambda name, module: name in names)


@register("memsave.checkpoint_sequential/2", "memsave.checkpoint_sequential, 2 segments",
          requires=("memsave.recompute:checkpoint_sequential",))
def _memsave_sequential(model: nn.Module, inputs: Tuple[Any, ...]) -> nn.Module:
    from memsave.recompute.region import checkpoint_sequential

    return SequentialRunner(model.as_sequential(), 2, checkpoint_sequential)  # type: ignore[operator]


#: The rows of issue 2, in table order.
DEFAULT_STRATEGIES: Tuple[str, ...] = (
    "eager",
    "torch.checkpoint/block",
    "torch.checkpoint_sequential/2",
    "memsave.checkpoint/block",
    "memsave.checkpoint_sequential/2",
)
