"""Eager vs. every memory-saving strategy, in one table: :func:`compare`, :class:`Comparison`, the strategy registry.

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

How the numbers are taken is :func:`memsave.measure`'s business (DESIGN.md, "Measuring memory"); :func:`compare`
runs it on a fresh deep copy of the model per strategy and adds the gradient column.
"""

from __future__ import annotations

import contextlib
import copy
import html
import importlib
import json
import math
import os
import re
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, ContextManager, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import torch
from torch import nn

from ._state import RngState
from .measure import LossFn, Measurement, _resolve_device, default_loss, format_bytes, measure

__all__ = [
    "Comparison",
    "ComparisonRow",
    "Strategy",
    "StrategyDef",
    "StrategyUnavailableError",
    "compare",
    "parse_strategy",
    "parse_bytes",
    "register_strategy",
    "available_strategies",
    "resolve_checkpoint_policy",
]


class StrategyUnavailableError(ImportError):
    """A strategy was named correctly, but the memsave module it needs is not available in this build."""


# ------------------------------------------------------------------------------------------------------ byte strings
_UNITS = {
    "": 1, "b": 1,
    "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9, "t": 10**12, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40,
}
_BYTES_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:e([+-]?[0-9]+))?\s*([a-zA-Z]*)\s*$")


def parse_bytes(value: Union[int, float, str], what: str = "memory") -> int:
    """Parse a memory size: an int of bytes, or a string such as ``"24GiB"``, ``"512MB"``, ``"1.5 GiB"``, ``"4096"``.

    Units are case-insensitive; ``KiB/MiB/GiB/TiB`` are powers of 1024, ``KB/MB/GB/TB`` (and ``K/M/G/T``) powers
    of 1000, as in SI. A 24 GB GPU card usually has 24 GiB: write ``"24GiB"``.

    Args:
        value: the size.
        what: what the size is, for the error message.

    Returns:
        the size in bytes (rounded down to an int).

    Raises:
        ValueError: the string does not parse, or the size is negative.
        TypeError: ``value`` is neither an int, a float nor a string.

    Example:
        >>> parse_bytes("1.5KiB")
        1536
    """
    if isinstance(value, bool):
        raise TypeError(f"{what}: expected a number of bytes or a string like '24GiB', got {value!r}")
    if isinstance(value, (int, float)):
        if value < 0 or (isinstance(value, float) and not math.isfinite(value)):
            raise ValueError(f"{what}: must be a non-negative number of bytes, got {value!r}")
        return int(value)
    if not isinstance(value, str):
        raise TypeError(f"{what}: expected a number of bytes or a string like '24GiB', got {type(value).__name__}")
    m = _BYTES_RE.match(value)
    unit = m.group(3).lower() if m else None
    if m is None or unit not in _UNITS:
        raise ValueError(
            f"{what}: cannot parse {value!r} as a memory size; write a number with an optional unit, e.g. "
            f"'24GiB', '512MiB', '1.5GB' or '4096' (units: B, KB/MB/GB/TB = 1000^n, KiB/MiB/GiB/TiB = 1024^n)"
        )
    number = float(m.group(1)) * (10 ** int(m.group(2)) if m.group(2) else 1)
    return int(number * _UNITS[unit])


# ------------------------------------------------------------------------------------------------ strategy registry
@dataclass
class StrategyContext:
    """What a strategy's ``apply`` may use besides the model.

    Attributes:
        inputs: the example inputs (positional arguments of the model).
        loss_fn: output -> scalar loss (never None here).
        device: the device the step runs on.
        fake: True when the model is being prepared for :func:`memsave.estimate` (fake tensors: nothing may be
            allocated for real, and nothing can be measured).
    """

    inputs: Tuple[Any, ...]
    loss_fn: LossFn
    device: torch.device
    fake: bool = False


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
        requires: ``"module:attribute"`` entries that must import, checked before anything runs.
    """

    name: str
    description: str
    arg: Optional[str] = None
    choices: Optional[Tuple[str, ...]] = None
    apply: Optional[Apply] = None
    context: Optional[Context] = None
    lossless: bool = True
    requires: Tuple[str, ...] = ()

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
    requires: Sequence[str] = (),
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
        requires: ``"module:attribute"`` entries (e.g. ``"memsave.convert:convert"``) that must import first.
        replace: allow redefining an existing name.

    Returns:
        the registered :class:`StrategyDef`.

    Raises:
        ValueError: a bad name, an existing name without ``replace=True``, or neither ``apply`` nor ``context``
            for a strategy other than eager.

    Example:
        >>> register_strategy("channels_last", "NHWC memory format",
        ...                   apply=lambda model, arg, ctx: model.to(memory_format=torch.channels_last))
    """
    if not re.fullmatch(r"[A-Za-z0-9_.\-]+", name or ""):
        raise ValueError(f"register_strategy: bad name {name!r}; use letters, digits, '_', '-' and '.'")
    if name in _REGISTRY and not replace:
        raise ValueError(f"register_strategy: {name!r} is already registered; pass replace=True to redefine it")
    if choices is not None and arg is None:
        arg = "<" + "|".join(choices) + ">"
    spec = StrategyDef(name, description, arg, tuple(choices) if choices is not None else None, apply, context,
                       lossless, tuple(requires))
    _REGISTRY[name] = spec
    return spec


def available_strategies() -> List[str]:
    """Every strategy spelling, e.g. ``["eager", "checkpoint:<policy>", ..., "amp:fp16", "amp:bf16"]``."""
    return [u for spec in _REGISTRY.values() for u in spec.usage()]


def _check_requires(spec: StrategyDef, full_name: str) -> None:
    for req in spec.requires:
        mod_name, _, attr = req.partition(":")
        path = "python/" + mod_name.replace(".", "/") + ".py"
        try:
            mod = importlib.import_module(mod_name)
        except ImportError as e:
            raise StrategyUnavailableError(
                f"strategy {full_name!r} needs {mod_name} ({path}), which cannot be imported in this build: {e}. "
                f"Choose another strategy, or update memsave to a version that has it."
            ) from e
        if attr and not hasattr(mod, attr):
            raise StrategyUnavailableError(
                f"strategy {full_name!r} needs {mod_name}.{attr}, which this build of memsave does not have "
                f"({path}). Choose another strategy, or update memsave to a version that has it."
            )


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

    def check_available(self) -> None:
        """Raise :class:`StrategyUnavailableError` naming the missing module if a part cannot run in this build."""
        for spec, _ in self.parts:
            _check_requires(spec, self.name)

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
        self.check_available()
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
        the :class:`Strategy`; availability of the modules it needs is checked when it runs
        (:meth:`Strategy.check_available`).

    Raises:
        ValueError: an unknown name, a missing or unexpected argument (the message lists the valid names).
        TypeError: ``spec`` is not a string.

    Example:
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
            raise ValueError(
                f"strategy {kind!r} accepts {', '.join(d.usage())}; got {piece!r} in {spec!r}"
            )
        parts.append((d, arg))
    # "eager" adds nothing to a combination.
    if len(parts) > 1:
        parts = [p for p in parts if p[0].name != "eager"] or parts[:1]
    name = "+".join(d.name if a is None else f"{d.name}:{a}" for d, a in parts)
    return Strategy(name, tuple(parts))


# ----------------------------------------------------------------------------------------------- built-in strategies
_CONTAINERS = (nn.Sequential, nn.ModuleList)


def _plain_container(m: nn.Module) -> bool:
    return isinstance(m, nn.ModuleList) or (isinstance(m, nn.Sequential) and type(m).forward is nn.Sequential.forward)


def resolve_checkpoint_policy(model: nn.Module, policy: str) -> List[str]:
    """The qualified names of the modules ``checkpoint:<policy>`` wraps in ``model``.

    * ``blocks``: the names ``model.checkpoint_blocks()`` returns when the model defines that method (the
      benchmark models do); otherwise the children of ``model`` if it is an ``nn.Sequential``/``nn.ModuleList``;
      otherwise the children of its direct children that are such containers (a transformer's layer list, the
      stages of a ResNet); otherwise its direct children.
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
        ValueError: the policy selects nothing (the message lists the model's module classes).

    Example:
        >>> resolve_checkpoint_policy(gpt, "blocks")[:2]
        ['h.0', 'h.1']
    """
    modules = dict(model.named_modules())
    names: List[str]
    if policy == "blocks":
        if callable(getattr(model, "checkpoint_blocks", None)):
            names = list(model.checkpoint_blocks())  # type: ignore[operator]
        elif isinstance(model, _CONTAINERS):
            names = [n for n, _ in model.named_children()]
        else:
            containers = [(n, c) for n, c in model.named_children() if _plain_container(c)]
            if containers:
                names = [f"{n}.{cn}" for n, c in containers for cn, _ in c.named_children()]
            else:
                names = [n for n, _ in model.named_children()]
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
            matched = [n for n, m in modules.items()
                       if item in (type(m).__name__, f"{type(m).__module__}.{type(m).__qualname__}")]
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
    unknown = [n for n in names if n not in modules]
    if unknown:
        raise ValueError(f"checkpoint:{policy}: {type(model).__name__} has no submodule named {', '.join(unknown)} "
                         "(from its checkpoint_blocks())")
    outer = [n for n in names if not any(n != o and (o == "" or n.startswith(o + ".")) for o in names)]
    if not outer:
        raise ValueError(f"checkpoint:{policy} selects no module of {type(model).__name__} (it has no children)")
    return outer


def _apply_checkpoint(model: nn.Module, policy: Optional[str], ctx: StrategyContext) -> nn.Module:
    wrap = importlib.import_module("memsave.wrap").wrap
    names = set(resolve_checkpoint_policy(model, policy or "blocks"))
    return wrap(model, lambda name, module: name in names)


def _budget(arg: str) -> Union[int, float]:
    text = arg.strip()
    if text.endswith("%"):
        try:
            frac = float(text[:-1]) / 100.0
        except ValueError:
            frac = -1.0
        if not 0.0 < frac:
            raise ValueError(f"plan:{arg}: a percentage budget must be a positive number, e.g. 'plan:50%'")
        return frac
    try:
        f = float(text)
    except ValueError:
        return parse_bytes(text, what=f"plan:{arg} budget")
    if 0.0 < f <= 1.0 and not text.isdigit():
        return f  # a fraction of eager's peak
    return parse_bytes(text, what=f"plan:{arg} budget")


_PLAN_STRATEGIES = ("sqrt", "all", "none", "min_memory")


def _apply_plan(model: nn.Module, arg: Optional[str], ctx: StrategyContext) -> nn.Module:
    if ctx.fake:
        raise ValueError(
            f"plan:{arg} cannot be estimated with fake tensors: memsave.plan profiles real steps. Plan on a real "
            "model, apply it with memsave.wrap(model, plan), and estimate the wrapped model with strategy='eager'"
        )
    memsave_plan = importlib.import_module("memsave.planning").plan
    wrap = importlib.import_module("memsave.wrap").wrap
    text = (arg or "").strip()
    if text in _PLAN_STRATEGIES or re.fullmatch(r"uniform:[1-9][0-9]*", text):
        kwargs: Dict[str, Any] = {"strategy": text}
    else:
        kwargs = {"budget": _budget(text)}
    rng = RngState()
    try:
        p = memsave_plan(model, *ctx.inputs, loss_fn=ctx.loss_fn, **kwargs)
    finally:
        rng.restore()
    return wrap(model, p)


def _apply_convert(model: nn.Module, arg: Optional[str], ctx: StrategyContext) -> nn.Module:
    convert = importlib.import_module("memsave.convert").convert
    out = convert(model)
    return model if out is None else out


def _apply_convert_all(model: nn.Module, arg: Optional[str], ctx: StrategyContext) -> nn.Module:
    convert = importlib.import_module("memsave.convert").convert
    out = convert(model, fuse=True, dropout=True)
    return model if out is None else out


_AMP_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def _amp_context(arg: Optional[str], device: torch.device) -> ContextManager[Any]:
    return torch.autocast(device_type=device.type if device.type != "meta" else "cpu", dtype=_AMP_DTYPES[arg or "bf16"])


register_strategy("eager", "plain PyTorch: every activation kept for backward")
register_strategy("checkpoint", "memsave.wrap: recompute the selected modules in backward", arg="<policy>",
                  apply=_apply_checkpoint, requires=("memsave.wrap:wrap",))
register_strategy("plan", "memsave.plan at a budget ('4GiB', '50%', 0.5) or with a baseline strategy (sqrt, "
                  "uniform:K, all), applied with memsave.wrap", arg="<budget>",
                  apply=_apply_plan, requires=("memsave.planning:plan", "memsave.wrap:wrap"))
register_strategy("convert", "memsave.convert: bit-mask ReLU/LeakyReLU and byte-index MaxPool2d (bitwise exact)",
                  apply=_apply_convert, requires=("memsave.convert:convert",))
register_strategy("amp", "torch.autocast around the forward (lossy)", choices=("fp16", "bf16"),
                  context=_amp_context, lossless=False)
register_strategy("convert_all", "memsave.convert(fuse=True, dropout=True): also fused BN/LayerNorm/MLP operators "
                  "(equal up to float rounding) and memsave Dropout (other random bits than torch's)",
                  apply=_apply_convert_all, lossless=False, requires=("memsave.convert:convert",))


# ------------------------------------------------------------------------------------------------------- comparison
@dataclass
class ComparisonRow:
    """One strategy's numbers in a :class:`Comparison`.

    Attributes:
        strategy: canonical strategy name.
        peak_bytes: peak memory of a training step above what was allocated before it (see :func:`memsave.measure`).
        activation_bytes: bytes created in forward and alive at its end.
        step_seconds: median step time.
        time_ratio: ``step_seconds`` / eager's.
        max_grad_diff: max |grad - eager grad| over all parameters (0.0 means bitwise equal).
        lossless: the strategy promises bitwise-equal gradients.
        reserved_bytes: CUDA only: ``max_memory_reserved()`` during the measured step.
        by_module: activation bytes per module at the end of forward, largest first.
        snapshot: path of the CUDA memory snapshot written for this strategy, if any.
    """

    strategy: str
    peak_bytes: int
    activation_bytes: int
    step_seconds: float
    time_ratio: float
    max_grad_diff: float
    lossless: bool
    reserved_bytes: Optional[int] = None
    by_module: Dict[str, int] = field(default_factory=dict)
    snapshot: Optional[str] = None


_COLUMNS = ("strategy", "peak", "vs eager", "activations", "step", "time x", "max |dgrad|", "reserved")


class Comparison:
    """The result of :func:`compare`: one :class:`ComparisonRow` per strategy, eager first.

    Shows itself as an HTML table in notebooks, as an aligned text table with ``str()``; ``plot()`` draws peak
    memory and time ratio per strategy; ``to_json()``/``from_json()`` round-trip; ``to_dataframe()`` needs pandas.

    Attributes:
        rows: the rows, eager first.
        device: where the steps ran.
        steps: timed steps per median.
        info: free-form facts (torch version, CUDA device name, model class, input shapes).
    """

    def __init__(self, rows: Sequence[ComparisonRow], device: str, steps: int,
                 info: Optional[Dict[str, Any]] = None) -> None:
        self.rows: List[ComparisonRow] = list(rows)
        self.device = device
        self.steps = steps
        self.info: Dict[str, Any] = dict(info or {})

    # --------------------------------------------------------------------------- access
    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[ComparisonRow]:
        return iter(self.rows)

    def __getitem__(self, key: Union[int, str]) -> ComparisonRow:
        if isinstance(key, int):
            return self.rows[key]
        for r in self.rows:
            if r.strategy == key:
                return r
        try:  # another spelling of a row's strategy ("eager+amp:bf16", spaces)
            name = parse_strategy(key).name
        except ValueError:
            name = None
        for r in self.rows:
            if r.strategy == name:
                return r
        raise KeyError(f"no row for strategy {key!r}; rows: {', '.join(r.strategy for r in self.rows)}")

    @property
    def eager(self) -> ComparisonRow:
        """The eager row."""
        return self["eager"]

    @property
    def has_reserved(self) -> bool:
        return any(r.reserved_bytes is not None for r in self.rows)

    # --------------------------------------------------------------------------- text
    def _cells(self, r: ComparisonRow) -> List[str]:
        eager_peak = self.eager.peak_bytes
        rel = "-" if r.strategy == "eager" or not eager_peak else f"{100.0 * (r.peak_bytes / eager_peak - 1):+.1f}%"
        grad = "0" if r.max_grad_diff == 0 else f"{r.max_grad_diff:.2e}"
        cells = [r.strategy, format_bytes(r.peak_bytes), rel, format_bytes(r.activation_bytes),
                 f"{r.step_seconds * 1e3:.1f} ms", f"{r.time_ratio:.2f}", grad]
        if self.has_reserved:
            cells.append(format_bytes(r.reserved_bytes))
        return cells

    def _header(self) -> List[str]:
        return list(_COLUMNS if self.has_reserved else _COLUMNS[:-1])

    def __str__(self) -> str:
        header = self._header()
        body = [self._cells(r) for r in self.rows]
        widths = [max(len(row[i]) for row in [header] + body) for i in range(len(header))]

        def line(cells: List[str]) -> str:
            return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

        title = f"memsave.compare on {self.device}: median of {self.steps} steps"
        return "\n".join([title, line(header), "  ".join("-" * w for w in widths)] + [line(b) for b in body])

    def __repr__(self) -> str:
        return f"<Comparison on {self.device}: {', '.join(r.strategy for r in self.rows)}>"

    def _repr_html_(self) -> str:
        header = "".join(f"<th>{html.escape(h)}</th>" for h in self._header())
        body = ""
        for r in self.rows:
            cells = self._cells(r)
            body += "<tr>" + f"<td style='text-align:left'><code>{html.escape(cells[0])}</code></td>" + "".join(
                f"<td>{html.escape(c)}</td>" for c in cells[1:]) + "</tr>"
        caption = html.escape(f"memsave.compare on {self.device}: median of {self.steps} steps")
        return f"<table><caption>{caption}</caption><tr>{header}</tr>{body}</table>"

    def breakdown(self, strategy: str = "eager", top: int = 10) -> str:
        """Text table of a row's activation bytes per module at the end of forward (the largest ``top``).

        Example:
            >>> print(result.breakdown("eager", top=5))
        """
        row = self[strategy]
        items = list(row.by_module.items())
        shown = items[:top]
        width = max([len(n or "(root)") for n, _ in shown] + [6])
        lines = [f"activations by module, {row.strategy} (total {format_bytes(row.activation_bytes)}):"]
        lines += [f"  {(n or '(root)'):<{width}}  {format_bytes(b):>11}" for n, b in shown]
        if len(items) > len(shown):
            rest = sum(b for _, b in items[top:])
            lines.append(f"  {'... ' + str(len(items) - top) + ' more':<{width}}  {format_bytes(rest):>11}")
        return "\n".join(lines)

    # --------------------------------------------------------------------------- data
    def to_dict(self) -> Dict[str, Any]:
        """Plain-data form: ``{"device", "steps", "info", "rows": [...]}``."""
        return {"device": self.device, "steps": self.steps, "info": self.info,
                "rows": [asdict(r) for r in self.rows]}

    def to_json(self, path: Optional[str] = None, indent: int = 2) -> str:
        """The comparison as JSON (written to ``path`` too when given).

        Example:
            >>> Comparison.from_json(result.to_json()).rows == result.rows
            True
        """
        text = json.dumps(self.to_dict(), indent=indent)
        if path is not None:
            with open(path, "w") as f:
                f.write(text + "\n")
        return text

    @classmethod
    def from_json(cls, text: str) -> "Comparison":
        """Rebuild a :class:`Comparison` from :meth:`to_json` output."""
        data = json.loads(text)
        rows = [ComparisonRow(**r) for r in data["rows"]]
        return cls(rows, data["device"], data["steps"], data.get("info"))

    def to_dataframe(self) -> Any:
        """A pandas DataFrame, one row per strategy (indexed by name); needs pandas.

        Raises:
            ImportError: pandas is not installed.
        """
        try:
            import pandas as pd
        except ImportError as e:
            raise ImportError("Comparison.to_dataframe needs pandas: pip install pandas") from e
        records = []
        for r in self.rows:
            d = asdict(r)
            d.pop("by_module")
            d["peak_ratio"] = r.peak_bytes / self.eager.peak_bytes if self.eager.peak_bytes else float("nan")
            records.append(d)
        return pd.DataFrame.from_records(records).set_index("strategy")

    def plot(self, figsize: Tuple[float, float] = (9.0, 3.6)) -> Any:
        """One matplotlib figure: peak memory (MiB) and step-time ratio to eager, one bar per strategy.

        Returns:
            the ``matplotlib.figure.Figure`` (notebooks display it; save it with ``fig.savefig("x.png")``).

        Raises:
            ImportError: matplotlib is not installed.
        """
        try:
            from matplotlib.figure import Figure
        except ImportError as e:
            raise ImportError("Comparison.plot needs matplotlib: pip install matplotlib") from e
        names = [r.strategy for r in self.rows]
        fig = Figure(figsize=figsize, layout="constrained")
        ax_mem, ax_time = fig.subplots(1, 2)
        ys = list(range(len(names)))[::-1]
        mib = [r.peak_bytes / 2**20 for r in self.rows]
        colors = ["#7f7f7f" if n == "eager" else ("#1f77b4" if r.lossless else "#ff7f0e")
                  for n, r in zip(names, self.rows)]
        ax_mem.barh(ys, mib, color=colors)
        ax_mem.set_yticks(ys, names)
        ax_mem.set_xlabel("peak memory of a step (MiB)")
        ax_mem.axvline(mib[0], color="#7f7f7f", lw=0.8, ls="--")
        for y, v in zip(ys, mib):
            ax_mem.text(v, y, f" {v:.0f}", va="center", fontsize=8)
        ratios = [r.time_ratio for r in self.rows]
        ax_time.barh(ys, ratios, color=colors)
        ax_time.set_yticks(ys, [""] * len(ys))
        ax_time.set_xlabel("step time / eager")
        ax_time.axvline(1.0, color="#7f7f7f", lw=0.8, ls="--")
        for y, v in zip(ys, ratios):
            ax_time.text(v, y, f" {v:.2f}x", va="center", fontsize=8)
        ax_mem.set_xlim(0, max(mib) * 1.2 if max(mib) > 0 else 1)
        ax_time.set_xlim(0, max(ratios) * 1.25 if ratios and max(ratios) > 0 else 1)
        fig.suptitle(f"memsave.compare on {self.device} (orange: lossy)", fontsize=10)
        return fig


# ----------------------------------------------------------------------------------------------------------- compare
def _param_grads(model: nn.Module) -> Dict[str, Optional[torch.Tensor]]:
    """Gradients by state_dict key (stable under wrap and convert), detached."""
    out: Dict[str, Optional[torch.Tensor]] = {}
    for key, v in model.state_dict(keep_vars=True).items():
        if isinstance(v, nn.Parameter) and v.requires_grad:
            out[key] = None if v.grad is None else v.grad.detach().clone()
    return out


def _max_grad_diff(ref: Dict[str, Optional[torch.Tensor]], got: Dict[str, Optional[torch.Tensor]], name: str) -> float:
    if set(ref) != set(got):
        missing = sorted(set(ref) ^ set(got))
        raise RuntimeError(
            f"compare: strategy {name!r} changed the model's parameter names ({', '.join(missing[:5])}); "
            "strategies must keep the state_dict keys"
        )
    worst = 0.0
    for key, g_ref in ref.items():
        g = got[key]
        if g_ref is None and g is None:
            continue
        if g_ref is None or g is None:
            return float("inf")
        if g.shape != g_ref.shape:
            return float("inf")
        if torch.equal(g, g_ref):
            continue
        worst = max(worst, float((g.double() - g_ref.to(g.device).double()).abs().max()))
    return worst


def _strip_runner_prefix(by_module: Dict[str, int], runner: nn.Module) -> Dict[str, int]:
    if not isinstance(runner, _ContextRunner):
        return by_module
    out: Dict[str, int] = {}
    for name, b in by_module.items():
        if name == "":
            continue  # the runner itself creates nothing
        new = "" if name == "model" else name[len("model."):] if name.startswith("model.") else name
        out[new] = out.get(new, 0) + b
    return dict(sorted(out.items(), key=lambda kv: (-kv[1], kv[0])))


def _progress(total: int, enabled: bool, desc: str) -> Any:
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc=desc, unit="strategy", leave=False)


def compare(
    model: nn.Module,
    *inputs: Any,
    strategies: Sequence[Union[str, Strategy]] = ("eager", "checkpoint:blocks"),
    loss_fn: Optional[LossFn] = None,
    steps: int = 5,
    warmup: int = 1,
    progress: bool = False,
    snapshot_dir: Optional[str] = None,
) -> Comparison:
    """Measure a training step of ``model`` under each strategy and compare it with eager.

    Every strategy runs on a fresh ``copy.deepcopy`` of ``model``; ``model`` itself, its gradients, its buffers and
    the RNG states (CPU and initialised CUDA devices) are as they were when this returns. Eager is always measured
    (first row), since times are ratios to eager from the same run. For each strategy: one step from the RNG state
    at the call gives the gradients compared with eager's (so dropout draws the same masks), then
    :func:`memsave.measure` (``warmup`` + ``steps`` timed steps, one step for the peak, one under the tracker).

    Args:
        model: the model; its parameters, buffers and tensor inputs must be on one device.
        *inputs: positional arguments of ``model``.
        strategies: names (see the module docstring) or parsed :class:`Strategy` objects.
        loss_fn: output -> scalar loss; default :func:`memsave.measure.default_loss`.
        steps: timed steps per strategy (median).
        warmup: untimed steps per strategy before timing.
        progress: show a tqdm progress bar over the strategies.
        snapshot_dir: CUDA only: write a memory snapshot of one step per strategy there
            (``<dir>/<strategy>.pickle``, open it at https://pytorch.org/memory_viz).

    Returns:
        a :class:`Comparison`.

    Raises:
        ValueError: an unknown strategy (the message lists the valid ones), model and inputs on different devices,
            ``steps`` < 1, or ``snapshot_dir`` on a device other than CUDA.
        StrategyUnavailableError: a strategy needs a memsave module this build lacks (checked before any run).

    Example:
        >>> result = memsave.compare(model, x, strategies=["eager", "checkpoint:blocks", "convert"])
        >>> print(result)            # or just `result` as the last line of a notebook cell
        >>> fig = result.plot()
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"compare: model must be an nn.Module, got {type(model).__name__}")
    if loss_fn is None:
        loss_fn = default_loss
    elif not callable(loss_fn):
        raise TypeError(f"compare: loss_fn must be callable (output -> scalar loss), got {type(loss_fn).__name__}")
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"compare: steps must be an int >= 1, got {steps!r}")
    if isinstance(strategies, (str, Strategy)):
        strategies = [strategies]
    parsed = [parse_strategy(s) for s in strategies]
    if not parsed or parsed[0].name != "eager":
        parsed = [parse_strategy("eager")] + [s for s in parsed if s.name != "eager"]
    parsed = list({s.name: s for s in parsed}.values())
    for s in parsed:
        s.check_available()
    try:
        dev = _resolve_device(model, inputs, None)
    except ValueError as e:
        raise ValueError(str(e).replace("measure:", "compare:", 1)) from None
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"compare: the model is on {dev}; compare runs steps for real, on 'cpu' or 'cuda' "
                         "(for a model on the meta device use memsave.estimate)")
    if snapshot_dir is not None and dev.type != "cuda":
        raise ValueError(f"compare: snapshot_dir needs CUDA (memory snapshots are a CUDA allocator feature); "
                         f"the model is on {dev}")

    rng = RngState()
    ctx = StrategyContext(tuple(inputs), loss_fn, dev)
    rows: List[ComparisonRow] = []
    ref_grads: Dict[str, Optional[torch.Tensor]] = {}
    eager_seconds = 1.0
    bar = _progress(len(parsed), progress, "memsave.compare")
    try:
        for s in parsed:
            if bar is not None:
                bar.set_postfix_str(s.name)
            rng.restore()
            work = copy.deepcopy(model)
            for p in work.parameters():
                p.grad = None
            runner = s.prepare(work, ctx)
            # The gradient step starts from the caller's RNG state, as eager's did.
            rng.restore()
            loss_fn(runner(*inputs)).backward()
            grads = _param_grads(work)
            for p in runner.parameters():
                p.grad = None
            if s.name == "eager":
                ref_grads = grads
                diff = 0.0
            else:
                diff = _max_grad_diff(ref_grads, grads, s.name)
            del grads
            rng.restore()
            m: Measurement = measure(runner, *inputs, loss_fn=loss_fn, steps=steps, warmup=warmup, device=dev)
            snap = None
            if snapshot_dir is not None:
                from .monitor import cuda_memory_snapshot

                os.makedirs(snapshot_dir, exist_ok=True)
                snap = os.path.join(snapshot_dir, re.sub(r"[^A-Za-z0-9_.%+-]", "_", s.name) + ".pickle")
                with cuda_memory_snapshot(snap):
                    loss_fn(runner(*inputs)).backward()
                for p in runner.parameters():
                    p.grad = None
            if s.name == "eager":
                eager_seconds = m.step_seconds
            rows.append(ComparisonRow(
                strategy=s.name,
                peak_bytes=m.peak_bytes,
                activation_bytes=m.activation_bytes,
                step_seconds=m.step_seconds,
                time_ratio=m.step_seconds / eager_seconds if eager_seconds > 0 else float("nan"),
                max_grad_diff=diff,
                lossless=s.lossless,
                reserved_bytes=m.reserved_bytes,
                by_module=_strip_runner_prefix(m.by_module, runner),
                snapshot=snap,
            ))
            del runner, work
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
        rng.restore()

    info: Dict[str, Any] = {
        "model": type(model).__name__,
        "inputs": [list(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__ for t in inputs],
        "torch": torch.__version__,
    }
    if dev.type == "cuda":
        info["cuda_device"] = torch.cuda.get_device_name(dev)
        info["cuda"] = torch.version.cuda
    for r in rows:
        if r.lossless and r.max_grad_diff != 0.0 and dev.type == "cpu":
            warnings.warn(
                f"compare: strategy {r.strategy!r} is declared lossless but its gradients differ from eager's by "
                f"up to {r.max_grad_diff:.3g}", RuntimeWarning, stacklevel=2)
    return Comparison(rows, str(dev), steps, info)
