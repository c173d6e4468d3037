"""Checkpoint chosen submodules of a model in place: :func:`wrap` and :func:`unwrap`.

A wrapped module gets an *instance-level* ``forward`` — a small picklable, deep-copyable callable object that
runs the module's original forward as a :func:`memsave.checkpoint` region — and an instance-level
``extra_repr`` that adds ``[memsave.checkpoint]`` to ``repr(model)``. Nothing else changes: no wrapper module
is inserted, so ``state_dict`` keys, ``named_modules`` and parameter identity are exactly those of the plain
model, and :func:`unwrap` restores the plain eager model exactly.
"""

from __future__ import annotations

import abc
import functools
import inspect
import warnings
import weakref
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple, Type, TypeVar, Union, cast

import torch
from torch import nn

from ..common.regions import RegionForward, region_forward, region_forwards
from ..common.snapshot import ModelSnapshot, all_or_nothing
from ..errors import MemsaveWarning, WrapConflictError
from .blocks import find_blocks
from .policies import resolve_checkpoint_policy
from .region import DEFAULT_OPTIONS, ModuleChain, RegionOptions, count_leading_inplace, run_region

__all__ = [
    "CheckpointedForward",
    "RegionPlan",
    "WrappedRepr",
    "add_wrap_listener",
    "all_or_nothing",
    "install_once",
    "is_wrapped",
    "region_signatures",
    "unwrap",
    "unwrap_module",
    "wrap",
    "wrap_module",
]

Policy = Union[str, Type[nn.Module], Tuple[Type[nn.Module], ...], Callable[[str, nn.Module], bool]]

#: The model's own class: :func:`wrap` and :func:`unwrap` return the model they were given, typed as it was
#: (``memsave.wrap(llama).generate(...)`` type-checks).
ModuleT = TypeVar("ModuleT", bound=nn.Module)

_TAG = "[memsave.checkpoint]"

#: The wrap listeners: each is called with the model at the end of every :func:`wrap` that wrapped something
#: (``after_wrap``) and of every :func:`unwrap` (``after_unwrap``). Filled only by :func:`add_wrap_listener`, which
#: ``memsave/__init__.py`` calls once (a Hugging Face model's own checkpointing switch, claimed by
#: :mod:`memsave.integrations.transformers_switch`); this part never imports its listeners.
_WRAP_LISTENERS: List[Callable[[nn.Module], None]] = []
_UNWRAP_LISTENERS: List[Callable[[nn.Module], None]] = []

#: Every region forward alive (made, copied or unpickled), held weakly: a module knows its children, not its parent,
#: so this is how :func:`wrap` finds a region around the module it is given.
_LIVE_REGIONS: "weakref.WeakSet[CheckpointedForward]" = weakref.WeakSet()


def add_wrap_listener(after_wrap: Callable[[nn.Module], None], after_unwrap: Callable[[nn.Module], None]) -> None:
    """Have ``after_wrap(model)`` called at the end of every :func:`wrap` that wrapped something, and
    ``after_unwrap(model)`` at the end of every :func:`unwrap`; adding the same pair twice adds it once.

    A listener's exception propagates from :func:`wrap` / :func:`unwrap`; what the listener changed on the model
    before raising it must undo itself.

    Args:
        after_wrap: called with the model :func:`wrap` was given, once its regions are in place.
        after_unwrap: called with the model :func:`unwrap` was given, once it is plain eager again.

    Raises:
        TypeError: a listener is not callable.

    Examples:
        >>> add_wrap_listener(transformers_switch.after_wrap, transformers_switch.after_unwrap)
    """
    for listener in (after_wrap, after_unwrap):
        if not callable(listener):
            raise TypeError(f"add_wrap_listener: listeners must be callable, got {type(listener).__name__}")
    if after_wrap not in _WRAP_LISTENERS:
        _WRAP_LISTENERS.append(after_wrap)
    if after_unwrap not in _UNWRAP_LISTENERS:
        _UNWRAP_LISTENERS.append(after_unwrap)


def _run_hooks(hooks: Sequence[Callable[[nn.Module], None]], model: ModuleT) -> ModuleT:
    for hook in hooks:
        hook(model)
    return model


class RegionPlan(abc.ABC):
    """A choice of regions that knows how to install itself: what :func:`wrap` accepts besides a policy.

    :class:`memsave.Plan` is one. Keeping the interface here lets ``wrap(model, plan)`` work without this module
    knowing the planner (which builds on this module).
    """

    @abc.abstractmethod
    def apply_to(self, model: nn.Module, *, preserve_rng_state: bool = True, strict: bool = False) -> nn.Module:
        """Checkpoint the chosen regions of ``model`` in place and return ``model``."""


class CheckpointedForward(RegionForward):
    """The instance-level ``forward`` of a wrapped module: its original forward, run as a checkpointed region.

    Holds the module (a reference cycle the garbage collector handles; it keeps the object picklable and
    deep-copyable, which a weak reference would not) and the module's previous instance-level ``forward``, if
    it had one. Every one made, copied or unpickled is remembered weakly (:data:`_LIVE_REGIONS`), so that
    :func:`wrap` can tell that a module it is given runs inside another model's region.
    """

    def __init__(
        self,
        module: nn.Module,
        name: str,
        previous: Optional[Callable[..., Any]],
        options: RegionOptions = DEFAULT_OPTIONS,
    ) -> None:
        self.module = module
        self.name = name
        self.previous = previous
        self.options = options
        # Read once here: dynamo (torch.compile) cannot trace inspect.signature inside the call.
        self.parameter_names = _parameter_names(self.original())
        _LIVE_REGIONS.add(self)

    def __setstate__(self, state: Dict[str, Any]) -> None:
        # copy.deepcopy and pickle restore the attributes here: remember the copy as a region too.
        self.__dict__.update(state)
        if "options" not in state:  # pickled by memsave 0.3, which kept the options as three attributes
            self.options = RegionOptions(
                preserve_rng_state=state.get("preserve_rng_state", True),
                strict=state.get("strict", False),
                context_fn=state.get("context_fn"),
            )
            for old in ("preserve_rng_state", "strict", "context_fn"):
                self.__dict__.pop(old, None)
        _LIVE_REGIONS.add(self)

    def signature(self) -> Tuple[Any, ...]:
        """What makes two regions on one module the same region: their kind and options (not their names)."""
        o = self.options
        return (type(self).__name__, o.preserve_rng_state, o.strict, _callable_key(o.context_fn))

    def runs_inside(self, module: nn.Module) -> bool:
        """Whether ``module`` runs inside this region: it is one of the wrapped module's submodules."""
        return any(m is module for m in self.module.modules() if m is not self.module)

    def original(self) -> Callable[..., Any]:
        if self.previous is not None:
            return self.previous
        # A partial rather than types.MethodType: dynamo (torch.compile) traces partials, not MethodType calls.
        return functools.partial(type(self.module).forward, self.module)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        module = self.module
        forward = self.original()
        # A module working in place on its input (nn.ReLU(inplace=True)) cannot be a region, and has nothing
        # to gain from one: it runs as usual.
        if not torch.is_grad_enabled() or getattr(module, "inplace", False) is True:
            return forward(*args, **kwargs)
        if getattr(type(module), "_can_checkpoint_with_cache", None) is False:
            given = _kv_cache_given(self.parameter_names, args, kwargs)
            if not module.training and any(name != "use_cache" for name in given):
                # Outside training the cache is the point of the call (evaluation, generation with gradients): keep
                # it, and run the layer eagerly, since a recompute would write the cache a second time.
                _warn_once(type(module).__name__, "eval")
                return forward(*args, **kwargs)
            if module.training and given:
                _warn_once(type(module).__name__, "train", given)
                args, kwargs = _without_kv_cache(self.parameter_names, args, kwargs)
        if (
            isinstance(module, nn.Sequential)
            and type(module).forward is nn.Sequential.forward
            and self.previous is None
            and len(args) == 1
            and not kwargs
        ):
            # Leading in-place children (a VGG block starting with ReLU(inplace=True)) run before the region.
            children = list(module)
            skip = count_leading_inplace(children)
            if skip:
                x = args[0]
                for child in children[:skip]:
                    x = child(x)
                if skip == len(children):
                    return x
                return run_region(ModuleChain(children[skip:]), (x,), {}, self.options, name=self.name, watch=(module,))
        return run_region(forward, args, kwargs, self.options, name=self.name, watch=(module,))


# The cache argument's names across transformers releases (5.24 renamed past_key_values to cache).
_KV_CACHE_ARGS = ("past_key_values", "cache", "layer_past")

# (layer class name, mode) pairs already warned about: each warning is given once per process, as Hugging Face's
# ``logger.warning_once`` does for its own gradient checkpointing.
_warned_once: Set[Tuple[str, str]] = set()


def _parameter_names(forward: Callable[..., Any]) -> Tuple[str, ...]:
    try:
        return tuple(inspect.signature(forward).parameters)
    except (TypeError, ValueError):
        return ()


def _argument(names: Sequence[str], args: Tuple[Any, ...], kwargs: Dict[str, Any], name: str) -> Any:
    """The value of argument ``name`` of a call, given by keyword or by position; None when not given."""
    if name in kwargs:
        return kwargs[name]
    if name in names and names.index(name) < len(args):
        return args[names.index(name)]
    return None


def _kv_cache_given(names: Sequence[str], args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> List[str]:
    """The cache arguments of a Hugging Face layer's call that are set (a cache object, or ``use_cache=True``)."""
    given = []
    for name in (*_KV_CACHE_ARGS, "use_cache"):
        value = _argument(names, args, kwargs, name)
        # An empty cache may be falsy: compare with None.
        if value is not None and value is not False:
            given.append(name)
    return given


def _warn_once(layer: str, mode: str, dropped: Sequence[str] = ()) -> None:
    # Under torch.compile a warning would break the graph (fullgraph=True fails): the eager call warns instead.
    if (layer, mode) in _warned_once or torch.compiler.is_compiling():
        return
    _warned_once.add((layer, mode))
    if mode == "train":
        message = (
            f"memsave: {layer} is a checkpointed region in training mode and was given a KV cache "
            f"({', '.join(dropped)}); a recompute would write the cache a second time, so the region runs without "
            f"it (cache None, use_cache=False), as under Hugging Face's gradient checkpointing. Call the model with "
            f"use_cache=False to silence this."
        )
    else:
        message = (
            f"memsave: {layer} was given a KV cache in eval mode with gradients on, so it runs without recompute "
            f"(a recompute would write the cache a second time) and keeps its activations as in eager. Call the model "
            f"with use_cache=False to checkpoint it."
        )
    warnings.warn(message, MemsaveWarning, stacklevel=2)


def _without_kv_cache(
    names: Sequence[str], args: Tuple[Any, ...], kwargs: Dict[str, Any]
) -> Tuple[Tuple[Any, ...], Dict[str, Any]]:
    """The arguments of a Hugging Face layer that writes to the key/value cache it is given, without the cache.

    A region's recompute would write the same keys and values into the cache a second time (and then see twice
    the sequence length). Hugging Face's own gradient checkpointing drops the cache for the same reason, in training
    mode only; its marker is the layer class's ``_can_checkpoint_with_cache = False``
    (``GradientCheckpointingLayer``). Here the cache arguments become ``None`` and ``use_cache`` ``False``, passed
    positionally (GPT-2's blocks take ``past_key_values`` second) or by keyword.
    """
    new_args, new_kwargs = list(args), dict(kwargs)
    for name in _kv_cache_given(names, args, kwargs):
        off: Any = False if name == "use_cache" else None
        if name in new_kwargs:
            new_kwargs[name] = off
        else:
            new_args[names.index(name)] = off
    return tuple(new_args), new_kwargs


class WrappedRepr:
    """The instance-level ``extra_repr`` of a wrapped module: the original one plus ``[memsave.checkpoint]``."""

    def __init__(self, module: nn.Module, previous: Optional[Callable[[], str]]) -> None:
        self.module = module
        self.previous = previous

    def __call__(self) -> str:
        base = self.previous() if self.previous is not None else type(self.module).extra_repr(self.module)
        return f"{base}, {_TAG}" if base else _TAG


def is_wrapped(module: nn.Module) -> bool:
    """Whether ``module`` itself is checkpointed by :func:`wrap` (its submodules are not looked at).

    Examples:
        >>> [name for name, m in model.named_modules() if memsave.recompute.is_wrapped(m)]
        ['layers.0', 'layers.1']
    """
    return region_forward(module) is not None


def wrap_module(
    module: nn.Module,
    name: str,
    options: RegionOptions = DEFAULT_OPTIONS,
) -> bool:
    """Make ``module`` a checkpointed region named ``name``, in place. Returns False if it already was one.

    The building block of :func:`wrap`; a planner that picked its modules by name calls it directly.
    """
    if is_wrapped(module):
        return False
    previous_forward = module.__dict__.get("forward")
    previous_repr = module.__dict__.get("extra_repr")
    module.__dict__["forward"] = CheckpointedForward(module, name, previous_forward, options)
    module.__dict__["extra_repr"] = WrappedRepr(module, previous_repr)
    return True


def unwrap_module(module: nn.Module) -> bool:
    """Undo :func:`wrap_module` on ``module``. Returns False if it was not wrapped."""
    forward = module.__dict__.get("forward")
    if not isinstance(forward, CheckpointedForward):
        return False
    if forward.previous is None:
        del module.__dict__["forward"]
    else:
        module.__dict__["forward"] = forward.previous
    extra = module.__dict__.get("extra_repr")
    if isinstance(extra, WrappedRepr):
        if extra.previous is None:
            del module.__dict__["extra_repr"]
        else:
            module.__dict__["extra_repr"] = extra.previous
    return True


def _callable_key(fn: Any) -> Any:
    """A value equal for equal context functions: ``memsave.selective("matmul")`` makes a new partial each call."""
    if isinstance(fn, functools.partial):
        return ("partial", _callable_key(fn.func), fn.args, tuple(sorted(fn.keywords.items())))
    return fn


def region_signatures(model: nn.Module) -> Dict[str, Tuple[Any, ...]]:
    """The regions :func:`wrap` or a plan put in ``model``: qualified name -> the region's kind and options.

    Two wraps that give equal answers made the same regions (the second one is a no-op).

    Args:
        model: any module.

    Returns:
        One entry per region in ``model`` (``""`` for ``model`` itself), in ``named_modules()`` order.

    Examples:
        >>> region_signatures(memsave.wrap(model))
        {'blocks.0': ('CheckpointedForward', True, False, None), 'blocks.1': (...)}
    """
    # Every region forward is a CheckpointedForward (the plan's grouped one derives from it).
    return {name: cast(CheckpointedForward, f).signature() for name, f in region_forwards(model).items()}


def _enclosing_region(model: nn.Module) -> Optional[CheckpointedForward]:
    """The region (of another model, or of a module above ``model``) that ``model`` runs inside, if any."""
    for region in list(_LIVE_REGIONS):
        # A region unwrapped since (its module's forward is another one now) no longer counts.
        if region.module is not model and region_forward(region.module) is region and region.runs_inside(model):
            return region
    return None


def _label(name: str) -> str:
    return repr(name) if name else "the model itself"


def _names(names: Sequence[str], limit: int = 4) -> str:
    shown = ", ".join(_label(n) for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "") if names else "none"


def _inside(inner: str, outer: str) -> bool:
    return inner != outer and (outer == "" or inner.startswith(outer + "."))


def _conflict_message(caller: str, model: nn.Module, before: Sequence[str], after: Sequence[str]) -> str:
    """What a second wrap would have done to the regions ``before``, and what to do instead."""
    added = [n for n in after if n not in before]
    nested = [(i, o) for i in added for o in before if _inside(i, o)]
    nested += [(i, o) for o in added for i in before if _inside(i, o)]
    if set(after) != set(before):
        what = f"other regions ({_names(list(after))})"
    else:
        what = "other regions on the same modules (other groups, preserve_rng_state, strict or context_fn)"
    if nested:
        effect = f"would nest {_label(nested[0][0])} inside {_label(nested[0][1])}"
        effect += " (a nested region keeps its inner arguments alive)"
    else:
        effect = "would mix the two choices"
    return (
        f"{caller}: {type(model).__name__} already has memsave regions ({_names(list(before))}; from an earlier "
        f"memsave.wrap or plan), and this one selects {what}: wrapping on top {effect}. Nothing was changed. Call "
        "memsave.unwrap(model) first, then wrap it with the policy or plan you want (wrapping again with the same "
        "regions is a no-op)."
    )


def install_once(model: nn.Module, install: Callable[[], Any], caller: str) -> bool:
    """Run ``install()`` (which makes regions in ``model``) unless that would conflict with regions already there.

    On a model without regions, ``install()`` runs (all or nothing). On a model with regions, it runs on the model
    stripped of them, and the model is then put back as it was: if it made exactly the same regions, nothing more
    happens (a no-op); otherwise :class:`WrapConflictError`. What :func:`wrap` and applying a plan share.

    Args:
        model: the model ``install`` changes in place.
        install: makes the regions (wraps modules of ``model``).
        caller: the public call, for the message (``"memsave.wrap"``).

    Returns:
        True when ``install()`` changed the model, False for the no-op.

    Raises:
        WrapConflictError: ``model`` has other regions than ``install()`` makes (they would mix or nest), or it
            runs inside another model's region and ``install()`` made regions; the model is left as it was.

    Examples:
        >>> install_once(model, lambda: apply_plan(model, plan), "memsave.wrap(model, plan)")
        True
    """
    before = region_signatures(model)
    if not before:
        with all_or_nothing(model):
            install()
            outer = _enclosing_region(model) if region_forwards(model) else None
            if outer is not None:
                raise WrapConflictError(
                    f"{caller}: {type(model).__name__} runs inside the memsave region {outer.name!r} of a model "
                    "memsave already wrapped, so its regions would be nested in that one (a nested region keeps its "
                    "inner arguments alive). Nothing was changed. Wrap the whole model with one policy or plan, or "
                    "call memsave.unwrap on that model first."
                )
        return True
    snapshot = ModelSnapshot(model)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a trial: its "selected nothing" warning is not the outcome
            for module in model.modules():
                unwrap_module(module)
            install()
        after = region_signatures(model)
    finally:
        snapshot.restore()
    if after != before:
        raise WrapConflictError(_conflict_message(caller, model, list(before), list(after)))
    return False


def _check_predicate(policy: Callable[..., Any]) -> None:
    """Raise a TypeError naming the expected signature when ``policy`` cannot take ``(name, module)``."""
    try:
        signature = inspect.signature(policy)
    except (TypeError, ValueError):
        return  # a builtin without a signature: let the call decide
    try:
        signature.bind("", nn.Module())
    except TypeError as e:
        raise TypeError(
            f"memsave.wrap: a predicate policy must take two arguments, (name, module) -> bool, where name is the "
            f"module's qualified name ('' for the model itself); {getattr(policy, '__name__', policy)!r} has the "
            f"signature {signature} ({e}). Write it as lambda name, m: ..., or pass a module class."
        ) from None


def _resolve_policy(policy: Any) -> Callable[[str, nn.Module], bool]:
    if isinstance(policy, nn.Module):
        raise TypeError(
            f"memsave.wrap: policy is a module instance ({type(policy).__name__}); pass its class "
            f"({type(policy).__name__}), a tuple of classes, or a predicate (qualified_name, module) -> bool "
            f"such as lambda name, m: m is model.block."
        )
    if isinstance(policy, type):
        classes: Tuple[type, ...] = (policy,)
    elif isinstance(policy, (tuple, list)) and policy and all(isinstance(c, type) for c in policy):
        classes = tuple(policy)
    elif callable(policy) and not isinstance(policy, (tuple, list)):
        _check_predicate(policy)
        return policy
    else:
        raise TypeError(
            f"memsave.wrap: policy must be an nn.Module subclass, a non-empty tuple of them, or a predicate "
            f"(qualified_name, module) -> bool; got {policy!r}."
        )
    for c in classes:
        if not issubclass(c, nn.Module):
            raise TypeError(f"memsave.wrap: policy class {c.__name__} is not an nn.Module subclass.")
    return lambda name, module: isinstance(module, classes)


def wrap(
    model: ModuleT,
    policy: Optional[Union[Policy, RegionPlan]] = None,
    *,
    preserve_rng_state: bool = True,
    strict: bool = False,
    context_fn: Optional[Callable[[], Tuple[Any, Any]]] = None,
) -> ModuleT:
    """Checkpoint, in place, every submodule of ``model`` (the model itself included) that ``policy`` selects;
    with no policy, the model's repeated blocks (:func:`memsave.find_blocks`).

    Each selected module's forward becomes a :func:`memsave.checkpoint` region named by its qualified name.
    ``state_dict`` keys never change, ``repr(model)`` shows ``[memsave.checkpoint]`` on the selected modules,
    and :func:`unwrap` restores plain eager. Selected modules nested in other selected modules become nested
    regions (correct, but the inner arguments stay alive: select one level, e.g. the blocks of a transformer). A
    selected module with ``inplace=True`` runs unchecked, and leading ``inplace=True`` children of a selected plain
    ``nn.Sequential`` run before its region.

    One wrap per model: on a model that already has regions (an earlier ``wrap`` or plan), wrapping again with a
    policy or plan that makes exactly the same regions (modules and options) is a no-op, and any other choice
    raises :class:`memsave.WrapConflictError` naming the regions there, without changing anything; call
    :func:`unwrap` first to choose again. A module that runs inside another model's region (a block of a wrapped
    model) is refused the same way, since its regions would be nested in that one.

    Args:
        model: the model, modified in place.
        policy: ``None`` (the default: exactly the modules :func:`memsave.find_blocks` names — a Hugging Face
            model's decoder/encoder layers, a ResNet's bottlenecks, a ViT's encoder blocks), an ``nn.Module``
            subclass, a tuple of subclasses, a predicate ``(qualified_name, module) -> bool`` (the root's qualified
            name is ``""``), a policy string as the ``checkpoint:<policy>`` strategies take it (``"blocks"``,
            ``"all"``, a class name, comma-separated qualified names; see
            :func:`memsave.recompute.policies.resolve_checkpoint_policy`), or a :class:`memsave.Plan` made for this
            model by :func:`memsave.plan`.
        preserve_rng_state, strict: as for :func:`memsave.checkpoint`, for every region created here.
        context_fn: as for :func:`memsave.checkpoint`, called once per call of each region: e.g.
            :func:`memsave.selective` (keep the matrix products' outputs, recompute the rest) or torch's
            ``functools.partial(create_selective_checkpoint_contexts, policy_fn)``. Not with a plan.

    Returns:
        ``model`` itself, typed as the class it was given (``memsave.wrap(llama).generate(...)`` type-checks).

    The change is all or nothing: if anything fails (a predicate that raises, a plan naming a module the model
    lacks), the model is left exactly as it was.

    Raises:
        TypeError: ``policy`` is not one of the accepted forms (e.g. a module instance instead of its class, or a
            predicate that does not take ``(name, module)``), ``strict`` or ``preserve_rng_state`` is not a bool,
            or ``context_fn`` is not callable or is combined with a plan.
        ValueError: ``policy`` is a policy string that names no module of ``model`` (the message lists its module
            classes).
        PlanMismatchError: ``policy`` is a plan made for another model (the message says what differs).
        WrapConflictError: ``model`` already has other regions than this policy or plan makes, or runs inside the
            region of a wrapped model (the message names the regions and says to call :func:`unwrap` first).

    Warns:
        MemsaveWarning: the policy selected no module, or with no policy the model has no repeated blocks, so
            nothing is checkpointed.

    Examples:
        >>> memsave.wrap(model)                                # recompute each of its blocks in backward
        >>> memsave.wrap(model, nn.TransformerEncoderLayer)   # recompute each layer of this class
        >>> memsave.wrap(model, "blocks")                      # the policy strings of checkpoint:<policy>
        >>> memsave.wrap(model, lambda name, m: name.startswith("encoder.blocks."))
        >>> memsave.wrap(model, context_fn=memsave.selective("matmul"))   # selective recompute in each block
        >>> memsave.wrap(memsave.unwrap(model), nn.Linear)    # to choose other regions, unwrap first
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"memsave.wrap: model must be an nn.Module, got {type(model).__name__}.")
    options = RegionOptions.checked("wrap", preserve_rng_state=preserve_rng_state, strict=strict, context_fn=context_fn)
    if isinstance(policy, RegionPlan):
        if options.context_fn is not None:
            raise TypeError(
                "memsave.wrap: a plan's regions recompute whole segments, as it measured them; apply the "
                "plan without context_fn, or wrap with a module policy and context_fn instead."
            )
        with all_or_nothing(model):
            policy.apply_to(model, preserve_rng_state=preserve_rng_state, strict=strict)  # in place: returns model
            return _run_hooks(_WRAP_LISTENERS, model)
    if policy is None:
        blocks = set(find_blocks(model))
        if not blocks:
            warnings.warn(
                f"memsave.wrap: found no repeated blocks in {type(model).__name__}, so nothing is checkpointed "
                "(memsave.find_blocks looks for the units of the model's own checkpointing switch -- Hugging Face, "
                "timm, diffusers -- else a family of same-class modules with children held in a "
                "ModuleList/Sequential/ModuleDict). Pass a policy: the class of the "
                "blocks to recompute, or a predicate taking (qualified_name, module).",
                MemsaveWarning,
                stacklevel=2,
            )
            return model
        select: Callable[[str, nn.Module], bool] = lambda name, module: name in blocks  # noqa: E731
    elif isinstance(policy, str):  # a policy string, read as the checkpoint:<policy> strategies read it
        named = set(resolve_checkpoint_policy(model, policy))
        select = lambda name, module: name in named  # noqa: E731
    else:
        select = _resolve_policy(policy)
    # Select first, then wrap: a predicate that raises leaves the model untouched, and install_once covers the rest.
    selected = [(name, module) for name, module in model.named_modules() if select(name, module)]
    matched = len(selected)

    def install() -> None:
        for qualified_name, module in selected:
            wrap_module(module, qualified_name or type(module).__name__, options)

    install_once(model, install, "memsave.wrap")
    if matched == 0:
        warnings.warn(
            f"memsave.wrap: policy {policy!r} selected no module of {type(model).__name__}, so nothing is "
            f"checkpointed. Pass the class of the blocks to recompute (not an instance), or a predicate taking "
            f"(qualified_name, module); list candidates with [n for n, _ in model.named_modules()].",
            MemsaveWarning,
            stacklevel=2,
        )
    return _run_hooks(_WRAP_LISTENERS, model) if matched else model


def unwrap(model: ModuleT) -> ModuleT:
    """Undo :func:`wrap` on ``model`` and all its submodules, in place: back to plain eager (all or nothing).

    Args:
        model: a model (partly) wrapped by :func:`wrap`; modules that are not wrapped are left alone.

    Returns:
        ``model`` itself, typed as the class it was given.

    Raises:
        TypeError: ``model`` is not an ``nn.Module``.

    Examples:
        >>> memsave.unwrap(model)
        >>> assert "[memsave.checkpoint]" not in repr(model)
    """
    if not isinstance(model, nn.Module):
        raise TypeError(
            f"memsave.unwrap: model must be the nn.Module that memsave.wrap changed, got {type(model).__name__}; "
            f"pass the model itself (memsave.unwrap(model))."
        )
    with all_or_nothing(model):
        for module in model.modules():
            unwrap_module(module)
    return _run_hooks(_UNWRAP_LISTENERS, model)
