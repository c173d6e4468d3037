"""The allocator-level memory of one call: what every memory figure in memsave is read from (docs/design.md).

* CUDA: ``torch.cuda.max_memory_allocated() - memory_allocated()`` around the call, peak statistics reset first.
* CPU: PyTorch's profiler with ``profile_memory=True`` records every CPU allocation and free with its size and time
  (:func:`cpu_allocation_profiler`); :func:`read_cpu_events` turns them into signed deltas by the one rule memsave
  uses (only frees of blocks allocated within the call count) and :func:`cpu_memory_stats` takes the peak of their
  running sum. The planner reads the same events, with its markers, through :func:`read_cpu_events`.
"""

from __future__ import annotations

import contextlib
import gc
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import torch

from ..common import compat

__all__ = [
    "CpuEvents",
    "CpuMemoryStats",
    "collector_paused",
    "cpu_allocation_profiler",
    "cpu_memory_stats",
    "cpu_peak_bytes",
    "read_cpu_events",
    "step_peak_bytes",
]


@dataclass(frozen=True)
class CpuMemoryStats:
    """CPU allocator events of one call, from :func:`cpu_memory_stats`.

    Attributes:
        peak_bytes: maximum of the running sum of allocations minus frees, relative to the start (>= 0).
        net_bytes: the running sum at the end (bytes allocated during the call and still alive after it).
        num_events: how many allocation and free events were recorded.
        result: what the function returned (kept alive, so ``net_bytes`` includes it).
    """

    peak_bytes: int
    net_bytes: int
    num_events: int
    result: Any = field(default=None, repr=False, compare=False)


@dataclass(frozen=True)
class CpuEvents:
    """What :func:`read_cpu_events` reads from one profiled run.

    Attributes:
        deltas: ``(time_ns, signed bytes)`` of the CPU allocations made during the run (+) and of their frees (-),
            in time order. Frees of blocks allocated before the run are left out (see :func:`read_cpu_events`).
        markers: start time (ns) of every ``record_function`` range whose name starts with the marker prefix,
            by name.
    """

    deltas: List[Tuple[int, int]]
    markers: Dict[str, int]


def read_cpu_events(prof: Any, marker_prefix: Optional[str] = None) -> CpuEvents:
    """The CPU allocation events (and optional marker times) of a run under :func:`cpu_allocation_profiler`.

    The one rule every CPU memory figure in memsave uses: only frees of blocks allocated *within* the run count,
    matched by address. Why: PyTorch's CPU allocator learns a block's size from a table it fills only while memory
    profiling is on, and it looks blocks up (and erases them) only while profiling is on too. A block allocated in
    one profiled run and freed outside it leaves a stale entry; a later block at the same address, allocated outside
    profiling and freed inside, is then reported as a free of the *stale* size. Summing every free would subtract
    such wrong sizes (and the sizes of blocks older than the run), so a peak relative to the run's start could come
    out too low or even negative. The figure is therefore the peak of the memory the run allocated, which is the
    peak relative to the start whenever the run frees nothing older than itself (a training step with gradients set
    to None beforehand). ``prof.events()`` cannot be used: on torch 2.11 it drops the memory events of nested
    operators; the event tree keeps them.

    Args:
        prof: the finished profiler (``with cpu_allocation_profiler() as prof: ...``).
        marker_prefix: also collect the start times of ``torch.autograd.profiler.record_function`` ranges whose
            name starts with this prefix (how the planner marks module calls in a step).

    Returns:
        :class:`CpuEvents`.

    Raises:
        RuntimeError: this torch does not expose the profiler's event tree.

    Examples:
        >>> with cpu_allocation_profiler() as prof:
        ...     x = torch.ones(1024)
        >>> read_cpu_events(prof).deltas[-1][1]
        4096
    """
    tree, _EventType = compat.profiler_event_tree(prof)
    raw: List[Tuple[int, int, int, int]] = []
    markers: Dict[str, int] = {}
    stack = list(tree)
    while stack:
        node = stack.pop()
        stack.extend(node.children)
        if node.tag == _EventType.Allocation:
            f = node.extra_fields
            if f.device.type == "cpu" and f.alloc_size != 0:
                raw.append((node.start_time_ns, f.id, f.ptr, f.alloc_size))
        elif marker_prefix is not None and node.name.startswith(marker_prefix):
            markers[node.name] = node.start_time_ns
    raw.sort()
    live: Dict[int, int] = {}
    deltas: List[Tuple[int, int]] = []
    for t, _, ptr, size in raw:
        if size > 0:
            live[ptr] = size
            deltas.append((t, size))
        elif ptr in live:
            deltas.append((t, -live.pop(ptr)))
    return CpuEvents(deltas, markers)


def cpu_allocation_profiler() -> torch.autograd.profiler.profile:
    """The profiler context that records every CPU allocation and free with its size and time (docs/design.md).

    The autograd profiler is what ``torch.profiler.profile`` wraps; used directly it records CPU activity only and
    does not warn about profiling cycles.
    """
    if not torch.cuda.is_available():
        # A CUDA build of torch on a machine without a GPU makes kineto log "gpuGetDeviceCount failed" as an ERROR
        # on its first use, and some builds log a "USDT: ... profiler_start" / "profiler_stop" pair on every run
        # (level 5, the highest). Neither is about the user's run, so keep both off their screen (unless they chose
        # a log level themselves): 6 is above every kineto level.
        os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    return torch.autograd.profiler.profile(use_cpu=True, profile_memory=True, use_kineto=True)


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for the block (as it was after it): objects are freed by their
    reference counts alone, at the same points in every run. Every CPU memory measurement runs under it.

    Example:
        >>> with collector_paused():
        ...     step()
    """
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


def cpu_memory_stats(fn: Callable[[], Any]) -> CpuMemoryStats:
    """Run ``fn()`` once under the profiler and return its CPU allocator-level memory statistics.

    Every CPU allocation made while ``fn`` runs (by operators, kernel temporaries, autograd) and its free, when that
    happens during the call too, is recorded with its size and time; ``peak_bytes`` is the maximum of their running
    sum, relative to the start. Blocks that existed before the call and are freed during it are not subtracted
    (see :func:`read_cpu_events`): keep such frees out of ``fn`` (clear gradients before it, for example).

    Args:
        fn: the work to measure, called with no arguments (one training step, say).

    Returns:
        :class:`CpuMemoryStats`, with ``fn``'s return value in ``.result``.

    Examples:
        >>> stats = cpu_memory_stats(lambda: torch.ones(1024))
        >>> stats.net_bytes
        4096
    """
    if not callable(fn):
        raise TypeError(f"cpu_memory_stats: fn must be callable, got {type(fn).__name__}")
    # The cyclic collector stays off during the call: when it would run (and what it would free) varies from run to
    # run, and a full collection beforehand costs more than a training step of a small model (0.23 s with GPT-2
    # loaded). Frees of blocks older than the call are not counted anyway (read_cpu_events).
    with collector_paused(), cpu_allocation_profiler() as prof:
        result = fn()
    running = peak = 0
    deltas = read_cpu_events(prof).deltas
    for _, d in deltas:
        running += d
        if running > peak:
            peak = running
    return CpuMemoryStats(peak_bytes=peak, net_bytes=running, num_events=len(deltas), result=result)


def cpu_peak_bytes(step_fn: Callable[[], Any]) -> int:
    """Allocator-level peak CPU memory of one call of ``step_fn``, relative to the start (docs/design.md).

    Args:
        step_fn: the work to measure, called once with no arguments.

    Returns:
        the peak, in bytes, of (bytes allocated - bytes freed) since ``step_fn`` started.

    Examples:
        >>> model, x = torch.nn.Linear(64, 64), torch.randn(32, 64)
        >>> cpu_peak_bytes(lambda: model(x).sum().backward()) > 0
        True
    """
    return cpu_memory_stats(step_fn).peak_bytes


# ------------------------------------------------------------------------------------------------------ measurement
def step_peak_bytes(step_fn: Callable[[], Any], device: torch.device) -> int:
    """Peak memory of one call of ``step_fn`` above what was allocated before it, as docs/design.md describes.

    CUDA: ``max_memory_allocated() - memory_allocated()`` around the call, peak statistics reset first (so
    ``max_memory_reserved`` afterwards is the call's too). CPU: :func:`cpu_peak_bytes`.

    Examples:
        >>> step_peak_bytes(lambda: model(x).sum().backward(), torch.device("cpu")) > 0
        True
    """
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        step_fn()
        torch.cuda.synchronize(device)
        return int(torch.cuda.max_memory_allocated(device) - before)
    return int(cpu_peak_bytes(step_fn))
