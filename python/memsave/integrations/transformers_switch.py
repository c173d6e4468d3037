"""A Hugging Face model's own activation-checkpointing switch, made memsave's (no transformers import here).

Hugging Face models carry a switch: ``model.activation_checkpointing_enable(...)`` (transformers 5; ``Trainer``
calls it when its arguments say ``activation_checkpointing=True``), its older spelling (the ``gradient_*`` names,
deprecated in transformers 5), and the ``*_disable()`` pair. Thrown by transformers, it sets the
``gradient_checkpointing`` flag of the model's layers and stores the function they call,
``layer._gradient_checkpointing_func`` (``functools.partial(torch.utils.checkpoint.checkpoint, **kwargs)``).

:func:`claim` puts memsave's switch in its place, as instance attributes under the same public names. Turning it on
or off runs transformers' own method (so the flags, ``every_n_layers``, PEFT's input gradients and
``model.is_activation_checkpointing`` are transformers' own, and truthful), then gives every module with a
``gradient_checkpointing`` flag memsave's function, a :class:`LayerCheckpoint`, instead of torch's:

* after :func:`memsave.integrations.transformers.enable` (mode ``"enable"``), each flagged layer runs as a
  :func:`memsave.checkpoint` region;
* on a model memsave already checkpoints (``memsave.wrap(model)`` or a plan; mode ``"wrap"``, claimed by
  :func:`after_wrap`), the layers run as they are inside memsave's regions: no region is nested in another;
* ``*_disable()`` also unwraps the model (:func:`memsave.unwrap`): the switch off means nothing recomputes.

Either way ``torch.utils.checkpoint`` is never called. If the model's own checkpointing is already on when it is
claimed, its layers get memsave's function at once. :func:`release` (after :func:`memsave.unwrap`, for a ``"wrap"``
claim) gives the model back to transformers as transformers would have left it: its methods, and the layers'
functions transformers' last switch call stored.

Nothing is patched when this module is imported: ``memsave/__init__.py`` registers :func:`after_wrap` and
:func:`after_unwrap` with :func:`memsave.recompute.wrapping.add_wrap_listener`, and only a model given to
:func:`memsave.wrap` or ``enable`` is changed, on the instance. The switch objects are module-level classes holding
the model, so it stays deep-copyable and picklable.
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import torch.utils.checkpoint
from torch import nn

from ..errors import MemsaveWarning
from ..recompute import checkpoint, checkpointed, is_wrapped, unwrap
from ..recompute.region import check_context_fn, check_region_options

__all__ = [
    "LayerCheckpoint",
    "SwitchState",
    "after_unwrap",
    "after_wrap",
    "checkpointing_on",
    "claim",
    "has_switch",
    "release",
    "switch_of",
]

_ENABLE = ("activation_checkpointing_enable", "gradient_checkpointing_enable")
_DISABLE = ("activation_checkpointing_disable", "gradient_checkpointing_disable")
_STATE = "_memsave_switch"
#: What transformers' layers read: their flag, and the checkpoint function the switch stored on them.
_FLAG = "gradient_checkpointing"
_FUNC = "_gradient_checkpointing_func"

#: torch.utils.checkpoint keyword arguments a switch call may carry that the regions take (with torch's meaning).
_REGION_OPTIONS = ("preserve_rng_state", "context_fn", "determinism_check", "debug")
#: enable()'s own region options (memsave.wrap's names).
ENABLE_OPTIONS = ("preserve_rng_state", "strict", "context_fn")


@dataclass
class SwitchState:
    """What memsave's switch on a model does.

    Attributes:
        mode: ``"wrap"`` (memsave.wrap claimed it: keep its regions) or ``"enable"`` (each flagged layer a region).
        options: ``enable``'s region options (``preserve_rng_state``, ``strict``, ``context_fn``).
        call_options: the region options of the last switch call (torch.utils.checkpoint's names), over ``options``.
        on: whether the switch was last turned on.
        regions: whether some module of the model is wrapped (memsave's regions): the layers then run inside them.
    """

    mode: str
    options: Dict[str, Any] = field(default_factory=dict)
    call_options: Dict[str, Any] = field(default_factory=dict)
    on: bool = False
    regions: bool = False


def has_switch(model: nn.Module) -> bool:
    """Whether ``model``'s class has a Hugging Face style checkpointing switch (either spelling).

    Examples:
        >>> has_switch(llama)
        True
    """
    return any(callable(getattr(type(model), name, None)) for name in _ENABLE)


def switch_of(model: nn.Module) -> Optional[SwitchState]:
    """memsave's switch state on ``model``, or None when it has none.

    Examples:
        >>> switch_of(enable(llama)).mode
        'enable'
    """
    state = model.__dict__.get(_STATE)
    return state if isinstance(state, SwitchState) else None


def checkpointing_on(model: nn.Module) -> bool:
    """Whether some module of ``model`` has its ``gradient_checkpointing`` flag set: what transformers'
    ``model.is_activation_checkpointing`` (named ``is_gradient_*`` before transformers 5) reports, read without
    a deprecation warning.

    Examples:
        >>> checkpointing_on(llama)
        False
    """
    return any(getattr(m, _FLAG, False) is True for m in model.modules())


class LayerCheckpoint:
    """The checkpoint function memsave's switch gives a layer in place of torch's (``_gradient_checkpointing_func``).

    Transformers' layers call it as ``func(functools.partial(forward, layer, **kwargs), *args)`` when their flag is
    on, in training, with gradients. It runs that as a :func:`memsave.checkpoint` region, or as it is when the layer
    already runs inside memsave's regions (a wrap or a plan on the model).

    Args:
        module: the module it is stored on.
        state: the switch it belongs to.
        replaced: the function it replaced (transformers', given back by :func:`release`), or None.

    Examples:
        >>> layer._gradient_checkpointing_func(functools.partial(type(layer).forward, layer), hidden)
    """

    def __init__(self, module: nn.Module, state: SwitchState, replaced: Optional[Callable[..., Any]]) -> None:
        self.module, self.state, self.replaced = module, state, replaced

    def __call__(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if self.state.regions or is_wrapped(self.module):
            return function(*args, **kwargs)  # inside memsave's region already: one region, not two
        options = {**self.state.options, **self.state.call_options}
        if options.pop("strict", False):
            return checkpointed(
                function,
                strict=True,
                preserve_rng_state=options.get("preserve_rng_state", True),
                context_fn=options.get("context_fn"),
            )(*args, **kwargs)
        return checkpoint(function, *args, use_reentrant=False, **options, **kwargs)


def _options_of(call_kwargs: Optional[Dict[str, Any]], where: str) -> Dict[str, Any]:
    """The region options in a switch call's ``*_checkpointing_kwargs`` (torch.utils.checkpoint's names)."""
    if call_kwargs is not None and not isinstance(call_kwargs, dict):
        raise TypeError(f"{where}: the checkpointing kwargs must be a dict or None, got {type(call_kwargs).__name__}")
    out: Dict[str, Any] = {}
    for key, value in (call_kwargs or {}).items():
        if key in _REGION_OPTIONS:
            out[key] = value
        elif key == "use_reentrant":
            if value:
                warnings.warn(
                    f"{where}: use_reentrant=True asks for torch's reentrant checkpoint; memsave's regions are always "
                    "non-reentrant (the same gradients)",
                    MemsaveWarning,
                    stacklevel=4,
                )
        else:
            raise TypeError(
                f"{where}: memsave's checkpointing switch does not take {key!r}; it takes use_reentrant, "
                f"{', '.join(_REGION_OPTIONS)} (torch.utils.checkpoint's names)"
            )
    # Checked here, before the switch changes anything, rather than in the first training forward.
    check_region_options(where, **{k: v for k, v in out.items() if k in ("preserve_rng_state", "debug")})
    check_context_fn(where, out.get("context_fn"))
    if out.get("determinism_check", "default") not in ("default", "none"):
        raise ValueError(f"{where}: determinism_check must be 'default' or 'none', got {out['determinism_check']!r}")
    return out


def _install(holder: nn.Module, state: SwitchState) -> None:
    """Give every module of ``holder`` with a ``gradient_checkpointing`` flag memsave's function (keeping the
    function it replaces, for :func:`release`)."""
    for module in holder.modules():
        if not hasattr(module, _FLAG):
            continue
        current = module.__dict__.get(_FUNC)
        if isinstance(current, LayerCheckpoint):
            if current.state is state:
                continue
            current = current.replaced  # another claim's (a nested model's): transformers' function under it
        setattr(module, _FUNC, LayerCheckpoint(module, state, current))


def _inherited_options(holder: nn.Module) -> Dict[str, Any]:
    """The region options of the torch checkpoint function the model's own switch stored (read when memsave
    claims a model whose checkpointing is on): ``preserve_rng_state=False`` there stays so under memsave."""
    for module in holder.modules():
        func = module.__dict__.get(_FUNC)
        if isinstance(func, functools.partial) and func.func is torch.utils.checkpoint.checkpoint:
            return {k: v for k, v in func.keywords.items() if k in _REGION_OPTIONS}
    return {}


def _refresh(holder: nn.Module, state: SwitchState) -> None:
    state.regions = any(is_wrapped(m) for m in holder.modules())


class _TransformersOwn:
    """While open, ``holder``'s switch methods are its class's (transformers'): memsave's instance attributes are
    set aside, so transformers' own dispatch between the two spellings does not call back into memsave's."""

    def __init__(self, holder: nn.Module) -> None:
        self.holder = holder
        self.saved: Dict[str, Any] = {}

    def __enter__(self) -> nn.Module:
        self.saved = {n: self.holder.__dict__.pop(n) for n in (*_ENABLE, *_DISABLE) if n in self.holder.__dict__}
        return self.holder

    def __exit__(self, *exc: Any) -> None:
        self.holder.__dict__.update(self.saved)


class _Enable:
    """``model.activation_checkpointing_enable`` (and its deprecated ``gradient_*`` alias) under memsave's switch."""

    def __init__(self, model: nn.Module, name: str) -> None:
        self.model, self.name = model, name

    def __call__(
        self,
        activation_checkpointing_kwargs: Optional[Dict[str, Any]] = None,
        every_n_layers: int = 1,
        offload: bool = False,
        gradient_checkpointing_kwargs: Optional[Dict[str, Any]] = None,
    ) -> None:
        where = f"{type(self.model).__name__}.{self.name}"
        state = switch_of(self.model)
        if state is None:
            raise RuntimeError(f"{where}: memsave's switch was released from this model; call the model's own method")
        if offload:
            raise ValueError(
                f"{where}(offload=True): memsave's regions recompute, they do not offload to host memory; "
                "call it without offload, or memsave.unwrap(model) to use transformers' own switch"
            )
        if isinstance(every_n_layers, bool) or not isinstance(every_n_layers, int) or every_n_layers < 1:
            raise ValueError(f"{where}: every_n_layers must be an int >= 1, got {every_n_layers!r}")
        given = activation_checkpointing_kwargs
        if given is None:
            given = gradient_checkpointing_kwargs
        call_options = _options_of(given, where)
        # Each spelling with its own keyword; every_n_layers only when asked (transformers 4 has no such argument).
        arguments: Dict[str, Any] = {self.name.split("_")[0] + "_checkpointing_kwargs": given}
        if every_n_layers != 1:
            arguments["every_n_layers"] = every_n_layers
        with _TransformersOwn(self.model) as model:
            getattr(type(model), self.name)(model, **arguments)
        state.on, state.call_options = True, call_options
        _install(self.model, state)
        _refresh(self.model, state)


class _Disable:
    """``model.activation_checkpointing_disable`` (and its deprecated ``gradient_*`` alias): transformers' own, then
    :func:`memsave.unwrap` (the switch off means nothing recomputes)."""

    def __init__(self, model: nn.Module, name: str) -> None:
        self.model, self.name = model, name

    def __call__(self) -> None:
        state = switch_of(self.model)
        with _TransformersOwn(self.model) as model:
            getattr(type(model), self.name)(model)
        if state is not None:
            state.on = False
        if any(is_wrapped(m) for m in self.model.modules()):
            unwrap(self.model)  # gives a "wrap" claim back to transformers (after_unwrap)


def _switch_holders(model: nn.Module) -> Tuple[nn.Module, ...]:
    """The outermost modules of ``model`` (itself included) that carry a switch (a PEFT model's base model)."""
    holders: List[Tuple[str, nn.Module]] = []
    for name, module in model.named_modules():
        if has_switch(module) and not any(name.startswith(h + ".") or h == "" for h, _ in holders):
            holders.append((name, module))
    return tuple(m for _, m in holders)


def _nested_claims(holder: nn.Module) -> Iterator[nn.Module]:
    return (m for m in holder.modules() if m is not holder and switch_of(m) is not None)


def _put_switch(holder: nn.Module, state: SwitchState) -> None:
    holder.__dict__[_STATE] = state
    for name in _ENABLE:
        if callable(getattr(type(holder), name, None)):
            holder.__dict__[name] = _Enable(holder, name)
    for name in _DISABLE:
        if callable(getattr(type(holder), name, None)):
            holder.__dict__[name] = _Disable(holder, name)


def claim(model: nn.Module, mode: str, **options: Any) -> bool:
    """Put memsave's switch on ``model`` (and on its outermost submodules that have one); see the module docstring.

    If the model's own checkpointing is on, it stays on and its layers get memsave's function now. Claiming a model
    that already has memsave's switch keeps it, upgrading ``"wrap"`` to ``"enable"`` (with ``options``). A claim
    on a submodule of the model (a base model claimed before the model around it) is released: the outermost governs.

    Args:
        model: the model.
        mode: ``"wrap"`` or ``"enable"`` (see :class:`SwitchState`).
        **options: ``enable``'s region options (``preserve_rng_state``, ``strict``, ``context_fn``).

    Returns:
        True when some module of ``model`` has a switch (now memsave's).

    Raises:
        ValueError: ``mode`` is neither ``"wrap"`` nor ``"enable"``.

    Examples:
        >>> claim(hf_model, "enable", preserve_rng_state=True)
        True
    """
    if mode not in ("wrap", "enable"):
        raise ValueError(f"claim: mode must be 'wrap' or 'enable', got {mode!r}")
    holders = _switch_holders(model)
    for holder in holders:
        state = switch_of(holder)
        if state is None:
            for nested in list(_nested_claims(holder)):
                release(nested)
            on = checkpointing_on(holder)
            state = SwitchState(mode, dict(options), _inherited_options(holder) if on else {}, on)
            _put_switch(holder, state)
        elif mode == "enable":
            state.mode, state.options = "enable", dict(options)
        if state.on:
            _install(holder, state)  # the model's own checkpointing was on: memsave's from now on
        _refresh(holder, state)
    return bool(holders)


def release(model: nn.Module, mode: Optional[str] = None) -> None:
    """Take memsave's switch off ``model`` and its submodules (only those claimed in ``mode`` when given):
    transformers' own switch is in force again, and each layer has the function transformers' last switch call
    stored (its flag is left as it is).

    Args:
        model: the model.
        mode: ``"wrap"`` or ``"enable"``: release only the claims made in that mode; None: all.

    Examples:
        >>> release(hf_model)
    """
    for holder in list(model.modules()):
        state = switch_of(holder)
        if state is None or (mode is not None and state.mode != mode):
            continue
        for module in holder.modules():
            func = module.__dict__.get(_FUNC)
            if isinstance(func, LayerCheckpoint) and func.state is state:
                if func.replaced is None:
                    del module.__dict__[_FUNC]
                else:
                    module.__dict__[_FUNC] = func.replaced
        for name in (_STATE, *_ENABLE, *_DISABLE):
            holder.__dict__.pop(name, None)


def after_wrap(model: nn.Module) -> None:
    """Wrap listener: a model :func:`memsave.wrap` checkpoints keeps its regions when its switch is turned on.

    Examples:
        >>> after_wrap(memsave.wrap(hf_model))   # memsave/__init__.py registers it; wrap calls it
    """
    claim(model, "wrap")


def after_unwrap(model: nn.Module) -> None:
    """Unwrap listener: a ``"wrap"`` claim goes back to transformers; an ``"enable"`` one recomputes per layer again.

    Examples:
        >>> after_unwrap(memsave.unwrap(hf_model))   # memsave/__init__.py registers it; unwrap calls it
    """
    release(model, "wrap")
    for module in model.modules():
        state = switch_of(module)
        if state is not None:
            _refresh(module, state)
