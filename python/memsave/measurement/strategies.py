"""The strategy registry: how :func:`memsave.compare`, :func:`memsave.estimate`, the command line, the demo and the
benchmark harness name and apply a memory-saving strategy.

A *strategy* is named by a string, so that a notebook cell, the command line and a JSON result all speak the same
language:

==========================  ========================================================================================
``eager``                   plain PyTorch (always measured: every ratio is to eager from the same run)
``checkpoint:<policy>``     :func:`memsave.wrap` with ``<policy>``: ``blocks`` (the blocks of the model, see
                            :func:`resolve_checkpoint_policy`), ``all`` (every top-level stage), a module class name
                            (``TransformerBlock``), or comma-separated qualified module names (``h.0,h.1``)
``plan:<budget>``           :func:`memsave.plan` at ``<budget>`` (``4GiB``, ``512MB``, ``50%`` or ``0.5`` of eager's
                            peak) or with a baseline (``plan:sqrt``, ``plan:uniform:4``, ``plan:all``), applied with
                            :func:`memsave.wrap`
``convert``                 :func:`memsave.convert`: bit-mask activations, byte-index pooling (bitwise exact)
``convert_all``             ``memsave.convert(fuse=True, dropout=True)``: fused operators too (not bitwise)
``amp:fp16`` / ``amp:bf16`` ``torch.autocast`` around the forward (lossy: gradients differ from float32 eager)
==========================  ========================================================================================

Names combine with ``+``: ``convert+checkpoint:blocks``, ``amp:bf16+plan:50%``. Model transforms are applied in the
order written; runtime contexts (autocast) are entered around planning and every step. More strategies plug in with
:func:`register_strategy`.

``eager`` is defined here; each part defines its own strategies in a ``register_strategies()`` function
(``checkpoint`` and ``plan`` in :mod:`memsave.recompute.strategies`, ``convert`` and ``convert_all`` in
:mod:`memsave.operators.strategies`, ``amp`` in :mod:`memsave.amp.strategies`) that ``memsave/__init__.py`` calls
once, in that order (the order of :func:`strategy_definitions`). So this module depends on no part, and no part on
:func:`compare`.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import torch
from torch import nn

from .measuring import LossFn

__all__ = [
    "Strategy",
    "StrategyContext",
    "StrategyDef",
    "available_strategies",
    "parse_strategy",
    "register_strategy",
    "strategy_definitions",
    "strategy_from_callable",
    "strip_runner_prefix",
    "unregister_strategy",
]


@dataclass
class StrategyContext:
    """What a strategy's ``apply`` may use besides the model.

    Attributes:
        inputs: the example inputs (positional arguments of the model).
        loss_fn: output -> scalar loss (never None here).
        kwargs: the example keyword inputs of the model (``labels=ids``).
        device: the device the step runs on.
        fake: True when the model is being prepared for :func:`memsave.estimate` (fake tensors: nothing may be
            allocated for real, and nothing can be measured).
    """

    inputs: Tuple[Any, ...]
    loss_fn: LossFn
    device: torch.device
    fake: bool = False
    kwargs: Dict[str, Any] = field(default_factory=dict)


Apply = Callable[[nn.Module, Optional[str], StrategyContext], nn.Module]
Context = Callable[[Optional[str], torch.device], ContextManager[Any]]


@dataclass(frozen=True)
class StrategyDef:
    """One registered strategy kind (``checkpoint``, ``amp``, ...).

    Attributes:
        name: the part before ``:``.
        description: one line for help texts.
        arg: placeholder of the argument after ``:`` (``"<policy>"``), or None when the strategy takes none.
        choices: the only arguments allowed, or None for free-form ones.
        apply: (model copy, argument, context) -> the module to step; may change the copy in place. None: no
            model transform.
        context: (argument, device) -> a context manager entered around every forward. None: no context.
        lossless: whether gradients equal eager's bitwise (CPU, float32).
    """

    name: str
    description: str
    arg: Optional[str] = None
    choices: Optional[Tuple[str, ...]] = None
    apply: Optional[Apply] = None
    context: Optional[Context] = None
    lossless: bool = True

    def usage(self) -> List[str]:
        """The spellings of this strategy for help and error messages."""
        if self.arg is None:
            return [self.name]
        if self.choices:
            return [f"{self.name}:{c}" for c in self.choices]
        return [f"{self.name}:{self.arg}"]


_REGISTRY: Dict[str, StrategyDef] = {}


def register_strategy(
    name: str,
    description: str,
    *,
    apply: Optional[Apply] = None,
    context: Optional[Context] = None,
    arg: Optional[str] = None,
    choices: Optional[Sequence[str]] = None,
    lossless: bool = True,
    replace: bool = False,
) -> StrategyDef:
    """Add a strategy kind that :func:`compare`, :func:`memsave.estimate` and the command line understand.

    Args:
        name: the name before ``:`` (letters, digits, ``_``, ``-``, ``.``).
        description: one line for help texts.
        apply: ``(model, arg, ctx: StrategyContext) -> module`` applied to a fresh copy of the model.
        context: ``(arg, device) -> context manager`` entered around each forward (autocast, say).
        arg: placeholder for the argument after ``:``, e.g. ``"<budget>"``; None when the strategy takes none.
        choices: allowed arguments, if only a few are.
        lossless: gradients are bitwise equal to eager's (CPU, float32).
        replace: allow redefining an existing name.

    Returns:
        the registered :class:`StrategyDef`.

    Raises:
        ValueError: a bad name, an existing name without ``replace=True``, or neither ``apply`` nor ``context``
            for a strategy other than eager.
        TypeError: ``name`` or ``description`` is not a string, or ``apply`` / ``context`` is not callable.

    Examples:
        >>> register_strategy("channels_last", "NHWC memory format",
        ...                   apply=lambda model, arg, ctx: model.to(memory_format=torch.channels_last))
    """
    if not isinstance(name, str):
        raise TypeError(f"register_strategy: name must be a string, got {type(name).__name__}")
    if not re.fullmatch(r"[A-Za-z0-9_.\-]+", name or ""):
        raise ValueError(f"register_strategy: bad name {name!r}; use letters, digits, '_', '-' and '.'")
    if not isinstance(description, str):
        raise TypeError(
            f"register_strategy: description must be a string (one line for help texts), got "
            f"{type(description).__name__}; pass the function as apply=..."
        )
    for what, fn in (("apply", apply), ("context", context)):
        if fn is not None and not callable(fn):
            raise TypeError(f"register_strategy: {what} must be a function or None, got {type(fn).__name__}")
    if apply is None and context is None and name != "eager":
        raise ValueError(
            f"register_strategy: strategy {name!r} needs apply=(model, arg, ctx) -> model or context=(arg, device) "
            f"-> context manager"
        )
    if name in _REGISTRY and not replace:
        raise ValueError(f"register_strategy: {name!r} is already registered; pass replace=True to redefine it")
    if choices is not None and arg is None:
        arg = "<" + "|".join(choices) + ">"
    spec = StrategyDef(
        name,
        description,
        arg,
        tuple(choices) if choices is not None else None,
        apply,
        context,
        lossless,
    )
    _REGISTRY[name] = spec
    return spec


def unregister_strategy(name: str) -> None:
    """Remove a strategy kind added with :func:`register_strategy`.

    Raises:
        KeyError: no strategy kind is called ``name``.

    Examples:
        >>> unregister_strategy("channels_last")
    """
    if name not in _REGISTRY:
        raise KeyError(f"unregister_strategy: no strategy named {name!r}; registered: {', '.join(_REGISTRY)}")
    del _REGISTRY[name]


def strategy_definitions() -> List[StrategyDef]:
    """Every registered strategy kind, in registration order (for help texts and argument splitting).

    Examples:
        >>> [d.name for d in strategy_definitions()][:2]
        ['eager', 'checkpoint']
    """
    return list(_REGISTRY.values())


def available_strategies() -> List[str]:
    """Every strategy spelling, e.g. ``["eager", "checkpoint:<policy>", ..., "amp:fp16", "amp:bf16"]``."""
    return [u for spec in _REGISTRY.values() for u in spec.usage()]


@dataclass(frozen=True)
class Strategy:
    """A parsed strategy: one or more registered kinds with their arguments, joined by ``+``.

    Attributes:
        name: the canonical spelling, e.g. ``"convert+checkpoint:blocks"``.
        parts: ``(StrategyDef, argument or None)`` in the order written.
    """

    name: str
    parts: Tuple[Tuple[StrategyDef, Optional[str]], ...]

    @property
    def lossless(self) -> bool:
        """True when every part is lossless."""
        return all(spec.lossless for spec, _ in self.parts)

    @property
    def is_eager(self) -> bool:
        return all(spec.apply is None and spec.context is None for spec, _ in self.parts)

    @contextlib.contextmanager
    def context(self, device: torch.device) -> Iterator[None]:
        """Enter every part's runtime context (autocast, ...) for ``device``."""
        with contextlib.ExitStack() as stack:
            for spec, arg in self.parts:
                if spec.context is not None:
                    stack.enter_context(spec.context(arg, device))
            yield

    def prepare(self, model: nn.Module, ctx: StrategyContext) -> nn.Module:
        """Apply the model transforms to ``model`` (changed in place) and return the module to step.

        The returned module runs the forward under :meth:`context`; its parameters are ``model``'s.
        """
        runner = model
        with self.context(ctx.device):
            for spec, arg in self.parts:
                if spec.apply is not None:
                    runner = spec.apply(runner, arg, ctx)
                    if not isinstance(runner, nn.Module):
                        raise TypeError(
                            f"strategy {self.name!r}: {spec.name}'s apply returned {type(runner).__name__}, "
                            "not an nn.Module"
                        )
        if any(spec.context is not None for spec, _ in self.parts):
            runner = _ContextRunner(runner, self, ctx.device)
        return runner

    def __str__(self) -> str:
        return self.name


class _ContextRunner(nn.Module):
    """Runs ``model`` under a strategy's runtime contexts; parameter names gain the prefix ``model.``."""

    def __init__(self, model: nn.Module, strategy: Strategy, device: torch.device) -> None:
        super().__init__()
        self.model = model
        self._strategy = strategy
        self._device = device

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with self._strategy.context(self._device):
            return self.model(*args, **kwargs)


def _unknown(name: str, full: str) -> ValueError:
    return ValueError(
        f"unknown strategy {name!r} in {full!r}; valid strategies: {', '.join(available_strategies())} "
        "(combine them with '+', e.g. 'convert+checkpoint:blocks')"
    )


def parse_strategy(spec: Union[str, Strategy]) -> Strategy:
    """Parse a strategy name such as ``"eager"``, ``"checkpoint:blocks"`` or ``"amp:bf16+plan:2GiB"``.

    Args:
        spec: the name (or an already parsed :class:`Strategy`, returned as is).

    Returns:
        the :class:`Strategy`.

    Raises:
        ValueError: an unknown name, a missing or unexpected argument (the message lists the valid names).
        TypeError: ``spec`` is not a string.

    Examples:
        >>> parse_strategy("convert+checkpoint:blocks").parts[1][1]
        'blocks'
    """
    if isinstance(spec, Strategy):
        return spec
    if not isinstance(spec, str):
        raise TypeError(f"a strategy is named by a string such as 'checkpoint:blocks', got {type(spec).__name__}")
    pieces = [p.strip() for p in spec.split("+")]
    if not spec.strip() or any(not p for p in pieces):
        raise _unknown(spec, spec)
    parts: List[Tuple[StrategyDef, Optional[str]]] = []
    for piece in pieces:
        kind, sep, arg = piece.partition(":")
        kind = kind.strip()
        d = _REGISTRY.get(kind)
        if d is None:
            raise _unknown(piece, spec)
        if d.arg is None:
            if sep:
                raise ValueError(f"strategy {kind!r} takes no argument, got {piece!r} in {spec!r}; write {kind!r}")
            parts.append((d, None))
            continue
        arg = arg.strip()
        if not arg:
            raise ValueError(
                f"strategy {kind!r} needs an argument, e.g. {', '.join(d.usage())}; got {piece!r} in {spec!r}"
            )
        if d.choices is not None and arg not in d.choices:
            raise ValueError(f"strategy {kind!r} accepts {', '.join(d.usage())}; got {piece!r} in {spec!r}")
        parts.append((d, arg))
    # "eager" adds nothing to a combination.
    if len(parts) > 1:
        parts = [p for p in parts if p[0].name != "eager"] or parts[:1]
    name = "+".join(d.name if a is None else f"{d.name}:{a}" for d, a in parts)
    return Strategy(name, tuple(parts))


class _CallableApply:
    """``apply`` of a strategy made from the user's ``fn(model) -> model`` (a class: deep-copyable)."""

    def __init__(self, fn: Callable[[nn.Module], nn.Module]) -> None:
        self.fn = fn

    def __call__(self, model: nn.Module, arg: Optional[str], ctx: StrategyContext) -> nn.Module:
        return self.fn(model)


def strategy_from_callable(name: str, fn: Callable[[nn.Module], nn.Module]) -> Strategy:
    """A one-off strategy for :func:`memsave.compare`: ``fn(model copy) -> module to step``, not registered.

    Its gradients are compared with eager's, but it is not declared lossless (no warning when they differ).

    Args:
        name: the row's name (not a registered strategy's).
        fn: takes a fresh copy of the model, returns the module to step (the copy itself, changed, or a wrapper).

    Raises:
        ValueError: ``name`` is empty or names a registered strategy.
        TypeError: ``fn`` is not callable.

    Examples:
        >>> s = strategy_from_callable("hf_checkpointing", lambda m: (m.activation_checkpointing_enable(), m)[1])
    """
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"compare: a strategy name must be a non-empty string, got {name!r}")
    if name.partition(":")[0] in _REGISTRY:
        raise ValueError(
            f"compare: {name!r} is a registered strategy's name; give your function another name, e.g. 'my_{name}'"
        )
    if not callable(fn):
        raise TypeError(f"compare: strategy {name!r} must be a callable model -> model, got {type(fn).__name__}")
    spec = StrategyDef(name, "user function", apply=_CallableApply(fn), lossless=False)
    return Strategy(name, ((spec, None),))


def strip_runner_prefix(by_module: Dict[str, int], runner: nn.Module) -> Dict[str, int]:
    """Per-module bytes of a prepared runner, named as in the user's model (a context runner adds ``model.``)."""
    if not isinstance(runner, _ContextRunner):
        return by_module
    out: Dict[str, int] = {}
    for name, b in by_module.items():
        if name == "":
            continue  # the runner itself creates nothing
        new = "" if name == "model" else name[len("model.") :] if name.startswith("model.") else name
        out[new] = out.get(new, 0) + b
    return dict(sorted(out.items(), key=lambda kv: (-kv[1], kv[0])))


def register_strategies() -> None:
    """Register the ``eager`` strategy, the baseline every table compares with (called once, first, by
    ``memsave/__init__.py``)."""
    register_strategy("eager", "plain PyTorch: every activation kept for backward")
