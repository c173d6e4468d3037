"""memsave with Hugging Face transformers: :class:`Memsave`, :func:`enable` and :class:`MemoryCallback`.

* :class:`Memsave` does it in one line, ``Trainer(..., callbacks=[Memsave(budget="20GiB")])``: convert, a plan or a
  wrap applied to the model Trainer trains when training begins, and the memory logged as :class:`MemoryCallback`
  logs it.

* ``memsave.wrap(model)`` or ``memsave.wrap(model, plan)`` on a ``PreTrainedModel`` stays in force when ``Trainer``
  turns activation checkpointing on (``TrainingArguments(activation_checkpointing=True)``) or the user calls
  ``model.activation_checkpointing_enable()``: memsave takes over the model's switch when it wraps it, so no layer
  calls ``torch.utils.checkpoint`` and no region is nested in another
  (:mod:`memsave.integrations.transformers_switch`).
* :func:`enable` makes the model's own switch mean memsave: ``model.activation_checkpointing_enable()`` (or Trainer's
  argument) then runs each checkpointed layer as a memsave region; ``*_disable()`` turns that off. The model
  reports it through transformers' own ``model.is_activation_checkpointing``.
* :class:`MemoryCallback` adds each logged step's peak and activation bytes to Trainer's logs, before its reporting
  integrations (TensorBoard, W&B, MLflow) read them.

Only stable transformers names are used (the switch's methods, the layers' ``gradient_checkpointing`` flag and
``_gradient_checkpointing_func``, ``TrainerCallback``); :func:`check_version` says which releases have them.
Importing this module patches nothing; :func:`enable` changes the model it is given, on the instance.
"""

from __future__ import annotations

import inspect
import warnings
import weakref
from typing import Any, Dict, List, Mapping, Optional, Tuple, TypeVar, Union

from torch import nn
from transformers import TrainerCallback
from transformers import __version__ as transformers_version

from ..errors import MemsaveWarning
from ..measurement.units import Budget
from ..recompute import Plan
from ..recompute.region import check_context_fn, check_region_options
from .recipe import Recipe, finish, prepare, sample_batch, split_batch, to_device
from .step_memory import StepMemoryProbe
from .transformers_switch import ENABLE_OPTIONS, claim, has_switch

__all__ = ["MemoryCallback", "Memsave", "check_version", "enable"]

#: The model's own class: :func:`enable` returns the model it was given, typed as it was.
ModuleT = TypeVar("ModuleT", bound=nn.Module)

#: The oldest transformers whose checkpointing switch takes keyword options (a dict of checkpoint options).
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

    After this, ``model.activation_checkpointing_enable(...)`` (and its deprecated ``gradient_*`` alias) and
    ``Trainer(args with activation_checkpointing=True)`` turn transformers' checkpointing on as usual (the layers'
    flags, ``every_n_layers``, ``model.is_activation_checkpointing``), but each checkpointed layer runs as a
    memsave region (:func:`memsave.checkpoint`) instead of going through ``torch.utils.checkpoint``: the layers'
    ``_gradient_checkpointing_func`` is memsave's. ``*_disable()`` turns it off. The keyword options those calls
    carry (``activation_checkpointing_kwargs``) are read with torch.utils.checkpoint's names: ``preserve_rng_state``,
    ``context_fn``, ``determinism_check`` and ``debug`` apply to the regions, ``use_reentrant`` is accepted (memsave's
    regions are always non-reentrant), others raise ``TypeError``; ``offload=True`` raises ``ValueError``.
    If the model's checkpointing is already on, its layers are memsave regions from this call on. A model memsave
    already checkpoints (a wrap, a plan) keeps its regions when the switch is turned on.

    Args:
        model: a Hugging Face ``PreTrainedModel`` (or a model holding one, such as a PEFT model).
        **checkpoint_options: region options for the layers: ``preserve_rng_state``, ``strict``, ``context_fn``
            (``memsave.selective("matmul")``, say), as :func:`memsave.wrap` takes them; a switch call's own
            options override them.

    Returns:
        ``model`` itself, typed as the class it was given.

    Raises:
        TypeError: ``model`` has no checkpointing switch, or no module with transformers' ``gradient_checkpointing``
            flag, or an option that :func:`memsave.wrap` does not take, or an option of the wrong type.
        ImportError: transformers is older than :data:`MIN_VERSION`.

    Examples:
        >>> import memsave.integrations.transformers as ms_hf
        >>> ms_hf.enable(model)
        >>> model.activation_checkpointing_enable()      # each decoder layer a memsave region
        >>> model.is_activation_checkpointing
        True
        >>> Trainer(model, TrainingArguments(..., activation_checkpointing=True), ...)   # the same
    """
    check_version()
    if not isinstance(model, nn.Module):
        raise TypeError(f"enable: model must be an nn.Module, got {type(model).__name__}")
    unknown = sorted(set(checkpoint_options) - set(ENABLE_OPTIONS))
    if unknown:
        raise TypeError(
            f"enable: unknown option(s) {', '.join(unknown)}; memsave.wrap's are {', '.join(ENABLE_OPTIONS)}"
        )
    check_region_options(
        "integrations.transformers.enable", **{k: v for k, v in checkpoint_options.items() if k != "context_fn"}
    )
    check_context_fn("integrations.transformers.enable", checkpoint_options.get("context_fn"))
    if not any(has_switch(m) for m in model.modules()):
        raise TypeError(
            f"enable: {type(model).__name__} has no gradient_checkpointing_enable / activation_checkpointing_enable "
            "switch (not a Hugging Face PreTrainedModel); use memsave.wrap(model) directly"
        )
    if not any(hasattr(m, "gradient_checkpointing") for m in model.modules()):
        raise TypeError(
            f"enable: no module of {type(model).__name__} has transformers' gradient_checkpointing flag, so its "
            "switch checkpoints nothing memsave can take over; use memsave.wrap(model) directly"
        )
    claim(model, "enable", **checkpoint_options)
    return model


class MemoryCallback(TrainerCallback):
    """A ``TrainerCallback`` adding each logged training step's memory to Trainer's logs.

    Keys added to the ``logs`` of every training log (and to ``trainer.state.log_history``): ``peak_bytes`` (the most
    allocated at once during the logged step, above its start: CUDA ``max_memory_allocated``, CPU live tensors) and
    ``activation_bytes`` (allocated when the model's training forward returned, above the step's start); see
    :class:`memsave.integrations.StepMemoryProbe`. Only the steps that are logged are probed (on CPU the probe is a
    dispatch mode with a cost per operator), and a log carries the keys only when its step was measured: never a
    reading of another step.

    Trainer calls its reporting integrations (TensorBoard, W&B, MLflow, ...) in the order of its callback list, and
    puts user callbacks after them; so that they all see the keys, this callback moves itself to the front of that
    list when Trainer is built (and again when training begins). It finds the list from the call that delivers its
    events (transformers has no public hook for it); where it cannot, it warns (``MemsaveWarning``) and only the
    callbacks after it see the keys.

    Args:
        device: the device to read; None: the model's.

    Examples:
        >>> trainer = Trainer(model, args, train_dataset=ds, callbacks=[MemoryCallback()])
        >>> trainer.train(); trainer.state.log_history[0]["peak_bytes"]
    """

    def __init__(self, device: Optional[Any] = None) -> None:
        check_version()
        self.probe = StepMemoryProbe(device)
        self.last: Optional[Tuple[int, Dict[str, int]]] = None  # (the step measured, its reading)

    def on_init_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        _run_first(self)

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Optional[nn.Module] = None, **kw: Any) -> None:
        _run_first(self)  # again: a callback added with trainer.add_callback() after Trainer was built
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
            self.last = (state.global_step, self.probe.end())

    def on_log(self, args: Any, state: Any, control: Any, logs: Optional[Dict[str, Any]] = None, **kw: Any) -> None:
        if self.last is None or logs is None or "loss" not in logs:
            return  # evaluation logs, or nothing probed yet
        step, reading = self.last
        self.last = None
        if step != state.global_step:
            return  # a measured step that was not logged: its reading is not this step's
        logs.update(reading)
        history = state.log_history
        if history and history[-1].get("step") == state.global_step:
            history[-1].update(reading)  # Trainer copied the logs into its history before calling back


def _callback_list(callback: TrainerCallback) -> Optional[List[Any]]:
    """The list of callbacks holding ``callback`` that Trainer's callback handler is calling it from, or None.

    transformers calls each event as ``for cb in self.callbacks: getattr(cb, event)(...)`` in its handler and offers
    no public way to reorder: the handler is the ``self`` of a calling frame whose ``callbacks`` list holds this
    callback.
    """
    frame = inspect.currentframe()
    try:
        for _ in range(8):
            frame = frame.f_back if frame is not None else None
            if frame is None:
                return None
            callbacks = getattr(frame.f_locals.get("self"), "callbacks", None)
            if isinstance(callbacks, list) and any(c is callback for c in callbacks):
                return callbacks
        return None
    finally:
        del frame  # frames in locals keep their locals alive


def _run_first(callback: TrainerCallback) -> None:
    """Move ``callback`` to the front of Trainer's callback list, so that its keys are in the logs before the
    reporting integrations read them (see :class:`MemoryCallback`)."""
    callbacks = _callback_list(callback)
    if callbacks is None:
        if not getattr(callback, "_warned_order", False):
            callback._warned_order = True  # type: ignore[attr-defined]
            warnings.warn(
                f"{type(callback).__name__}: could not find Trainer's callback list, so reporting integrations called "
                "before it (report_to=...) will not see peak_bytes and activation_bytes",
                MemsaveWarning,
                stacklevel=3,
            )
        return
    if callbacks[0] is not callback:
        # Removing it at i and inserting it at 0 leaves every callback after i where it was: the handler's loop,
        # which is at i now, calls the next one as it would have.
        callbacks.remove(callback)
        callbacks.insert(0, callback)


def _device_of(model: nn.Module) -> Optional[Any]:
    first = next(iter(model.parameters()), None)
    return None if first is None else first.device


class Memsave(MemoryCallback):
    """memsave on the model Trainer trains, in one line: :func:`memsave.convert`, then a plan for a memory budget
    or a wrap of the model's blocks, applied when training begins; and each logged step's memory in the logs every
    reporting integration sees, as :class:`MemoryCallback` adds it.

    In ``on_train_begin`` (the model on its device, its optimizer made; memsave keeps every parameter object): the
    checkpointing the model already has is taken off -- transformers' own, whether
    ``TrainingArguments(activation_checkpointing=True)`` or ``model.activation_checkpointing_enable()`` turned it on,
    memsave's switch (:func:`enable`) and ``memsave.wrap`` regions (:mod:`memsave.integrations.recipe`) -- then
    ``convert``, then :func:`memsave.plan` for the budget on a sample batch (the first
    ``per_device_train_batch_size`` samples of the train dataloader's dataset, collated by its collator, moved to the
    model's device; the RNG put back, the loader not iterated) applied with ``memsave.wrap(model, plan)``, or
    without a budget ``memsave.wrap(model)`` on the model's blocks. No layer then calls ``torch.utils.checkpoint``,
    and a lossless recipe (``convert=True``, a plan, a wrap) trains with eager's losses. The plan is for the sample
    batch's shapes: pad or group the data so that batches are alike, or give a budget with room for the longest.

    Args:
        convert: True (:func:`memsave.convert` with its defaults, bitwise eager), a dict of its options
            (``{"fuse": True}``: fused operators and the loss without logits), or False.
        budget: the plan's budget for a training step's peak: an int of bytes, a size string (``"20GiB"``) or a
            fraction of eager's peak below 1 (``0.6``, ``"60%"``); None: no plan.
        checkpoint: without a budget, wrap the model's blocks (:func:`memsave.find_blocks`).
        plan_options: more of :func:`memsave.plan`'s options (``solver``, ``selective``, ``loss_fn``, ...).
        log_memory: log each logged step's memory (False: only apply the recipe).
        device: the device :class:`MemoryCallback` reads; None: the model's.

    Attributes:
        plan: the :class:`memsave.Plan` applied, once training began (None without a budget).

    Raises:
        ValueError: at construction, a budget that does not parse, is not positive or is eager's whole peak or more,
            a budget with ``checkpoint=False``, or nothing to do (``convert=False, budget=None, checkpoint=False``);
            when training begins, :class:`memsave.InfeasibleBudgetError` (with the smallest budget that fits).
        TypeError: an argument of the wrong type, an unknown convert or plan option.
        ImportError: transformers is older than :data:`MIN_VERSION`.

    Examples:
        >>> from memsave.integrations.transformers import Memsave
        >>> Trainer(model, args, train_dataset=ds, callbacks=[Memsave(budget="20GiB")]).train()
        >>> Trainer(model, args, train_dataset=ds, callbacks=[Memsave(convert={"fuse": True})])   # + wrap every block
    """

    def __init__(
        self,
        convert: Union[bool, Mapping[str, Any]] = False,
        budget: Optional[Budget] = None,
        checkpoint: bool = True,
        *,
        plan_options: Optional[Mapping[str, Any]] = None,
        log_memory: bool = True,
        device: Optional[Any] = None,
    ) -> None:
        self.recipe = Recipe.of("Memsave", convert, budget, checkpoint, plan_options)
        super().__init__(device)
        self.log_memory = bool(log_memory)
        self.plan: Optional[Plan] = None
        self._done: "weakref.WeakSet[nn.Module]" = weakref.WeakSet()

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Optional[nn.Module] = None, **kw: Any) -> None:
        if model is None:
            raise RuntimeError("Memsave: Trainer gave on_train_begin no model; transformers >= 4.35 does")
        if model not in self._done:  # a second train() of the same model keeps the recipe applied once
            self._apply(args, state, model, kw.get("train_dataloader"))
            self._done.add(model)
        if self.log_memory:
            super().on_train_begin(args, state, control, model=model, **kw)
        else:
            _run_first(self)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if self.log_memory:
            super().on_step_begin(args, state, control, **kw)

    def _apply(self, args: Any, state: Any, model: nn.Module, loader: Any) -> None:
        inputs = None
        if self.recipe.budget is not None:  # the sample batch first: a loader without one changes nothing
            size = int(getattr(state, "train_batch_size", None) or args.per_device_train_batch_size)
            inputs = split_batch(to_device(sample_batch(loader, size, "Memsave"), _device_of(model)))
        prepared = prepare(model, self.recipe, "Memsave")
        self.plan = finish(model, self.recipe, prepared, "Memsave", inputs)
