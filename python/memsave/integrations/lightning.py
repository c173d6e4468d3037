"""memsave with Lightning: :class:`Memsave` (convert, plan or wrap the ``LightningModule`` in one line) and
:class:`MemoryCallback` (each measured training step's peak and activation bytes in every Lightning logger; the
numbers :class:`memsave.integrations.transformers.MemoryCallback` adds to Trainer's logs).

``MemoryMonitor``, this module's old name for :class:`MemoryCallback`, still works and warns (``DeprecationWarning``):
:class:`memsave.MemoryMonitor` is the monitor of a training loop you write yourself, not a Lightning callback.

Works with ``lightning`` (``import lightning.pytorch``) and, when that is absent, ``pytorch_lightning``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import warnings
import weakref
from typing import Any, Dict, List, Mapping, Optional, Union

from torch import nn

try:
    from lightning.pytorch.callbacks import Callback
except ImportError:  # the older package name
    from pytorch_lightning.callbacks import Callback  # type: ignore[assignment]

from ..measurement.units import Budget
from ..recompute import Plan
from .recipe import Prepared, Recipe, finish, prepare
from .step_memory import StepMemoryProbe

__all__ = ["Memsave", "MemoryCallback"]


def _logger_step(trainer: Any) -> int:
    """The step number Lightning's loggers get for what is logged in the current training batch.

    Lightning logs a batch's metrics after ``on_train_batch_end`` under the count of batches that stepped the
    optimizer so far (``fit_loop.epoch_loop._batches_that_stepped``, not ``trainer.global_step``, which counts
    optimizer steps and is already advanced there). The one private read of this module, with
    ``global_step`` as the fallback for a Lightning without it.
    """
    epoch_loop = getattr(getattr(trainer, "fit_loop", None), "epoch_loop", None)
    count = getattr(epoch_loop, "_batches_that_stepped", None)
    return int(count) if isinstance(count, int) else int(trainer.global_step)


class MemoryCallback(Callback):
    """Log ``peak_bytes`` and ``activation_bytes`` of measured training steps to every logger of the Lightning
    ``Trainer`` (CSV, TensorBoard, W&B, MLflow, ...), at the step numbers the loggers use for the module's own metrics.

    A measured step runs from ``on_train_batch_start`` of a batch whose logger step is a multiple of
    ``every_n_steps`` to the ``on_train_batch_end`` of the batch that steps the optimizer (with gradient
    accumulation: the whole window). Its activation bytes are read in ``on_before_backward`` (the forward and the
    loss are done, backward has not started), above the step's start; its peak is the most allocated at once during
    the step, above its start (CUDA: ``max_memory_allocated``; CPU: live tensors, see
    :class:`memsave.integrations.StepMemoryProbe`). Unmeasured steps log nothing: a logger's rows carry memory
    values exactly on the measured steps. The last reading is also in ``trainer.callback_metrics`` (and the progress
    bar with ``prog_bar=True``).

    Args:
        every_n_steps: measure every this many training steps (on CPU the probe costs a Python call per operator).
        prog_bar: also show the two numbers in the progress bar.
        device: the device to read; None: the module's.

    Attributes:
        history: ``{"step", "peak_bytes", "activation_bytes"}`` of every measured step (``step``: the logger's).

    Raises:
        ValueError: ``every_n_steps`` is not an int >= 1.

    Examples:
        >>> from memsave.integrations.lightning import MemoryCallback
        >>> trainer = lightning.Trainer(max_steps=100, callbacks=[MemoryCallback(every_n_steps=10)])
        >>> trainer.fit(module, loader); trainer.callback_metrics["peak_bytes"]
    """

    def __init__(self, every_n_steps: int = 1, prog_bar: bool = False, device: Optional[Any] = None) -> None:
        super().__init__()
        name = type(self).__name__
        if isinstance(every_n_steps, bool) or not isinstance(every_n_steps, int) or every_n_steps < 1:
            raise ValueError(f"{name}: every_n_steps must be an int >= 1, got {every_n_steps!r}")
        self.every_n_steps = every_n_steps
        self.prog_bar = prog_bar
        self.probe = StepMemoryProbe(device)
        self.history: List[Dict[str, int]] = []
        self._optimizer_steps = 0

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if self.probe.device is None:
            self.probe.device = pl_module.device

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if not self.probe.active and _logger_step(trainer) % self.every_n_steps == 0:
            self.probe.begin()
            self._optimizer_steps = int(trainer.global_step)

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        self.probe.mark_forward_end()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if not self.probe.active or int(trainer.global_step) == self._optimizer_steps:
            return  # not measuring, or an accumulation batch: the step ends with the optimizer's
        reading: Dict[str, int] = self.probe.end()
        step = _logger_step(trainer)
        self.history.append({"step": step, **reading})
        metrics = {key: float(value) for key, value in reading.items()}
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=step)
        for key, value in metrics.items():
            # callback_metrics and the progress bar only: the loggers got the reading above, once, at its step
            pl_module.log(key, value, on_step=True, on_epoch=False, prog_bar=self.prog_bar, logger=False, batch_size=1)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if self.probe.active:
            self.probe.end()


class _TrainingStep(nn.Module):
    """``module.training_step(batch, 0)`` as a module's forward, for :func:`memsave.plan` to profile (its regions
    are the LightningModule's submodules, under ``module.``). ``self.log`` is muted while it runs."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module: Any = module  # a LightningModule (typed Any: this file imports no LightningModule)

    def forward(self, batch: Any) -> Any:
        return self.module.training_step(batch, 0)


def _training_loss(output: Any) -> Any:
    """The loss of a ``training_step`` output: the tensor, or the ``"loss"`` entry of a dict."""
    return output["loss"] if isinstance(output, Mapping) else output


class _Muted:
    """While open, ``module.log`` and ``module.log_dict`` do nothing (instance attributes over the methods)."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module

    def __enter__(self) -> None:
        for name in ("log", "log_dict"):
            self.module.__dict__[name] = lambda *args, **kwargs: None

    def __exit__(self, *exc: Any) -> None:
        for name in ("log", "log_dict"):
            self.module.__dict__.pop(name, None)


class Memsave(MemoryCallback):
    """memsave on a ``LightningModule`` in one line: :func:`memsave.convert`, then a plan for a memory budget or a
    wrap of the module's blocks, applied when fitting starts; and each measured step's memory in the loggers, as
    :class:`MemoryCallback` logs it.

    In ``on_fit_start`` (the module on its device, its optimizers made; memsave keeps every parameter object): the
    checkpointing the module already has is taken off (a Hugging Face model's switch, ``memsave.wrap`` regions:
    :mod:`memsave.integrations.recipe`), then ``convert``, then, without a budget, ``memsave.wrap`` on the module's
    blocks (:func:`memsave.find_blocks`). With a budget, the plan is made in ``on_train_batch_start`` of the first
    batch (on its device, under the trainer's precision, the module's ``training_step`` profiled with ``self.log``
    muted and the RNG put back), and applied before that batch trains: the plan is for that batch's shapes. Planning
    runs ``training_step`` a few extra times, with its other side effects. No region calls
    ``torch.utils.checkpoint``; a lossless recipe (``convert=True``, a plan, a wrap) trains with eager's losses.

    Args:
        convert: True (:func:`memsave.convert` with its defaults, bitwise eager), a dict of its options
            (``{"fuse": True}``), or False.
        budget: the plan's budget for a training step's peak: an int of bytes, a size string (``"20GiB"``) or a
            fraction of eager's peak below 1 (``0.6``, ``"60%"``); None: no plan.
        checkpoint: without a budget, wrap the module's blocks.
        plan_options: more of :func:`memsave.plan`'s options (``solver``, ``selective``, ``loss_fn``, ...; the
            default loss is ``training_step``'s, or its ``"loss"`` entry).
        every_n_steps, prog_bar, device: as for :class:`MemoryCallback`.
        log_memory: log each measured step's memory (False: only apply the recipe).

    Attributes:
        plan: the :class:`memsave.Plan` applied, once it is made (None without a budget).

    Raises:
        ValueError: at construction, a budget that does not parse, is not positive or is eager's whole peak or more,
            a budget with ``checkpoint=False``, nothing to do, or a bad ``every_n_steps``; when fitting starts, a
            budget with ``automatic_optimization=False`` (the plan profiles ``training_step`` as one forward and
            backward); in the first batch, :class:`memsave.InfeasibleBudgetError` (with the smallest budget that
            fits).
        TypeError: an argument of the wrong type, an unknown convert or plan option.

    Examples:
        >>> from memsave.integrations.lightning import Memsave
        >>> lightning.Trainer(max_steps=1000, callbacks=[Memsave(budget="20GiB")]).fit(module, loader)
        >>> lightning.Trainer(callbacks=[Memsave(convert={"fuse": True})])       # convert, then wrap every block
    """

    def __init__(
        self,
        convert: Union[bool, Mapping[str, Any]] = False,
        budget: Optional[Budget] = None,
        checkpoint: bool = True,
        *,
        plan_options: Optional[Mapping[str, Any]] = None,
        every_n_steps: int = 1,
        prog_bar: bool = False,
        device: Optional[Any] = None,
        log_memory: bool = True,
    ) -> None:
        self.recipe = Recipe.of("Memsave", convert, budget, checkpoint, plan_options)
        super().__init__(every_n_steps, prog_bar, device)
        self.log_memory = bool(log_memory)
        self.plan: Optional[Plan] = None
        self._pending: "weakref.WeakKeyDictionary[nn.Module, Prepared]" = weakref.WeakKeyDictionary()
        self._done: "weakref.WeakSet[nn.Module]" = weakref.WeakSet()

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        if pl_module in self._done or pl_module in self._pending:
            return  # a second fit of the same module: the recipe is in place
        if self.recipe.budget is not None and not getattr(pl_module, "automatic_optimization", True):
            raise ValueError(
                "Memsave: a budget needs automatic_optimization=True (the plan profiles training_step as one forward "
                "and backward); with manual optimization use Memsave(convert=..., checkpoint=True) or memsave.plan"
            )
        prepared = prepare(pl_module, self.recipe, "Memsave")
        if self.recipe.budget is None:
            finish(pl_module, self.recipe, prepared, "Memsave")
            self._done.add(pl_module)
        else:
            self._pending[pl_module] = prepared

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        prepared = self._pending.pop(pl_module, None)
        if prepared is not None:
            self._plan(trainer, pl_module, prepared, batch)
            self._done.add(pl_module)
        if self.log_memory:
            super().on_train_batch_start(trainer, pl_module, batch, batch_idx)

    def _plan(self, trainer: Any, pl_module: nn.Module, prepared: Prepared, batch: Any) -> None:
        recipe = self.recipe
        if "loss_fn" not in recipe.plan_options:
            recipe = dataclasses.replace(recipe, plan_options={**recipe.plan_options, "loss_fn": _training_loss})
        precision = getattr(getattr(trainer, "precision_plugin", None), "train_step_context", None)
        with _Muted(pl_module), precision() if callable(precision) else contextlib.nullcontext():
            self.plan = finish(_TrainingStep(pl_module), recipe, prepared, "Memsave", ((batch,), {}))


def __getattr__(name: str) -> Any:
    """``MemoryMonitor``: the old name of :class:`MemoryCallback`, with a ``DeprecationWarning``."""
    if name == "MemoryMonitor":
        warnings.warn(
            "memsave.integrations.lightning.MemoryMonitor is now MemoryCallback (memsave.MemoryMonitor is the monitor "
            "of a loop you write yourself); the old name will be removed",
            DeprecationWarning,
            stacklevel=2,
        )
        return MemoryCallback
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
