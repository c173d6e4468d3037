"""memsave.convert: swap memory-efficient modules into an existing model, in place, keeping its state_dict keys.

Two kinds of rewrite, both extensible:

* **module swaps** — one torch module for one memsave module: ``nn.ReLU -> memsave.nn.ReLU``,
  ``nn.LeakyReLU -> memsave.nn.LeakyReLU``, ``nn.MaxPool2d -> memsave.nn.MaxPool2d`` (exact types: subclasses are
  left alone), and with ``dropout=True`` ``nn.Dropout -> memsave.nn.Dropout``. More with
  :func:`register_module_swap`.
* **Sequential patterns** (with ``fuse=True``) — consecutive children of an ``nn.Sequential`` replaced together
  (fused operators, e.g. BatchNorm -> activation). Registered with :func:`register_sequential_pattern`; tried before
  module swaps, highest priority first.

Lossless by default
-------------------
``convert(model)`` makes only the swaps whose outputs, gradients and buffers are bitwise equal to eager on CPU
(ReLU, LeakyReLU, MaxPool2d). Two opt-ins change results in ways the user should choose knowingly:

* ``dropout=True``: memsave's Dropout keeps the keep probability and scaling but draws its own random bits (from
  the same generator), so a converted model's dropout masks, and hence gradients, differ from torch's Dropout —
  equal in distribution, not bitwise. Recompute inside ``memsave.checkpoint`` still replays them exactly.
* ``fuse=True``: fused operators recompute in backward with their own reduction order, so gradients equal the unfused
  model's up to float rounding (<= 1e-5 relative in float32, tested); running statistics are equal.

Where a mask pays, and where it does not
-----------------------------------------
A module's saved tensors are what it keeps alive until backward. A 1-bit ReLU mask instead of the ReLU's output
frees memory **only if nothing else keeps that output**:

* it pays when the consumer does not keep its input: memsave's MaxPool2d (keeps 1-byte indices), Dropout, another
  mask activation, an addition, or a checkpointed region (``memsave.checkpoint`` keeps only the region's inputs, and
  during its recompute the masks keep the peak down);
* it gains nothing on its own when the next Conv/Linear/BatchNorm (or torch's MaxPool2d) keeps that output for its
  own backward anyway: you then hold the output *and* a mask (1/32 of a float32 output more).

``convert(model, verbose=True)`` prints this verdict for every module it swaps, as far as the model's structure
shows it (inside an ``nn.Sequential`` the consumer is the next child; elsewhere it is decided in ``forward`` and
reported as "depends"). :func:`plan_convert` returns the same report without changing the model.
"""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

from torch import nn

from . import nn as mnn
from .functional import _pool_params

__all__ = [
    "ConvertEntry",
    "ConvertReport",
    "convert",
    "plan_convert",
    "register_module_swap",
    "register_sequential_pattern",
    "sequential_patterns",
    "unregister_sequential_pattern",
]

Selector = Union[type, str]
ElementMatcher = Union[type, Tuple[type, ...], Callable[[nn.Module], bool]]

# ---- verdicts ---------------------------------------------------------------------------------------------------

PAYS = "pays"
NO_GAIN = "no gain alone"
DEPENDS = "depends"
SKIPPED = "skipped"

# torch modules that keep their input for backward (so a mask on their producer's output buys nothing alone).
_KEEPS_INPUT: Tuple[type, ...] = (
    nn.Linear, nn.Bilinear, nn.LazyLinear,
    nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d,
    nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm,
    nn.LayerNorm, nn.GroupNorm, nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d,
    nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d, nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d,
    nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool3d,
    nn.AdaptiveMaxPool1d, nn.AdaptiveMaxPool2d, nn.AdaptiveMaxPool3d,
    nn.GELU, nn.SiLU, nn.Mish, nn.Softplus, nn.ELU, nn.LeakyReLU, nn.PReLU,
    nn.MultiheadAttention, nn.LSTM, nn.GRU, nn.RNN,
)  # fmt: skip
# torch modules that do not keep their input (dropout keeps a mask; tanh/sigmoid keep their own output).
_FREES_INPUT: Tuple[type, ...] = (nn.Dropout, nn.Tanh, nn.Sigmoid)
# Modules that return a view of their input: the consumer after them decides.
_TRANSPARENT: Tuple[type, ...] = (nn.Flatten, nn.Unflatten, nn.Identity)


def _keeps_input(module: nn.Module) -> Optional[bool]:
    """Whether ``module`` keeps its input for backward: True, False, or None when unknown.

    A module may declare it with a class attribute ``memsave_keeps_input`` (memsave's modules do).
    """
    declared = getattr(type(module), "memsave_keeps_input", None)
    if isinstance(declared, bool):
        return declared
    if isinstance(module, nn.ReLU):
        return False  # torch's ReLU keeps its output, which is its consumer's input only when in place
    if isinstance(module, _FREES_INPUT):
        return False
    if isinstance(module, _KEEPS_INPUT):
        return True
    return None


# ---- registries -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _ModuleSwap:
    torch_type: type
    build: Callable[[nn.Module], nn.Module]
    refuse: Callable[[nn.Module], Optional[str]]
    # note(module, producer, consumer) -> (verdict, detail); producer/consumer None when not visible
    note: Callable[[nn.Module, Optional[nn.Module], Optional[nn.Module]], Tuple[str, str]]
    # The convert() flag that must be set for this swap (None: bitwise exact, always made).
    opt_in: Optional[str] = None


@dataclass(frozen=True)
class _SequentialPattern:
    name: str
    elements: Tuple[ElementMatcher, ...]
    build: Callable[[List[nn.Module]], Optional[Sequence[nn.Module]]]
    note: str
    priority: int
    order: int


_SWAPS: Dict[type, _ModuleSwap] = {}
_PATTERNS: Dict[str, _SequentialPattern] = {}
_pattern_counter = [0]


def register_module_swap(
    torch_type: type,
    build: Callable[[nn.Module], nn.Module],
    note: str,
    refuse: Optional[Callable[[nn.Module], Optional[str]]] = None,
) -> None:
    """Teach :func:`convert` to replace modules of exactly ``torch_type`` (not subclasses) one for one.

    Args:
        torch_type: the module class to replace.
        build: ``build(old) -> new``; ``new`` must have the same state_dict keys as ``old`` (convert checks).
        note: one line for the summary: what the replacement keeps for backward instead of what.
        refuse: optional ``refuse(old) -> reason or None``; a reason leaves ``old`` in place, reported as skipped.

    Example:
        >>> from memsave.convert import register_module_swap
        >>> register_module_swap(nn.GELU, lambda m: MyGELU(m.approximate), "keeps the input only")
    """
    if not isinstance(torch_type, type) or not issubclass(torch_type, nn.Module):
        raise TypeError(f"register_module_swap: torch_type must be an nn.Module subclass, got {torch_type!r}")
    _SWAPS[torch_type] = _ModuleSwap(torch_type, build, refuse or (lambda m: None), lambda m, prv, nxt: (PAYS, note))


def register_sequential_pattern(
    name: str,
    pattern: Sequence[ElementMatcher],
    build: Callable[[List[nn.Module]], Optional[Sequence[nn.Module]]],
    note: str = "",
    priority: int = 0,
) -> None:
    """Teach :func:`convert` to replace runs of consecutive children of an ``nn.Sequential`` together.

    The contract that keeps state_dict keys: ``build`` receives the matched modules (a list as long as
    ``pattern``) and returns a sequence **of the same length**, one replacement per position, or None to decline
    this match (the children are then left to module swaps). Each position keeps its child name, so parameters must
    stay at the position they came from (e.g. a fused BatchNorm+activation module in the BatchNorm's place with its
    parameter names, ``nn.Identity()`` in the activation's place). convert checks that the model's state_dict keys
    are unchanged and undoes everything with a ValueError naming the pattern if not.

    Args:
        name: unique name (registering a name again replaces the pattern).
        pattern: one matcher per position: a class (matches that exact type), a tuple of classes (exact type in
            it), or a predicate ``fn(module) -> bool``.
        build: ``build(modules) -> replacements`` as above.
        note: one line for the summary: what the fused replacement keeps for backward.
        priority: patterns are tried highest priority first, then in registration order.

    Example:
        >>> from memsave.convert import register_sequential_pattern
        >>> register_sequential_pattern(
        ...     "bn_relu", (nn.BatchNorm2d, nn.ReLU),
        ...     lambda ms: [BatchNormAct2d.from_batchnorm(ms[0], "relu"), nn.Identity()],
        ...     note="keeps the BN input only; recomputes BN+ReLU in backward")
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"register_sequential_pattern: name must be a non-empty string, got {name!r}")
    elements = tuple(pattern)
    if not elements:
        raise ValueError(f"register_sequential_pattern({name!r}): the pattern is empty")
    for el in elements:
        ok = (isinstance(el, type) and issubclass(el, nn.Module)) or callable(el) or (
            isinstance(el, tuple) and all(isinstance(t, type) and issubclass(t, nn.Module) for t in el)
        )
        if not ok:
            raise TypeError(
                f"register_sequential_pattern({name!r}): each element must be an nn.Module class, a tuple of them "
                f"or a predicate, got {el!r}"
            )
    if not callable(build):
        raise TypeError(f"register_sequential_pattern({name!r}): build must be callable, got {build!r}")
    _pattern_counter[0] += 1
    _PATTERNS[name] = _SequentialPattern(name, elements, build, note, int(priority), _pattern_counter[0])


def unregister_sequential_pattern(name: str) -> None:
    """Remove a pattern registered with :func:`register_sequential_pattern` (KeyError if there is none)."""
    if name not in _PATTERNS:
        raise KeyError(f"no Sequential pattern named {name!r}; registered: {sorted(_PATTERNS)}")
    del _PATTERNS[name]


def sequential_patterns() -> List[str]:
    """Names of the registered Sequential patterns, in the order convert tries them."""
    return [p.name for p in _ordered_patterns()]


def _ordered_patterns() -> List[_SequentialPattern]:
    return sorted(_PATTERNS.values(), key=lambda p: (-p.priority, p.order))


def _element_matches(el: ElementMatcher, module: nn.Module) -> bool:
    if isinstance(el, type):
        return type(module) is el
    if isinstance(el, tuple):
        return type(module) in el
    return bool(el(module))


# ---- the built-in swaps -----------------------------------------------------------------------------------------


def _kind(module: nn.Module) -> str:
    return f"{type(module).__module__.split('.')[0]}.{type(module).__name__}"


def _keeps_output(module: nn.Module) -> Optional[bool]:
    """Whether ``module`` keeps its own output for backward (torch's ReLU, Sigmoid, Tanh and Softmax do).

    A module may declare it with a class attribute ``memsave_keeps_output`` (memsave's modules do).
    """
    declared = getattr(type(module), "memsave_keeps_output", None)
    if isinstance(declared, bool):
        return declared
    if type(module) in (nn.ReLU, nn.Sigmoid, nn.Tanh, nn.Softmax, nn.LogSoftmax):
        return True
    if isinstance(module, _KEEPS_INPUT) and not isinstance(module, (nn.MultiheadAttention, nn.LSTM, nn.GRU, nn.RNN)):
        return False  # layers that keep their input, not their output
    if isinstance(module, nn.Dropout):
        return False
    return None


def _relu_note(module: nn.Module, producer: Optional[nn.Module], consumer: Optional[nn.Module]) -> Tuple[str, str]:
    """torch's ReLU (and in-place LeakyReLU) keeps its output: the mask pays iff the consumer does not keep it."""
    if consumer is None:
        return DEPENDS, (
            "keeps 1 bit/element instead of its output; pays only if its consumer (decided in forward, not "
            "visible here) does not keep its input: memsave MaxPool2d, an addition, a checkpointed region"
        )
    keeps = _keeps_input(consumer)
    kind = _kind(consumer)
    if keeps is True:
        return NO_GAIN, (
            f"no gain on its own: the next {kind} keeps this output for its backward anyway (the mask pays only "
            f"inside a checkpointed region)"
        )
    if keeps is False:
        return PAYS, f"keeps 1 bit/element instead of its output: the next {kind} does not keep it"
    return DEPENDS, f"keeps 1 bit/element instead of its output; pays only if the next {kind} does not keep its input"


def _leaky_relu_note(module: nn.Module, producer: Optional[nn.Module], consumer: Optional[nn.Module]) -> Tuple[str, str]:
    """torch's LeakyReLU keeps its input (its output when in place): the mask pays iff nothing else keeps that."""
    if getattr(module, "inplace", False):
        return _relu_note(module, producer, consumer)
    if producer is None:
        return DEPENDS, (
            "keeps 1 bit/element instead of its input; pays unless the producer of that input (not visible here) "
            "keeps it anyway"
        )
    keeps = _keeps_output(producer)
    if keeps is True:
        return NO_GAIN, f"no gain on its own: the previous {_kind(producer)} keeps this input (its output) anyway"
    if keeps is False:
        return PAYS, f"keeps 1 bit/element instead of its input: the previous {_kind(producer)} does not keep it"
    return DEPENDS, f"keeps 1 bit/element instead of its input; pays unless the previous {_kind(producer)} keeps it"


def _maxpool_refuse(module: nn.Module) -> Optional[str]:
    try:
        _pool_params(module.kernel_size, module.stride, module.padding, module.dilation)
    except (TypeError, ValueError) as exc:
        return str(exc)
    return None


_SWAPS[nn.ReLU] = _ModuleSwap(nn.ReLU, lambda m: mnn.ReLU(inplace=m.inplace), lambda m: None, _relu_note)
_SWAPS[nn.LeakyReLU] = _ModuleSwap(
    nn.LeakyReLU,
    lambda m: mnn.LeakyReLU(m.negative_slope, inplace=m.inplace),
    lambda m: None,
    _leaky_relu_note,
)
_SWAPS[nn.Dropout] = _ModuleSwap(
    nn.Dropout,
    lambda m: mnn.Dropout(m.p, inplace=m.inplace),
    lambda m: None,
    lambda m, prv, nxt: (PAYS, "keeps 1 bit/element instead of torch's mask (1 byte/element on CUDA, 1 element on CPU)"),
    opt_in="dropout",
)
_SWAPS[nn.MaxPool2d] = _ModuleSwap(
    nn.MaxPool2d,
    lambda m: mnn.MaxPool2d(m.kernel_size, m.stride, m.padding, m.dilation, m.return_indices, m.ceil_mode),
    _maxpool_refuse,
    lambda m, prv, nxt: (PAYS, "keeps 1 byte/output element instead of int64 indices (8 bytes) and its input"),
)

# ---- the report -------------------------------------------------------------------------------------------------


@dataclass
class ConvertEntry:
    """One line of a :class:`ConvertReport`."""

    name: str  # qualified module name ("" for the root)
    old: str  # old module type
    new: str  # new module type ("" when skipped)
    verdict: str  # "pays", "no gain alone", "depends" or "skipped"
    detail: str


@dataclass
class ConvertReport:
    """What :func:`convert` swapped (or would swap) and where it saves memory.

    Attributes:
        entries: one :class:`ConvertEntry` per swapped, fused or skipped module.
    """

    entries: List[ConvertEntry] = field(default_factory=list)

    def count(self, verdict: str) -> int:
        """Number of entries with this verdict."""
        return sum(e.verdict == verdict for e in self.entries)

    def summary(self) -> str:
        """A plain-text table: module, swap, verdict and why."""
        if not self.entries:
            return "memsave.convert: nothing to convert (no nn.ReLU, nn.LeakyReLU, nn.Dropout or nn.MaxPool2d)."
        rows = [(e.name or "(root)", f"{e.old} -> {e.new}" if e.new else e.old, e.verdict, e.detail)
                for e in self.entries]
        w0 = max(len(r[0]) for r in rows)
        w1 = max(len(r[1]) for r in rows)
        w2 = max(len(r[2]) for r in rows)
        lines = [f"{r[0]:<{w0}}  {r[1]:<{w1}}  {r[2]:<{w2}}  {r[3]}" for r in rows]
        converted = len(self.entries) - self.count(SKIPPED)
        lines.append(
            f"memsave.convert: {converted} converted ({self.count(PAYS)} pay, {self.count(NO_GAIN)} no gain alone, "
            f"{self.count(DEPENDS)} depend on their consumer), {self.count(SKIPPED)} skipped. A mask pays where the "
            f"consumer does not keep its input (pooling with memsave MaxPool2d, addition, a checkpointed region), "
            f"not where the next Linear/Conv keeps the output anyway."
        )
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()


# ---- planning and applying --------------------------------------------------------------------------------------


def _as_selectors(arg: object, what: str) -> Optional[List[Selector]]:
    if arg is None:
        return None
    items = [arg] if isinstance(arg, (str, type)) else list(arg)  # type: ignore[call-overload]
    for it in items:
        if not (isinstance(it, str) or (isinstance(it, type) and issubclass(it, nn.Module))):
            raise TypeError(
                f"memsave.convert: {what} takes module classes (e.g. torch.nn.ReLU) and qualified-name patterns "
                f"(e.g. 'features.*'), got {it!r}"
            )
    return items


def _selected(selectors: Optional[List[Selector]], name: str, module: nn.Module) -> bool:
    for s in selectors or ():
        if isinstance(s, str):
            if fnmatch.fnmatchcase(name, s):
                return True
        elif isinstance(module, s):
            return True
    return False


@dataclass
class _Planned:
    parent: nn.Module
    child: str
    name: str
    old: nn.Module
    new: nn.Module


def _qualify(prefix: str, child: str) -> str:
    return f"{prefix}.{child}" if prefix else child


def _plan(model: nn.Module, include: Optional[List[Selector]], exclude: Optional[List[Selector]],
          build: bool, fuse: bool = False, dropout: bool = False) -> Tuple[List[_Planned], ConvertReport]:
    """Decide every swap; with build=False (a dry run) Sequential patterns are matched but not built."""
    opted_in = {"dropout": dropout}
    report = ConvertReport()
    planned: List[_Planned] = []
    done: Dict[int, Optional[nn.Module]] = {}  # shared modules are swapped once, to one replacement

    def candidate(name: str, module: nn.Module) -> bool:
        if include is not None and not _selected(include, name, module):
            return False
        return not _selected(exclude, name, module)

    def neighbour(children: List[Tuple[str, nn.Module]], i: int, step: int,
                  final: Dict[int, nn.Module]) -> Optional[nn.Module]:
        """The nearest non-view module before (step -1) or after (step +1) position i, None at the ends."""
        j = i + step
        while 0 <= j < len(children):
            m = final.get(j, children[j][1])
            if not isinstance(m, _TRANSPARENT):
                return m
            j += step
        return None

    def visit(prefix: str, module: nn.Module) -> None:
        # every child slot, a module registered twice included (named_children() lists it once)
        children = [(c, m) for c, m in module._modules.items() if m is not None]
        in_sequential = isinstance(module, nn.Sequential)
        final: Dict[int, nn.Module] = {}  # position -> planned replacement (for the consumer analysis)
        consumed = set()
        singles: List[Tuple[int, _ModuleSwap]] = []
        if in_sequential and fuse:
            patterns = _ordered_patterns()
            i = 0
            while i < len(children):
                matched = False
                for pat in patterns:
                    n = len(pat.elements)
                    run = children[i:i + n]
                    if len(run) < n or any(id(m) in done for _, m in run):
                        continue
                    if not all(_element_matches(el, m) for el, (_, m) in zip(pat.elements, run)):
                        continue
                    if not all(candidate(_qualify(prefix, c), m) for c, m in run):
                        continue
                    olds = [m for _, m in run]
                    news = pat.build(list(olds)) if build else olds
                    if news is None:
                        continue
                    news = list(news)
                    if len(news) != n or not all(isinstance(x, nn.Module) for x in news):
                        raise ValueError(
                            f"memsave.convert: Sequential pattern {pat.name!r} must return {n} modules (one per "
                            f"matched position), got {news!r}"
                        )
                    for k, ((c, old), new) in enumerate(zip(run, news)):
                        qn = _qualify(prefix, c)
                        if new is not old:
                            planned.append(_Planned(module, c, qn, old, new))
                        final[i + k] = new
                        consumed.add(i + k)
                        done[id(old)] = new
                        report.entries.append(ConvertEntry(
                            qn, type(old).__name__, f"{type(new).__name__}" if build else f"[{pat.name}]", PAYS,
                            f"pattern {pat.name}" + (f": {pat.note}" if pat.note else "")))
                    i += n
                    matched = True
                    break
                if not matched:
                    i += 1
        for i, (c, child) in enumerate(children):
            if i in consumed:
                continue
            qn = _qualify(prefix, c)
            swap = _SWAPS.get(type(child))
            if swap is not None and swap.opt_in is not None and not opted_in.get(swap.opt_in, False):
                swap = None
            if swap is None or not candidate(qn, child):
                if swap is None:
                    visit(qn, child)
                continue
            if id(child) in done:
                new = done[id(child)]
                if new is not None:
                    planned.append(_Planned(module, c, qn, child, new))
                    final[i] = new
                continue
            reason = swap.refuse(child)
            if reason is not None:
                done[id(child)] = None
                report.entries.append(ConvertEntry(qn, type(child).__name__, "", SKIPPED, reason))
                continue
            new = swap.build(child)  # built in a dry run too (cheap): the consumer analysis looks at it
            new.train(child.training)
            if build:
                planned.append(_Planned(module, c, qn, child, new))
            done[id(child)] = new
            final[i] = new
            singles.append((i, swap))
        for i, swap in singles:
            c, child = children[i]
            nxt = neighbour(children, i, +1, final) if in_sequential else None
            prv = neighbour(children, i, -1, final) if in_sequential else None
            new = final[i]
            verdict, detail = swap.note(child, prv, nxt)
            new_name = f"memsave.{type(new).__name__}"
            report.entries.append(ConvertEntry(_qualify(prefix, c), type(child).__name__, new_name, verdict, detail))

    visit("", model)
    order = {name: k for k, (name, _) in enumerate(model.named_modules(remove_duplicate=False))}
    report.entries.sort(key=lambda e: order.get(e.name, len(order)))
    return planned, report


def plan_convert(
    model: nn.Module,
    include: Optional[Iterable[Selector]] = None,
    exclude: Optional[Iterable[Selector]] = None,
    *,
    fuse: bool = False,
    dropout: bool = False,
) -> ConvertReport:
    """What :func:`convert` would swap, and where it would pay, without changing the model.

    Args:
        model, include, exclude, fuse, dropout: as for :func:`convert`.

    Returns:
        A :class:`ConvertReport`; ``print(report)`` shows the table.

    Example:
        >>> from memsave.convert import plan_convert
        >>> print(plan_convert(model))
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"memsave.plan_convert expects an nn.Module, got {type(model).__name__}")
    _, report = _plan(model, _as_selectors(include, "include"), _as_selectors(exclude, "exclude"), build=False,
                      fuse=fuse, dropout=dropout)
    return report


def convert(
    model: nn.Module,
    include: Optional[Iterable[Selector]] = None,
    exclude: Optional[Iterable[Selector]] = None,
    verbose: bool = False,
    *,
    fuse: bool = False,
    dropout: bool = False,
) -> nn.Module:
    """Swap memory-efficient modules into ``model``, recursively and in place; state_dict keys do not change.

    Replaces ``nn.ReLU``, ``nn.LeakyReLU`` and ``nn.MaxPool2d`` (exact types) by their :mod:`memsave.nn`
    counterparts; outputs, gradients and buffers stay bitwise equal to eager on CPU. ``fuse=True`` also replaces
    runs of ``nn.Sequential`` children matching a registered pattern by fused modules (equal up to float rounding),
    ``dropout=True`` also swaps ``nn.Dropout`` (other random bits than torch's). See the module docstring for where a
    mask saves memory and where it does not.

    Args:
        model: the model; modified in place.
        include: if given, only modules matching one of these are converted: module classes (``isinstance``) or
            qualified-name patterns as ``named_modules()`` prints them (shell-style, e.g. ``"features.*"``). A
            Sequential pattern needs all its modules included.
        exclude: modules matching one of these (same forms) are left alone, and patterns touching them skipped.
        verbose: print the :class:`ConvertReport`: each swap and whether its mask pays.
        fuse: also apply the fused Sequential patterns (BatchNorm -> activation, LayerNorm -> Linear,
            Linear -> activation -> Linear, ...): gradients equal up to float rounding, not bitwise.
        dropout: also swap ``nn.Dropout``: same keep probability and scaling, other random bits than torch's.

    Returns:
        ``model`` itself.

    Raises:
        TypeError: ``model`` is not an nn.Module, or include/exclude hold something else than classes and strings.
        ValueError: a registered pattern broke the state_dict keys (everything is undone first).

    Example:
        >>> model = memsave.convert(torchvision.models.vgg16(), verbose=True)
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"memsave.convert expects an nn.Module, got {type(model).__name__}")
    keys_before = set(model.state_dict().keys())
    planned, report = _plan(model, _as_selectors(include, "include"), _as_selectors(exclude, "exclude"), build=True,
                            fuse=fuse, dropout=dropout)
    for p in planned:
        setattr(p.parent, p.child, p.new)
    keys_after = set(model.state_dict().keys())
    if keys_after != keys_before:
        for p in reversed(planned):
            setattr(p.parent, p.child, p.old)
        changed = sorted(keys_before ^ keys_after)[:6]
        raise ValueError(
            f"memsave.convert: the swaps would change state_dict keys ({changed}...), so nothing was converted; a "
            f"registered Sequential pattern must return one module per position keeping that position's keys "
            f"(patterns: {sequential_patterns()})"
        )
    if verbose:
        print(report.summary())
    return model


# The fused operators' Sequential patterns (BatchNorm -> act, LayerNorm -> Linear, act -> Linear) register here.
from . import _convert_fused  # noqa: E402,F401
