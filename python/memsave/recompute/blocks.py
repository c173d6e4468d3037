"""Find a model's repeated blocks: the modules that one-line checkpointing (:func:`memsave.wrap` with no policy,
the ``checkpoint:blocks`` strategy) turns into regions.

:func:`find_blocks` tries these sources, in order, and returns the first non-empty answer:

1. **The model's own list.** A model with a ``checkpoint_blocks()`` method (memsave's benchmark models,
   :mod:`memsave.models`) names its blocks itself.
2. **Hugging Face transformers' checkpoint units.** Every ``GradientCheckpointingLayer`` (the layers
   ``model.activation_checkpointing_enable()`` checkpoints: decoder layers, Wav2Vec2's convolutional feature encoder
   layers beside its encoder layers, SegFormer's and Swin's blocks). For a ``supports_gradient_checkpointing`` model
   from before that class, the layers it checkpoints itself: the members of the layer lists held by its modules
   with a ``gradient_checkpointing`` switch attribute (its encoder, its feature encoder).
3. **timm's checkpoint units.** In a model whose class has ``set_grad_checkpointing``, the blocks its modules with a
   ``grad_checkpointing`` switch attribute run through ``checkpoint_seq``/``checkpoint``: the members of their layer
   lists (``blocks``, ``stages``, ``layer1``...), or their own children when all of one class (RegNet's stages).
4. **diffusers' checkpoint units.** In a ``ModelMixin`` with ``_supports_gradient_checkpointing``, the members of
   the layer lists held by its modules with a ``gradient_checkpointing`` switch attribute (transformer blocks,
   ResNet blocks).
5. **The structure**, below.

Rules 2-4 are the units a model declares for its own checkpointing switch; ``memsave.wrap(model)`` checkpoints them,
and its peak is at or below the switch's (tests/recompute/test_architectures.py measures it). A unit that is a plain
``ModuleList``/``Sequential``/``ModuleDict`` (a timm stage of blocks: ``checkpoint_seq(self.stages, x)``) gives its
blocks, so MobileViT's MobileNetV2 blocks are blocks beside its transformer blocks. A unit holding other units (a
Swin stage and its blocks) gives way to them when they hold at least half of its parameters; otherwise it stays
whole and the ones inside it are dropped. These classes are recognised by name along the class hierarchy: memsave
imports neither transformers, timm nor diffusers. Hugging Face's ``_no_split_modules`` is not a source: it names
what a device map keeps on one device (SegFormer's whole stages), not what to checkpoint.

**The structure.** A *family* is a class together with its *members*: the modules of exactly that class that have
children (never a single leaf layer) and are *held*: directly in a ``ModuleList``/``Sequential``/``ModuleDict``
(subclasses included; a model that is itself one holds its children), or as attributes of a module beside another
non-container module of their class (RegNet's ``s1.b1, s1.b2``; Inception's ``Mixed_5b``, ``Mixed_5c``). A *run
block* is a non-container module with children whose parent holds only modules of its class: in a container, or as
attributes named by one prefix and a number (``b1, b2``; not Inception's side by side branches); experts of a
mixture of experts (a holder or class named like ``expert``) are never a run. Families nest -- stages hold blocks,
blocks hold layers -- and give way:

* F is a family of **stages** when the run blocks inside its members hold at least half of its parameters and
  each member holds them in one place (the member itself, or one list inside it). ConvNeXt and Swin stages give way
  to their blocks, DenseNet's dense blocks to their dense layers, EfficientNet's plain ``Sequential`` stages and
  RegNet's ``RegStage`` to theirs. A member whose runs sit in two or more of its parts is a **multi-branch block**
  (GoogLeNet's Inception module, whose branches are concatenated): it stays one block.
* G is a family of **parts** when its members nested inside members of another family F hold at least half of
  G's parameters, unless F is a family of stages and they are its run blocks: the ``Conv2dNormActivation``
  layers and squeeze-excitation modules inside MobileNet's inverted residual blocks, the convolutions of an
  Inception module's branches.

Of the families left (all of them, if every one gave way), less a model's **auxiliary heads** (a class or every
member named like ``aux``: GoogLeNet's training-time side classifiers, large in parameters but small in
activations) unless nothing else is left, the largest wins: the most parameters held by its members (each
parameter counted once), then the most members, then the one whose first member comes first in
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

import logging
import re
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, List, Optional, Set, Tuple

from torch import nn

__all__ = ["BlockChoice", "explain_blocks", "find_blocks"]

_log = logging.getLogger(__name__)

_CONTAINERS = (nn.ModuleList, nn.Sequential, nn.ModuleDict)


@dataclass
class BlockChoice:
    """What :func:`find_blocks` answers for a model, and which rule chose it.

    Attributes:
        names: the blocks' qualified names (what :func:`find_blocks` returns).
        source: the rule that answered: ``"checkpoint_blocks"`` (the model's own list), ``"transformers"``,
            ``"timm"`` or ``"diffusers"`` (the units of the library's own checkpointing switch), ``"structure"``,
            or ``"none"`` (no blocks).
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
        ('timm', 13, ['s1.b1', 's2.b1'])
        >>> print(choice.reason)
        timm: 13 blocks that its set_grad_checkpointing checkpoints (Bottleneck)
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"find_blocks: model must be an nn.Module, got {type(model).__name__}")
    own = getattr(model, "checkpoint_blocks", None)
    if callable(own):
        modules = dict(model.named_modules())
        names = list(dict.fromkeys(own()))
        unknown = [n for n in names if n not in modules]
        if unknown:
            raise ValueError(
                f"find_blocks: {type(model).__name__}.checkpoint_blocks() names {', '.join(unknown)}, "
                "which are not submodules of the model"
            )
        if names:
            return BlockChoice(_outermost(names), "checkpoint_blocks", "the model's own checkpoint_blocks()")
    tree = _Tree(model)
    for source, rule in _DECLARED:
        found = rule(tree)
        if found is not None:
            units = _opened(tree, found[0])
            names = _resolve_nested(tree, units)
            if names:
                return BlockChoice(names, source, _declared_reason(tree, source, found[1], units, names))
    names, why = _structure(model)
    return BlockChoice(names, "structure" if names else "none", why)


def find_blocks(model: nn.Module) -> List[str]:
    """The qualified names of ``model``'s repeated blocks (transformer layers, ResNet bottlenecks, ViT encoder
    blocks, ConvNeXt/Swin blocks, DenseNet dense layers, RegNet blocks, EfficientNet blocks of every stage,
    Inception modules): what ``memsave.wrap(model)`` checkpoints.

    The rules, in order (the first that finds something answers; details and the exact thresholds in
    :mod:`memsave.recompute.blocks`; :func:`explain_blocks` says which rule answered and why):

    1. the model's own ``checkpoint_blocks()``;
    2. the units of Hugging Face transformers' checkpointing switch: every ``GradientCheckpointingLayer``, or, in a
       ``supports_gradient_checkpointing`` model from before that class, the members of the layer lists held by
       its modules with a ``gradient_checkpointing`` attribute;
    3. the units of timm's ``set_grad_checkpointing``: the members of the layer lists (or the children, all of
       one class) of its modules with a ``grad_checkpointing`` attribute;
    4. the units of diffusers' checkpointing switch (``_supports_gradient_checkpointing``): the members of the
       layer lists held by its modules with a ``gradient_checkpointing`` attribute;
    5. the structure: the largest *family* of same-class, non-leaf modules held in a
       ``ModuleList``/``Sequential``/``ModuleDict`` or as attributes beside others of their class -- largest by
       parameters covered, then by member count, then first in module order -- after a family of stages has given
       way to the runs of blocks making up at least half of its parameters (every stage to its own run, whatever
       the blocks' class there: one family per stage; a multi-branch block such as an Inception module, whose
       runs sit in several branches, is no stage), and a family of parts (a block's conv-norm-activation layers)
       to the blocks holding it; auxiliary heads (named like ``aux``) win only when nothing else is left.

    In rules 2-4 a unit that is a plain container gives its members, and a unit holding other units gives way to
    them when they hold at least half of its parameters. ``_no_split_modules`` (a device-map unit) is not read.

    Args:
        model: any ``nn.Module``; it is only inspected (no forward pass, nothing is modified, nothing imported).

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
        >>> memsave.find_blocks(torchvision.models.googlenet(init_weights=False))[:2]
        ['inception3a', 'inception3b']
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


# ------------------------------------------------------------------------ the units a model's own switch declares
def _is_from(cls: type, name: str, package: str) -> bool:
    """Whether ``cls`` is, or derives from, a class called ``name`` defined in ``package`` (by name: no import)."""
    return any(c.__name__ == name and c.__module__.partition(".")[0] == package for c in cls.__mro__)


def _within(tree: "_Tree", is_root: Callable[[nn.Module], bool]) -> Set[str]:
    """The modules inside (or being) a module for which ``is_root`` holds."""
    roots = {n for n, m in tree.modules.items() if is_root(m)}
    return {n for n in tree.modules if n in roots or _inside(n, roots)}


def _switch_units(tree: "_Tree", is_root: Callable[[nn.Module], bool], flag: str) -> List[str]:
    """The members of the layer lists that a library's switch holders (modules inside a root, with the boolean
    instance attribute ``flag``) run through checkpoint; a holder without such a list, its children when they are
    all non-leaf modules of one class (timm's ``RegStage``: ``checkpoint_seq(self.children(), x)``)."""
    units: List[str] = []
    for name in sorted(_within(tree, is_root), key=tree.position.__getitem__):
        if isinstance(tree.modules[name].__dict__.get(flag), bool):
            units += tree.sequence(name)
    return units


def _hf_layers(tree: "_Tree") -> Optional[Tuple[List[str], str]]:
    layers = [n for n, m in tree.modules.items() if _is_from(type(m), "GradientCheckpointingLayer", "transformers")]
    if layers:
        return layers, "that are Hugging Face GradientCheckpointingLayers"

    def root(m: nn.Module) -> bool:
        supported = getattr(m, "supports_gradient_checkpointing", False) is True
        return supported and _is_from(type(m), "PreTrainedModel", "transformers")

    units = _switch_units(tree, root, "gradient_checkpointing")
    return (units, "in the layer lists of the modules with a gradient_checkpointing switch") if units else None


def _timm_units(tree: "_Tree") -> Optional[Tuple[List[str], str]]:
    def root(m: nn.Module) -> bool:
        return callable(getattr(type(m), "set_grad_checkpointing", None))

    units = _switch_units(tree, root, "grad_checkpointing")
    return (units, "that its set_grad_checkpointing checkpoints") if units else None


def _diffusers_units(tree: "_Tree") -> Optional[Tuple[List[str], str]]:
    def root(m: nn.Module) -> bool:
        supported = getattr(m, "_supports_gradient_checkpointing", False) is True
        return supported and _is_from(type(m), "ModelMixin", "diffusers")

    units = _switch_units(tree, root, "gradient_checkpointing")
    return (units, "in the layer lists of the modules with a gradient_checkpointing switch") if units else None


#: The libraries' own checkpoint units, in the order :func:`find_blocks` reads them.
_DECLARED: Tuple[Tuple[str, Callable[["_Tree"], Optional[Tuple[List[str], str]]]], ...] = (
    ("transformers", _hf_layers),
    ("timm", _timm_units),
    ("diffusers", _diffusers_units),
)


def _declared_reason(tree: "_Tree", source: str, how: str, units: List[str], names: List[str]) -> str:
    """The sentence of :class:`BlockChoice` for a library's units: the classes chosen, those that gave way."""
    classes = ", ".join(sorted({type(tree.modules[n]).__name__ for n in names}))
    reason = f"{source}: {len(names)} blocks {how} ({classes})"
    chosen = set(names)
    outer = sorted(
        {type(tree.modules[u]).__name__ for u in units if u not in chosen and any(_inside(n, {u}) for n in names)}
    )
    return reason + (f"; {', '.join(outer)} gave way to the units inside" if outer else "")


def _opened(tree: "_Tree", names: Iterable[str]) -> List[str]:
    """``names`` with every container replaced by its non-leaf members (a timm stage of blocks gives its blocks)."""
    out: List[str] = []
    for name in names:
        if isinstance(tree.modules[name], _CONTAINERS):
            out += _opened(tree, tree.nonleaf_children(name))
        else:
            out.append(name)
    return list(dict.fromkeys(out))


def _resolve_nested(tree: "_Tree", names: List[str]) -> List[str]:
    """One level of ``names``: a unit holding others gives way to them when they hold at least half of its
    parameters (a Swin stage to its blocks), else it stays and they go. Innermost first, so levels chain."""
    kept = set(names)
    for name in sorted(kept, key=lambda n: (-len(n.split(".")) if n else 0, tree.position[n])):
        if name not in kept:
            continue
        below = f"{name}." if name else ""
        inside = sorted((n for n in kept if n != name and n.startswith(below)), key=tree.position.__getitem__)
        inner = _outermost(inside)
        if not inner:
            continue
        if 2 * tree.count(inner) >= tree.count([name]):
            kept.discard(name)
        else:
            kept.difference_update(inside)
    return _outermost(sorted(kept, key=tree.position.__getitem__))


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

    def sequence(self, name: str) -> List[str]:
        """The blocks a switch holder ``name`` runs one after another: a container's non-leaf members; else the
        non-leaf members of its container children that hold only non-leaf modules, or two or more (``blocks``,
        ``stages``, ``layer1``...; a leaf between them, EfficientFormer's ``Flat``, is no block; a head of single
        layers around one pooling module is no list of blocks); else its own children when they are all non-leaf
        and of one class."""
        module = self.modules[name]
        if isinstance(module, _CONTAINERS):
            return self.nonleaf_children(name)
        lists = [k for k in self.children(name) if isinstance(self.modules[k], _CONTAINERS)]
        lists = [k for k in lists if self.children(k) == self.nonleaf_children(k) or len(self.nonleaf_children(k)) > 1]
        members = [g for k in lists for g in self.nonleaf_children(k)]
        if members:
            return members
        kids = self.children(name)
        same = kids and all(_has_children(self.modules[k]) for k in kids)
        return kids if same and len({type(self.modules[k]) for k in kids}) == 1 else []

    def nonleaf_children(self, name: str) -> List[str]:
        return [k for k in self.children(name) if _has_children(self.modules[k])]

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

    def branched(self, cls: type, runs: List[str]) -> bool:
        """Whether a member of ``cls`` holds its ``runs`` in two or more places (side by side branches, as an
        Inception module's): a multi-branch block, not a stage."""
        return any(len({_parent(r) for r in runs if _inside(r, {m})}) >= 2 for m in self.members[cls])


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
    stages = {
        cls
        for cls in fam.members
        if runs[cls] and 2 * tree.count(runs[cls]) >= total[cls] and not fam.branched(cls, runs[cls])
    }
    parts = _parts(tree, fam, stages, total)
    kept = [cls for cls in fam.members if cls not in stages | parts] or list(fam.members)
    aux = [cls for cls in kept if _auxiliary(cls, fam.members[cls])]
    kept = [cls for cls in kept if cls not in aux] or kept
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
    if aux and winner not in aux:
        reason += f"; {', '.join(sorted(c.__name__ for c in aux))} are auxiliary heads"
    return names, reason


def _auxiliary(cls: type, members: List[str]) -> bool:
    """Whether a family is a model's auxiliary heads (GoogLeNet's ``aux1``, ``aux2``: a class or every member named
    like ``aux``): training-only side outputs, large in parameters but not in activations."""
    return "aux" in cls.__name__.lower() or all("aux" in n.rpartition(".")[2].lower() for n in members)


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
