"""memsave.convert: swap memory-efficient modules into an existing model, in place, keeping its state_dict keys.

Three kinds of rewrite, each extensible:

* **module swaps** — one torch module for one memsave module: ``nn.ReLU -> memsave.nn.ReLU``,
  ``nn.LeakyReLU -> memsave.nn.LeakyReLU``, ``nn.MaxPool2d -> memsave.nn.MaxPool2d`` (exact types: subclasses are
  left alone), and with ``dropout=True`` ``nn.Dropout -> memsave.nn.Dropout``. More with
  :func:`register_module_swap`.
* **Sequential patterns** (with ``fuse=True``) — consecutive children of an ``nn.Sequential`` replaced together
  (fused operators, e.g. BatchNorm -> activation). Registered with :func:`register_sequential_pattern`; tried before
  module swaps, highest priority first.
* **Structures** (with ``fuse=True``) — recognised in any model by what modules compute, not by class name
  (``structure.py``, ``causal_lm.py``): RMS-style norms (``1 + weight`` and head-dimension ones too) and LayerNorms
  fused into the Linears that alone read them, gated MLPs (separate or packed gate/up projections, mixture-of-experts
  experts that are such modules), activation -> Linear, and a causal LM's loss (with ``labels``,
  ``linear_cross_entropy`` from the last hidden state: the logits are never built and ``.logits`` is an empty
  ``[batch, seq, 0]`` tensor). Each candidate is checked on a probe before it is swapped (``probe.py``: equal to
  the original within float tolerance, and fewer bytes kept for backward); what is left, and why, is in the report.
* **Module rules** (with ``fuse=True``) — modules of known classes rewritten inside, for what structure cannot cover
  (``model_zoo.py``: timm's ViT Mlp and Block). A rule is applied to a module before its children are visited; what
  it does not replace is visited as usual. More with :func:`registry.add_module_rule`.

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
shows it (inside an ``nn.Sequential`` the consumer is the next child; with ``fuse=True`` on a model the probe can
run, the module that reads the output in a traced forward; elsewhere it is decided in ``forward`` and reported as
"depends"). :func:`plan_convert` returns the same report without changing the model.

Swaps that do not pay are not made
-----------------------------------
A swap whose replacement keeps as many bytes for backward as what it replaces, or more, is not made by default and
is reported as skipped with the reason: a ReLU mask whose consumer keeps the ReLU's output anyway ("no gain alone":
the output *and* the mask, 1/32 more), a structure whose probe shows no saving (an ActLinear after a ReLU). With
``unprofitable=True`` they are made anyway (a mask pays inside a checkpointed region's recompute).
"""

from __future__ import annotations

import fnmatch
import warnings
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Optional, Tuple, TypeVar, Union

from torch import nn

from ...common.chunking import check_chunks
from ...common.regions import regions_in
from ...common.snapshot import all_or_nothing
from ...errors import MemsaveWarning, WrapConflictError
from .model_zoo import chunk_mlps
from .registry import (
    DEPENDS,
    NO_GAIN,
    PAYS,
    SKIPPED,
    TRANSPARENT,
    ModuleRule,
    ModuleSwap,
    Note,
    Replacement,
    Rewrite,
    Unit,
    element_matches,
    module_rule_for,
    module_swap_for,
    ordered_patterns,
    sequential_patterns,
)
from .structure import analyse

__all__ = ["ConvertEntry", "ConvertReport", "convert", "plan_convert"]

Selector = Union[type, str]

#: The model's own class: :func:`convert` returns the model it was given, typed as it was.
ModuleT = TypeVar("ModuleT", bound=nn.Module)


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
            return (
                "memsave.convert: nothing to convert (no nn.ReLU, nn.LeakyReLU, nn.Dropout or nn.MaxPool2d; with "
                "fuse=True, no fusable nn.Sequential run, no structure it recognises and no module of a known class)."
            )
        rows = [
            (e.name or "(root)", f"{e.old} -> {e.new}" if e.new else e.old, e.verdict, e.detail) for e in self.entries
        ]
        w0 = max(len(r[0]) for r in rows)
        w1 = max(len(r[1]) for r in rows)
        w2 = max(len(r[2]) for r in rows)
        lines = [f"{r[0]:<{w0}}  {r[1]:<{w1}}  {r[2]:<{w2}}  {r[3]}" for r in rows]
        converted = len(self.entries) - self.count(SKIPPED)
        no_gain = any(e.verdict == SKIPPED and e.detail.startswith("no gain alone") for e in self.entries)
        mask_note = (
            " A mask pays where the consumer does not keep its input (pooling with memsave MaxPool2d, addition, a "
            "checkpointed region), not where the next Linear/Conv keeps the output anyway."
            if self.count(NO_GAIN) or self.count(DEPENDS) or no_gain
            else ""
        )
        lines.append(
            f"memsave.convert: {converted} converted ({self.count(PAYS)} pay, {self.count(NO_GAIN)} no gain alone, "
            f"{self.count(DEPENDS)} depend on their consumer), {self.count(SKIPPED)} skipped.{mask_note}"
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


def _check_patterns_match(model: nn.Module, selectors: Optional[List[Selector]], what: str) -> None:
    """A name pattern that matches no module of the model is a typo (or a class name written as a string)."""
    names = [n for n, _ in model.named_modules() if n]
    for s in selectors or ():
        if isinstance(s, str) and not any(fnmatch.fnmatchcase(n, s) for n in names):
            raise ValueError(
                f"memsave.convert: the {what} pattern {s!r} matches no module of this model (patterns match qualified "
                f"names such as {names[:3]}; for a module class pass the class itself, e.g. torch.nn.ReLU)"
            )


def _matching(model: nn.Module, arg: object, what: str) -> Optional[List[Selector]]:
    selectors = _as_selectors(arg, what)
    _check_patterns_match(model, selectors, what)
    return selectors


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


def _common_ancestor(paths: List[str]) -> str:
    """The qualified name of the nearest module containing (or being) every one of ``paths``."""
    parts = [p.split(".") if p else [] for p in paths]
    common: List[str] = []
    for level in zip(*parts):
        if any(x != level[0] for x in level):
            break
        common.append(level[0])
    return ".".join(common)


def _relative(anchor: str, path: str) -> str:
    """``path`` relative to ``anchor`` (``""`` for the anchor itself)."""
    if path == anchor:
        return ""
    return path[len(anchor) + 1 :] if anchor else path


Install = Tuple[nn.Module, Callable[[nn.Module], None]]


def _neighbour(
    children: List[Tuple[str, nn.Module]], i: int, step: int, final: Dict[int, nn.Module]
) -> Optional[nn.Module]:
    """The nearest non-view module before (step -1) or after (step +1) position i, None at the ends."""
    j = i + step
    while 0 <= j < len(children):
        m = final.get(j, children[j][1])
        if not isinstance(m, TRANSPARENT):
            return m
        j += step
    return None


def _new_name(new: nn.Module) -> str:
    return f"memsave.{type(new).__name__}" if type(new).__module__.startswith("memsave") else type(new).__name__


@dataclass
class _Children:
    """The child slots of one module being visited, and what the visit decided for them."""

    prefix: str
    module: nn.Module
    items: List[Tuple[str, nn.Module]]
    final: Dict[int, nn.Module] = field(default_factory=dict)  # position -> planned replacement (consumer analysis)
    consumed: set = field(default_factory=set)  # positions a Sequential pattern replaced
    singles: List[Tuple[int, ModuleSwap]] = field(default_factory=list)  # positions a module swap replaced


class _Planner:
    """Decides every swap of one :func:`convert` or :func:`plan_convert` call; with build=False (a dry run) nothing
    is put in the model, though the replacements are built (so that the report says what convert would do).
    Nothing here changes the model."""

    def __init__(
        self,
        include: Optional[List[Selector]],
        exclude: Optional[List[Selector]],
        build: bool,
        fuse: bool,
        dropout: bool,
        unprofitable: bool = False,
    ) -> None:
        self.include, self.exclude, self.build, self.fuse = include, exclude, build, fuse
        self.unprofitable = unprofitable
        self.opted_in = {"dropout": dropout}
        self.report = ConvertReport()
        self.next_of: Dict[int, nn.Module] = {}  # a module -> the one module that reads its output (traced)
        self.replaced: set = set()  # qualified names a structural unit replaced (nothing below them is planned)
        self.planned: List[_Planned] = []
        self.installs: List[Install] = []
        self.done: Dict[int, Optional[nn.Module]] = {}  # shared modules are swapped once, to one replacement
        self.placed: set = set()  # (id(parent), child name) slots a module rule filled: not visited again

    def candidate(self, name: str, module: nn.Module) -> bool:
        if self.include is not None and not _selected(self.include, name, module):
            return False
        return not _selected(self.exclude, name, module)

    def run(self, model: nn.Module) -> None:
        if self.fuse:
            self.plan_structure(model)
        root_rule = module_rule_for(model) if self.fuse else None
        if root_rule is not None:
            self.apply_rule("", model, root_rule, None, "")
        self.visit("", model)
        order = {name: k for k, (name, _) in enumerate(model.named_modules(remove_duplicate=False))}
        self.report.entries.sort(key=lambda e: order.get(e.name, len(order)))

    # ---- structures (fuse=True) ----

    def plan_structure(self, model: nn.Module) -> None:
        """Plan the structural units of :mod:`.structure`, in its order, and report its notes."""
        analysis = analyse(model, self.unprofitable)
        for item in analysis.units(self.done):
            if isinstance(item, Note):
                if self.candidate(item.path, item.module) and not self._below_replaced(item.path):
                    self.report.entries.append(
                        ConvertEntry(item.path, type(item.module).__name__, "", SKIPPED, item.detail)
                    )
            elif not any(self._below_replaced(t.path) or t.path in self.replaced for t in item.targets):
                self.apply_unit(model, item)
        self.next_of = analysis.next_of

    def _below_replaced(self, path: str) -> bool:
        return any(path.startswith(r + ".") for r in self.replaced)

    def apply_unit(self, model: nn.Module, unit: Unit) -> None:
        """Plan one :class:`Unit` as a module rule applied to its anchor (all its replacements or none)."""
        anchor = unit.anchor if unit.anchor is not None else _common_ancestor([t.path for t in unit.targets])
        module = model.get_submodule(anchor)
        parent_path, _, slot = anchor.rpartition(".")
        parent = model.get_submodule(parent_path) if anchor else None
        reps = tuple(Replacement(_relative(anchor, t.path), t.new, t.detail) for t in unit.targets)
        rewrite = Rewrite(replacements=reps, install=unit.install)
        olds = [model.get_submodule(t.path) for t in unit.targets]
        self.apply_rule(anchor, module, ModuleRule(unit.rule, (), lambda m: rewrite), parent, slot)
        if all(self.done.get(id(old)) is t.new for old, t in zip(olds, unit.targets)):
            self.replaced.update(t.path for t in unit.targets)

    # ---- module rules ----

    def _rule_refusal(self, prefix: str, module: nn.Module, targets: list, olds: List[nn.Module]) -> Optional[str]:
        """Why a rule's replacements (which only work together) cannot all be applied, or None."""
        excluded = [qn for (qn, _, _, _), old in zip(targets, olds) if _selected(self.exclude, qn, old)]
        if _selected(self.exclude, prefix, module):
            excluded.insert(0, prefix or "(root)")
        not_included = (
            self.include is not None
            and not _selected(self.include, prefix, module)
            and not all(_selected(self.include, qn, old) for (qn, _, _, _), old in zip(targets, olds))
        )
        if not targets or not (excluded or not_included):
            return None
        return f"excluded ({', '.join(excluded)})" if excluded else "not all of its modules are included"

    def apply_rule(
        self, prefix: str, module: nn.Module, rule: ModuleRule, parent: Optional[nn.Module], slot: str
    ) -> bool:
        """Plan ``rule`` on ``module`` (at ``prefix``, the child ``slot`` of ``parent``); True if it replaced
        ``module`` itself (then there is nothing left inside it to visit)."""
        rewrite = rule.rewrite(module)
        targets = []
        for r in rewrite.replacements:
            if r.path:
                owner_path, _, attr = r.path.rpartition(".")
                owner = module.get_submodule(owner_path) if owner_path else module
                targets.append((_qualify(prefix, r.path), owner, attr, r))
            elif parent is None:
                raise ValueError(f"memsave.convert: module rule {rule.name!r} cannot replace the root model itself")
            else:
                targets.append((prefix, parent, slot, r))
        olds = [getattr(owner, attr) for _, owner, attr, _ in targets]
        if any((id(owner), attr) in self.placed for _, owner, attr, _ in targets):
            return False  # a structural unit already replaced some of them: the visit leaves them alone too
        why = self._rule_refusal(prefix, module, targets, olds)
        if why is not None:
            detail = f"{rule.name}: not applied, {why}; its replacements only work together"
            self.report.entries.append(ConvertEntry(prefix, type(module).__name__, "", SKIPPED, detail))
            return False
        for (qn, owner, attr, r), old in zip(targets, olds):
            if self.build:
                self.planned.append(_Planned(owner, attr, qn, old, r.new))
            self.placed.add((id(owner), attr))
            self.done[id(old)] = r.new
            entry = ConvertEntry(qn, type(old).__name__, _new_name(r.new), r.verdict, f"{rule.name}: {r.detail}")
            self.report.entries.append(entry)
        for path, reason in rewrite.skipped:
            old = module.get_submodule(path) if path else module
            entry = ConvertEntry(_qualify(prefix, path), type(old).__name__, "", SKIPPED, f"{rule.name}: {reason}")
            self.report.entries.append(entry)
        if rewrite.install is not None and targets:
            self.installs.append((module, rewrite.install))
        return any(not r.path for r in rewrite.replacements)

    # ---- visiting a module's children ----

    def visit(self, prefix: str, module: nn.Module) -> None:
        # every child slot, a module registered twice included (named_children() lists it once)
        kids = _Children(prefix, module, [(c, m) for c, m in module._modules.items() if m is not None])
        in_sequential = isinstance(module, nn.Sequential)
        if in_sequential and self.fuse:
            i = 0
            while i < len(kids.items):
                i += self._match_pattern(kids, i) or 1
        for i, (c, child) in enumerate(kids.items):
            if i not in kids.consumed and (id(module), c) not in self.placed:
                self._visit_child(kids, i, c, child)
        self._report_singles(kids, in_sequential)

    def _verdict(self, kids: _Children, i: int, swap: ModuleSwap, in_sequential: bool) -> Tuple[str, str]:
        child = kids.items[i][1]
        if in_sequential:
            nxt = _neighbour(kids.items, i, +1, kids.final)
            prv = _neighbour(kids.items, i, -1, kids.final)
        else:  # the traced reader where there is one (fuse=True), else not visible
            nxt, prv = self.next_of.get(id(child)), None
        return swap.note(child, prv, nxt)

    def _report_singles(self, kids: _Children, in_sequential: bool) -> None:
        """Report the module swaps of one visit; undo those that gain nothing on their own (their neighbours keep
        what they would save), unless ``unprofitable``. Undoing one changes its neighbours' view: repeat until
        none is left to undo."""
        undone: Dict[int, str] = {}
        while True:
            verdicts = {i: self._verdict(kids, i, s, in_sequential) for i, s in kids.singles if i not in undone}
            newly = {i: d for i, (v, d) in verdicts.items() if v == NO_GAIN and not self.unprofitable}
            if not newly:
                break
            for i, detail in newly.items():
                self._undo_swap(kids, i)
                undone[i] = detail
        for i, _ in kids.singles:
            c, child = kids.items[i]
            qn = _qualify(kids.prefix, c)
            if i in undone:
                detail = f"no gain alone, not made: {undone[i]}; convert(..., unprofitable=True) makes it anyway"
                self.report.entries.append(ConvertEntry(qn, type(child).__name__, "", SKIPPED, detail))
                continue
            verdict, detail = verdicts[i]
            new_name = f"memsave.{type(kids.final[i]).__name__}"
            self.report.entries.append(ConvertEntry(qn, type(child).__name__, new_name, verdict, detail))

    def _undo_swap(self, kids: _Children, i: int) -> None:
        """Take back the planned swap of child ``i`` (in every slot it was registered in)."""
        child = kids.items[i][1]
        self.planned = [p for p in self.planned if p.old is not child]
        for j, (_, m) in enumerate(kids.items):
            if m is child:
                kids.final.pop(j, None)
        self.done[id(child)] = None

    def _match_pattern(self, kids: _Children, i: int) -> int:
        """Plan the first Sequential pattern matching the children from position i; the number of children it
        replaced, 0 when none matches."""
        for pat in ordered_patterns():
            n = len(pat.elements)
            run = kids.items[i : i + n]
            if len(run) < n or any(id(m) in self.done for _, m in run):
                continue
            if not all(element_matches(el, m) for el, (_, m) in zip(pat.elements, run)):
                continue
            if not all(self.candidate(_qualify(kids.prefix, c), m) for c, m in run):
                continue
            olds = [m for _, m in run]
            news = pat.build(list(olds))  # in a dry run too (cheap, the model untouched): a build may decline
            if news is None:
                continue
            news = list(news)
            if len(news) != n or not all(isinstance(x, nn.Module) for x in news):
                raise ValueError(
                    f"memsave.convert: Sequential pattern {pat.name!r} must return {n} modules (one per matched "
                    f"position), got {news!r}"
                )
            for k, ((c, old), new) in enumerate(zip(run, news)):
                qn = _qualify(kids.prefix, c)
                if new is not old and self.build:
                    self.planned.append(_Planned(kids.module, c, qn, old, new))
                kids.final[i + k] = new
                kids.consumed.add(i + k)
                self.done[id(old)] = new
                new_name = type(new).__name__
                detail = f"pattern {pat.name}" + (f": {pat.note}" if pat.note else "")
                self.report.entries.append(ConvertEntry(qn, type(old).__name__, new_name, PAYS, detail))
            return n
        return 0

    def _visit_child(self, kids: _Children, i: int, c: str, child: nn.Module) -> None:
        """Plan a module rule or a module swap for one child, or visit it."""
        qn = _qualify(kids.prefix, c)
        rule = module_rule_for(child) if self.fuse else None
        if rule is not None:
            if id(child) in self.done:  # registered twice: the same replacement in this slot too
                if self.build and self.done[id(child)] is not None:
                    self.planned.append(_Planned(kids.module, c, qn, child, self.done[id(child)]))  # type: ignore[arg-type]
            elif not self.apply_rule(qn, child, rule, kids.module, c):
                self.visit(qn, child)
            return
        swap = module_swap_for(type(child))
        if swap is not None and swap.opt_in is not None and not self.opted_in.get(swap.opt_in, False):
            swap = None
        if swap is None or not self.candidate(qn, child):
            if swap is None:
                self.visit(qn, child)
            return
        if id(child) in self.done:
            new = self.done[id(child)]
            if new is not None:
                self.planned.append(_Planned(kids.module, c, qn, child, new))
                kids.final[i] = new
            return
        reason = swap.refuse(child)
        if reason is not None:
            self.done[id(child)] = None
            self.report.entries.append(ConvertEntry(qn, type(child).__name__, "", SKIPPED, reason))
            return
        new = swap.build(child)  # built in a dry run too (cheap): the consumer analysis looks at it
        new.train(child.training)
        if self.build:
            self.planned.append(_Planned(kids.module, c, qn, child, new))
        self.done[id(child)] = new
        kids.final[i] = new
        kids.singles.append((i, swap))


def _plan(
    model: nn.Module,
    include: Optional[List[Selector]],
    exclude: Optional[List[Selector]],
    build: bool,
    fuse: bool = False,
    dropout: bool = False,
    unprofitable: bool = False,
) -> Tuple[List[_Planned], ConvertReport, List[Install]]:
    """Decide every swap; with build=False (a dry run) nothing is planned for putting in the model.

    Returns the planned swaps, the report, and the installs of module rules (module, install) to run after them.
    """
    planner = _Planner(include, exclude, build, fuse, dropout, unprofitable)
    planner.run(model)
    return planner.planned, planner.report, planner.installs


def plan_convert(
    model: nn.Module,
    include: Optional[Iterable[Selector]] = None,
    exclude: Optional[Iterable[Selector]] = None,
    *,
    fuse: bool = False,
    dropout: bool = False,
    unprofitable: bool = False,
) -> ConvertReport:
    """What :func:`convert` would swap, and where it would pay, without changing the model.

    With ``fuse=True`` the structural candidates are probed as :func:`convert` probes them (the model runs on probe
    inputs; its parameters, buffers, training flags and RNG state are put back).

    Args:
        model, include, exclude, fuse, dropout, unprofitable: as for :func:`convert`.

    Returns:
        A :class:`ConvertReport`; ``print(report)`` shows the table.

    Raises:
        TypeError, ValueError: as :func:`convert`, for the same arguments.

    Examples:
        >>> from memsave.operators.convert import plan_convert
        >>> print(plan_convert(model))
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"memsave.plan_convert expects an nn.Module, got {type(model).__name__}")
    _check_unprofitable(unprofitable, "plan_convert")
    _, report, _ = _plan(
        model,
        _matching(model, include, "include"),
        _as_selectors(exclude, "exclude"),
        build=False,
        fuse=fuse,
        dropout=dropout,
        unprofitable=unprofitable,
    )
    return report


def _convert(
    model: nn.Module,
    include: Optional[List[Selector]],
    exclude: Optional[List[Selector]],
    *,
    fuse: bool,
    dropout: bool,
    chunks: Optional[Union[int, str]],
    unprofitable: bool = False,
) -> ConvertReport:
    """Plan, swap, check the state_dict keys, run the rules' installs and chunk the MLPs (the caller undoes all of
    it if anything raises)."""
    keys_before = set(model.state_dict().keys())
    planned, report, installs = _plan(
        model, include, exclude, build=True, fuse=fuse, dropout=dropout, unprofitable=unprofitable
    )
    _check_no_region_replaced(planned)
    for p in planned:
        setattr(p.parent, p.child, p.new)
    keys_after = set(model.state_dict().keys())
    if keys_after != keys_before:
        changed = sorted(keys_before ^ keys_after)[:6]
        raise ValueError(
            f"memsave.convert: the swaps would change state_dict keys ({changed}...), so nothing was converted; a "
            f"registered Sequential pattern must return one module per position keeping that position's keys "
            f"(patterns: {sequential_patterns()})"
        )
    for module, install in installs:
        install(module)
    chunked = chunk_mlps(model, chunks) if chunks is not None else []
    if not planned and not installs and not chunked:
        _warn_unchanged(model, report, fuse)
    return report


def _check_no_region_replaced(planned: List[_Planned]) -> None:
    """Raise WrapConflictError, before any swap, when a swap would replace a memsave region or a module holding one:
    the new module would not be a region, so the recompute the user chose would silently stop."""
    lost = [f"{p.name}.{n}" if n else p.name for p in planned for n in regions_in(p.old)]
    if lost:
        shown = ", ".join(lost[:4]) + (f" and {len(lost) - 4} more" if len(lost) > 4 else "")
        raise WrapConflictError(
            f"memsave.convert: the swaps would replace {shown}, which memsave.wrap (or a plan) made checkpointed "
            "regions; the new modules would not be regions. Nothing was converted. Convert first, then wrap: "
            "memsave.unwrap(model), memsave.convert(model, ...), then memsave.wrap(model, ...) (or convert with "
            "exclude=[...] naming those modules)."
        )


def _check_unprofitable(value: object, where: str) -> None:
    if not isinstance(value, bool):
        raise TypeError(
            f"memsave.{where}: unprofitable must be True or False (make the swaps that keep as many bytes as what "
            f"they replace), got {value!r}"
        )


def _warn_unchanged(model: nn.Module, report: ConvertReport, fuse: bool) -> None:
    """A convert that changed nothing says so, as ``memsave.wrap`` does when it finds no block (a user otherwise
    believes the model saves memory)."""
    if report.entries:
        why = f"every candidate was skipped ({report.count(SKIPPED)}; verbose=True prints why)"
    else:
        why = "no module left that convert swaps (nn.ReLU, nn.LeakyReLU, nn.MaxPool2d; nn.Dropout with dropout=True)"
        why += "" if fuse else "; fuse=True also fuses nn.Sequential runs and the structures it recognises"
    warnings.warn(
        f"memsave.convert: changed nothing in {type(model).__name__}: {why}. memsave.wrap(model) saves memory "
        "in any model by recomputing its blocks.",
        MemsaveWarning,
        stacklevel=4,  # the caller of convert
    )


def convert(
    model: ModuleT,
    include: Optional[Iterable[Selector]] = None,
    exclude: Optional[Iterable[Selector]] = None,
    verbose: bool = False,
    *,
    fuse: bool = False,
    dropout: bool = False,
    mlp_chunks: Optional[Union[int, str]] = None,
    unprofitable: bool = False,
) -> ModuleT:
    """Swap memory-efficient modules into ``model``, recursively and in place; state_dict keys do not change.

    Replaces ``nn.ReLU``, ``nn.LeakyReLU`` and ``nn.MaxPool2d`` (exact types) by their :mod:`memsave.nn`
    counterparts; outputs, gradients and buffers stay bitwise equal to eager on CPU. ``fuse=True`` also replaces
    runs of ``nn.Sequential`` children matching a registered pattern by fused modules and the structures it
    recognises by what they compute, each checked on a probe (equal up to float rounding), ``dropout=True`` also
    swaps ``nn.Dropout`` (other random bits than torch's). A swap that would not lower the bytes kept for backward is
    not made unless ``unprofitable=True``. See the module docstring for where a mask saves memory and where it does
    not.

    Args:
        model: the model; modified in place.
        include: if given, only modules matching one of these are converted: module classes (``isinstance``) or
            qualified-name patterns as ``named_modules()`` prints them (shell-style, e.g. ``"features.*"``). A
            Sequential pattern needs all its modules included.
        exclude: modules matching one of these (same forms) are left alone, and patterns touching them skipped.
        verbose: print the :class:`ConvertReport`: each swap and whether its mask pays.
        fuse: also apply the fused Sequential patterns (BatchNorm -> activation, LayerNorm -> Linear,
            Linear -> activation -> Linear, ...), the structures recognised in any model (RMS norms and LayerNorms
            fused into the Linears that read them, gated MLPs, activation -> Linear, a causal LM's loss without
            logits; see the module docstring) and the timm ViT rules: gradients equal up to float rounding, not
            bitwise. What is not converted is reported as skipped, with why.
        dropout: also swap ``nn.Dropout``: same keep probability and scaling, other random bits than torch's.
        mlp_chunks: also run the MLPs slice by slice along the sequence (every gated MLP it recognises, GPT-2's,
            BERT's and timm ViT's; see ``model_zoo.py``), each slice recomputed in its own backward
            (:func:`memsave.chunked`): an int number of slices, or ``"auto"`` (from the sequence length at each
            call: ``ceil(length / max(hidden, 256))`` slices). Gradients equal up to float rounding. ``None``
            (default): unchunked.
        unprofitable: also make the swaps that keep as many bytes for backward as what they replace, or more (a
            ReLU mask whose consumer keeps the ReLU's output anyway: it pays only inside a checkpointed region).

    Returns:
        ``model`` itself, typed as the class it was given (``memsave.convert(llama).generate(...)`` type-checks).

    Raises:
        TypeError: ``model`` is not an nn.Module, include/exclude hold something else than classes and strings, or
            ``unprofitable`` is not a bool.
        ValueError: an include pattern matches no module of the model, or a registered pattern broke the state_dict
            keys. Whatever fails (a rule, a pattern, an install), the model is left exactly as it was: module tree,
            forwards, parameters, buffers and hooks.
        WrapConflictError: a swap would replace a module that :func:`memsave.wrap` or a plan made a region (or one
            holding a region), whose recompute would be lost: convert before wrapping. Regions around swapped modules
            (a wrapped block whose ReLUs are swapped) are fine and stay.

    Warns:
        MemsaveWarning: nothing was changed (no module it swaps, every candidate skipped, nothing to chunk), as
            :func:`memsave.wrap` warns when it finds no block.

    Examples:
        >>> model = memsave.convert(torchvision.models.vgg16(), verbose=True)
        >>> llama = memsave.convert(transformers.LlamaForCausalLM(config), fuse=True)
        >>> llama(input_ids, labels=input_ids).loss.backward()         # no logits built; .logits is [batch, seq, 0]
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"memsave.convert expects an nn.Module, got {type(model).__name__}")
    _check_unprofitable(unprofitable, "convert")
    chunks = check_chunks(mlp_chunks, "convert: mlp_chunks") if mlp_chunks is not None else None
    selectors = _matching(model, include, "include"), _as_selectors(exclude, "exclude")
    with all_or_nothing(model):  # a rule, a pattern or an install that fails leaves the model as it was
        report = _convert(model, *selectors, fuse=fuse, dropout=dropout, chunks=chunks, unprofitable=unprofitable)
    if verbose:
        print(report.summary())
    return model
