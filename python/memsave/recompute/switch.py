"""A model's own activation-checkpointing switch, routed to memsave.

Hugging Face models carry a switch: ``model.activation_checkpointing_enable(...)`` (transformers 5; ``Trainer`` calls
it when its arguments say ``activation_checkpointing=True``) and its older spelling
``model.gradient_checkpointing_enable(...)``. Thrown by transformers itself, it makes every layer call
``torch.utils.checkpoint`` -- inside memsave's regions when the model is wrapped (nested regions), or over a plan's
choice of what to keep. :func:`claim` puts memsave's switch in its place, as instance attributes under the same
public names (no transformers import, no private transformers method):

* on a model memsave already checkpoints (``memsave.wrap(model)``, ``memsave.wrap(model, plan)``), turning the
  switch on keeps memsave's regions as they are, and no layer calls torch's checkpoint;
* after :func:`memsave.integrations.transformers.enable`, turning it on wraps the model's blocks
  (:func:`memsave.find_blocks`, every ``every_n_layers``-th one) with memsave's regions;
* turning it off unwraps the model (:func:`memsave.unwrap`).

The switch objects are module-level classes holding the model, so the model stays deep-copyable and picklable.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from torch import nn

from ..errors import MemsaveWarning
from .blocks import find_blocks
from .wrapping import UNWRAP_HOOKS, WRAP_HOOKS, is_wrapped, unwrap_module, wrap

__all__ = ["SwitchState", "claim", "has_switch", "release", "switch_of"]

_ENABLE = ("activation_checkpointing_enable", "gradient_checkpointing_enable")
_DISABLE = ("activation_checkpointing_disable", "gradient_checkpointing_disable")
_STATE = "_memsave_switch"

#: torch.utils.checkpoint keyword arguments a switch call may carry, and what memsave does with them.
_REGION_OPTIONS = ("preserve_rng_state", "context_fn")
_IGNORED_OPTIONS = ("use_reentrant", "determinism_check", "debug")


@dataclass
class SwitchState:
    """What memsave's switch on a model does.

    Attributes:
        mode: ``"wrap"`` (memsave.wrap claimed it: keep the regions) or ``"enable"`` (wrap the blocks when on).
        options: :func:`memsave.wrap`'s options for the regions the switch makes (``preserve_rng_state``,
            ``strict``, ``context_fn``).
        on: whether the switch was last turned on.
    """

    mode: str
    options: Dict[str, Any] = field(default_factory=dict)
    on: bool = False


def has_switch(model: nn.Module) -> bool:
    """Whether ``model``'s class has a Hugging Face style checkpointing switch (either spelling)."""
    return any(callable(getattr(type(model), name, None)) for name in _ENABLE)


def switch_of(model: nn.Module) -> Optional[SwitchState]:
    """memsave's switch state on ``model``, or None when it has none."""
    state = model.__dict__.get(_STATE)
    return state if isinstance(state, SwitchState) else None


def _options_of(call_kwargs: Optional[Dict[str, Any]], where: str) -> Dict[str, Any]:
    """The region options in a switch call's ``*_checkpointing_kwargs`` (torch.utils.checkpoint's names)."""
    out: Dict[str, Any] = {}
    for key, value in (call_kwargs or {}).items():
        if key in _REGION_OPTIONS:
            out[key] = value
        elif key == "use_reentrant" and value:
            warnings.warn(
                f"{where}: use_reentrant=True asks for torch's reentrant checkpoint; memsave's regions are always "
                "non-reentrant (the same gradients)",
                MemsaveWarning,
                stacklevel=4,
            )
        elif key not in _IGNORED_OPTIONS:
            raise TypeError(
                f"{where}: memsave's checkpointing switch does not take {key!r}; it takes "
                f"{', '.join(_REGION_OPTIONS + _IGNORED_OPTIONS)} (torch.utils.checkpoint's names)"
            )
    return out


class _Enable:
    """``model.activation_checkpointing_enable`` / ``gradient_checkpointing_enable`` under memsave's switch."""

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
        assert state is not None
        if offload:
            raise ValueError(
                f"{where}(offload=True): memsave's regions recompute, they do not offload to host memory; "
                "call it without offload, or memsave.unwrap(model) to use transformers' own switch"
            )
        if not isinstance(every_n_layers, int) or every_n_layers < 1:
            raise ValueError(f"{where}: every_n_layers must be an int >= 1, got {every_n_layers!r}")
        options = {
            **state.options,
            **_options_of(activation_checkpointing_kwargs or gradient_checkpointing_kwargs, where),
        }
        state.on = True
        if any(is_wrapped(m) for m in self.model.modules()):
            return  # memsave's regions (a wrap or a plan) stay as they are
        blocks = find_blocks(self.model)[::every_n_layers]
        if not blocks:
            raise ValueError(f"{where}: memsave.find_blocks found no repeated blocks in {type(self.model).__name__}")
        chosen = set(blocks)
        wrap(self.model, lambda name, module: name in chosen, **options)


class _Disable:
    """``model.activation_checkpointing_disable`` / ``gradient_checkpointing_disable``: memsave.unwrap."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def __call__(self) -> None:
        state = switch_of(self.model)
        if state is not None:
            state.on = False
        for module in self.model.modules():
            unwrap_module(module)


def _switch_holders(model: nn.Module) -> Tuple[nn.Module, ...]:
    """The outermost modules of ``model`` (itself included) that carry a switch (a PEFT model's base model)."""
    holders: List[Tuple[str, nn.Module]] = []
    for name, module in model.named_modules():
        if has_switch(module) and not any(name.startswith(h + ".") or h == "" for h, _ in holders):
            holders.append((name, module))
    return tuple(m for _, m in holders)


def claim(model: nn.Module, mode: str, **options: Any) -> bool:
    """Put memsave's switch on ``model`` (and on its outermost submodules that have one); see the module docstring.

    Transformers' own checkpointing, if it was on, is turned off first (with the model's public ``*_disable``).
    Claiming a model that already has memsave's switch keeps it, upgrading ``"wrap"`` to ``"enable"``.

    Args:
        model: the model.
        mode: ``"wrap"`` or ``"enable"`` (see :class:`SwitchState`).
        **options: :func:`memsave.wrap`'s region options for the blocks the switch wraps.

    Returns:
        True when some module of ``model`` has a switch (now memsave's).

    Examples:
        >>> claim(hf_model, "enable", preserve_rng_state=True)
        True
    """
    if mode not in ("wrap", "enable"):
        raise ValueError(f"claim: mode must be 'wrap' or 'enable', got {mode!r}")
    holders = _switch_holders(model)
    for holder in holders:
        state = switch_of(holder)
        if state is not None:
            if mode == "enable":
                state.mode, state.options = "enable", dict(options)
            continue
        # transformers 5 spells the flag is_activation_checkpointing (is_gradient_checkpointing warns there).
        new = hasattr(type(holder), "is_activation_checkpointing")
        if getattr(holder, "is_activation_checkpointing" if new else "is_gradient_checkpointing", False):
            off = getattr(type(holder), _DISABLE[0], None) or getattr(type(holder), _DISABLE[1])
            off(holder)  # transformers' torch checkpoint must not run inside memsave's regions
        holder.__dict__[_STATE] = SwitchState(mode, dict(options))
        for name in _ENABLE:
            holder.__dict__[name] = _Enable(holder, name)
        for name in _DISABLE:
            holder.__dict__[name] = _Disable(holder)
    return bool(holders)


def release(model: nn.Module, mode: Optional[str] = None) -> None:
    """Take memsave's switch off ``model`` and its submodules (only those claimed in ``mode`` when given):
    transformers' own switch is in force again.

    Examples:
        >>> release(hf_model)
    """
    for module in model.modules():
        state = switch_of(module)
        if state is None or (mode is not None and state.mode != mode):
            continue
        for name in (_STATE, *_ENABLE, *_DISABLE):
            module.__dict__.pop(name, None)


def _claim_after_wrap(model: nn.Module) -> None:
    claim(model, "wrap")


def _release_after_unwrap(model: nn.Module) -> None:
    release(model, "wrap")


WRAP_HOOKS.append(_claim_after_wrap)
UNWRAP_HOOKS.append(_release_after_unwrap)
