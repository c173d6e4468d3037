"""Find a model's repeated blocks: the modules that one-line checkpointing (:func:`memsave.wrap` with no policy,
the ``checkpoint:blocks`` strategy) turns into regions.

:func:`find_blocks` tries three sources, in order, and returns the first non-empty answer:

1. **The model's own list.** A model with a ``checkpoint_blocks()`` method (memsave's benchmark models,
   :mod:`memsave.measurement.models`) names its blocks itself.
2. **Hugging Face's convention.** ``_no_split_modules`` — the class names that accelerate's device maps and FSDP's
   auto-wrap policy keep whole — read from the model and every submodule that has it (a PEFT model holds the
   transformers model inside). The blocks are the modules whose class name is listed; if some of them sit in a
   ``ModuleList``/``Sequential``/``ModuleDict``, only those (a model's embeddings are often listed too, but they are
   held by an attribute, not by a list of layers).
3. **The structure.** A *family* is a class together with its *members*: the modules of exactly that class that
   have children (never a single leaf layer) and are held directly in a ``ModuleList``/``Sequential``/
   ``ModuleDict`` (subclasses included; a model that is itself one holds its children). Families nest — stages
   hold blocks, blocks hold layers — so for every pair where members of family G lie inside members of family F
   (G's *nested* members), one of the two gives way:

   * F is a family of **stages** and gives way to G when G's class is not itself a ``Sequential``/``ModuleList``/
     ``ModuleDict`` subclass, every container holding a nested G member holds only G's class (a run of blocks),
     and the nested G members hold at least half of F's parameters. ConvNeXt and Swin stages give way to their
     blocks, DenseNet's dense blocks to their dense layers, EfficientNet's plain ``Sequential`` stages to their
     MBConv blocks.
   * Otherwise G is a family of **parts** and gives way to F when its nested members hold at least half of G's
     parameters: the ``Conv2dNormActivation`` layers and squeeze-excitation modules inside MobileNet's inverted
     residual blocks.

   Of the families left (all of them, if every one gave way), the largest wins: the most parameters held by its
   members (each parameter counted once), then the most members, then the one whose first member comes first in
   ``named_modules()`` order. Parameter counts are element counts, so a model on the ``meta`` device works too.

In each case a member nested inside another member is dropped (the outermost one stays), and the names come in
``named_modules()`` order. A model with no family (an ``nn.Sequential`` of single layers) has no blocks: the
answer is empty, and ``memsave.wrap(model)`` warns that it checkpoints nothing.

Example:
    >>> model = nn.Sequential(nn.Linear(8, 8), nn.Sequential(nn.Linear(8, 8), nn.GELU()),
    ...                       nn.Sequential(nn.Linear(8, 8), nn.GELU()), nn.Linear(8, 2))
    >>> find_blocks(model)          # the family of non-leaf Sequentials, not the Linear layers
    ['1', '2']
"""

from __future__ import annotations

import contextlib
from typing import Dict, Iterable, List, Optional, Set, Tuple

from torch import nn

__all__ = ["find_blocks"]

_CONTAINERS = (nn.ModuleList, nn.Sequential, nn.ModuleDict)


def find_blocks(model: nn.Module) -> List[str]:
    """The qualified names of ``model``'s repeated blocks (transformer layers, ResNet bottlenecks, ViT encoder
    blocks, ConvNeXt/Swin blocks, DenseNet dense layers): what ``memsave.wrap(model)`` checkpoints.

    The rule, in order (the first that finds something answers; details and the exact thresholds in
    :mod:`memsave.recompute.blocks`): the model's own ``checkpoint_blocks()``; the modules whose class is in a
    Hugging Face ``_no_split_modules`` list (those held in a layer list, when some are); else the largest *family*
    of same-class, non-leaf modules held in a ``ModuleList``/``Sequential``/``ModuleDict`` anywhere in the tree —
    largest by parameters covered, then by member count, then first in module order — after a family of stages
    has given way to the run of blocks making up at least half of its parameters, and a family of parts (a
    block's conv-norm-activation layers) to the blocks holding it.

    Args:
        model: any ``nn.Module``; it is only inspected (no forward pass, nothing is modified).

    Returns:
        Qualified module names in ``named_modules()`` order, none nested in another; empty when the model has no
        repeated non-leaf blocks (e.g. an ``nn.Sequential`` of single layers).

    Raises:
        TypeError: ``model`` is not an ``nn.Module``.
        ValueError: ``model.checkpoint_blocks()`` names a submodule that does not exist.

    Example:
        >>> import torchvision
        >>> memsave.find_blocks(torchvision.models.resnet18())[:3]
        ['layer1.0', 'layer1.1', 'layer2.0']
        >>> memsave.find_blocks(transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=2)))
        ['transformer.h.0', 'transformer.h.1']
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
            return _outermost(names)
    held = _held_in_container(model)
    names = _no_split_blocks(model, held)
    if names:
        return _outermost(names)
    return _outermost(_largest_family(model, held))


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


def _no_split_blocks(model: nn.Module, held: Set[str]) -> List[str]:
    classes: Set[str] = set()
    for module in model.modules():
        listed = getattr(module, "_no_split_modules", None)
        if isinstance(listed, str):
            classes.add(listed)
        elif listed:
            with contextlib.suppress(TypeError):  # not an iterable: not Hugging Face's convention
                classes.update(c for c in listed if isinstance(c, str))
    if not classes:
        return []
    matched = [n for n, m in model.named_modules() if type(m).__name__ in classes]
    in_lists = [n for n in matched if n in held]
    return in_lists or matched


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


def _largest_family(model: nn.Module, held: Set[str]) -> List[str]:
    families: Dict[type, List[str]] = {}
    order: Dict[type, int] = {}
    modules: Dict[str, nn.Module] = {}
    for position, (name, module) in enumerate(model.named_modules()):
        modules[name] = module
        if name in held and next(module.children(), None) is not None:
            families.setdefault(type(module), []).append(name)
            order.setdefault(type(module), position)
    if not families:
        return []
    members = {cls: _outermost(names) for cls, names in families.items()}
    params = {cls: _param_ids(modules[n] for n in names) for cls, names in members.items()}

    def parent(name: str) -> str:
        return name.rpartition(".")[0]

    def homogeneous(cls: type, names: List[str]) -> bool:
        """Whether every container holding one of ``names`` holds only modules of class ``cls``."""
        return all(all(type(c) is cls for c in modules[parent(n)].children()) for n in names)

    member_sets = {cls: set(names) for cls, names in members.items()}
    dropped: Set[type] = set()
    for outer in members:
        for inner in members:
            nested = [n for n in members[inner] if _inside(n, member_sets[outer])] if inner is not outer else []
            if not nested:
                continue
            shared = sum(_param_ids(modules[n] for n in nested).values())
            if (
                not issubclass(inner, _CONTAINERS)
                and homogeneous(inner, nested)
                and 2 * shared >= sum(params[outer].values())
            ):
                dropped.add(outer)  # a family of stages, each a run of blocks: the blocks
            elif 2 * shared >= sum(params[inner].values()):
                dropped.add(inner)  # a family of parts of blocks: the blocks
    kept = [cls for cls in members if cls not in dropped] or list(members)
    best: Optional[Tuple[int, int, int]] = None
    winner = kept[0]
    for cls in kept:
        key = (sum(params[cls].values()), len(members[cls]), -order[cls])
        if best is None or key > best:
            best, winner = key, cls
    return members[winner]
