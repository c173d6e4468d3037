"""The rewrite registry of :func:`memsave.convert`: one-for-one module swaps and nn.Sequential patterns, with the
verdicts convert reports (does a swap pay on its own, given what its neighbours keep for backward?), and the kinds
of rule ``fuse=True`` applies.

The kinds of rule:

* module swaps: one module of an exact type for one memsave module;
* Sequential patterns: runs of consecutive ``nn.Sequential`` children replaced together;
* structural units (``fuse=True``): what :mod:`.structure` and :mod:`.causal_lm` recognise by what modules compute
  -- a :class:`Unit` of :class:`Target` replacements that only work together, or a :class:`Note` saying why a
  module is left as it is;
* module rules (``fuse=True``): a module of a known class whose ``forward`` memsave knows, rewritten inside (its
  children replaced, hooks installed), for what structure cannot cover (timm's ViT blocks, ``model_zoo.py``).
  Rules match classes by qualified name (``"timm.layers.mlp.Mlp"``), so memsave never imports the libraries they
  come from.

Built-in entries register themselves: the mask and pooling swaps in ``mask_swaps.py``, the fused operators'
patterns in ``fused_patterns.py``, the module rules in ``model_zoo.py``. Users add swaps and patterns with
:func:`register_module_swap` and :func:`register_sequential_pattern`, rules with :func:`add_module_rule`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from torch import nn

__all__ = [
    "DEPENDS",
    "NO_GAIN",
    "PAYS",
    "SKIPPED",
    "TRANSPARENT",
    "ModuleRule",
    "ModuleSwap",
    "Note",
    "Replacement",
    "Rewrite",
    "SequentialPattern",
    "Target",
    "Unit",
    "add_module_rule",
    "add_module_swap",
    "element_matches",
    "keeps_input",
    "keeps_output",
    "module_kind",
    "module_rule_for",
    "module_swap_for",
    "ordered_patterns",
    "qualified_class_name",
    "register_module_swap",
    "register_sequential_pattern",
    "sequential_patterns",
    "unregister_sequential_pattern",
]

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
TRANSPARENT: Tuple[type, ...] = (nn.Flatten, nn.Unflatten, nn.Identity)


def keeps_input(module: nn.Module) -> Optional[bool]:
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
class ModuleSwap:
    """A one-for-one swap convert makes: how to build the replacement, when to refuse, and the verdict note."""

    torch_type: type
    build: Callable[[Any], nn.Module]
    refuse: Callable[[Any], Optional[str]]
    # note(module, producer, consumer) -> (verdict, detail); producer/consumer None when not visible
    note: Callable[[Any, Optional[nn.Module], Optional[nn.Module]], Tuple[str, str]]
    # The convert() flag that must be set for this swap (None: bitwise exact, always made).
    opt_in: Optional[str] = None


@dataclass(frozen=True)
class SequentialPattern:
    """A run of consecutive nn.Sequential children convert replaces together (see register_sequential_pattern)."""

    name: str
    elements: Tuple[ElementMatcher, ...]
    build: Callable[[List[nn.Module]], Optional[Sequence[nn.Module]]]
    note: str
    priority: int
    order: int


_SWAPS: Dict[type, ModuleSwap] = {}
_PATTERNS: Dict[str, SequentialPattern] = {}
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

    Examples:
        >>> from memsave.operators.convert import register_module_swap
        >>> register_module_swap(nn.GELU, lambda m: MyGELU(m.approximate), "keeps the input only")
    """
    if not isinstance(torch_type, type) or not issubclass(torch_type, nn.Module):
        raise TypeError(f"register_module_swap: torch_type must be an nn.Module subclass, got {torch_type!r}")
    _SWAPS[torch_type] = ModuleSwap(torch_type, build, refuse or (lambda m: None), lambda m, prv, nxt: (PAYS, note))


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

    Examples:
        >>> from memsave.operators.convert import register_sequential_pattern
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
        ok = (
            (isinstance(el, type) and issubclass(el, nn.Module))
            or callable(el)
            or (isinstance(el, tuple) and all(isinstance(t, type) and issubclass(t, nn.Module) for t in el))
        )
        if not ok:
            raise TypeError(
                f"register_sequential_pattern({name!r}): each element must be an nn.Module class, a tuple of them "
                f"or a predicate, got {el!r}"
            )
    if not callable(build):
        raise TypeError(f"register_sequential_pattern({name!r}): build must be callable, got {build!r}")
    _pattern_counter[0] += 1
    _PATTERNS[name] = SequentialPattern(name, elements, build, note, int(priority), _pattern_counter[0])


def unregister_sequential_pattern(name: str) -> None:
    """Remove a pattern registered with :func:`register_sequential_pattern` (KeyError if there is none)."""
    if name not in _PATTERNS:
        raise KeyError(f"no Sequential pattern named {name!r}; registered: {sorted(_PATTERNS)}")
    del _PATTERNS[name]


def sequential_patterns() -> List[str]:
    """Names of the registered Sequential patterns, in the order convert tries them."""
    return [p.name for p in ordered_patterns()]


def ordered_patterns() -> List[SequentialPattern]:
    """The registered Sequential patterns in the order convert tries them: highest priority first, then oldest."""
    return sorted(_PATTERNS.values(), key=lambda p: (-p.priority, p.order))


def element_matches(el: ElementMatcher, module: nn.Module) -> bool:
    """Whether ``module`` matches one pattern position: an exact class, a tuple of exact classes, or a predicate."""
    if isinstance(el, type):
        return type(module) is el
    if isinstance(el, tuple):
        return type(module) in el
    return bool(el(module))


def module_kind(module: nn.Module) -> str:
    """A module's kind for the report, e.g. ``"torch.Conv2d"`` or ``"memsave.MaxPool2d"``."""
    return f"{type(module).__module__.split('.')[0]}.{type(module).__name__}"


def keeps_output(module: nn.Module) -> Optional[bool]:
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


def module_swap_for(module_type: type) -> Optional[ModuleSwap]:
    """The registered swap for modules of exactly ``module_type``, or None."""
    return _SWAPS.get(module_type)


def add_module_swap(swap: ModuleSwap) -> None:
    """Register a fully specified :class:`ModuleSwap` (the built-in swaps use it for their verdict functions)."""
    _SWAPS[swap.torch_type] = swap


# ---- structural units (fuse=True): what a module computes -------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """One module a :class:`Unit` puts into the model: its qualified path, the new module, the report line.

    Examples:
        >>> Target("model.norm", memsave.nn.RMSNorm.from_module(model.model.norm), "keeps its input")
    """

    path: str
    new: nn.Module
    detail: str


@dataclass(frozen=True)
class Unit:
    """Replacements that only work together (a norm and the Linears it is fused into), planned as one rule.

    Attributes:
        rule: the rule's name in the report.
        targets: the replacements.
        anchor: the qualified path of the module the rule applies to (default: the targets' common ancestor).
        install: run on the anchor module after the swaps (the causal-LM loss's hooks).

    Examples:
        >>> Unit("rms_norm", (Target("model.norm", new_norm, "keeps its input and one float per row"),))
    """

    rule: str
    targets: Tuple[Target, ...]
    anchor: Optional[str] = None
    install: Optional[Callable[[nn.Module], None]] = None


@dataclass(frozen=True)
class Note:
    """A module left as it is, and why (a "skipped" line of the report).

    Examples:
        >>> Note("model.norm", model.model.norm, "rms_norm: not an RMS norm: ...")
    """

    path: str
    module: nn.Module
    detail: str


# ---- module rules (fuse=True): known model classes rewritten inside ---------------------------------------------


def qualified_class_name(module: nn.Module) -> str:
    """``module``'s class as ``"package.module.Class"``, the key module rules match on.

    Args:
        module: any module.

    Returns:
        The qualified class name, e.g. ``"transformers.models.llama.modeling_llama.LlamaMLP"``.

    Examples:
        >>> qualified_class_name(torch.nn.ReLU())
        'torch.nn.modules.activation.ReLU'
    """
    cls = type(module)
    return f"{cls.__module__}.{cls.__qualname__}"


@dataclass(frozen=True)
class Replacement:
    """One module a :class:`ModuleRule` puts into the model.

    Attributes:
        path: where, relative to the rewritten module (dotted, e.g. ``"mlp"`` or ``"self_attn.q_proj"``; ``""`` is
            the rewritten module itself). The new module must keep the old one's state_dict keys.
        new: the replacement (sharing the old module's parameters).
        detail: one line for the report: what it keeps for backward instead of what.
        verdict: the report's verdict (``PAYS`` unless the replacement only serves another one).
    """

    path: str
    new: nn.Module
    detail: str
    verdict: str = PAYS


@dataclass(frozen=True)
class Rewrite:
    """What a :class:`ModuleRule` does to one module: replacements, reasons for what it left, and hooks.

    Attributes:
        replacements: the modules to put in (applied together; all or nothing with the rest of ``convert``).
        skipped: ``(path, reason)`` for parts the rule left as they were, reported as skipped.
        install: optional ``install(module)``, run by :func:`memsave.convert` once the replacements are in place
            and the state_dict keys checked (never by a dry run): hooks or attributes the rewrite needs besides
            modules.
    """

    replacements: Tuple[Replacement, ...] = ()
    skipped: Tuple[Tuple[str, str], ...] = ()
    install: Optional[Callable[[nn.Module], None]] = None


@dataclass(frozen=True)
class ModuleRule:
    """A rewrite ``convert(fuse=True)`` applies inside modules of known classes.

    Attributes:
        name: unique name (for messages).
        class_names: the qualified class names (see :func:`qualified_class_name`) of the exact classes it rewrites.
        rewrite: ``rewrite(module) -> Rewrite``; a rule that leaves a module entirely alone returns a Rewrite with
            no replacements and a reason in ``skipped``. Modules inside the rewritten one that it did not replace
            are still visited (and may be converted by other rules and swaps).
    """

    name: str
    class_names: Tuple[str, ...]
    rewrite: Callable[[nn.Module], Rewrite]


_RULES: Dict[str, ModuleRule] = {}


def add_module_rule(rule: ModuleRule) -> None:
    """Register a :class:`ModuleRule` for each of its class names (a later rule for a class replaces an earlier).

    Args:
        rule: the rule.

    Raises:
        TypeError: a class name that is not a dotted ``"package.module.Class"`` string.

    Examples:
        >>> add_module_rule(ModuleRule("my_mlp", ("mypkg.model.MyMLP",), rewrite_my_mlp))
    """
    for name in rule.class_names:
        if not isinstance(name, str) or "." not in name:
            raise TypeError(f"add_module_rule({rule.name!r}): class names are 'package.module.Class', got {name!r}")
        _RULES[name] = rule


def module_rule_for(module: nn.Module) -> Optional[ModuleRule]:
    """The registered :class:`ModuleRule` for ``module``'s exact class, or None.

    Args:
        module: any module.

    Returns:
        The rule :func:`memsave.convert` applies to it with ``fuse=True``, or None (subclasses have none).

    Examples:
        >>> module_rule_for(vit.blocks[0]).name
        'timm_vit_block'
    """
    return _RULES.get(qualified_class_name(module))
