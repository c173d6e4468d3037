"""Find a model's repeated blocks: the modules that one-line checkpointing (:func:`memsave.wrap` with no policy,
the ``checkpoint:blocks`` strategy) turns into regions.

:func:`find_blocks` tries three sources, in order, and returns the first non-empty answer:

1. **The model's own list.** A model with a ``checkpoint_blocks()`` method (memsave's benchmark models,
   :mod:`memsave.models`) names its blocks itself.
2. **Hugging Face's convention.** ``_no_split_modules`` — the class names that accelerate's device maps and FSDP's
   auto-wrap policy keep whole — read from the model and every submodule that has it (a PEFT model holds the
   transformers model inside). The blocks are the modules whose class name is listed; if some of them sit in a
   ``ModuleList``/``Sequential``/``ModuleDict``, only those (a model's embeddings are often listed too, but they are
   held by an attribute, not by a list of layers).
3. **The structure.** A *family* is a class together with its *members*: the modules of exactly that class that
   have children (never a single leaf layer) and are *held*: directly in a ``ModuleList``/``Sequential``/
   ``ModuleDict`` (subclasses included; a model that is itself one holds its children), or as attributes of a module
   beside another non-container module of their class (RegNet's ``s1.b1, s1.b2``; Inception's ``Mixed_5b``,
   ``Mixed_5c``). A *run block* is a non-container module with children whose parent holds only modules of its
   class: in a container, or as attributes named by one prefix and a number (``b1, b2``; not Inception's side by
   side branches); experts of a mixture of experts (a holder or class named like ``expert``) are never a run.
   Families nest -- stages hold blocks, blocks hold layers -- and give way:

   * F is a family of **stages** when the run blocks inside its members hold at least half of its parameters.
     ConvNeXt and Swin stages give way to their blocks, DenseNet's dense blocks to their dense layers,
     EfficientNet's plain ``Sequential`` stages and RegNet's ``RegStage`` to theirs.
   * G is a family of **parts** when its members nested inside members of another family F hold at least half of
     G's parameters, unless F is a family of stages and they are its run blocks: the ``Conv2dNormActivation``
     layers and squeeze-excitation modules inside MobileNet's inverted residual blocks.

   Of the families left (all of them, if every one gave way), the largest wins: the most parameters held by its
   members (each parameter counted once), then the most members, then the one whose first member comes first in
   ``named_modules()`` order. When the winner's members lie in a family of stages, every stage of that family
   gives its own run of blocks at the same place, whatever their class (**one family per stage**): EfficientNetV2's
   ConvBnAct, EdgeResidual and InvertedResidual stages all give their blocks, and a stage of one block (RegNet's
   ``s1``) gives that block. Parameter counts are element counts, so a model on the ``meta`` device works too.

In each case a member nested inside another member is dropped (the outermost one stays), and the names come in
``named_modules()`` order. A model with no family (an ``nn.Sequential`` of single layers) has no blocks: the
answer is empty, and ``memsave.wrap(model)`` warns that it checkpoints nothing.

Examples:
    >>> model = nn.Sequential(nn.Linear(8, 8), nn.Sequential(nn.Linear(8, 8), nn.GELU()),
    ...                       nn.Sequential(nn.Linear(8, 8), nn.GELU()), nn.Linear(8, 2))
    >>> find_blocks(model)          # the family of non-leaf Sequentials, not the Linear layers
    ['1', '2']
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections import Counter
from dataclasses import dataclass
from typing import Dict, Iterable, List, Set, Tuple

from torch import nn

__all__ = ["BlockChoice", "explain_blocks", "find_blocks"]

_log = logging.getLogger(__name__)

_CONTAINERS = (nn.ModuleList, nn.Sequential, nn.ModuleDict)


@dataclass
class BlockChoice:
    """What :func:`find_blocks` answers for a model, and which rule chose it.

    Attributes:
        names: the blocks' qualified names (what :func:`find_blocks` returns).
        source: the rule that answered: ``"checkpoint_blocks"`` (the model's own list), ``"_no_split_modules"``
            (Hugging Face's convention), ``"structure"``, or ``"none"`` (no blocks).
        reason: one sentence saying why these modules (the classes, the stages opened, the parts left out).
    """

    names: List[str]
    source: str
    reason: str


def explain_blocks(model: nn.Module) -> BlockChoice:
    """:func:`find_blocks`' answer with the rule that chose it: for checking what ``memsave.wrap(model)`` will
    checkpoint and why (``find_blocks`` also logs the reason on the ``memsave.recompute.blocks`` logger at DEBUG).

    Args:
        model: any ``nn.Module``; it is only inspected.

    Returns:
        A :class:`BlockChoice` (``names``, ``source``, ``reason``).

    Raises:
        TypeError: ``model`` is not an ``nn.Module``.
        ValueError: ``model.checkpoint_blocks()`` names a submodule that does not exist.

    Examples:
        >>> choice = memsave.recompute.blocks.explain_blocks(timm.create_model("regnety_002"))
        >>> choice.source, len(choice.names), choice.names[:2]
        ('structure', 13, ['s1.b1', 's2.b1'])
        >>> print(choice.reason)   # structure: 13 blocks; the largest family of repeated blocks is Bottleneck ...
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"find_blocks: model must be an nn.Module, got {type(model).__name__}")
    modules = dict(model.named_modules())
    own = getattr(model, "checkpoint_blocks", None)
    if callable(own):
        names = list(dict.fromkeys(own()))
        unknown = [n for n in names if n not in modules]
        if unknown:
            raise ValueError(
                f"find_blocks: {type(model).__name__}.checkpoint_blocks() names {', '.join(unknown)}, "
                "which are not submodules of the model"
            )
        if names:
            return BlockChoice(_outermost(names), "checkpoint_blocks", "the model's own checkpoint_blocks()")
    names, classes = _no_split_blocks(model, _held_in_container(model))
    if names:
        listed = ", ".join(sorted({type(modules[n]).__name__ for n in names}))
        why = f"Hugging Face's _no_split_modules lists {listed}" + (" (those held in a layer list)" if classes else "")
        return BlockChoice(_outermost(names), "_no_split_modules", why)
    names, why = _structure(model)
    return BlockChoice(names, "structure" if names else "none", why)


def find_blocks(model: nn.Module) -> List[str]:
    """The qualified names of ``model``'s repeated blocks (transformer layers, ResNet bottlenecks, ViT encoder
    blocks, ConvNeXt/Swin blocks, DenseNet dense layers, RegNet blocks, EfficientNet blocks of every stage): what
    ``memsave.wrap(model)`` checkpoints.

    The rule, in order (the first that finds something answers; details and the exact thresholds in
    :mod:`memsave.recompute.blocks`; :func:`explain_blocks` says which rule answered and why): the model's own
    ``checkpoint_blocks()``; the modules whose class is in a Hugging Face ``_no_split_modules`` list (those held
    in a layer list, when some are); else the structure: the largest *family* of same-class, non-leaf modules held
    in a ``ModuleList``/``Sequential``/``ModuleDict`` or as attributes beside others of their class -- largest by
    parameters covered, then by member count, then first in module order -- after a family of stages has given
    way to the runs of blocks making up at least half of its parameters (every stage to its own run, whatever the
    blocks' class there: one family per stage), and a family of parts (a block's conv-norm-activation layers) to
    the blocks holding it.

    Args:
        model: any ``nn.Module``; it is only inspected (no forward pass, nothing is modified).

    Returns:
        Qualified module names in ``named_modules()`` order, none nested in another; empty when the model has no
        repeated non-leaf blocks (e.g. an ``nn.Sequential`` of single layers).

    Raises:
        TypeError: ``model`` is not an ``nn.Module``.
        ValueError: ``model.checkpoint_blocks()`` names a submodule that does not exist.

    Examples:
        >>> import torchvision
        >>> memsave.find_blocks(torchvision.models.resnet18())[:3]
        ['layer1.0', 'layer1.1', 'layer2.0']
        >>> memsave.find_blocks(transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=2)))
        ['transformer.h.0', 'transformer.h.1']
    """
    choice = explain_blocks(model)
    _log.debug("find_blocks(%s): %d blocks; %s", type(model).__name__, len(choice.names), choice.reason)
    return choice.names


def _outermost(names: Iterable[str]) -> List[str]:
    """``names`` less any nested inside another of them (``""``, the root, contains everything), order kept."""
    names = list(names)
    chosen = set(names)
    return [n for n in names if not _inside(n, chosen)]


def _held_in_container(model: nn.Module) -> Set[str]:
    """Qualified names of the modules held directly in a ModuleList/Sequential/ModuleDict."""
    held: Set[str] = set()
    for name, module in model.named_modules():
        if isinstance(module, _CONTAINERS):
            prefix = f"{name}." if name else ""
            held.update(prefix + child for child, _ in module.named_children())
    return held


def _no_split_blocks(model: nn.Module, held: Set[str]) -> Tuple[List[str], bool]:
    """The modules of a class listed in a ``_no_split_modules``, and whether they are only those in a layer list."""
    classes: Set[str] = set()
    for module in model.modules():
        listed = getattr(module, "_no_split_modules", None)
        if isinstance(listed, str):
            classes.add(listed)
        elif listed:
            with contextlib.suppress(TypeError):  # not an iterable: not Hugging Face's convention
                classes.update(c for c in listed if isinstance(c, str))
    if not classes:
        return [], False
    matched = [n for n, m in model.named_modules() if type(m).__name__ in classes]
    in_lists = [n for n in matched if n in held]
    return (in_lists, True) if in_lists else (matched, False)


def _param_ids(modules: Iterable[nn.Module]) -> Dict[int, int]:
    """id -> element count of every parameter under ``modules``, each counted once."""
    out: Dict[int, int] = {}
    for module in modules:
        for p in module.parameters():
            out.setdefault(id(p), p.numel())
    return out


def _inside(name: str, outer: Set[str]) -> bool:
    """Whether the module ``name`` is a strict descendant of one named in ``outer``."""
    if not name:
        return False
    if "" in outer:
        return True
    parts = name.split(".")
    return any(".".join(parts[:i]) in outer for i in range(1, len(parts)))


def _has_children(module: nn.Module) -> bool:
    return next(module.children(), None) is not None


def _parent(name: str) -> str:
    return name.rpartition(".")[0]


class _Tree:
    """The model's modules by qualified name, in ``named_modules()`` order (a shared module under its first name)."""

    def __init__(self, model: nn.Module) -> None:
        self.modules: Dict[str, nn.Module] = dict(model.named_modules())
        self.position = {name: i for i, name in enumerate(self.modules)}

    def children(self, name: str) -> List[str]:
        prefix = f"{name}." if name else ""
        return [prefix + c for c, _ in self.modules[name].named_children() if prefix + c in self.modules]

    def held(self) -> Set[str]:
        """Modules held in a container, or beside another non-leaf module of their class that is not a container
        itself (blocks held as attributes, RegNet's ``s1.b1, s1.b2``; not a model's ``features`` and ``classifier``)."""
        held = _held_in_container(self.modules[""])
        for name in self.modules:
            kids = [k for k in self.children(name) if _has_children(self.modules[k])]
            kids = [k for k in kids if not isinstance(self.modules[k], _CONTAINERS)]  # stages' lists: not blocks
            count = Counter(type(self.modules[k]) for k in kids)
            held.update(k for k in kids if count[type(self.modules[k])] >= 2)
        return held

    def is_run_block(self, name: str) -> bool:
        """Whether ``name`` is a block of a run: a non-leaf module, not itself a container, whose parent holds only
        modules of its class (a stage's blocks, in a container or as attributes; one block is a run too). Experts of
        a mixture of experts (a holder or class named like ``experts``) run side by side, not one after another.
        A holder that is not a container must name them by number (``b1``, ``b2``)."""
        module = self.modules[name]
        if not name or isinstance(module, _CONTAINERS) or not _has_children(module):
            return False
        holder = _parent(name)
        if "expert" in holder.rpartition(".")[2].lower() or "expert" in type(module).__name__.lower():
            return False
        kids = list(self.modules[holder].named_children())
        if not all(type(c) is type(module) for _, c in kids):
            return False
        if isinstance(self.modules[holder], _CONTAINERS):
            return True
        # Held as attributes: a run only when numbered (RegNet's b1, b2, ...); Inception's branch1x1, branch5x5_1,
        # ... are of one class too, but side by side.
        numbered = [re.fullmatch(r"(.*?)(\d+)", child) for child, _ in kids]
        return all(numbered) and len({m.group(1) for m in numbered if m}) == 1

    def count(self, names: Iterable[str]) -> int:
        """Parameter elements under the modules ``names``, each parameter counted once."""
        return sum(_param_ids(self.modules[n] for n in names).values())


@dataclass
class _Families:
    """Same-class non-leaf held modules (outermost only), and which of the model's modules are blocks of runs."""

    members: Dict[type, List[str]]
    runs: Set[str]

    def runs_in(self, tree: _Tree, cls: type) -> List[str]:
        """The outermost run blocks inside the members of ``cls``, in module order."""
        outer = set(self.members[cls])
        return _outermost(n for n in tree.modules if n in self.runs and _inside(n, outer))


def _families(tree: _Tree) -> _Families:
    held = tree.held()
    families: Dict[type, List[str]] = {}
    for name, module in tree.modules.items():
        if name in held and _has_children(module):
            families.setdefault(type(module), []).append(name)
    runs = {n for n in tree.modules if tree.is_run_block(n)}
    return _Families({cls: _outermost(names) for cls, names in families.items()}, runs)


def _structure(model: nn.Module) -> Tuple[List[str], str]:
    """The structure rule (see the module docstring): the chosen blocks and the sentence saying why."""
    tree = _Tree(model)
    fam = _families(tree)
    if not fam.members:
        return [], "no module with children is held in a layer list or beside another module of its class"
    total = {cls: tree.count(names) for cls, names in fam.members.items()}
    runs = {cls: fam.runs_in(tree, cls) for cls in fam.members}
    stages = {cls for cls in fam.members if runs[cls] and 2 * tree.count(runs[cls]) >= total[cls]}
    parts = _parts(tree, fam, stages, total)
    kept = [cls for cls in fam.members if cls not in stages | parts] or list(fam.members)
    winner = max(kept, key=lambda c: (total[c], len(fam.members[c]), -tree.position[fam.members[c][0]]))
    chosen = set(fam.members[winner])
    opened = [c for c in stages if c is not winner and any(_inside(n, set(fam.members[c])) for n in chosen)]
    for cls in opened:  # one family per stage: each stage's own run of blocks, whatever their class
        chosen.update(_stage_runs(fam, cls, fam.members[winner]))
    names = _outermost(sorted(chosen, key=tree.position.__getitem__))
    reason = f"structure: {len(names)} blocks; the largest family of repeated blocks is {winner.__name__}"
    reason += f" ({len(fam.members[winner])} held in a layer list or beside others of their class)"
    added = sorted({type(tree.modules[n]).__name__ for n in names} - {winner.__name__})
    if opened:
        reason += f", found inside the stages {', '.join(sorted(c.__name__ for c in opened))}, which give way to"
        reason += " the run of blocks each holds" + (
            f" (also {', '.join(added)}: one family per stage)" if added else ""
        )
    if parts:
        reason += f"; {', '.join(sorted(c.__name__ for c in parts))} are parts of blocks"
    return names, reason


def _stage_runs(fam: _Families, stage: type, blocks: List[str]) -> List[str]:
    """The run blocks of every member of the family ``stage`` held where ``blocks`` are held in theirs (the same
    path from the stage to the run's holder: ConvNeXt's ``blocks``, RegNet's and EfficientNet's stage itself), none
    holding one of ``blocks``."""
    paths = {_parent(b)[len(s) :] for s in fam.members[stage] for b in blocks if _inside(b, {s})}
    return [
        r
        for s in fam.members[stage]
        for r in sorted(fam.runs)
        if _inside(r, {s}) and _parent(r)[len(s) :] in paths and not any(_inside(b, {r}) for b in blocks)
    ]


def _parts(tree: _Tree, fam: _Families, stages: Set[type], total: Dict[type, int]) -> Set[type]:
    """The families of parts: those with at least half of their parameters in members of another family, unless
    they are the run blocks of a family of stages."""
    parts: Set[type] = set()
    member_sets = {cls: set(names) for cls, names in fam.members.items()}
    for outer in fam.members:
        for inner in fam.members:
            nested = [n for n in fam.members[inner] if _inside(n, member_sets[outer])] if inner is not outer else []
            if not nested or (outer in stages and any(n in fam.runs for n in nested)):
                continue
            if 2 * tree.count(nested) >= total[inner]:
                parts.add(inner)
    return parts
