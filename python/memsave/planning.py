"""Automatic checkpoint plans for a memory budget: :func:`plan`, :class:`Plan`.

How a plan is made:

1. **Profile** (a few forward+backward steps on the example inputs, state restored afterwards). One step runs
   under an allocation log (a ``TorchDispatchMode`` recording every new storage and, through a finalizer, its
   death) with forward hooks on every module and gradient hooks on module inputs and outputs. This gives the module
   call tree and, in order, every allocation and free of the step. Further steps time each module call.
2. **Chain**: the candidate *pieces* are the module calls one level below the model (plain ``nn.Sequential``
   containers, and custom modules holding most of the memory, are opened up), in execution order, with the code
   between them (residual adds, concatenations, the loss) as *glue* pieces that are never recomputed. A module
   working in place (``ReLU(inplace=True)``) joins the piece before it. From the allocation log, each tensor of the
   forward is classified by which piece made it and which pieces used it: kept for backward inside its piece
   (``saved_bytes``), handed to the next piece (a boundary; *passing* when it is freed once read), or read further
   on (a skip connection: counted for as long as it lives). Parameter gradients are the backward's allocations that
   outlive the step. Working memory is fitted so that the model's predicted timeline of the eager step is never
   below the allocator-level one measured in the same step, and a remaining difference between the eager peak
   (measured again without the log) and the prediction, if positive, is added to all moments. What a checkpointed
   region itself holds (the saved RNG state, snapshots of module buffers) is part of the model.
3. **Solve** with the C++ planner (``memsave._C.planner_solve``): the least recompute time whose predicted peak fits
   the budget (or a baseline strategy). Several consecutive pieces can share one checkpointed region only when they
   are consecutive children of one plain ``nn.Sequential``.
4. **Verify** (default): apply the plan to the model, measure one step's peak with the allocator-level measure, and
   if it exceeds the budget tighten the solver's budget by the error and solve again. The returned plan's measured
   peak is in :attr:`Plan.measured_peak_bytes`.

Budget = the peak memory of one training step (gradients set to None, forward, loss, backward) above what was
allocated before it: ``max_memory_allocated`` on CUDA, the profiler's allocation events on CPU (DESIGN.md).
"""
from __future__ import annotations

import bisect
import contextlib
import hashlib
import itertools
import json
import math
import numbers
import re
import statistics
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple, Union

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from .checkpoint import _Chain, _run_region
from .errors import InfeasibleBudgetError
from ._tracker import _nbytes, _storage_of
from .measure import (_SavedState, _resolve_device, _tensors, cpu_allocation_profiler, default_loss, format_bytes,
                      step_peak_bytes)
from .wrap import _CheckpointedForward, _ExtraRepr, _unwrap_module, _wrap_module, is_wrapped

__all__ = ["plan", "Plan", "PlanMismatchError", "InfeasibleBudgetError", "parse_budget", "apply_plan"]

Budget = Union[int, float, str]
LossFn = Callable[[Any], torch.Tensor]

_PLAN_FORMAT = 1
_STRATEGIES = ("optimal", "sqrt", "none", "all", "min_memory")


class PlanMismatchError(ValueError):
    """A :class:`Plan` was applied to a model it was not made for (other modules or parameter shapes)."""


# ------------------------------------------------------------------------------------------------------- budgets
_UNITS = {
    "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}


def parse_budget(budget: Budget, eager_peak_bytes: Optional[int] = None) -> int:
    """Turn a budget into bytes.

    Args:
        budget: an int number of bytes; a string with a unit, ``"512MiB"``, ``"4GB"``, ``"1.5 GiB"`` (KB/MB/GB/TB
            are powers of 1000, KiB/MiB/GiB/TiB powers of 1024, case-insensitive); or a float fraction of
            ``eager_peak_bytes`` (``0.5`` = half of eager's peak).
        eager_peak_bytes: eager's measured peak, needed for a fraction.

    Returns:
        the budget in bytes (> 0).

    Raises:
        TypeError: the budget is not an int, float or str (a bool, say).
        ValueError: the budget is not positive, the string cannot be parsed, or a fraction is given without
            ``eager_peak_bytes``.

    Example:
        >>> parse_budget("1.5 KiB")
        1536
        >>> parse_budget(0.5, eager_peak_bytes=1000)
        500
    """
    if isinstance(budget, bool) or not isinstance(budget, (numbers.Real, str)):
        raise TypeError(
            f"memsave.plan: budget must be an int number of bytes, a string like '512MiB' or '4GB', or a float "
            f"fraction of eager's peak; got {type(budget).__name__} {budget!r}")
    if isinstance(budget, str):
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([A-Za-z]*)\s*", budget)
        unit = m.group(2).lower() if m else None
        if m is None or unit not in _UNITS and unit != "":
            raise ValueError(
                f"memsave.plan: cannot parse budget {budget!r}; write a number with a unit, e.g. '512MiB', '4GB', "
                f"'1.5 GiB' (units: B, KB, MB, GB, TB, KiB, MiB, GiB, TiB), an int number of bytes or a float "
                f"fraction of eager's peak")
        value = float(m.group(1)) * _UNITS[unit or "b"]
        if value < 1:
            raise ValueError(f"memsave.plan: budget {budget!r} is not positive; give at least 1 byte")
        return int(value)
    if isinstance(budget, numbers.Integral):
        if budget <= 0:
            raise ValueError(f"memsave.plan: budget must be > 0 bytes, got {budget}")
        return int(budget)
    value = float(budget)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"memsave.plan: a fractional budget must be a positive fraction of eager's peak, got {budget}")
    if eager_peak_bytes is None:
        raise ValueError("memsave.plan: a fractional budget needs eager's peak (measured by plan() itself)")
    return max(1, int(value * eager_peak_bytes))


# ------------------------------------------------------------------------------------------- profiling: the trace
@dataclass
class _Call:
    """One module call seen while tracing a step."""

    index: int
    name: str
    module: nn.Module
    parent: Optional[int]
    depth: int
    children: List[int] = field(default_factory=list)
    inputs: List[int] = field(default_factory=list)   # storage uids created during the step (not parameters)
    outputs: List[int] = field(default_factory=list)
    pos_call: int = 0
    pos_ret: int = 0


def _storage_key(t: torch.Tensor) -> Optional[int]:
    s = _storage_of(t)
    return None if s is None else s._cdata


class _AllocLog(TorchDispatchMode):
    """Appends ("alloc", uid, nbytes) for every new storage an operator returns, ("free", uid) when it dies and
    ("use", uid) for every storage an operator reads."""

    def __init__(self, events: List[tuple]) -> None:
        super().__init__()
        self.events = events
        self.uid_of: Dict[int, int] = {}
        self.nbytes: Dict[int, int] = {}
        self._finalizers: List[Any] = []

    def _free(self, key: int, uid: int) -> None:
        self.events.append(("free", uid))
        if self.uid_of.get(key) == uid:
            del self.uid_of[key]

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        inputs = {_storage_key(t) for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}
        for key in inputs:
            uid = self.uid_of.get(key) if key is not None else None
            if uid is not None:
                self.events.append(("use", uid))
        outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        if not outs:
            return out
        for t in outs:
            s = _storage_of(t)
            if s is None:
                continue
            key = s._cdata
            if key in inputs or key in self.uid_of:
                continue
            nb = _nbytes(s)
            if not nb:  # None (symbolic size) or 0
                continue
            uid = len(self.nbytes)
            self.nbytes[uid] = nb
            self.uid_of[key] = uid
            fin = weakref.finalize(s, self._free, key, uid)
            fin.atexit = False
            self._finalizers.append(fin)
            self.events.append(("alloc", uid, nb))
        return out

    def detach(self) -> None:
        for fin in self._finalizers:
            fin.detach()
        self._finalizers = []


class _Trace:
    """Everything one traced step recorded: module calls, allocations and frees, gradient marks, and the
    allocator-level memory between consecutive markers (every event but alloc/free/use is a marker)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.events: List[tuple] = []
        self.calls: List[_Call] = []
        self.grad_bytes: Dict[int, int] = {}
        self.nbytes: Dict[int, int] = {}
        self.bwd_pos = 0
        self.end_pos = 0
        self.input_grad_bytes = 0
        self.markers: List[int] = []            # event indices of markers, increasing
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
            with torch.autograd.profiler.record_function(f"memsave_marker_{idx}"):
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

    def finish_cpu(self, prof: Any) -> None:
        try:
            events = prof.kineto_results.events()
        except AttributeError as e:  # pragma: no cover - guards a future torch that moves the private results
            raise RuntimeError(
                f"memsave.plan: this torch ({torch.__version__}) does not expose the profiler's kineto results, "
                f"which memsave needs to measure CPU memory") from e
        cpu = torch.autograd.DeviceType.CPU
        for e in events:
            name = e.name()
            if name == "[memory]" and e.device_type() == cpu:
                self.mem_deltas.append((e.start_ns(), int(e.nbytes())))
            elif name.startswith("memsave_marker_"):
                self.marker_ns[int(name[len("memsave_marker_"):])] = e.start_ns()
        self.mem_deltas.sort()
        self._times = [t for t, _ in self.mem_deltas]
        self._running = list(itertools.accumulate(d for _, d in self.mem_deltas))
        missing = [m for m in self.markers if m not in self.marker_ns]
        if missing:
            raise RuntimeError(f"memsave.plan: the profiler lost {len(missing)} of memsave's markers")


def _module_names(model: nn.Module) -> Dict[int, str]:
    return {id(m): name for name, m in model.named_modules()}


def _trace_step(model: nn.Module, inputs: Sequence[Any], loss_fn: LossFn, device: torch.device) -> _Trace:
    """Run one step recording the call tree, every allocation/free/use and when each tensor's gradient is ready."""
    tr = _Trace(device)
    names = _module_names(model)
    log = _AllocLog(tr.events)
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
            key = _storage_key(t)
            uid = log.uid_of.get(key) if key is not None else None
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
        c = _Call(len(tr.calls), names.get(id(module), type(module).__name__), module, parent, len(stack))
        c.pos_call = len(tr.events)
        note(_tensors((args, kwargs)), c.inputs)
        tr.calls.append(c)
        if parent is not None:
            tr.calls[parent].children.append(c.index)
        tr.marker(("call", c.index))
        stack.append(c.index)

    def post(module: nn.Module, args: Any, kwargs: Any, output: Any) -> None:
        if not stack:
            return
        c = tr.calls[stack.pop()]
        note(_tensors(output), c.outputs)
        c.pos_ret = len(tr.events)
        tr.marker(("ret", c.index))

    for m in model.modules():
        handles.append(m.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(m.register_forward_hook(post, with_kwargs=True, always_call=True))
    prof = None
    try:
        with contextlib.ExitStack() as stack_ctx:
            if device.type == "cuda":
                torch.cuda.synchronize(device)
                torch.cuda.reset_peak_memory_stats(device)
                tr.cuda_base = torch.cuda.memory_allocated(device)
            else:
                prof = stack_ctx.enter_context(cpu_allocation_profiler())
            stack_ctx.enter_context(log)
            tr.marker(("start",))
            out = model(*inputs)
            loss = loss_fn(out)
            tr.bwd_pos = len(tr.events)
            tr.marker(("bwd",))
            key = _storage_key(loss)
            if key is not None and key in log.uid_of and loss.grad_fn is not None:
                loss.register_hook(mark(log.uid_of[key]))
            loss.backward()
            tr.end_pos = len(tr.events)
            tr.marker(("end",))
            del out, loss
    finally:
        for h in handles:
            h.remove()
        log.detach()
    if prof is not None:
        tr.finish_cpu(prof)
    tr.input_grad_bytes = sum(t.numel() * t.element_size() for t in _tensors(inputs)
                              if t.requires_grad and t.is_leaf)
    return tr


def _time_steps(model: nn.Module, inputs: Sequence[Any], loss_fn: LossFn, n_calls: int, steps: int,
                sync: Callable[[], None]) -> List[Dict[str, Any]]:
    """Time ``steps`` steps: start/end of every module call (in call order), forward, loss and backward."""
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
            out = model(*inputs)
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
                f"plan needs the same sequence of module calls in every step (no data-dependent branches)")
        runs.append({"t_call": t_call, "t_ret": t_ret, "t0": t0, "t1": t1, "t2": t2, "t3": t3})
    return runs


# ----------------------------------------------------------------------------------------- profiling: the chain
def _is_plain_sequential(m: nn.Module) -> bool:
    return isinstance(m, nn.Sequential) and type(m).forward is nn.Sequential.forward


def _is_inplace(m: nn.Module) -> bool:
    return getattr(m, "inplace", False) is True


@dataclass
class _Piece:
    kind: str                      # "module" or "glue"
    calls: List[int]
    lo: int                        # event range [lo, hi)
    hi: int


def _held_by_call(tr: _Trace) -> Dict[int, int]:
    """Bytes allocated inside each call (descendants included) still alive when forward ends."""
    alive: Set[int] = set()
    created_at: Dict[int, int] = {}
    for pos, ev in enumerate(tr.events[:tr.bwd_pos]):
        if ev[0] == "alloc":
            alive.add(ev[1])
            created_at[ev[1]] = pos
        elif ev[0] == "free":
            alive.discard(ev[1])
    held = {}
    for c in tr.calls:
        held[c.index] = sum(tr.nbytes[u] for u in alive if c.pos_call <= created_at[u] <= c.pos_ret)
    return held


def _frontier(tr: _Trace) -> List[int]:
    """The candidate module calls: children of the model's call, with plain Sequentials and memory-dominant custom
    modules opened up."""
    if not tr.calls:
        return []
    root = tr.calls[0]
    held = _held_by_call(tr)
    total = max(1, sum(held[c] for c in root.children))
    front = list(root.children)
    changed = True
    while changed:
        changed = False
        nxt: List[int] = []
        for ci in front:
            c = tr.calls[ci]
            open_up = bool(c.children) and (
                _is_plain_sequential(c.module) or (len(c.children) >= 2 and held[ci] * 2 > total))
            if open_up:
                nxt.extend(c.children)
                changed = True
            else:
                nxt.append(ci)
        front = nxt
    return front


def _pieces(tr: _Trace, front: List[int]) -> Tuple[List[_Piece], List[int]]:
    """Split the forward's events into pieces. Returns the pieces and, per forward event, its piece index."""
    pieces: List[_Piece] = []
    owner = [-1] * tr.bwd_pos

    def has_alloc(lo: int, hi: int) -> bool:
        return any(tr.events[p][0] == "alloc" for p in range(lo, hi))

    def assign(lo: int, hi: int, idx: int) -> None:
        for p in range(lo, hi):
            owner[p] = idx

    cursor = 0
    for ci in front:
        c = tr.calls[ci]
        if has_alloc(cursor, c.pos_call):
            pieces.append(_Piece("glue", [], cursor, c.pos_call))
            assign(cursor, c.pos_call, len(pieces) - 1)
        elif pieces:  # frees between pieces belong to the piece before (its outputs die when the next returns)
            pieces[-1].hi = c.pos_call
            assign(cursor, c.pos_call, len(pieces) - 1)
        else:
            assign(cursor, c.pos_call, 0)
        if pieces and _is_inplace(c.module):
            pieces[-1].calls.append(ci)
            pieces[-1].hi = c.pos_ret + 1
        else:
            pieces.append(_Piece("module", [ci], c.pos_call, c.pos_ret + 1))
        assign(c.pos_call, c.pos_ret + 1, len(pieces) - 1)
        cursor = c.pos_ret + 1
    if has_alloc(cursor, tr.bwd_pos) or not pieces:
        pieces.append(_Piece("glue", [], cursor, tr.bwd_pos))
    else:
        pieces[-1].hi = tr.bwd_pos
    assign(cursor, tr.bwd_pos, len(pieces) - 1)
    return pieces, owner


def _build_chain(tr: _Trace, model: nn.Module, timing: List[Dict[str, Any]]) -> Tuple[Dict[str, Any], List[Dict]]:
    front = _frontier(tr)
    pieces, owner = _pieces(tr, front)
    n = len(pieces)
    calls = tr.calls
    nbytes = tr.nbytes

    # How often each module was called in the step: a module called twice cannot be planned per call.
    call_count: Dict[int, int] = {}
    for c in calls:
        call_count[id(c.module)] = call_count.get(id(c.module), 0) + 1

    # Creation, death and last use (by any operator, glue included) of every storage made in forward.
    creator: Dict[int, int] = {}
    freed_in: Dict[int, int] = {}
    users: Dict[int, int] = {}
    for pos in range(tr.bwd_pos):
        ev = tr.events[pos]
        if ev[0] == "alloc":
            creator[ev[1]] = owner[pos]
        elif ev[0] == "free" and ev[1] in creator:
            freed_in[ev[1]] = owner[pos]
        elif ev[0] == "use" and ev[1] in creator and owner[pos] > creator[ev[1]]:
            users[ev[1]] = max(users.get(ev[1], -1), owner[pos])

    A = [0] * (n + 1)   # boundary bytes kept for backward
    T = [0] * (n + 1)   # boundary bytes freed once the next piece has read them ("passing")
    G = [0] * (n + 1)
    saved = [0] * n
    skips: List[Dict[str, int]] = []
    for uid, c in creator.items():
        if freed_in.get(uid) == c:
            continue  # made and freed inside its piece: working memory
        last = max(users.get(uid, -1), freed_in.get(uid, -1))
        b, g = nbytes[uid], tr.grad_bytes.get(uid, 0)
        if last <= c:
            saved[c] += b
        elif last == c + 1:
            if uid in freed_in:
                T[c + 1] += b
            else:
                A[c + 1] += b
            G[c + 1] += g
        else:
            skips.append({"producer": c, "consumer": last, "bytes": b, "grad_bytes": g})
    G[0] = tr.input_grad_bytes

    # Allocator-level peaks: forward of each piece; backward of each piece, which starts when the gradient of one
    # of its tensors is first ready and ends when the next piece's starts.
    fwd_peak = [tr.allocator_peak(pc.lo, pc.hi) for pc in pieces]
    bwd_start: Dict[int, int] = {}
    for pos in range(tr.bwd_pos, tr.end_pos):
        ev = tr.events[pos]
        if ev[0] == "mark" and ev[1] in creator:
            bwd_start.setdefault(creator[ev[1]], pos)
    order = sorted(bwd_start.items(), key=lambda kv: kv[1])
    bwd_peak = [0] * n
    param_grad = [0] * n
    alive_after: Set[int] = set()
    for pos in range(tr.bwd_pos, tr.end_pos):
        ev = tr.events[pos]
        if ev[0] == "alloc":
            alive_after.add(ev[1])
        elif ev[0] == "free":
            alive_after.discard(ev[1])
    if order:
        bounds = [tr.bwd_pos] + [pos for _, pos in order[1:]] + [tr.end_pos + 1]
        for k, (p, _) in enumerate(order):
            lo, hi = bounds[k], bounds[k + 1]
            bwd_peak[p] = tr.allocator_peak(lo, hi)
            for pos in range(lo, min(hi, tr.end_pos)):
                ev = tr.events[pos]
                if ev[0] == "alloc" and ev[1] in alive_after:
                    param_grad[p] += ev[2]  # outlives the step: a parameter (or input) gradient

    # Times: median over the timed steps.
    fwd_time = [0.0] * n
    per_run: List[List[float]] = []
    bwd_total: List[float] = []
    for run in timing:
        t_call, t_ret = run["t_call"], run["t_ret"]
        ts = []
        for i, pc in enumerate(pieces):
            if pc.kind == "module":
                ts.append(sum(t_ret.get(ci, t_call[ci]) - t_call[ci] for ci in pc.calls))
            else:
                ts.append(0.0)
        stage_total = sum(ts)
        glue = [i for i, pc in enumerate(pieces) if pc.kind == "glue"]
        glue_total = max(0.0, (run["t2"] - run["t0"]) - stage_total)
        for i in glue:
            ts[i] = glue_total / len(glue)
        per_run.append(ts)
        bwd_total.append(run["t3"] - run["t2"])
    for i in range(n):
        fwd_time[i] = statistics.median(r[i] for r in per_run) if per_run else 0.0
    total_fwd = sum(fwd_time)
    bwd_sum = statistics.median(bwd_total) if bwd_total else 0.0
    bwd_time = [bwd_sum * (t / total_fwd) if total_fwd > 0 else 0.0 for t in fwd_time]

    # Which pieces may be recomputed, and which may share a region with the piece before.
    info: List[Dict[str, Any]] = []
    for i, pc in enumerate(pieces):
        mods = [calls[ci].name for ci in pc.calls]
        parents = {calls[ci].parent for ci in pc.calls}
        parent = next(iter(parents)) if len(parents) == 1 else None
        parent_mod = calls[parent].module if parent is not None else None
        child_index: List[int] = []
        seq_parent = parent_mod is not None and _is_plain_sequential(parent_mod)
        if seq_parent:
            kids = list(parent_mod)  # type: ignore[arg-type]
            ids = [id(k) for k in kids]
            child_index = [ids.index(id(calls[ci].module)) for ci in pc.calls]
        contiguous = seq_parent and child_index == list(range(child_index[0], child_index[-1] + 1))
        recomputable = (
            pc.kind == "module" and all(call_count[id(calls[ci].module)] == 1 for ci in pc.calls)
            and not _is_inplace(calls[pc.calls[0]].module) and (len(pc.calls) == 1 or contiguous))
        info.append({
            "kind": pc.kind,
            "modules": mods,
            "parent": calls[parent].name if seq_parent else None,
            "parent_call": parent if seq_parent else None,
            "child_index": child_index,
            "recomputable": bool(recomputable),
        })
    for i, pi in enumerate(info):
        prev = info[i - 1] if i > 0 else None
        pi["joins_previous"] = bool(
            prev is not None and pi["recomputable"] and prev["recomputable"] and pi["parent_call"] is not None
            and pi["parent_call"] == prev["parent_call"] and pi["child_index"][0] == prev["child_index"][-1] + 1)

    # What a checkpointed region holds besides activations: snapshots of its modules' buffers, taken at entry (the
    # cost model counts them a second time during the recompute, when fresh copies are swapped in).
    checkpoint_bytes = [0] * n
    for i, pc in enumerate(pieces):
        seen: Set[int] = set()
        for ci in pc.calls:
            for m in calls[ci].module.modules():
                for b in m._buffers.values():
                    if b is not None and id(b) not in seen:
                        seen.add(id(b))
                        checkpoint_bytes[i] += b.numel() * b.element_size()

    stages = []
    for i, pi in enumerate(info):
        label = "+".join(pi["modules"]) if pi["modules"] else f"<glue {i}>"
        stages.append({
            "name": label,
            "fwd_time": fwd_time[i],
            "bwd_time": bwd_time[i],
            "input_bytes": A[i],
            "output_bytes": A[i + 1],
            "input_passing_bytes": T[i],
            "output_passing_bytes": T[i + 1],
            "input_grad_bytes": G[i],
            "output_grad_bytes": G[i + 1],
            "saved_bytes": saved[i],
            "param_grad_bytes": param_grad[i],
            "checkpoint_bytes": checkpoint_bytes[i],
            "recomputable": pi["recomputable"],
            "joins_previous": pi["joins_previous"],
        })
    # Each region saves the RNG states at entry and forks them for its recompute; only the CPU generator's state is
    # a tensor in the measured memory (on CUDA the states are CPU tensors and do not count).
    rng_bytes = torch.get_rng_state().numel() if tr.device.type == "cpu" else 0
    chain = {"stages": stages, "skips": skips, "base_bytes": 0, "segment_bytes": rng_bytes,
             "recompute_bytes": rng_bytes}

    # Fit working memory: the predicted eager timeline must not be below the measured one at any moment.
    from . import _C
    sim = _C.planner_simulate(chain, [(0, n, False)], True)
    for phase, stage, predicted in sim["timeline"]:
        if phase == "forward":
            stages[stage]["fwd_transient_bytes"] = max(0, fwd_peak[stage] - predicted)
        elif phase == "backward":
            stages[stage]["bwd_transient_bytes"] = max(0, bwd_peak[stage] - predicted)
    for pi in info:
        del pi["parent_call"]
    return chain, info


# --------------------------------------------------------------------------------------------- measuring steps
class _Stepper:
    """Runs steps of the model with gradients cleared first, and measures a step's allocator-level peak."""

    def __init__(self, model: nn.Module, inputs: Sequence[Any], loss_fn: LossFn, device: torch.device,
                 state: _SavedState) -> None:
        self.model, self.inputs, self.loss_fn, self.device, self.state = model, inputs, loss_fn, device, state

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def step(self) -> None:
        self.state.clear_grads()
        out = self.model(*self.inputs)
        loss = self.loss_fn(out)
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise TypeError(
                f"memsave.plan: loss_fn must return a scalar tensor, got "
                f"{type(loss).__name__ if not isinstance(loss, torch.Tensor) else tuple(loss.shape)}")
        loss.backward()

    def peak(self) -> int:
        if self.device.type not in ("cpu", "cuda"):
            raise ValueError(f"memsave.plan: device type {self.device.type!r} is not supported; use 'cpu' or 'cuda'")
        self.state.clear_grads()
        return step_peak_bytes(self.step, self.device)


def _fingerprint(model: nn.Module) -> str:
    h = hashlib.sha256()
    for name, m in model.named_modules():
        h.update(f"m {name} {type(m).__name__}\n".encode())
    for name, p in model.named_parameters():
        h.update(f"p {name} {tuple(p.shape)} {p.dtype}\n".encode())
    return h.hexdigest()[:16]


# ------------------------------------------------------------------------------------------------------- the plan
@dataclass
class Plan:
    """Which parts of a model to recompute in backward, and what that is predicted to cost and save.

    Made by :func:`plan`, applied with ``memsave.wrap(model, plan)``. A plan is tied to the model it was made for
    (module names, classes and parameter shapes); applying it to another raises :class:`PlanMismatchError`.

    Attributes:
        strategy: the strategy asked for (``optimal``, ``sqrt``, ``uniform:K``, ``none``, ``all``, ``min_memory``).
        budget_bytes: the budget in bytes (None when none was given).
        predicted_peak_bytes: the cost model's peak for one step with this plan.
        measured_peak_bytes: the peak measured with the plan applied (None when ``verify=False``).
        eager_peak_bytes: the measured peak of the plain model.
        min_feasible_bytes: the cost model's smallest peak over all plans.
        predicted_extra_seconds: predicted recompute time per step.
        eager_step_seconds: the sum of the profiled forward and backward time of one step.
        segments: ``(begin, end, recompute)`` over the pieces (end exclusive).
        pieces: per piece: kind (module or glue), module names, the ``nn.Sequential`` parent when it has one.
        chain: the cost model the solver used (see ``memsave._C.planner_solve``).
    """

    strategy: str
    budget_bytes: Optional[int]
    predicted_peak_bytes: int
    measured_peak_bytes: Optional[int]
    eager_peak_bytes: int
    min_feasible_bytes: int
    predicted_extra_seconds: float
    eager_step_seconds: float
    segments: List[Tuple[int, int, bool]]
    pieces: List[Dict[str, Any]]
    chain: Dict[str, Any]
    model_class: str
    fingerprint: str
    device: str = "cpu"

    @property
    def predicted_overhead(self) -> float:
        """Predicted extra compute of a step as a fraction of the eager step's compute (0.2 = 20% more)."""
        return self.predicted_extra_seconds / self.eager_step_seconds if self.eager_step_seconds > 0 else 0.0

    def regions(self) -> List[List[str]]:
        """The checkpointed regions: each a list of the module names it runs, in order.

        Example:
            >>> plan.regions()
            [['blocks.0'], ['features.0', 'features.1', 'features.2']]
        """
        out = []
        for b, e, rec in self.segments:
            if rec:
                out.append([m for i in range(b, e) for m in self.pieces[i]["modules"]])
        return out

    def summary(self) -> str:
        """A table of the pieces (module names, kept / recomputed / glue, bytes, time) and the totals.

        Example:
            >>> print(plan.summary())
        """
        recomputed = set()
        for b, e, rec in self.segments:
            if rec:
                recomputed.update(range(b, e))
        region_of: Dict[int, int] = {}
        r = 0
        for b, e, rec in self.segments:
            if rec:
                for i in range(b, e):
                    region_of[i] = r
                r += 1
        rows = []
        for i, (pc, st) in enumerate(zip(self.pieces, self.chain["stages"])):
            if pc["kind"] == "glue":
                what = "glue"
            elif i in recomputed:
                what = f"recompute #{region_of[i]}"
            else:
                what = "kept"
            name = ", ".join(pc["modules"]) if pc["modules"] else "(code between modules)"
            held = st["saved_bytes"] + st["output_bytes"]
            rows.append((str(i), name if len(name) <= 48 else name[:45] + "...", what, format_bytes(held),
                         f"{st['fwd_time'] * 1e3:.2f}"))
        head = ("#", "modules", "plan", "held", "fwd ms")
        widths = [max(len(h), *(len(row[k]) for row in rows)) for k, h in enumerate(head)]
        fmt = "  ".join("{:<%d}" % w for w in widths)
        lines = [
            f"memsave plan for {self.model_class} ({self.strategy}) on {self.device}: "
            f"{len(self.regions())} checkpointed region(s) over {len(self.pieces)} pieces",
            f"  budget {format_bytes(self.budget_bytes)}, predicted peak {format_bytes(self.predicted_peak_bytes)}, "
            f"measured peak {format_bytes(self.measured_peak_bytes)}, eager peak "
            f"{format_bytes(self.eager_peak_bytes)}, smallest feasible {format_bytes(self.min_feasible_bytes)}",
            f"  predicted overhead {100 * self.predicted_overhead:.1f}% "
            f"({self.predicted_extra_seconds * 1e3:.2f} ms recompute per {self.eager_step_seconds * 1e3:.2f} ms step)",
            fmt.format(*head),
        ]
        lines += [fmt.format(*row) for row in rows]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()

    def to_json(self) -> str:
        """Serialise the plan (a JSON string) so that :meth:`from_json` gives an equal plan.

        Example:
            >>> s = plan.to_json(); memsave.Plan.from_json(s) == plan
            True
        """
        d = {
            "format": _PLAN_FORMAT,
            "strategy": self.strategy,
            "budget_bytes": self.budget_bytes,
            "predicted_peak_bytes": self.predicted_peak_bytes,
            "measured_peak_bytes": self.measured_peak_bytes,
            "eager_peak_bytes": self.eager_peak_bytes,
            "min_feasible_bytes": self.min_feasible_bytes,
            "predicted_extra_seconds": self.predicted_extra_seconds,
            "eager_step_seconds": self.eager_step_seconds,
            "segments": [list(s) for s in self.segments],
            "pieces": self.pieces,
            "chain": self.chain,
            "model_class": self.model_class,
            "fingerprint": self.fingerprint,
            "device": self.device,
        }
        return json.dumps(d, indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, s: str) -> "Plan":
        """Read a plan written by :meth:`to_json`.

        Args:
            s: the JSON text.

        Returns:
            the :class:`Plan`.

        Raises:
            ValueError: the text is not a memsave plan of a known format.

        Example:
            >>> plan = memsave.Plan.from_json(open("plan.json").read())
        """
        try:
            d = json.loads(s)
        except (TypeError, json.JSONDecodeError) as e:
            raise ValueError(f"memsave.Plan.from_json: not valid JSON ({e})") from e
        if not isinstance(d, dict) or d.get("format") != _PLAN_FORMAT:
            raise ValueError(
                f"memsave.Plan.from_json: not a memsave plan of format {_PLAN_FORMAT} (got "
                f"{d.get('format') if isinstance(d, dict) else type(d).__name__}); make it with memsave.plan(...)"
                f".to_json()")
        try:
            return cls(
                strategy=d["strategy"], budget_bytes=d["budget_bytes"],
                predicted_peak_bytes=d["predicted_peak_bytes"], measured_peak_bytes=d["measured_peak_bytes"],
                eager_peak_bytes=d["eager_peak_bytes"], min_feasible_bytes=d["min_feasible_bytes"],
                predicted_extra_seconds=d["predicted_extra_seconds"], eager_step_seconds=d["eager_step_seconds"],
                segments=[(int(b), int(e), bool(r)) for b, e, r in d["segments"]], pieces=d["pieces"],
                chain=d["chain"], model_class=d["model_class"], fingerprint=d["fingerprint"], device=d["device"])
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"memsave.Plan.from_json: the plan is missing or has a bad field ({e!r})") from e


# --------------------------------------------------------------------------------------------- applying a plan
class _GroupedForward(_CheckpointedForward):
    """Instance-level ``forward`` of a plain ``nn.Sequential`` some of whose runs of children are checkpointed
    regions (one region per run). A subclass of wrap's forward so that :func:`memsave.unwrap` removes it."""

    def __init__(self, module: nn.Sequential, name: str, groups: List[Tuple[int, int]],
                 preserve_rng_state: bool = True, strict: bool = False) -> None:
        super().__init__(module, name, None, preserve_rng_state, strict)
        self.groups = sorted(groups)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        module = self.module
        if not torch.is_grad_enabled() or kwargs or len(args) != 1:
            return nn.Sequential.forward(module, *args, **kwargs)
        children = list(module)
        x = args[0]
        i = 0
        for start, end in self.groups:
            for child in children[i:start]:
                x = child(x)
            x = _run_region(_Chain(children[start:end]), (x,), {}, name=f"{self.name}[{start}:{end}]",
                            preserve_rng_state=self.preserve_rng_state, strict=self.strict)
            i = end
        for child in children[i:]:
            x = child(x)
        return x


class _GroupedRepr(_ExtraRepr):
    def __init__(self, module: nn.Module, groups: List[Tuple[int, int]]) -> None:
        super().__init__(module, None)
        self.groups = sorted(groups)

    def __call__(self) -> str:
        base = type(self.module).extra_repr(self.module)
        tag = "[memsave.checkpoint " + ", ".join(f"{s}:{e}" for s, e in self.groups) + "]"
        return f"{base}, {tag}" if base else tag


def _check_plan_matches(model: nn.Module, p: Plan) -> None:
    fp = _fingerprint(model)
    if fp == p.fingerprint:
        return
    names = set(dict(model.named_modules()))
    wanted = {m for pc in p.pieces for m in pc["modules"]}
    missing = sorted(wanted - names)
    detail = f"; modules it names that this model lacks: {', '.join(missing[:5])}" if missing else \
        "; module names match but classes or parameter shapes differ"
    raise PlanMismatchError(
        f"memsave: this plan was made for a {p.model_class} (fingerprint {p.fingerprint}) but the model is a "
        f"{type(model).__name__} (fingerprint {fp}){detail}. Make a plan for this model with memsave.plan(model, "
        f"*example_inputs, budget=...).")


def apply_plan(model: nn.Module, p: Plan, *, preserve_rng_state: bool = True, strict: bool = False) -> nn.Module:
    """Checkpoint, in place, the regions of plan ``p`` (what ``memsave.wrap(model, plan)`` does).

    Args:
        model: the model the plan was made for.
        p: the plan.
        preserve_rng_state, strict: as for :func:`memsave.checkpoint`.

    Returns:
        ``model``.

    Raises:
        PlanMismatchError: the plan was made for another model.

    Example:
        >>> memsave.wrap(model, memsave.plan(model, x, budget="2GiB"))
    """
    _check_plan_matches(model, p)
    _apply_regions(model, p, preserve_rng_state=preserve_rng_state, strict=strict)
    return model


def _apply_regions(model: nn.Module, p: Plan, *, preserve_rng_state: bool = True,
                   strict: bool = False) -> List[nn.Module]:
    """Install the plan's regions; returns the modules given an instance-level forward (to undo them)."""
    modules = dict(model.named_modules())
    groups: Dict[str, List[Tuple[int, int]]] = {}
    changed: List[nn.Module] = []
    for b, e, rec in p.segments:
        if not rec:
            continue
        pcs = p.pieces[b:e]
        names = [m for pc in pcs for m in pc["modules"]]
        if len(names) == 1:
            if _wrap_module(modules[names[0]], names[0], preserve_rng_state=preserve_rng_state, strict=strict):
                changed.append(modules[names[0]])
            continue
        parent = pcs[0]["parent"]
        idx = [k for pc in pcs for k in pc["child_index"]]
        if parent is None or any(pc["parent"] != parent for pc in pcs) or idx != list(range(idx[0], idx[-1] + 1)):
            raise PlanMismatchError(
                f"memsave: region {names} of the plan is not a run of consecutive children of one nn.Sequential; "
                f"the plan is corrupt or was edited")
        groups.setdefault(parent, []).append((idx[0], idx[-1] + 1))
    for parent, gs in groups.items():
        mod = modules[parent]
        if is_wrapped(mod):
            continue
        mod.__dict__["forward"] = _GroupedForward(mod, parent or type(mod).__name__, gs, preserve_rng_state, strict)
        mod.__dict__["extra_repr"] = _GroupedRepr(mod, gs)
        changed.append(mod)
    return changed


# ---------------------------------------------------------------------------------------------------- plan()
def _progress(total: int, desc: str) -> Any:
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover - tqdm is a dependency
        return None
    return tqdm(total=total, desc=desc, delay=1.0, leave=False)


def _search_optimal(solve: Callable[[Optional[int]], Dict[str, Any]],
                    solve_min_memory: Callable[[], Dict[str, Any]], make: Callable[[Dict[str, Any]], "Plan"],
                    measure: Optional[Callable[["Plan"], int]], budget_bytes: int, rounds: int = 4
                    ) -> Optional["Plan"]:
    """The optimal plan whose *measured* peak fits ``budget_bytes``, or None.

    The cost model's peak is off by a few allocations either way (allocator rounding, a temporary it does not see).
    Each round solves for a solver budget, measures that plan, and moves the solver budget by the error just
    observed (``budget - (measured - predicted)``): down when the model was optimistic, up when it was pessimistic,
    so a plan predicted a little above the budget but measured within it is found too (at a tight budget the
    model's own minimum can sit just above the measured peak of the plan that fits). Of the plans that fit, the
    one with the least predicted recompute wins. Without ``measure`` the solver's answer is taken as it is.
    """
    if measure is None:
        res = solve(budget_bytes)
        return make(res) if res["feasible"] else None
    best: Optional[Plan] = None
    seen: set = set()
    solver_budget = budget_bytes
    for _ in range(rounds):
        res = solve(solver_budget)
        if not res["feasible"]:
            if seen:
                break
            res = solve_min_memory()  # learn the model's error where it is tightest
        p = make(res)
        key = tuple(p.segments)
        if key in seen:
            break
        seen.add(key)
        p.measured_peak_bytes = measure(p)
        error = p.measured_peak_bytes - p.predicted_peak_bytes
        if p.measured_peak_bytes <= budget_bytes:
            if best is None or p.predicted_extra_seconds < best.predicted_extra_seconds:
                best = p
            if error >= 0:
                break  # the model was not pessimistic here: a larger solver budget would not fit
            solver_budget = max(solver_budget + 1, budget_bytes - error)
        else:
            solver_budget = min(solver_budget - 1, budget_bytes - error)
            if solver_budget < 0:
                break
    return best


def plan(model: nn.Module, *example_inputs: Any, budget: Optional[Budget] = None,
         loss_fn: Optional[LossFn] = None, strategy: str = "optimal", verbose: bool = False,
         verify: bool = True, slots: int = 2000, timing_steps: int = 3) -> Plan:
    """Choose what to recompute in backward so that a training step fits ``budget``, with the least recompute.

    Profiles a few steps of ``model`` on ``example_inputs`` (and puts back parameters' gradients, buffers such as
    BatchNorm statistics and the RNG state afterwards), builds the chain of candidate pieces from the module tree,
    and solves it with memsave's C++ planner. Apply the result with ``memsave.wrap(model, plan)``.

    Args:
        model: the model (not wrapped: call :func:`memsave.unwrap` first).
        *example_inputs: positional arguments of ``model`` for one step, on the device to plan for.
        budget: peak bytes of one training step above what was allocated before it (DESIGN.md): an int, a
            string such as ``"512MiB"`` / ``"4GB"``, or a float fraction of the eager step's peak. Required for
            ``strategy="optimal"``; optional otherwise (then checked when given).
        loss_fn: maps the model's output to a scalar loss; default: ``out.float().sum()`` of the first
            floating-point output (:func:`memsave.measure.default_loss`).
        strategy: ``"optimal"`` (least recompute within the budget), ``"sqrt"`` (Chen et al.), ``"uniform:K"``,
            ``"none"``, ``"all"`` (every piece its own region) or ``"min_memory"``.
        verbose: print the plan's summary.
        verify: measure one step with the plan applied and solve again with the solver's budget moved by the
            model's error (up to 4 plans measured): lower when the plan measured above the budget, higher when
            the model was pessimistic, so the plan returned has a measured peak within the budget and is the
            cheapest such plan found.
        slots: memory slots of the solver's dynamic program (finer = closer to optimal, slower).
        timing_steps: steps timed to estimate each piece's forward and backward time.

    Returns:
        a :class:`Plan`.

    Raises:
        InfeasibleBudgetError: no plan fits the budget; ``.min_bytes`` is the smallest budget that does.
        ValueError: bad budget, unknown strategy, a wrapped model, no parameter or input needing gradients, or the
            model failing on the example inputs.
        TypeError: ``model`` is not an ``nn.Module`` or the budget has a wrong type.

    Example:
        >>> p = memsave.plan(model, x, budget="2GiB")
        >>> print(p.summary())
        >>> memsave.wrap(model, p)
    """
    from . import _C

    if not isinstance(model, nn.Module):
        raise TypeError(f"memsave.plan: model must be an nn.Module, got {type(model).__name__}")
    if not isinstance(strategy, str) or not (
            strategy in _STRATEGIES or re.fullmatch(r"uniform:[1-9][0-9]*", strategy)):
        raise ValueError(
            f"memsave.plan: unknown strategy {strategy!r}; use one of optimal, sqrt, uniform:K (K >= 1), none, all, "
            f"min_memory")
    if budget is None and strategy == "optimal":
        raise ValueError("memsave.plan: strategy='optimal' needs a budget, e.g. budget='4GiB' or budget=0.6")
    if budget is not None and not isinstance(budget, float):
        parse_budget(budget)  # fail early on a bad budget, before profiling
    elif isinstance(budget, float):
        parse_budget(budget, eager_peak_bytes=1)
    if loss_fn is None:
        loss_fn = default_loss
    elif not callable(loss_fn):
        raise TypeError(f"memsave.plan: loss_fn must be callable (output -> scalar), got {type(loss_fn).__name__}")
    wrapped = [n for n, m in model.named_modules() if is_wrapped(m)]
    if wrapped:
        raise ValueError(
            f"memsave.plan: the model already has checkpointed modules ({', '.join(wrapped[:3]) or '(root)'}); plan "
            f"profiles the plain model: call memsave.unwrap(model) first")
    if not any(p.requires_grad for p in model.parameters()) and not any(
            t.requires_grad for t in _tensors(example_inputs)):
        raise ValueError(
            f"memsave.plan: {type(model).__name__} has no parameter that requires grad and no example input "
            f"requires grad, so a training step has no backward to plan for")
    device = _resolve_device(model, example_inputs, None)

    state = _SavedState(model, example_inputs)
    stepper = _Stepper(model, example_inputs, loss_fn, device, state)
    bar = _progress(5 + timing_steps, f"memsave.plan({type(model).__name__})")

    def tick(n: int = 1) -> None:
        if bar is not None:
            bar.update(n)

    try:
        try:
            stepper.step()  # warm-up: lazy initialisation, allocator caches
        except Exception as e:
            raise ValueError(
                f"memsave.plan: one training step of {type(model).__name__} on the example inputs failed "
                f"({type(e).__name__}: {e}); pass example inputs that model(*inputs) accepts and a loss_fn that maps "
                f"its output to a scalar") from e
        tick()
        state.clear_grads()
        trace = _trace_step(model, example_inputs, loss_fn, device)
        tick()
        timing = _time_steps(model, example_inputs, loss_fn, len(trace.calls), timing_steps, stepper.sync)
        tick(timing_steps)
        eager_peak = stepper.peak()
        tick()
        chain, pieces = _build_chain(trace, model, timing)
        n = len(pieces)
        none_peak = _C.planner_simulate(chain, [(0, n, False)])["peak_bytes"]
        chain["base_bytes"] = max(0, eager_peak - none_peak)  # allocator-level memory the log cannot see
        eager_seconds = sum(s["fwd_time"] + s["bwd_time"] for s in chain["stages"])
        budget_bytes = parse_budget(budget, eager_peak) if budget is not None else None

        def make(res: Dict[str, Any]) -> Plan:  # the solver's answer, not measured yet
            return Plan(strategy=strategy, budget_bytes=budget_bytes,
                        predicted_peak_bytes=int(res["predicted_peak_bytes"]), measured_peak_bytes=None,
                        eager_peak_bytes=int(eager_peak), min_feasible_bytes=int(res["min_feasible_bytes"]),
                        predicted_extra_seconds=float(res["predicted_extra_time"]), eager_step_seconds=eager_seconds,
                        segments=[tuple(s) for s in res["segments"]], pieces=pieces, chain=chain,
                        model_class=type(model).__name__, fingerprint=_fingerprint(model), device=str(device))

        measured_cache: Dict[Tuple, int] = {}

        def measure_plan(p: Plan) -> int:
            key = tuple(p.segments)
            if key not in measured_cache:
                if not any(r for _, _, r in p.segments):
                    measured_cache[key] = eager_peak
                else:
                    changed = _apply_regions(model, p)
                    try:
                        measured_cache[key] = stepper.peak()
                    finally:
                        for m in changed:
                            _unwrap_module(m)
                tick()
            return measured_cache[key]

        solver_strategy = strategy
        if strategy == "optimal" and budget_bytes is not None and budget_bytes >= eager_peak:
            solver_strategy = "none"  # eager itself fits: nothing to recompute
        result: Optional[Plan] = None
        if solver_strategy != "optimal":
            res = _C.planner_solve(chain, budget_bytes, solver_strategy, slots)
            p = make(res)
            if verify or budget_bytes is not None:
                p.measured_peak_bytes = measure_plan(p)
            if budget_bytes is None or p.measured_peak_bytes is None or p.measured_peak_bytes <= budget_bytes:
                result = p
        else:
            assert budget_bytes is not None
            result = _search_optimal(
                solve=lambda b: _C.planner_solve(chain, b, "optimal", slots),
                solve_min_memory=lambda: _C.planner_solve(chain, None, "min_memory", slots),
                make=make, measure=measure_plan if verify else None,
                budget_bytes=budget_bytes)
        if result is None:
            # Nothing fits: the smallest budget that does is the measured peak of the minimum-memory plan.
            res = _C.planner_solve(chain, None, "min_memory", slots)
            smallest = make(res)
            min_bytes = measure_plan(smallest)
            if budget_bytes is not None and min_bytes <= budget_bytes and strategy == "optimal":
                smallest.measured_peak_bytes = min_bytes
                result = smallest
            else:
                what = f"strategy '{strategy}'" if strategy != "optimal" else "any plan"
                raise InfeasibleBudgetError(
                    f"memsave.plan: no checkpoint plan of {type(model).__name__} fits a budget of "
                    f"{format_bytes(budget_bytes)} ({budget_bytes} bytes) with {what}; the smallest budget that fits "
                    f"is {format_bytes(min_bytes)} ({min_bytes} bytes, measured with the minimum-memory plan; eager "
                    f"peaks at {format_bytes(eager_peak)}). Raise the budget, lower the batch size, or use "
                    f"memory-efficient modules (memsave.convert).", min_bytes=min_bytes)
    finally:
        if bar is not None:
            bar.close()
        state.restore()
    if verbose:
        print(result.summary())
    return result
