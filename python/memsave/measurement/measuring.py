"""Measure one training step: peak memory, activation memory, step time, per-module attribution.

How each number is taken (DESIGN.md, "Measuring memory"):

* **peak_bytes** -- CUDA: ``torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats()`` before one step and
  ``max_memory_allocated() - memory_allocated_before`` after it. CPU: the allocator-level analogue,
  :func:`memsave.measurement.allocator.cpu_peak_bytes`: PyTorch's profiler with ``profile_memory=True`` records every
  CPU allocation and free
  with its size and time; the peak is the maximum of their running sum over the step, relative to its start
  (gradients are set to None before the step, so it frees nothing older than itself; see
  :mod:`memsave.measurement.allocator`).
  Kernel temporaries are included by construction on both devices.
* **activation_bytes** -- the live-tensor tracker (:class:`memsave.measurement.tracker.LiveTensorTracker`): bytes of the
  tensors created during forward that are still alive when forward returns (tensors saved for backward and the
  output). Parameters, buffers, inputs and gradients are not counted.
* **by_module** -- the same tracker's bytes at the end of forward, grouped by the innermost module that created them.
* **step_seconds** -- median of ``steps`` timed steps after ``warmup`` warm-up steps, with neither the tracker nor
  the profiler on (CUDA is synchronized around each timed step).

One step is: gradients set to ``None``, forward, loss, backward. No optimizer runs.
"""

from __future__ import annotations

import html
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch.utils._pytree import tree_flatten

from ..common.rng import RngState
from .allocator import step_peak_bytes
from .tracker import LiveTensorTracker
from .units import format_bytes

__all__ = [
    "LossFn",
    "Measurement",
    "SavedStepState",
    "default_loss",
    "measure",
    "resolve_device",
    "resolve_loss_fn",
    "tensors_in",
]

LossFn = Callable[[Any], torch.Tensor]


# ---------------------------------------------------------------------------------------------------------- helpers
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


def resolve_loss_fn(loss_fn: Optional[LossFn], where: str) -> LossFn:
    """``loss_fn``, or :func:`default_loss` when it is None: the one place every step driver checks its loss.

    Args:
        loss_fn: output -> scalar loss, or None.
        where: the calling function's name, for the message (``"measure"``, ``"memsave.plan"``, ...).

    Raises:
        TypeError: ``loss_fn`` is not callable.

    Example:
        >>> resolve_loss_fn(None, "measure") is default_loss
        True
    """
    if loss_fn is None:
        return default_loss
    if not callable(loss_fn):
        raise TypeError(
            f"{where}: loss_fn must be callable (output -> scalar loss tensor), got {type(loss_fn).__name__}"
        )
    return loss_fn


def tensors_in(obj: Any) -> List[torch.Tensor]:
    """Every tensor inside ``obj`` (nested tuples, lists, dicts), in pytree order."""
    return [t for t in tree_flatten(obj)[0] if isinstance(t, torch.Tensor)]


def resolve_device(
    model: torch.nn.Module, inputs: Sequence[Any], device: Optional[Union[str, torch.device]]
) -> torch.device:
    """The one device ``model`` and ``inputs`` live on (checked against ``device`` when given).

    Raises:
        ValueError: they are on several devices, or not on ``device``.

    Example:
        >>> resolve_device(torch.nn.Linear(2, 2), (torch.ones(2),), None)
        device(type='cpu')
    """
    devices = {p.device for p in model.parameters()} | {b.device for b in model.buffers()}
    devices |= {t.device for t in tensors_in(inputs)}
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
            row += (
                "<table><tr><th>module</th><th>activations</th></tr>"
                + "".join(f"<tr><td><code>{html.escape(n)}</code></td><td>{format_bytes(b)}</td></tr>" for n, b in mods)
                + "</table>"
            )
        return head + row


class SavedStepState:
    """What a measured step changes, saved so it can be put back: buffers, gradients, RNG states.

    Args:
        model: the model whose buffers and parameter gradients are saved.
        inputs: the step's inputs; gradients of leaf inputs that require grad are saved too.

    Example:
        >>> state = SavedStepState(model, (x,))
        >>> state.clear_grads(); model(x).sum().backward()
        >>> state.restore()          # gradients, buffers and RNG as before the step
    """

    def __init__(self, model: torch.nn.Module, inputs: Sequence[Any]) -> None:
        # Buffers change in a step (BatchNorm statistics); copy their values, restore in place.
        self.buffers = [(b, b.detach().clone()) for b in model.buffers()]
        # Gradients are replaced (set to None) rather than written into, so keeping the tensors is enough.
        self.grads = [(p, p.grad) for p in model.parameters()]
        self.input_grads = [(t, t.grad) for t in tensors_in(inputs) if t.requires_grad and t.is_leaf]
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
    For a ``torch.compile``-d model, ``peak_bytes`` and the times are those of the compiled step, but
    ``activation_bytes`` are those of its eager run: the tracker is a dispatch mode, and under one dynamo runs the
    step operator by operator. Compare compiled variants by ``peak_bytes``.

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
    loss_fn = resolve_loss_fn(loss_fn, "measure")
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"measure: steps must be an int >= 1 (timed steps for the median), got {steps!r}")
    if not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"measure: warmup must be an int >= 0, got {warmup!r}")
    dev = resolve_device(model, inputs, device)
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"measure: device type {dev.type!r} is not supported; memsave measures on 'cpu' and 'cuda'")
    is_cuda = dev.type == "cuda"

    state = SavedStepState(model, inputs)

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
