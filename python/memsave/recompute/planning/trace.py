"""Step 1 of a plan: profile one training step of the model, module call by module call.

One step runs under :class:`_StorageEventLog` (memsave's live-storage tracker, logging every new storage, its death
and its readers) with forward hooks on every module and gradient hooks on module inputs and outputs, and under the
allocation profiler (CPU) or the CUDA allocator's statistics, sampled at markers between module calls. This gives the
module call tree and, in order, every allocation, free and use of the step: the :class:`Trace`. Further steps time
each module call (:func:`time_steps`).
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import time
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn
from torch.utils._pytree import tree_flatten

from ...measurement.allocator import collector_paused, cpu_allocation_profiler, read_cpu_events
from ...measurement.measuring import LossFn, tensors_in
from ...measurement.tracker import LiveTensorTracker, storage_of

__all__ = ["Call", "Trace", "time_steps", "trace_step"]

_MARKER = "memsave_marker_"


@dataclass
class Call:
    """One module call seen while tracing a step."""

    index: int
    name: str
    module: nn.Module
    parent: Optional[int]
    depth: int
    children: List[int] = field(default_factory=list)
    inputs: List[int] = field(default_factory=list)  # storage uids created during the step (not parameters)
    outputs: List[int] = field(default_factory=list)
    pos_call: int = 0
    pos_ret: int = 0


class _StorageEventLog(LiveTensorTracker):
    """The live-storage tracker, logging ("alloc", uid, nbytes) for every new storage an operator returns,
    ("free", uid) when it dies and ("use", uid) for every tracked storage an operator reads."""

    def __init__(self, events: List[tuple]) -> None:
        super().__init__(track_modules=False)
        self.events = events
        self.uid_of: Dict[int, int] = {}  # storage key (its _cdata) -> uid
        self.nbytes: Dict[int, int] = {}  # uid -> bytes

    def uid(self, t: torch.Tensor) -> Optional[int]:
        """The uid of ``t``'s storage if it was made during the step, else None."""
        s = storage_of(t)
        return None if s is None else self.uid_of.get(s._cdata)

    def track_storage(self, storage: torch.UntypedStorage, nbytes: int) -> None:
        super().track_storage(storage, nbytes)
        uid = len(self.nbytes)
        self.nbytes[uid] = nbytes
        self.uid_of[storage._cdata] = uid
        self.events.append(("alloc", uid, nbytes))

    def storage_freed(self, key: int) -> None:
        super().storage_freed(key)
        uid = self.uid_of.pop(key, None)
        if uid is not None:
            self.events.append(("free", uid))

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = super().__torch_dispatch__(func, types, args, kwargs)
        used = {self.uid(t) for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}
        self.events.extend(("use", uid) for uid in sorted(u for u in used if u is not None))
        return out


class Trace:
    """Everything one traced step recorded: module calls, allocations and frees, gradient marks, and the
    allocator-level memory between consecutive markers (every event but alloc/free/use is a marker)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.events: List[tuple] = []
        self.calls: List[Call] = []
        self.grad_bytes: Dict[int, int] = {}
        self.nbytes: Dict[int, int] = {}
        self.bwd_pos = 0
        self.end_pos = 0
        self.input_grad_bytes = 0
        self.markers: List[int] = []  # event indices of markers, increasing
        # CPU: profiler memory deltas (time ns, bytes) and marker times. CUDA: per marker (allocated, peak since
        # the previous marker), relative to what was allocated at the start.
        self.mem_deltas: List[Tuple[int, int]] = []
        self.marker_ns: Dict[int, int] = {}
        self.cuda_samples: Dict[int, Tuple[int, int]] = {}
        self.cuda_base = 0

    def marker(self, kind: tuple) -> None:
        idx = len(self.events)
        self.events.append(kind)
        self.markers.append(idx)
        if self.device.type == "cuda":
            alloc = torch.cuda.memory_allocated(self.device) - self.cuda_base
            peak = torch.cuda.max_memory_allocated(self.device) - self.cuda_base
            self.cuda_samples[idx] = (alloc, peak)
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            with torch.autograd.profiler.record_function(f"{_MARKER}{idx}"):
                pass

    def _marker_at_or_before(self, pos: int) -> int:
        k = bisect.bisect_right(self.markers, pos) - 1
        return self.markers[max(k, 0)]

    def _marker_at_or_after(self, pos: int) -> int:
        k = bisect.bisect_left(self.markers, pos)
        return self.markers[min(k, len(self.markers) - 1)]

    def allocator_peak(self, lo: int, hi: int) -> int:
        """Highest allocator-level live bytes while events [lo, hi) happened (widened to the enclosing markers)."""
        a, b = self._marker_at_or_before(lo), self._marker_at_or_after(max(lo, hi - 1))
        if self.device.type == "cuda":
            ks = [m for m in self.markers if a < m <= b]
            return max([self.cuda_samples[a][0]] + [self.cuda_samples[m][1] for m in ks])
        t_a, t_b = self.marker_ns[a], self.marker_ns[b]
        times = self._times
        i = bisect.bisect_right(times, t_a)
        peak = self._running[i - 1] if i > 0 else 0
        j = bisect.bisect_right(times, t_b)
        if j > i:
            peak = max(peak, max(self._running[i:j]))
        return peak

    def cpu_step_peak(self) -> int:
        """The traced step's allocator-level peak above its start (CPU): on CPU the same number as
        :func:`~memsave.measurement.allocator.cpu_peak_bytes` of the step run without the log, which neither
        allocates nor keeps a tensor alive (checked on the frontier models), so planning need not run it again."""
        if self.device.type != "cpu":
            raise ValueError("Trace.cpu_step_peak: the step was traced on CUDA; measure its peak with step_peak_bytes")
        return max([0, *self._running])

    def finish_cpu(self, prof: Any) -> None:
        """Read the profiler's allocation events and marker times (memsave's one CPU reading rule)."""
        events = read_cpu_events(prof, marker_prefix=_MARKER)
        self.mem_deltas = events.deltas
        self.marker_ns = {int(name[len(_MARKER) :]): ns for name, ns in events.markers.items()}
        self._times = [t for t, _ in self.mem_deltas]
        self._running = list(itertools.accumulate(d for _, d in self.mem_deltas))
        missing = [m for m in self.markers if m not in self.marker_ns]
        if missing:
            raise RuntimeError(f"memsave.plan: the profiler lost {len(missing)} of memsave's markers")


def _module_names(model: nn.Module) -> Dict[int, str]:
    return {id(m): name for name, m in model.named_modules()}


def _start_memory_readings(tr: Trace, stack: contextlib.ExitStack) -> Any:
    """CUDA: the allocator's statistics reset, what is allocated now the base (None returned). CPU: the allocation
    profiler entered on ``stack``, with the cyclic collector paused as in every CPU measurement (returned)."""
    if tr.device.type == "cuda":
        torch.cuda.synchronize(tr.device)
        torch.cuda.reset_peak_memory_stats(tr.device)
        tr.cuda_base = torch.cuda.memory_allocated(tr.device)
        return None
    stack.enter_context(collector_paused())
    return stack.enter_context(cpu_allocation_profiler())


def trace_step(
    model: nn.Module,
    inputs: Sequence[Any],
    loss_fn: LossFn,
    device: torch.device,
    kwargs: Optional[Dict[str, Any]] = None,
) -> Trace:
    """Run one step (``loss_fn(model(*inputs, **kwargs)).backward()``) recording the call tree, every
    allocation/free/use and when each tensor's gradient is ready."""
    kwargs = kwargs or {}
    tr = Trace(device)
    names = _module_names(model)
    log = _StorageEventLog(tr.events)
    tr.nbytes = log.nbytes
    stack: List[int] = []
    handles: List[Any] = []

    def mark(uid: int) -> Callable[[torch.Tensor], None]:
        def hook(grad: torch.Tensor) -> None:
            tr.marker(("mark", uid))

        return hook

    def note(tensors: List[torch.Tensor], into: List[int]) -> None:
        seen = set()
        for t in tensors:
            uid = log.uid(t)
            if uid is None or uid in seen:
                continue
            seen.add(uid)
            into.append(uid)
            if t.requires_grad:
                tr.grad_bytes[uid] = max(tr.grad_bytes.get(uid, 0), t.numel() * t.element_size())
                if t.grad_fn is not None:
                    t.register_hook(mark(uid))

    def pre(module: nn.Module, args: Any, kwargs: Any) -> None:
        parent = stack[-1] if stack else None
        c = Call(len(tr.calls), names.get(id(module), type(module).__name__), module, parent, len(stack))
        c.pos_call = len(tr.events)
        note(tensors_in((args, kwargs)), c.inputs)
        tr.calls.append(c)
        if parent is not None:
            tr.calls[parent].children.append(c.index)
        tr.marker(("call", c.index))
        stack.append(c.index)

    def post(module: nn.Module, args: Any, kwargs: Any, output: Any) -> None:
        if not stack:
            return
        c = tr.calls[stack.pop()]
        note(tensors_in(output), c.outputs)
        c.pos_ret = len(tr.events)
        tr.marker(("ret", c.index))

    for m in model.modules():
        handles.append(m.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(m.register_forward_hook(post, with_kwargs=True, always_call=True))
    prof = None
    try:
        with contextlib.ExitStack() as stack_ctx:
            prof = _start_memory_readings(tr, stack_ctx)
            stack_ctx.enter_context(log)
            tr.marker(("start",))
            out = model(*inputs, **kwargs)
            loss = loss_fn(out)
            tr.bwd_pos = len(tr.events)
            tr.marker(("bwd",))
            loss_uid = log.uid(loss)
            if loss_uid is not None and loss.grad_fn is not None:
                loss.register_hook(mark(loss_uid))
            loss.backward()
            tr.end_pos = len(tr.events)
            tr.marker(("end",))
            del out, loss
    finally:
        for h in handles:
            h.remove()
    if prof is not None:
        tr.finish_cpu(prof)
    tr.input_grad_bytes = sum(
        t.numel() * t.element_size() for t in tensors_in((inputs, kwargs)) if t.requires_grad and t.is_leaf
    )
    return tr


def time_steps(
    model: nn.Module,
    inputs: Sequence[Any],
    loss_fn: LossFn,
    n_calls: int,
    steps: int,
    sync: Callable[[], None],
    kwargs: Optional[Dict[str, Any]] = None,
    forward_context: Optional[Callable[[], ContextManager[Any]]] = None,
) -> List[Dict[str, Any]]:
    """Time ``steps`` steps: start/end of every module call (in call order), forward, loss and backward.

    Args:
        model, inputs, loss_fn, kwargs: one step is ``loss_fn(model(*inputs, **kwargs)).backward()`` (gradients set
            to None first).
        n_calls: the module calls the traced step made; every timed step must make as many.
        steps: how many steps to time.
        sync: waits for the device (``torch.cuda.synchronize`` on CUDA, a no-op on CPU).
        forward_context: when given, each forward runs inside ``forward_context()`` (the planner records the
            operator classes there: :meth:`.operators.OperatorClassProfiler.forward`).

    Returns:
        one dict per step: ``t_call`` (start of each module call, in call order), ``t_ret`` (call index -> its end)
        and ``t0``..``t3`` (forward start, forward end, loss end, backward end), all ``time.perf_counter()``.

    Raises:
        RuntimeError: a step made another number of module calls than ``n_calls``.

    Examples:
        >>> runs = time_steps(model, (x,), lambda y: y.sum(), len(trace.calls), 2, lambda: None)
        >>> runs[0]["t3"] - runs[0]["t0"]   # the first timed step's seconds
    """
    kwargs = kwargs or {}
    around_forward = forward_context or contextlib.nullcontext
    runs = []
    for _ in range(steps):
        t_call: List[float] = []
        t_ret: Dict[int, float] = {}
        stack: List[int] = []

        def pre(module: nn.Module, args: Any) -> None:
            sync()
            stack.append(len(t_call))
            t_call.append(time.perf_counter())

        def post(module: nn.Module, args: Any, output: Any) -> None:
            sync()
            if stack:
                t_ret[stack.pop()] = time.perf_counter()

        handles = []
        for m in model.modules():
            handles.append(m.register_forward_pre_hook(pre))
            handles.append(m.register_forward_hook(post, always_call=True))
        try:
            for p in model.parameters():
                p.grad = None
            sync()
            t0 = time.perf_counter()
            with around_forward():
                out = model(*inputs, **kwargs)
            sync()
            t1 = time.perf_counter()
            loss = loss_fn(out)
            sync()
            t2 = time.perf_counter()
            loss.backward()
            sync()
            t3 = time.perf_counter()
            del out, loss
        finally:
            for h in handles:
                h.remove()
        if len(t_call) != n_calls:
            raise RuntimeError(
                f"memsave.plan: the model made {len(t_call)} module calls in one step and {n_calls} in another; a "
                f"plan needs the same sequence of module calls in every step (no data-dependent branches)"
            )
        runs.append({"t_call": t_call, "t_ret": t_ret, "t0": t0, "t1": t1, "t2": t2, "t3": t3})
    return runs
