"""The memory of one training step inside a loop someone else drives (Trainer, Lightning): :class:`StepMemoryProbe`.

The readings are :class:`memsave.MemoryMonitor`'s (CUDA: the caching allocator's statistics; CPU: the live-tensor
tracker, on only while a step is probed), taken relative to the start of the step:

* ``peak_bytes``: the most bytes allocated at once during the step, above what was allocated when it began;
* ``activation_bytes``: the bytes allocated when the model's training forward returned (or the loop signalled the
  end of forward, :meth:`StepMemoryProbe.mark_forward_end`), above what was allocated when the step began: the
  activations kept for backward and the output.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Union

import torch
from torch import nn

from ..measurement.monitor import MemoryMonitor

__all__ = ["StepMemoryProbe"]


class StepMemoryProbe:
    """Peak and activation bytes of the training steps it is told about (:meth:`begin` ... :meth:`end`).

    Args:
        device: the device to read; None: the device of the first parameter of the model given to :meth:`attach`
            (else the current CUDA device when CUDA is available, else the CPU).

    Examples:
        >>> probe = StepMemoryProbe().attach(model)
        >>> probe.begin(); loss = model(x).sum(); loss.backward(); opt.step()
        >>> probe.end()
        {'peak_bytes': 1234, 'activation_bytes': 567}
    """

    def __init__(self, device: Optional[Union[str, torch.device]] = None) -> None:
        self.device = None if device is None else torch.device(device)
        self._monitor: Optional[MemoryMonitor] = None
        self._before = 0
        self._forward_end: Optional[int] = None
        self._hook: Any = None

    @property
    def active(self) -> bool:
        """Whether a step is being probed (between :meth:`begin` and :meth:`end`)."""
        return self._monitor is not None

    def attach(self, model: nn.Module) -> "StepMemoryProbe":
        """Read the end of forward from ``model``'s first training forward in each probed step (a forward hook).

        Returns:
            the probe.
        """
        self.detach()
        if self.device is None:
            first = next(iter(model.parameters()), None)
            self.device = first.device if first is not None else None
        self._hook = model.register_forward_hook(self._after_forward)
        return self

    def detach(self) -> None:
        """Remove the forward hook :meth:`attach` added."""
        if self._hook is not None:
            self._hook.remove()
            self._hook = None

    def _after_forward(self, module: nn.Module, args: Any, output: Any) -> None:
        if module.training and torch.is_grad_enabled():
            self.mark_forward_end()

    def begin(self) -> None:
        """A training step starts: reset the peak, take the baseline."""
        if self.active:
            self.end()
        self._monitor = MemoryMonitor(self.device).start()
        self._monitor.reset_peak()
        self._before = int(self._monitor.current()["allocated"] or 0)
        self._forward_end = None

    def mark_forward_end(self) -> None:
        """The forward of the probed step has returned (the first call counts; no-op outside a step)."""
        if self._monitor is not None and self._forward_end is None:
            self._forward_end = int(self._monitor.current()["allocated"] or 0)

    def end(self) -> Dict[str, int]:
        """The step is over: its readings.

        Returns:
            ``{"peak_bytes": ..., "activation_bytes": ...}`` (0 activation bytes when no training forward was seen).

        Raises:
            RuntimeError: no step was begun.
        """
        if self._monitor is None:
            raise RuntimeError("StepMemoryProbe.end: no step was begun (call begin() first)")
        monitor, self._monitor = self._monitor, None
        try:
            peak = int(monitor.current()["peak"] or 0) - self._before
        finally:
            monitor.stop()
        activation = 0 if self._forward_end is None else self._forward_end - self._before
        return {"peak_bytes": max(peak, 0), "activation_bytes": max(activation, 0)}
