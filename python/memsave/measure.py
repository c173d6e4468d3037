"""Measure one training step: peak memory, activation memory, step time, per-module attribution.

How each number is taken (DESIGN.md, "Measuring memory"):

* **peak_bytes** -- CUDA: ``torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats()`` before one step and
  ``max_memory_allocated() - memory_allocated_before`` after it. CPU: the allocator-level analogue,
  :func:`cpu_peak_bytes`: PyTorch's profiler with ``profile_memory=True`` records every CPU allocation and free
  with its size and time; the peak is the maximum of their running sum over the step, relative to its start
  (gradients are set to None before the step, so it frees nothing older than itself; see :func:`cpu_memory_stats`).
  Kernel temporaries are included by construction on both devices.
* **activation_bytes** -- the live-tensor tracker (:class:`memsave._tracker.LiveTensorTracker`): bytes of the
  tensors created during forward that are still alive when forward returns (tensors saved for backward and the
  output). Parameters, buffers, inputs and gradients are not counted.
* **by_module** -- the same tracker's bytes at the end of forward, grouped by the innermost module that created them.
* **step_seconds** -- median of ``steps`` timed steps after ``warmup`` warm-up steps, with neither the tracker nor
  the profiler on (CUDA is synchronized around each timed step).

One step is: gradients set to ``None``, forward, loss, backward. No optimizer runs.
"""

from __future__ import annotations

import gc
import html
import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch.utils._pytree import tree_flatten

from ._state import RngState
from ._tracker import LiveTensorTracker

__all__ = [
    "Measurement",
    "CpuMemoryStats",
    "measure",
    "cpu_peak_bytes",
    "cpu_memory_stats",
    "format_bytes",
    "default_loss",
]

LossFn = Callable[[Any], torch.Tensor]


# ---------------------------------------------------------------------------------------------------------- helpers
def format_bytes(n: Optional[Union[int, float]]) -> str:
    """Human-readable binary size.

    Args:
        n: a number of bytes (may be negative), or None.

    Returns:
        e.g. ``"12.3 MiB"``; ``"-"`` for None.

    Example:
        >>> format_bytes(3 * 2**20)
        '3.00 MiB'
    """
    if n is None:
        return "-"
    sign = "-" if n < 0 else ""
    v = float(abs(n))
    for unit in ("B", "KiB", "MiB", "GiB"):
        if v < 1024 or unit == "GiB":
            return f"{sign}{int(v)} B" if unit == "B" else f"{sign}{v:.2f} {unit}"
        v /= 1024
    raise AssertionError("unreachable")


def default_loss(output: Any) -> torch.Tensor:
    """The loss :func:`measure` uses when none is given: ``out.float().sum()`` of the first tensor in ``output``.

    Args:
        output: what the model returned: a tensor, or tuples / lists / dicts holding tensors.

    Returns:
        a scalar float32 (or float64) tensor.

    Raises:
        TypeError: the output holds no floating-point tensor that requires grad.

    Example:
        >>> default_loss((torch.ones(2, requires_grad=True), 3)).item()
        2.0
    """
    for t in tree_flatten(output)[0]:
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.requires_grad:
            return t.float().sum()
    raise TypeError(
        "measure: the model's output holds no floating-point tensor that requires grad, so there is nothing to "
        "backpropagate; pass loss_fn=... that maps the output to a scalar loss"
    )


def _tensors(obj: Any) -> List[torch.Tensor]:
    return [t for t in tree_flatten(obj)[0] if isinstance(t, torch.Tensor)]


def _resolve_device(model: torch.nn.Module, inputs: Sequence[Any], device: Optional[Union[str, torch.device]]) -> torch.device:
    devices = {p.device for p in model.parameters()} | {b.device for b in model.buffers()}
    devices |= {t.device for t in _tensors(inputs)}
    if device is not None:
        want = torch.device(device)
        if want.type == "cuda" and want.index is None:
            want = torch.device("cuda", torch.cuda.current_device())
        wrong = sorted(str(d) for d in devices if d != want)
        if wrong:
            raise ValueError(
                f"measure: device={str(device)!r} but the model or the inputs are on {', '.join(wrong)}; move them "
                f"with model.to({str(want)!r}) and x.to({str(want)!r}), or leave device=None to infer it"
            )
        return want
    if len(devices) > 1:
        raise ValueError(
            f"measure: the model and the inputs are on several devices ({', '.join(sorted(map(str, devices)))}); "
            "put them on one device"
        )
    if not devices:
        return torch.device("cpu")
    return devices.pop()


# ------------------------------------------------------------------------------------------------ CPU allocator peak
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


def _cpu_memory_deltas(prof: Any) -> List[Tuple[int, int]]:
    """(time_ns, signed bytes) of the CPU allocations (+) made during the trace and of their frees (-), in order.

    Why the event tree and address matching: PyTorch's CPU allocator learns a block's size from a table it fills
    only while memory profiling is on, and it looks blocks up (and erases them) only while profiling is on too. A
    block allocated in one profiled call and freed outside it leaves a stale entry; a later block at the same address,
    allocated outside profiling and freed inside, is then reported as a free of the *stale* size. So only frees of
    blocks allocated within this trace are counted, matched by address. Frees of blocks that existed before the
    call are left out (their size is unknown or wrong): the figure is the peak of the memory the call allocated,
    which is the peak relative to the start whenever the call frees nothing older than itself (a training step
    with gradients set to None beforehand). ``prof.events()`` cannot be used: on torch 2.11 it drops the memory
    events of nested operators.
    """
    try:
        tree = prof.kineto_results.experimental_event_tree()
        from torch._C._profiler import _EventType
    except (AttributeError, ImportError) as e:  # pragma: no cover - guards a future torch that moves the results
        raise RuntimeError(
            f"cpu_peak_bytes: this torch ({torch.__version__}) does not expose the profiler's event tree "
            "(torch.autograd.profiler.profile().kineto_results.experimental_event_tree()); memsave's CPU memory "
            "measure needs it"
        ) from e
    raw: List[Tuple[int, int, int, int]] = []
    stack = list(tree)
    while stack:
        node = stack.pop()
        stack.extend(node.children)
        if node.tag == _EventType.Allocation:
            f = node.extra_fields
            if f.device.type == "cpu" and f.alloc_size != 0:
                raw.append((node.start_time_ns, f.id, f.ptr, f.alloc_size))
    raw.sort()
    live: Dict[int, int] = {}
    out: List[Tuple[int, int]] = []
    for t, _, ptr, size in raw:
        if size > 0:
            live[ptr] = size
            out.append((t, size))
        elif ptr in live:
            out.append((t, -live.pop(ptr)))
    return out


def cpu_allocation_profiler() -> torch.autograd.profiler.profile:
    """The profiler context that records every CPU allocation and free with its size and time (DESIGN.md).

    The autograd profiler is what ``torch.profiler.profile`` wraps; used directly it records CPU activity only and
    does not warn about profiling cycles.
    """
    if not torch.cuda.is_available():
        # A CUDA build of torch on a machine without a GPU makes kineto log "gpuGetDeviceCount failed" as an ERROR
        # on its first use. Harmless for CPU-only profiling, so keep it off the user's screen (unless they chose a
        # log level themselves).
        os.environ.setdefault("KINETO_LOG_LEVEL", "5")
    return torch.autograd.profiler.profile(use_cpu=True, profile_memory=True, use_kineto=True)


def cpu_memory_stats(fn: Callable[[], Any]) -> CpuMemoryStats:
    """Run ``fn()`` once under the profiler and return its CPU allocator-level memory statistics.

    Every CPU allocation made while ``fn`` runs (by operators, kernel temporaries, autograd) and its free, when that
    happens during the call too, is recorded with its size and time; ``peak_bytes`` is the maximum of their running
    sum, relative to the start. Blocks that existed before the call and are freed during it are not subtracted
    (see ``_cpu_memory_deltas``): keep such frees out of ``fn`` (clear gradients before it, for example).

    Args:
        fn: the work to measure, called with no arguments (one training step, say).

    Returns:
        :class:`CpuMemoryStats`, with ``fn``'s return value in ``.result``.

    Example:
        >>> stats = cpu_memory_stats(lambda: torch.ones(1024))
        >>> stats.net_bytes
        4096
    """
    if not callable(fn):
        raise TypeError(f"cpu_memory_stats: fn must be callable, got {type(fn).__name__}")
    # Free cyclic garbage first, so that blocks older than the call are not collected during it (such frees are not
    # counted, see _cpu_memory_deltas, but the collection's own timing would otherwise vary from run to run).
    gc.collect()
    with cpu_allocation_profiler() as prof:
        result = fn()
    running = peak = 0
    deltas = _cpu_memory_deltas(prof)
    for _, d in deltas:
        running += d
        if running > peak:
            peak = running
    return CpuMemoryStats(peak_bytes=peak, net_bytes=running, num_events=len(deltas), result=result)


def cpu_peak_bytes(step_fn: Callable[[], Any]) -> int:
    """Allocator-level peak CPU memory of one call of ``step_fn``, relative to the start (DESIGN.md).

    Args:
        step_fn: the work to measure, called once with no arguments.

    Returns:
        the peak, in bytes, of (bytes allocated - bytes freed) since ``step_fn`` started.

    Example:
        >>> model, x = torch.nn.Linear(64, 64), torch.randn(32, 64)
        >>> cpu_peak_bytes(lambda: model(x).sum().backward()) > 0
        True
    """
    return cpu_memory_stats(step_fn).peak_bytes


# ------------------------------------------------------------------------------------------------------ measurement
def step_peak_bytes(step_fn: Callable[[], Any], device: torch.device) -> int:
    """Peak memory of one call of ``step_fn`` above what was allocated before it, as DESIGN.md measures it.

    CUDA: ``max_memory_allocated() - memory_allocated()`` around the call, peak statistics reset first (so
    ``max_memory_reserved`` afterwards is the call's too). CPU: :func:`cpu_peak_bytes`.

    Example:
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


@dataclass(frozen=True)
class Measurement:
    """The result of :func:`measure`.

    Attributes:
        peak_bytes: peak memory of one step above what was allocated before it (CUDA: ``max_memory_allocated``;
            CPU: allocator-level profiler events).
        activation_bytes: bytes of the tensors created in forward and alive at its end (live-tensor tracker).
        step_seconds: median wall time of one step.
        device: the device the step ran on, e.g. ``"cpu"`` or ``"cuda:0"``.
        reserved_bytes: CUDA only: ``max_memory_reserved()`` during the measured step (absolute: includes blocks the
            caching allocator held before); None on CPU.
        by_module: qualified module name -> activation bytes created in it (``""`` is the root model), largest first.
        steps: how many timed steps ``step_seconds`` is the median of.
    """

    peak_bytes: int
    activation_bytes: int
    step_seconds: float
    device: str
    reserved_bytes: Optional[int] = None
    by_module: Dict[str, int] = field(default_factory=dict)
    steps: int = 0

    def _module_rows(self, limit: int) -> List[Tuple[str, int]]:
        rows = list(self.by_module.items())[:limit]
        return [("(root)" if name == "" else name, b) for name, b in rows]

    def __str__(self) -> str:
        lines = [
            f"Measurement on {self.device}: peak {format_bytes(self.peak_bytes)}, "
            f"activations {format_bytes(self.activation_bytes)}, "
            f"step {self.step_seconds * 1e3:.2f} ms (median of {self.steps})"
            + (f", reserved {format_bytes(self.reserved_bytes)}" if self.reserved_bytes is not None else "")
        ]
        rows = self._module_rows(10)
        if rows:
            width = max(len(n) for n, _ in rows)
            lines.append("  activations by module:")
            lines += [f"    {n:<{width}}  {format_bytes(b):>12}" for n, b in rows]
            if len(self.by_module) > len(rows):
                lines.append(f"    ... {len(self.by_module) - len(rows)} more")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        head = (
            "<table><tr><th>device</th><th>peak</th><th>activations</th><th>step (median)</th>"
            + ("<th>reserved</th>" if self.reserved_bytes is not None else "")
            + "</tr>"
        )
        row = (
            f"<tr><td>{html.escape(self.device)}</td><td>{format_bytes(self.peak_bytes)}</td>"
            f"<td>{format_bytes(self.activation_bytes)}</td><td>{self.step_seconds * 1e3:.2f} ms</td>"
            + (f"<td>{format_bytes(self.reserved_bytes)}</td>" if self.reserved_bytes is not None else "")
            + "</tr></table>"
        )
        mods = self._module_rows(10)
        if mods:
            row += "<table><tr><th>module</th><th>activations</th></tr>" + "".join(
                f"<tr><td><code>{html.escape(n)}</code></td><td>{format_bytes(b)}</td></tr>" for n, b in mods
            ) + "</table>"
        return head + row


class _SavedState:
    """What a measured step changes, saved so it can be put back: buffers, gradients, RNG states."""

    def __init__(self, model: torch.nn.Module, inputs: Sequence[Any]) -> None:
        # Buffers change in a step (BatchNorm statistics); copy their values, restore in place.
        self.buffers = [(b, b.detach().clone()) for b in model.buffers()]
        # Gradients are replaced (set to None) rather than written into, so keeping the tensors is enough.
        self.grads = [(p, p.grad) for p in model.parameters()]
        self.input_grads = [(t, t.grad) for t in _tensors(inputs) if t.requires_grad and t.is_leaf]
        self.rng = RngState()

    def clear_grads(self) -> None:
        for p, _ in self.grads:
            p.grad = None
        for t, _ in self.input_grads:
            t.grad = None

    def restore(self) -> None:
        with torch.no_grad():
            for b, saved in self.buffers:
                b.copy_(saved)
        for p, g in self.grads:
            p.grad = g
        for t, g in self.input_grads:
            t.grad = g
        self.rng.restore()


def _forward_backward(model: Any, inputs: Sequence[Any], loss_fn: LossFn) -> None:
    out = model(*inputs)
    loss = loss_fn(out)
    loss.backward()


def measure(
    model: torch.nn.Module,
    *inputs: Any,
    loss_fn: Optional[LossFn] = None,
    steps: int = 5,
    warmup: int = 1,
    device: Optional[Union[str, torch.device]] = None,
) -> Measurement:
    """Measure the peak memory, activation memory and time of a training step of ``model`` on ``inputs``.

    One step is: gradients set to None, ``out = model(*inputs)``, ``loss = loss_fn(out)``, ``loss.backward()``.
    The default loss is :func:`default_loss`: ``out.float().sum()`` over the first floating-point tensor of the output
    that requires grad. ``measure`` runs ``warmup`` steps, ``steps`` timed steps, one step for the peak (CUDA
    allocator statistics, or the CPU profiler's allocation events) and one under the live-tensor tracker for the
    activation bytes and their per-module attribution. The model runs in whatever mode it is in (train/eval).

    State is left as it was: buffers (BatchNorm running statistics change during the steps) are copied back in
    place; each parameter's ``.grad`` (and that of leaf inputs requiring grad) is put back as the same tensor object
    it was, or None; the CPU RNG state and, when CUDA is initialized, every CUDA device's RNG state are restored.
    Parameters are not modified by a step without an optimizer.

    Args:
        model: the module to step; its parameters, buffers and the tensor inputs must be on one device.
        *inputs: positional arguments of ``model``.
        loss_fn: maps the model's output to a scalar loss; default :func:`default_loss`.
        steps: timed steps whose median is ``step_seconds`` (>= 1).
        warmup: untimed steps run first (>= 0): lazy initialisation, allocator warm-up.
        device: the device to measure on; None infers it from the model and inputs. When given it must match them.

    Returns:
        a frozen :class:`Measurement`.

    Raises:
        ValueError: ``steps`` < 1, ``warmup`` < 0, or model and inputs not on one (the given) device.
        TypeError: ``model`` or ``loss_fn`` is not callable, or the output has nothing to backpropagate.

    Example:
        >>> model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU())
        >>> m = measure(model, torch.randn(64, 256))
        >>> m.activation_bytes          # ReLU's output (saved for backward, and returned)
        65536
    """
    if not callable(model):
        raise TypeError(f"measure: model must be a callable nn.Module, got {type(model).__name__}")
    if loss_fn is None:
        loss_fn = default_loss
    elif not callable(loss_fn):
        raise TypeError(f"measure: loss_fn must be callable (output -> scalar tensor), got {type(loss_fn).__name__}")
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"measure: steps must be an int >= 1 (timed steps for the median), got {steps!r}")
    if not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"measure: warmup must be an int >= 0, got {warmup!r}")
    dev = _resolve_device(model, inputs, device)
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"measure: device type {dev.type!r} is not supported; memsave measures on 'cpu' and 'cuda'")
    is_cuda = dev.type == "cuda"

    state = _SavedState(model, inputs)

    def step() -> None:
        _forward_backward(model, inputs, loss_fn)

    def sync() -> None:
        if is_cuda:
            torch.cuda.synchronize(dev)

    try:
        for _ in range(warmup):
            state.clear_grads()
            step()

        times = []
        for _ in range(steps):
            state.clear_grads()
            sync()
            t0 = time.perf_counter()
            step()
            sync()
            times.append(time.perf_counter() - t0)

        state.clear_grads()
        reserved: Optional[int] = None
        peak = step_peak_bytes(step, dev)
        if is_cuda:
            reserved = torch.cuda.max_memory_reserved(dev)  # since step_peak_bytes reset the peak statistics

        state.clear_grads()
        with LiveTensorTracker(root=model if isinstance(model, torch.nn.Module) else None) as tracker:
            out = model(*inputs)
            activation = tracker.live_bytes
            by_module = tracker.live_by_module()
            loss_fn(out).backward()
            del out
    finally:
        state.restore()

    return Measurement(
        peak_bytes=int(peak),
        activation_bytes=int(activation),
        step_seconds=float(statistics.median(times)),
        device=str(dev),
        reserved_bytes=reserved,
        by_module=by_module,
        steps=steps,
    )
