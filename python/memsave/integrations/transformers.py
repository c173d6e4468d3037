"""memsave with Hugging Face transformers: :func:`enable` and :class:`MemoryCallback`.

* ``memsave.wrap(model)`` or ``memsave.wrap(model, plan)`` on a ``PreTrainedModel`` stays in force when ``Trainer``
  turns activation checkpointing on (``TrainingArguments(activation_checkpointing=True)``) or the user calls
  ``model.gradient_checkpointing_enable()``: memsave takes over the model's switch when it wraps it, so no layer
  calls ``torch.utils.checkpoint`` and no region is nested in another (:mod:`memsave.recompute.switch`).
* :func:`enable` makes the model's own switch mean memsave: ``model.gradient_checkpointing_enable()`` (or Trainer's
  argument) then wraps the model's blocks with memsave's regions; ``*_disable()`` unwraps them.
* :class:`MemoryCallback` adds each logged step's peak and activation bytes to Trainer's logs.

Only public transformers names are used (the switch's methods, ``TrainerCallback``); :func:`check_version` says
which transformers releases have them.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, TypeVar

from torch import nn
from transformers import TrainerCallback
from transformers import __version__ as transformers_version

from ..recompute.switch import claim, has_switch
from .step_memory import StepMemoryProbe

__all__ = ["MemoryCallback", "check_version", "enable"]

#: The model's own class: :func:`enable` returns the model it was given, typed as it was.
ModuleT = TypeVar("ModuleT", bound=nn.Module)

#: The oldest transformers whose checkpointing switch takes keyword options (``gradient_checkpointing_kwargs``).
MIN_VERSION = (4, 35)


def check_version(version: str = transformers_version) -> None:
    """Raise when ``version`` of transformers is older than :data:`MIN_VERSION` (the switch took no options then).

    Raises:
        ImportError: an older transformers.

    Examples:
        >>> check_version("5.24.0")
    """
    parts = tuple(int(p) for p in version.split(".")[:2] if p.isdigit())
    if parts < MIN_VERSION:
        raise ImportError(
            f"memsave.integrations.transformers needs transformers >= {'.'.join(map(str, MIN_VERSION))}, found "
            f"{version}; pip install -U transformers"
        )


def enable(model: ModuleT, **checkpoint_options: Any) -> ModuleT:
    """Make ``model``'s own checkpointing switch use memsave, in place.

    After this, ``model.gradient_checkpointing_enable(...)``, ``model.activation_checkpointing_enable(...)`` and
    ``Trainer(args with activation_checkpointing=True)`` wrap the model's blocks (:func:`memsave.find_blocks`; with
    ``every_n_layers=k``, every k-th one) as memsave regions, instead of sending each layer through
    ``torch.utils.checkpoint``; ``*_disable()`` unwraps them. The keyword options those calls carry
    (``gradient_checkpointing_kwargs``) are read with torch.utils.checkpoint's names: ``preserve_rng_state`` and
    ``context_fn`` apply to the regions, ``use_reentrant``, ``determinism_check`` and ``debug`` are accepted (memsave's
    regions are always non-reentrant), others raise ``TypeError``; ``offload=True`` raises ``ValueError``.
    A model memsave already checkpoints (a wrap, a plan) keeps its regions when the switch is turned on.

    Args:
        model: a Hugging Face ``PreTrainedModel`` (or a model holding one, such as a PEFT model).
        **checkpoint_options: :func:`memsave.wrap`'s region options for the blocks the switch wraps:
            ``preserve_rng_state``, ``strict``, ``context_fn`` (``memsave.selective("matmul")``, say).

    Returns:
        ``model`` itself, typed as the class it was given (its switch not yet turned on).

    Raises:
        TypeError: ``model`` has no checkpointing switch, or an option that :func:`memsave.wrap` does not take.
        ImportError: transformers is older than :data:`MIN_VERSION`.

    Examples:
        >>> import memsave.integrations.transformers as ms_hf
        >>> ms_hf.enable(model)
        >>> model.gradient_checkpointing_enable()        # memsave's regions around each decoder layer
        >>> Trainer(model, TrainingArguments(..., activation_checkpointing=True), ...)   # the same
    """
    check_version()
    if not isinstance(model, nn.Module):
        raise TypeError(f"enable: model must be an nn.Module, got {type(model).__name__}")
    allowed = ("preserve_rng_state", "strict", "context_fn")
    unknown = sorted(set(checkpoint_options) - set(allowed))
    if unknown:
        raise TypeError(f"enable: unknown option(s) {', '.join(unknown)}; memsave.wrap's are {', '.join(allowed)}")
    if not any(has_switch(m) for m in model.modules()):
        raise TypeError(
            f"enable: {type(model).__name__} has no gradient_checkpointing_enable / activation_checkpointing_enable "
            "switch (not a Hugging Face PreTrainedModel); use memsave.wrap(model) directly"
        )
    claim(model, "enable", **checkpoint_options)
    return model


class MemoryCallback(TrainerCallback):
    """A ``TrainerCallback`` adding each logged training step's memory to Trainer's logs.

    Keys added to the ``logs`` of every training log (and to ``trainer.state.log_history``): ``peak_bytes`` (the most
    allocated at once during the logged step, above its start: CUDA ``max_memory_allocated``, CPU live tensors) and
    ``activation_bytes`` (allocated when the model's training forward returned, above the step's start); see
    :class:`memsave.integrations.StepMemoryProbe`. Only the steps that are logged are probed (on CPU the probe is a
    dispatch mode with a cost per operator).

    Args:
        device: the device to read; None: the model's.

    Examples:
        >>> trainer = Trainer(model, args, train_dataset=ds, callbacks=[MemoryCallback()])
        >>> trainer.train(); trainer.state.log_history[0]["peak_bytes"]
    """

    def __init__(self, device: Optional[Any] = None) -> None:
        check_version()
        self.probe = StepMemoryProbe(device)
        self.last: Optional[Dict[str, int]] = None

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Optional[nn.Module] = None, **kw: Any) -> None:
        if model is not None:
            self.probe.attach(model)

    def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if self.probe.active:
            self.probe.end()
        self.probe.detach()

    @staticmethod
    def _will_log(args: Any, state: Any) -> bool:
        step = state.global_step + 1  # the step about to run
        every = int(getattr(state, "logging_steps", 0) or getattr(args, "logging_steps", 0) or 0)
        strategy = str(getattr(args.logging_strategy, "value", args.logging_strategy))
        if strategy != "steps" or every < 1:
            return True  # epoch-end logging: probe every step, keep the last
        return step % every == 0 or (step == 1 and bool(getattr(args, "logging_first_step", False)))

    def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if self._will_log(args, state):
            self.probe.begin()

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if self.probe.active:
            self.last = self.probe.end()

    def on_log(self, args: Any, state: Any, control: Any, logs: Optional[Dict[str, Any]] = None, **kw: Any) -> None:
        if self.last is None or logs is None or "loss" not in logs:
            return  # evaluation logs, or nothing probed yet
        logs.update(self.last)
        history = state.log_history
        if history and history[-1].get("step") == state.global_step:
            history[-1].update(self.last)  # Trainer copied the logs into its history before calling back
        self.last = None
