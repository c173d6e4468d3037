"""State that a checkpointed region must replay or protect in its recompute.

Kept apart from :mod:`memsave.checkpoint` so the region logic there stays readable:

* nested containers: walking / mapping the tensors inside tuples, lists and dicts of arguments;
* the per-thread stack of regions whose forward is running, and the global module hooks that record, for
  each module called inside such a region, its ``training`` flag and (when the module changes its own
  buffers) the buffer values it started from;
* the autocast state at region entry (the RNG states are :class:`memsave.common.rng.RngState`).
"""

from __future__ import annotations

import copy
import threading
import weakref
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import torch
from torch import nn

# --------------------------------------------------------------------------------------------------------------
# Nested containers
# --------------------------------------------------------------------------------------------------------------


def iter_tensors(obj: Any, path: str) -> Iterator[Tuple[str, torch.Tensor]]:
    """Yield ``(path, tensor)`` for every tensor inside tuples, lists and dicts of ``obj`` (depth first)."""
    if isinstance(obj, torch.Tensor):
        yield path, obj
    elif isinstance(obj, (tuple, list)):
        for i, item in enumerate(obj):
            yield from iter_tensors(item, f"{path}[{i}]")
    elif isinstance(obj, dict):
        for key, item in obj.items():
            yield from iter_tensors(item, f"{path}[{key!r}]")


def map_tensors(fn: Callable[[torch.Tensor], Any], obj: Any) -> Any:
    """Return ``obj`` with every tensor inside tuples (named tuples too), lists and dicts replaced by ``fn(t)``."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, tuple):
        items = [map_tensors(fn, item) for item in obj]
        if hasattr(obj, "_fields"):  # named tuple
            return type(obj)(*items)
        return tuple(items) if type(obj) is tuple else type(obj)(items)
    if isinstance(obj, list):
        return (
            [map_tensors(fn, item) for item in obj]
            if type(obj) is list
            else type(obj)(map_tensors(fn, item) for item in obj)
        )
    if isinstance(obj, dict):
        if type(obj) is dict:
            return {key: map_tensors(fn, item) for key, item in obj.items()}
        new = copy.copy(obj)  # keeps the subclass (OrderedDict, defaultdict's factory, ...)
        for key, item in obj.items():
            new[key] = map_tensors(fn, item)
        return new
    return obj


# --------------------------------------------------------------------------------------------------------------
# Active regions and the module hooks
# --------------------------------------------------------------------------------------------------------------


class _ThreadState(threading.local):
    def __init__(self) -> None:
        # Module-record tables of the regions whose forward is running on this thread, innermost last.
        self.records: List["ModuleRecords"] = []
        # Module calls in progress inside some region: (module, snapshot), innermost last.
        self.calls: List[Tuple[nn.Module, "ModuleSnapshot"]] = []


tls = _ThreadState()


# Forwards that, in training mode, normalise with batch statistics and only *write* their buffers (running stats,
# num_batches_tracked). A recompute of such a module may start from scratch copies taken at recompute time, so no
# region-entry copy has to stay alive from forward to backward (which would cost more than torch's checkpoint keeps).
_WRITE_ONLY_BUFFER_FORWARDS = frozenset({nn.BatchNorm1d.forward, nn.SyncBatchNorm.forward, nn.InstanceNorm1d.forward})
# Stands for "clone the buffer's current value when the recompute starts" in a snapshot.
CLONE_AT_REPLAY: Any = object()


def _buffers_write_only(module: nn.Module) -> bool:
    """True when ``module``'s output cannot depend on its buffers' values (see _WRITE_ONLY_BUFFER_FORWARDS).

    Only torch's own forwards count (a subclass overriding forward may read its buffers), and a module with forward
    pre-hooks is excluded (a hook may read them).
    """
    return (
        module.training
        and not module._forward_pre_hooks
        and getattr(type(module), "forward", None) in _WRITE_ONLY_BUFFER_FORWARDS
    )


class ModuleSnapshot:
    """A module's ``training`` flag and own buffers as they were when a call of it started.

    ``buffers`` maps each buffer name to ``(tensor object, version, clone)``; the clone is what the recompute
    starts from when the call turns out to change the module's buffers.
    """

    __slots__ = ("buffers", "training")

    def __init__(self, module: nn.Module) -> None:
        self.training = module.training
        write_only = _buffers_write_only(module)
        bufs: Dict[str, Tuple[Optional[torch.Tensor], int, Any]] = {}
        for name, buf in module._buffers.items():
            if buf is None:
                bufs[name] = (None, -1, None)
            elif write_only:
                bufs[name] = (buf, buf._version, CLONE_AT_REPLAY)
            else:
                with torch.no_grad():
                    bufs[name] = (buf, buf._version, buf.detach().clone())
        self.buffers = bufs

    def buffers_changed(self, module: nn.Module) -> bool:
        """Whether the module replaced or (as seen by a version counter) modified any of its own buffers.

        BatchNorm writes ``running_mean``/``running_var`` without bumping their version counter, but always
        bumps ``num_batches_tracked`` (``add_(1)``) in the same call: the module counts as changed as a whole.
        """
        current = module._buffers
        for name, (obj, version, _) in self.buffers.items():
            now = current.get(name)
            if now is not obj:
                return True
            if obj is not None and obj._version != version:
                return True
        return False

    def buffer_values(self) -> Dict[str, Optional[torch.Tensor]]:
        return {name: clone for name, (_, _, clone) in self.buffers.items()}


class ModuleRecord:
    """What a region remembers about one module it called: replayed during its recompute."""

    __slots__ = ("buffers", "module_ref", "training")

    def __init__(self, module: nn.Module, training: bool) -> None:
        self.module_ref = weakref.ref(module)
        self.training = training
        # Buffer values at the region's first call that changed them; None when the region never changed them.
        self.buffers: Optional[Dict[str, Optional[torch.Tensor]]] = None


class ModuleRecords(dict):
    """One region's :class:`ModuleRecord` per module id, filled by the module hooks while its forward runs."""

    def note(self, module: nn.Module, snap: ModuleSnapshot, changed: bool) -> None:
        """Record one finished call of ``module`` inside the region (the first call's state wins)."""
        rec = self.get(id(module))
        if rec is None or rec.module_ref() is not module:
            rec = ModuleRecord(module, snap.training)
            self[id(module)] = rec
        if changed and rec.buffers is None:
            # Earlier calls (if any) left the buffers alone, so this call's starting values are the region's.
            rec.buffers = snap.buffer_values()

    def including(self, calls: List[Tuple[nn.Module, "ModuleSnapshot"]]) -> "ModuleRecords":
        """A copy of these records that also notes ``calls``, module calls still in progress (oldest first).

        For a recompute that starts before the region's forward has ended (a backward inside the region): a module
        whose call has begun must start the recompute from its state at that call's start too. The records
        themselves are left alone.
        """
        out = ModuleRecords()
        for key, rec in self.items():
            twin = ModuleRecord.__new__(ModuleRecord)
            twin.module_ref, twin.training, twin.buffers = rec.module_ref, rec.training, rec.buffers
            out[key] = twin
        for module, snap in calls:
            out.note(module, snap, snap.buffers_changed(module))
        return out


def _pre_hook(module: nn.Module, args: Any) -> None:
    if not tls.records:
        return
    tls.calls.append((module, ModuleSnapshot(module)))


def _post_hook(module: nn.Module, args: Any, output: Any) -> None:
    calls = tls.calls
    # Find this module's entry from the top; entries above it belong to calls that raised.
    for pos in range(len(calls) - 1, -1, -1):
        if calls[pos][0] is module:
            snap = calls[pos][1]
            del calls[pos:]
            break
    else:
        return
    changed = snap.buffers_changed(module)
    for records in tls.records:
        records.note(module, snap, changed)


_hook_lock = threading.Lock()
_hook_users = 0
_hook_handles: List[Any] = []


def acquire_module_hooks() -> None:
    """Register the global module hooks (reference counted).

    A global module hook turns off ``nn.Module.__call__``'s hook-free fast path for every module, so the hooks
    are only registered while some region's forward is running.
    """
    global _hook_users
    with _hook_lock:
        if _hook_users == 0:
            from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

            _hook_handles.append(register_module_forward_pre_hook(_pre_hook))
            _hook_handles.append(register_module_forward_hook(_post_hook, always_call=True))
        _hook_users += 1


def release_module_hooks() -> None:
    """Undo one :func:`acquire_module_hooks`; the hooks go when the last user releases them."""
    global _hook_users
    with _hook_lock:
        _hook_users -= 1
        if _hook_users == 0:
            for handle in _hook_handles:
                handle.remove()
            _hook_handles.clear()


def module_hooks_active() -> bool:
    """Whether memsave's global module hooks are registered (used by tests to check they are released)."""
    return bool(_hook_handles)


class ReplayedModuleState:
    """Context manager: put the recorded modules back in their forward-time state for a recompute.

    ``training`` flags are set to what they were at forward. Buffers a module changed during the region's
    forward are swapped (by name, in ``module._buffers``) for fresh copies of their values at region entry, so
    the recompute starts where the forward started and updates the copies, never the real buffers; on exit the
    real buffer objects are put back untouched. A BatchNorm inside a recomputed region is thus updated exactly
    once per forward, as in eager.
    """

    def __init__(self, records: Dict[int, ModuleRecord]) -> None:
        self.records = records
        self.undo: List[Tuple[nn.Module, str, Any]] = []

    def __enter__(self) -> "ReplayedModuleState":
        try:
            self._replay()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _replay(self) -> None:
        for rec in self.records.values():
            module = rec.module_ref()
            if module is None:
                continue
            if module.training != rec.training:
                self.undo.append((module, "training", module.training))
                module.training = rec.training
            if rec.buffers:
                for name, value in rec.buffers.items():
                    if name not in module._buffers:
                        continue
                    current = module._buffers[name]
                    self.undo.append((module, name, current))
                    if value is CLONE_AT_REPLAY:  # a write-only buffer: any scratch copy will do
                        value = current
                    module._buffers[name] = None if value is None else value.clone()

    def __exit__(self, *exc: Any) -> None:
        for module, name, value in reversed(self.undo):
            if name == "training":
                module.training = value
            else:
                module._buffers[name] = value
        self.undo.clear()


# --------------------------------------------------------------------------------------------------------------
# Autocast
# --------------------------------------------------------------------------------------------------------------


class AutocastState:
    """Autocast flags in force at region entry (CPU and CUDA), re-entered for the recompute."""

    __slots__ = ("cache", "cpu", "cuda")

    def __init__(self) -> None:
        self.cpu = (torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"))
        self.cuda = (torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda"))
        self.cache = torch.is_autocast_cache_enabled()

    def contexts(self) -> List[Any]:
        ctxs = [torch.autocast("cpu", dtype=self.cpu[1], enabled=self.cpu[0], cache_enabled=self.cache)]
        # Entering a CUDA autocast context without CUDA only warns; it is needed only when CUDA exists.
        if self.cuda[0] or torch.cuda.is_available():
            ctxs.append(torch.autocast("cuda", dtype=self.cuda[1], enabled=self.cuda[0], cache_enabled=self.cache))
        return ctxs
