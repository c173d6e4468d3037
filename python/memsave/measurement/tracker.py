"""Live-tensor tracker: which module's tensors hold how many bytes, on any device, fake tensors included.

The tracker is a :class:`~torch.utils._python_dispatch.TorchDispatchMode`. Every operator that runs while it is
active passes through :meth:`LiveTensorTracker.__torch_dispatch__`; each tensor the operator returns whose storage is
new (not the storage of one of the operator's inputs, not a storage already tracked: views and in-place results are
skipped) is recorded with its storage's ``nbytes`` and the qualified name of the innermost module whose ``forward``
was running. A :func:`weakref.finalize` on the storage's Python object subtracts the bytes when the storage dies.

Why a finalizer on the storage object is sound (checked on torch 2.1 .. 2.11): since torch 2.0 an
``UntypedStorage``'s Python object is *preserved* as long as its C++ ``StorageImpl`` lives, the same mechanism
tensors use. Dropping every Python reference to the storage object, or to the tensor, does not kill it while the
C++ side still holds the storage (a tensor saved for backward inside an autograd node, a view, a parameter's
``.grad``); the Python object is deallocated, and its finalizer runs, only when the C++ storage is released. The
test suite checks this behaviour (``tests/measurement/test_measure.py``), so a torch release that changed it would
be caught.

Operators run below autograd, so the tracker sees forward outputs, tensors saved for backward, recomputation in
backward (checkpointing) and gradients alike; it does not see allocations an operator makes internally and frees
before returning (kernel workspaces): the allocator-level measures of :mod:`memsave.measurement.allocator` do.

Fake tensors: the tracker works on fake tensors, so a caller can estimate memory without allocating any. Enter it
*inside* the fake mode so that it sits above it on the mode stack::

    with FakeTensorMode() as fake_mode:
        fake_model = ...; fake_x = fake_mode.from_tensor(x)
        with LiveTensorTracker(root=fake_model) as tracker:
            fake_model(fake_x).sum().backward()
    print(tracker.peak_bytes)
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

import torch
from torch.nn.modules import module as _module_mod
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

__all__ = ["LiveTensorTracker", "NO_MODULE", "storage_nbytes", "storage_of"]

#: Name under which bytes created outside any module's ``forward`` are reported (a loss, for example).
NO_MODULE = "<no module>"


def storage_of(t: torch.Tensor) -> Optional[torch.UntypedStorage]:
    """The tensor's untyped storage, or None for tensors without one (sparse, nested, some subclasses)."""
    try:
        return t.untyped_storage()
    except (RuntimeError, NotImplementedError, TypeError):
        return None


def storage_nbytes(storage: torch.UntypedStorage) -> Optional[int]:
    """The storage's size in bytes, or None when it is symbolic and has no concrete value (dynamic shapes)."""
    try:
        return int(storage.nbytes())
    except (RuntimeError, TypeError, ValueError):
        return None


@dataclass
class _Record:
    nbytes: int
    module: str
    finalizer: Any  # weakref.finalize


class LiveTensorTracker(TorchDispatchMode):
    """Count the bytes of live tensors created by operators while active, per module.

    Args:
        root: the model whose ``named_modules()`` give the qualified names used for attribution (the root itself
            is ``""``). Modules outside ``root`` are named ``"<ClassName>"``; bytes created outside any module's
            forward go to ``NO_MODULE``. Without ``root`` every module is named by its class.
        track_modules: install global module forward hooks while active to know which module is running. Turn it
            off when only totals are needed (slightly faster).

    Attributes:
        live_bytes: bytes of tracked storages alive now.
        peak_bytes: the largest ``live_bytes`` seen since entry or since :meth:`reset_peak`.

    Only storages created while the tracker is active count: parameters, buffers and inputs that existed before
    are not tracked, so ``live_bytes`` after a forward is exactly the activation memory of that forward.

    When the tracker exits, its finalizers are detached: the counters keep their values at exit and storages that
    die later no longer touch it.

    Examples:
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU())
        >>> x = torch.randn(2, 4)
        >>> with LiveTensorTracker(root=model) as tracker:
        ...     out = model(x)
        ...     tracker.live_by_module()
        {'1': 64}
    """

    def __init__(self, root: Optional[torch.nn.Module] = None, track_modules: bool = True) -> None:
        super().__init__()
        self._root = root
        self._track_modules = track_modules
        self._names: Dict[int, str] = {}
        self._stack: List[str] = []
        self._records: Dict[int, _Record] = {}
        self._lock = threading.Lock()
        self._handles: List[Any] = []
        self.live_bytes = 0
        self.peak_bytes = 0

    # ------------------------------------------------------------------ context management
    def __enter__(self) -> "LiveTensorTracker":
        if self._root is not None:
            self._names = {id(m): name for name, m in self._root.named_modules()}
        self._stack = []
        if self._track_modules:
            self._handles = [
                _module_mod.register_module_forward_pre_hook(self._pre_hook),
                _module_mod.register_module_forward_hook(self._post_hook, always_call=True),
            ]
        return super().__enter__()

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        try:
            super().__exit__(exc_type, exc, tb)
        finally:
            for h in self._handles:
                h.remove()
            self._handles = []
            with self._lock:
                records = list(self._records.values())
                self._records.clear()
            for r in records:
                r.finalizer.detach()

    def _module_name(self, module: torch.nn.Module) -> str:
        name = self._names.get(id(module))
        return name if name is not None else f"<{type(module).__name__}>"

    def _pre_hook(self, module: torch.nn.Module, args: Any) -> None:
        self._stack.append(self._module_name(module))

    def _post_hook(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        # A module whose forward raised still pops (always_call=True); guard against an unbalanced stack.
        if self._stack:
            self._stack.pop()

    # ------------------------------------------------------------------ accounting
    def storage_freed(self, key: int) -> None:
        """Called when a tracked storage dies (subclasses extend it, calling ``super()`` first)."""
        with self._lock:
            rec = self._records.pop(key, None)
            if rec is not None:
                self.live_bytes -= rec.nbytes

    def track_storage(self, storage: torch.UntypedStorage, nbytes: int) -> None:
        """Start counting ``storage`` (made by an operator while the tracker is active) as ``nbytes`` bytes.

        Subclasses extend it (the planner logs the event, the estimator rounds to allocator blocks).
        """
        key = storage._cdata
        module = self._stack[-1] if self._stack else NO_MODULE
        fin = weakref.finalize(storage, self.storage_freed, key)
        # Finalizers left at interpreter exit must not run (the tracker may be half torn down).
        fin.atexit = False
        with self._lock:
            self._records[key] = _Record(nbytes, module, fin)
            self.live_bytes += nbytes
            if self.live_bytes > self.peak_bytes:
                self.peak_bytes = self.live_bytes

    def resize_storage(self, key: int, nbytes: int) -> None:
        """A tracked storage was resized in place (``resize_``, ``out=``) to ``nbytes``."""
        with self._lock:
            rec = self._records.get(key)
            if rec is not None and rec.nbytes != nbytes:
                self.live_bytes += nbytes - rec.nbytes
                rec.nbytes = nbytes
                if self.live_bytes > self.peak_bytes:
                    self.peak_bytes = self.live_bytes

    @staticmethod
    def _input_storages(args: Any, kwargs: Any) -> set:
        keys = set()
        for t in tree_flatten((args, kwargs))[0]:
            if isinstance(t, torch.Tensor):
                s = storage_of(t)
                if s is not None:
                    keys.add(s._cdata)
        return keys

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        outputs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        if not outputs:
            return out
        # Storages of the inputs, collected only once an output storage is not tracked yet (in-place ops and views
        # of tracked tensors never need them).
        inputs: Optional[set] = None
        seen = set()
        for t in outputs:
            s = storage_of(t)
            if s is None:
                continue
            key = s._cdata
            if key in seen:
                continue
            seen.add(key)
            nbytes = storage_nbytes(s)
            if nbytes is None or (nbytes == 0 and key not in self._records):
                continue
            if key in self._records:
                # In-place resize (resize_, out= variants) of a storage we already count.
                self.resize_storage(key, nbytes)
            else:
                if inputs is None:
                    inputs = self._input_storages(args, kwargs)
                if key not in inputs:
                    self.track_storage(s, nbytes)
        return out

    # ------------------------------------------------------------------ queries
    def reset_peak(self) -> None:
        """Set ``peak_bytes`` to the current ``live_bytes``."""
        with self._lock:
            self.peak_bytes = self.live_bytes

    def live_by_module(self) -> Dict[str, int]:
        """Bytes of the tracked storages alive now, grouped by the module that created them.

        Returns:
            dict qualified module name -> bytes, largest first; sums to ``live_bytes``.
        """
        totals: Dict[str, int] = {}
        with self._lock:
            for rec in self._records.values():
                totals[rec.module] = totals.get(rec.module, 0) + rec.nbytes
        return dict(sorted(totals.items(), key=lambda kv: (-kv[1], kv[0])))

    @property
    def num_live(self) -> int:
        """Number of tracked storages alive now."""
        return len(self._records)
