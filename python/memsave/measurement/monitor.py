"""Memory of a training loop, step by step: :class:`MemoryMonitor`; CUDA memory snapshots: :func:`cuda_memory_snapshot`.

What people otherwise read off ``nvidia-smi`` or ``gpustat`` -- numbers that include the CUDA context and the
caching allocator's cache -- taken from the allocator itself:

* **CUDA**: ``torch.cuda.memory_allocated`` (live tensors now), ``torch.cuda.max_memory_allocated`` (the peak since
  the previous step; the monitor calls ``torch.cuda.reset_peak_memory_stats`` after reading it) and
  ``torch.cuda.memory_reserved`` (what the allocator holds, for fragmentation).
* **CPU**: PyTorch keeps no CPU allocator statistics, and the allocator-level CPU peak needs the profiler (one step
  at a time: :func:`memsave.measure`). The monitor instead runs the live-tensor tracker
  (:mod:`memsave._tracker`) while it is active: "allocated" is the bytes of the tensors created since the monitor
  started that are still alive (plus the model's parameters and buffers when ``model=`` is given), "peak" the most
  of them alive at once during the step. It does not see kernel temporaries, and it costs a Python call per
  operator, so use it to see the shape of memory, not for timing.
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass
from typing import Any, Dict, Iterable, Iterator, List, Optional, TypeVar, Union

import torch
from torch import nn

from ..common import compat
from .tracker import LiveTensorTracker
from .units import format_bytes

__all__ = ["MemoryMonitor", "StepMemory", "cuda_memory_snapshot"]

T = TypeVar("T")

#: What Lightning and transformers look up on a callback before its ``on_*`` hooks (Lightning: ``state_dict`` when
#: its Trainer is built, then ``setup``): :class:`MemoryMonitor` answers them with a TypeError naming the callbacks.
_CALLBACK_HOOKS = frozenset({"state_dict", "load_state_dict", "state_key", "setup", "teardown"})


@dataclass(frozen=True)
class StepMemory:
    """Memory of one step, as recorded by :meth:`MemoryMonitor.step`.

    Attributes:
        step: 1-based step number.
        allocated_bytes: bytes allocated (CUDA) or tracked live (CPU) at the end of the step.
        peak_bytes: the most allocated / live at any time during the step.
        reserved_bytes: CUDA only: bytes the caching allocator holds at the end of the step.
        extra: the keyword arguments passed to :meth:`MemoryMonitor.step` (a loss, say).
    """

    step: int
    allocated_bytes: int
    peak_bytes: int
    reserved_bytes: Optional[int] = None
    extra: Optional[Dict[str, Any]] = None


class MemoryMonitor:
    """Per-step allocated and peak memory of a training loop, into a tqdm progress bar or a logger.

    Args:
        device: the device to watch; default: the current CUDA device when CUDA is available, else the CPU.
        pbar: a ``tqdm`` progress bar: each step sets its postfix to ``mem=..., peak=...`` (plus ``step()``'s
            keyword arguments).
        logger: a :class:`logging.Logger` (or a logger name): each ``log_every`` steps it logs one INFO line.
        log_every: log every this many steps.
        model: CPU only: its parameters and buffers are counted in "allocated" and "peak" (they exist before the
            monitor starts, so the tracker would not see them).

    The monitor is active between :meth:`start` and :meth:`stop` (or inside ``with monitor:``); :meth:`iterate`
    starts it and records a step after each item's loop body. ``history`` keeps every :class:`StepMemory`.

    Examples:
        >>> monitor = memsave.MemoryMonitor(pbar=pbar)
        >>> for x, y in monitor.iterate(pbar):          # pbar = tqdm(loader)
        ...     loss = loss_fn(model(x), y); loss.backward(); opt.step(); opt.zero_grad()
        >>> max(s.peak_bytes for s in monitor.history)
    """

    def __init__(
        self,
        device: Optional[Union[str, torch.device]] = None,
        *,
        pbar: Any = None,
        logger: Optional[Union[logging.Logger, str]] = None,
        log_every: int = 1,
        model: Optional[nn.Module] = None,
    ) -> None:
        if device is None:
            device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else "cpu"
        try:
            dev = torch.device(device)
        except (RuntimeError, TypeError):  # "tpu", 3.5, a model passed first
            hint = " (pass the model as model=...)" if isinstance(device, nn.Module) else ""
            raise ValueError(
                f"MemoryMonitor: device must be 'cpu', 'cuda' or 'cuda:N' (a str or torch.device), got "
                f"{type(device).__name__} {device!r}{hint}"
            ) from None
        if dev.type == "cuda":
            if not torch.cuda.is_available():
                raise ValueError("MemoryMonitor: device='cuda' but CUDA is not available; use device='cpu'")
            if dev.index is None:
                dev = torch.device("cuda", torch.cuda.current_device())
        elif dev.type != "cpu":
            raise ValueError(f"MemoryMonitor: device must be 'cpu' or 'cuda', got {str(device)!r}")
        if not isinstance(log_every, int) or log_every < 1:
            raise ValueError(f"MemoryMonitor: log_every must be an int >= 1, got {log_every!r}")
        if pbar is not None and not callable(getattr(pbar, "set_postfix", None)):
            raise TypeError(
                f"MemoryMonitor: pbar must be a tqdm progress bar (with set_postfix), got {type(pbar).__name__}"
            )
        self.device = dev
        self.pbar = pbar
        self.logger = logging.getLogger(logger) if isinstance(logger, str) else logger
        self.log_every = log_every
        self.history: List[StepMemory] = []
        self._model = model
        self._baseline = 0
        self._tracker: Optional[LiveTensorTracker] = None
        self._active = False

    def __getattr__(self, name: str) -> Any:
        # Only for names the class lacks: a trainer looking up a callback hook gets a pointer to the right class.
        if name in _CALLBACK_HOOKS or name.startswith("on_"):
            raise TypeError(
                f"memsave.MemoryMonitor is the memory monitor of a training loop you write yourself, not a trainer "
                f"callback (a trainer asked it for {name!r}); pass "
                "memsave.integrations.lightning.MemoryCallback() to lightning.Trainer(callbacks=[...]), "
                "memsave.integrations.transformers.MemoryCallback() to transformers.Trainer(callbacks=[...])"
            )
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    # ------------------------------------------------------------------ lifetime
    def start(self) -> "MemoryMonitor":
        """Begin watching: reset the CUDA peak, or enter the live-tensor tracker on CPU. Returns the monitor."""
        if self._active:
            return self
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            self._baseline = _module_bytes(self._model) if self._model is not None else 0
            self._tracker = LiveTensorTracker(track_modules=False)
            self._tracker.__enter__()
        self._active = True
        return self

    def stop(self) -> None:
        """Stop watching (exit the tracker on CPU). Steps already recorded stay in ``history``."""
        if not self._active:
            return
        self._active = False
        if self._tracker is not None:
            tracker, self._tracker = self._tracker, None
            tracker.__exit__(None, None, None)

    def __enter__(self) -> "MemoryMonitor":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def reset_peak(self) -> None:
        """Start a new peak from now (as :meth:`step` does), without recording a step.

        Examples:
            >>> monitor.reset_peak(); train_step(); monitor.current()["peak"]
        """
        if not self._active:
            raise RuntimeError("MemoryMonitor: not started; call start(), use `with monitor:` or monitor.iterate(...)")
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            assert self._tracker is not None
            self._tracker.reset_peak()

    # ------------------------------------------------------------------ readings
    def current(self) -> Dict[str, Optional[int]]:
        """Allocated, peak-since-last-step and reserved bytes now, without recording a step or resetting the peak."""
        if not self._active:
            raise RuntimeError("MemoryMonitor: not started; call start(), use `with monitor:` or monitor.iterate(...)")
        if self.device.type == "cuda":
            return {
                "allocated": torch.cuda.memory_allocated(self.device),
                "peak": torch.cuda.max_memory_allocated(self.device),
                "reserved": torch.cuda.memory_reserved(self.device),
            }
        assert self._tracker is not None
        return {
            "allocated": self._baseline + self._tracker.live_bytes,
            "peak": self._baseline + self._tracker.peak_bytes,
            "reserved": None,
        }

    def step(self, **extra: Any) -> StepMemory:
        """Record the step that just ended, reset the peak, update the progress bar and the logger.

        Args:
            **extra: shown in the progress bar and the log line beside the memory (``loss=loss.item()``).

        Returns:
            the :class:`StepMemory` (also appended to ``history``).
        """
        now = self.current()
        rec = StepMemory(
            len(self.history) + 1,
            int(now["allocated"] or 0),
            int(now["peak"] or 0),
            now["reserved"],
            dict(extra) if extra else None,
        )
        self.reset_peak()
        self.history.append(rec)
        if self.pbar is not None:
            self.pbar.set_postfix(**self.postfix(rec, **extra))
        if self.logger is not None and rec.step % self.log_every == 0:
            self.logger.info("%s", self.format(rec))
        return rec

    def postfix(self, rec: Optional[StepMemory] = None, **extra: Any) -> Dict[str, Any]:
        """The progress-bar fields of ``rec`` (default: the last step): ``extra``, then ``mem`` and ``peak``."""
        rec = rec if rec is not None else (self.history[-1] if self.history else None)
        fields: Dict[str, Any] = dict(extra)
        if rec is not None:
            fields["mem"] = format_bytes(rec.allocated_bytes)
            fields["peak"] = format_bytes(rec.peak_bytes)
        return fields

    def format(self, rec: StepMemory) -> str:
        """One log line for ``rec``."""
        what = "allocated" if self.device.type == "cuda" else "live tensors"
        parts = [f"step {rec.step}: {what} {format_bytes(rec.allocated_bytes)}, peak {format_bytes(rec.peak_bytes)}"]
        if rec.reserved_bytes is not None:
            parts.append(f"reserved {format_bytes(rec.reserved_bytes)}")
        if rec.extra:
            parts += [f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in rec.extra.items()]
        return f"[{self.device}] " + ", ".join(parts)

    def iterate(self, iterable: Iterable[T]) -> Iterator[T]:
        """Yield the items of ``iterable``; record a step after each item's loop body. Starts and stops the monitor.

        Examples:
            >>> for batch in monitor.iterate(tqdm(loader)):
            ...     train_step(batch)
        """
        started_here = not self._active
        self.start()
        try:
            for item in iterable:
                yield item
                self.step()
        finally:
            if started_here:
                self.stop()

    @property
    def max_peak_bytes(self) -> int:
        """The largest step peak recorded so far (0 before the first step)."""
        return max((s.peak_bytes for s in self.history), default=0)


def _module_bytes(model: nn.Module) -> int:
    seen, total = set(), 0
    for t in list(model.parameters()) + list(model.buffers()):
        key = t.untyped_storage()._cdata
        if key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes()
    return total


def _check_snapshot_support() -> None:
    compat.cuda_memory_history()
    if not torch.cuda.is_available():
        raise RuntimeError("cuda_memory_snapshot needs a CUDA device (the snapshot records the CUDA caching allocator)")


@contextlib.contextmanager
def cuda_memory_snapshot(path: Union[str, os.PathLike], max_entries: int = 100_000) -> Iterator[None]:
    """Record every CUDA allocation and free (with stack traces) while active, then write a snapshot to ``path``.

    Open the file at https://pytorch.org/memory_viz to see each tensor's lifetime over the step. This is the only
    place memsave calls the allocator's private history API (``torch.cuda.memory._record_memory_history`` and
    ``_dump_snapshot``, torch >= 2.1).

    Args:
        path: where to write the pickle.
        max_entries: the most allocation events kept (oldest dropped first).

    Raises:
        RuntimeError: no CUDA device, or a torch without the history API.

    Examples:
        >>> with memsave.measurement.monitor.cuda_memory_snapshot("step.pickle"):
        ...     loss_fn(model(x)).backward()
    """
    _check_snapshot_support()
    torch.cuda.memory._record_memory_history(max_entries=max_entries)
    try:
        yield
    finally:
        try:
            torch.cuda.memory._dump_snapshot(os.fspath(path))
        finally:
            torch.cuda.memory._record_memory_history(enabled=None)
