"""memsave with Lightning: :class:`MemoryMonitor`, a ``Callback`` logging each training step's peak and activation
bytes (the numbers :class:`memsave.integrations.transformers.MemoryCallback` adds to Trainer's logs).

Works with ``lightning`` (``import lightning.pytorch``) and, when that is absent, ``pytorch_lightning``.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

try:
    from lightning.pytorch.callbacks import Callback
except ImportError:  # the older package name
    from pytorch_lightning.callbacks import Callback  # type: ignore[assignment]

from .step_memory import StepMemoryProbe

__all__ = ["MemoryMonitor"]


class MemoryMonitor(Callback):
    """Log ``peak_bytes`` and ``activation_bytes`` of training steps with ``pl_module.log`` (so every Lightning
    logger, the progress bar with ``prog_bar=True`` and ``trainer.callback_metrics`` see them).

    A step runs from ``on_train_batch_start`` to ``on_train_batch_end``; its activation bytes are read in
    ``on_before_backward`` (the forward and the loss are done, backward has not started), above the step's start;
    its peak is the most allocated at once during the step, above its start (CUDA: ``max_memory_allocated``; CPU:
    live tensors, see :class:`memsave.integrations.StepMemoryProbe`).

    Args:
        every_n_steps: probe every this many training steps (on CPU the probe costs a Python call per operator).
        prog_bar: also show the two numbers in the progress bar.
        device: the device to read; None: the module's.

    Attributes:
        history: ``{"step", "peak_bytes", "activation_bytes"}`` of every probed step.

    Examples:
        >>> from memsave.integrations.lightning import MemoryMonitor
        >>> trainer = lightning.Trainer(max_steps=100, callbacks=[MemoryMonitor(every_n_steps=10)])
        >>> trainer.fit(module, loader); trainer.callback_metrics["peak_bytes"]
    """

    def __init__(self, every_n_steps: int = 1, prog_bar: bool = False, device: Optional[Any] = None) -> None:
        super().__init__()
        if not isinstance(every_n_steps, int) or every_n_steps < 1:
            raise ValueError(f"MemoryMonitor: every_n_steps must be an int >= 1, got {every_n_steps!r}")
        self.every_n_steps = every_n_steps
        self.prog_bar = prog_bar
        self.probe = StepMemoryProbe(device)
        self.history: list = []

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if self.probe.device is None:
            self.probe.device = pl_module.device

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if trainer.global_step % self.every_n_steps == 0:
            self.probe.begin()

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        self.probe.mark_forward_end()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if not self.probe.active:
            return
        reading: Dict[str, int] = self.probe.end()
        self.history.append({"step": trainer.global_step, **reading})
        for key, value in reading.items():
            pl_module.log(key, float(value), on_step=True, on_epoch=False, prog_bar=self.prog_bar, batch_size=1)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if self.probe.active:
            self.probe.end()
