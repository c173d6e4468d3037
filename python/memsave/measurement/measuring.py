"""Measure one training step: peak memory, activation memory, step time, per-module attribution.

How each number is taken (docs/design.md, "Measuring and comparing"):

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
* **step_seconds** -- median over ``steps`` or more rounds of :func:`memsave.measurement.timing.time_interleaved`
  (``torch.utils.benchmark.Timer``; CUDA is synchronized around each timed call) after ``warmup`` warm-up steps,
  with neither the tracker nor the profiler on; ``step_iqr_seconds`` is the spread (inter-quartile range) of the
  rounds, and a warning says when it is over 10% of the median.

One step is: gradients set to ``None``, forward (positional and keyword inputs), loss, backward. No optimizer runs.
"""

from __future__ import annotations

import html
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch.utils._pytree import tree_flatten

from ..common.rng import RngState
from ..errors import MemsaveWarning
from .allocator import step_peak_bytes
from .timing import spread_warning, time_interleaved
from .tracker import LiveTensorTracker
from .units import format_bytes

__all__ = [
    "LossFn",
    "Measurement",
    "SavedStepState",
    "StepMemory",
    "check_loss",
    "checked_loss_fn",
    "default_loss",
    "measure",
    "measure_memory",
    "resolve_device",
    "resolve_loss_fn",
    "tensors_in",
]

LossFn = Callable[[Any], torch.Tensor]


# ---------------------------------------------------------------------------------------------------------- helpers
def _differentiable(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.is_floating_point() and t.requires_grad


def default_loss(output: Any) -> torch.Tensor:
    """The loss :func:`measure` (and compare, estimate, plan, the command line) uses when none is given.

    ``output.loss`` when the output has one (a Hugging Face model called with ``labels``), else ``output.logits``
    (a Hugging Face model without labels), else the first floating-point tensor of the output that requires grad (in
    pytree order through tuples, lists and dicts); summed in float32 (``t.float().sum()``).

    Args:
        output: what the model returned: a tensor, or tuples / lists / dicts / ``ModelOutput`` holding tensors.

    Returns:
        a scalar float32 (or float64) tensor.

    Raises:
        TypeError: the output holds no floating-point tensor that requires grad.

    Examples:
        >>> default_loss((torch.ones(2, requires_grad=True), 3)).item()
        2.0
    """
    for name in ("loss", "logits"):
        t = output.get(name) if isinstance(output, dict) else getattr(output, name, None)
        if t is not None and _differentiable(t) and t.numel() > 0:
            return t.float().sum()
    for t in tree_flatten(output)[0]:
        if _differentiable(t):
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

    Examples:
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
        ValueError: they are on several devices, or not on ``device``, or ``device`` is not a torch device.

    Examples:
        >>> resolve_device(torch.nn.Linear(2, 2), (torch.ones(2),), None)
        device(type='cpu')
    """
    devices = {p.device for p in model.parameters()} | {b.device for b in model.buffers()}
    devices |= {t.device for t in tensors_in(inputs)}
    if device is not None:
        try:
            want = torch.device(device)
        except (RuntimeError, TypeError) as exc:
            raise ValueError(
                f"measure: device must be a torch device such as 'cpu' or 'cuda:0', got {device!r}"
            ) from exc
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
        step_seconds: median wall time of one step over the timed rounds.
        device: the device the step ran on, e.g. ``"cpu"`` or ``"cuda:0"``.
        reserved_bytes: CUDA only: ``max_memory_reserved()`` during the measured step (absolute: includes blocks the
            caching allocator held before); None on CPU.
        by_module: qualified module name -> activation bytes created in it (``""`` is the root model), largest first.
        steps: how many timed rounds ``step_seconds`` is the median of.
        step_iqr_seconds: the inter-quartile range of the rounds' step times (their spread).

    Examples:
        >>> m = memsave.measure(model, x)
        >>> m.peak_bytes, m.activation_bytes
        >>> print(m)                                              # readable units
    """

    peak_bytes: int
    activation_bytes: int
    step_seconds: float
    device: str
    reserved_bytes: Optional[int] = None
    by_module: Dict[str, int] = field(default_factory=dict)
    steps: int = 0
    step_iqr_seconds: float = 0.0

    def _module_rows(self, limit: int) -> List[Tuple[str, int]]:
        rows = list(self.by_module.items())[:limit]
        return [("(root)" if name == "" else name, b) for name, b in rows]

    def __str__(self) -> str:
        lines = [
            f"Measurement on {self.device}: peak {format_bytes(self.peak_bytes)}, "
            f"activations {format_bytes(self.activation_bytes)}, "
            f"step {self.step_seconds * 1e3:.2f} ms (median of {self.steps} rounds, "
            f"IQR {self.step_iqr_seconds * 1e3:.2f} ms)"
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

    Examples:
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


def check_loss(out: Any, loss: Any, where: str) -> None:
    """Raise a TypeError saying what is wrong when ``loss`` (``loss_fn(out)``) is not a scalar tensor one can
    backpropagate: the check every step driver (:func:`measure`, :func:`memsave.compare`, :func:`memsave.plan`) makes
    before ``loss.backward()``.

    Args:
        out: the model's output; loss: what the loss function made of it.
        where: the calling function's name, for the message (``"measure"``, ``"memsave.plan"``).

    Raises:
        TypeError: the loss is None (a Hugging Face output without labels), not a one-element tensor, or does not
            require grad.

    Examples:
        >>> check_loss(out, out, "measure")   # an output of shape (4, 2) as the loss
        Traceback (most recent call last):
        TypeError: measure: loss_fn must return a scalar tensor, got a tensor of shape (4, 2); reduce it ...
    """
    if loss is None and getattr(out, "loss", 0) is None:
        raise TypeError(
            f"{where}: the loss is None: the model returned a {type(out).__name__} whose .loss is None (a Hugging "
            f"Face model computes its loss only when called with labels=...); pass labels=... to {where}, or a "
            f"loss_fn that maps the output to a scalar loss"
        )
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        got = f"a tensor of shape {tuple(loss.shape)}" if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise TypeError(
            f"{where}: loss_fn must return a scalar tensor, got {got}; reduce it to one value (e.g. "
            f"loss_fn=lambda out: out.sum() or a criterion with reduction='mean')"
        )
    if not loss.requires_grad:
        raise TypeError(
            f"{where}: the loss does not require grad (computed without autograd, or from nothing that requires "
            f"grad), so a training step has no backward"
        )


def checked_loss_fn(loss_fn: LossFn, where: str) -> LossFn:
    """``loss_fn`` with :func:`check_loss` run on each loss it returns (for step drivers that call it themselves).

    Examples:
        >>> checked_loss_fn(lambda out: out, "compare")(torch.ones(2, requires_grad=True))
        Traceback (most recent call last):
        TypeError: compare: loss_fn must return a scalar tensor, got a tensor of shape (2,); ...
    """

    def checked(out: Any) -> Any:
        loss = loss_fn(out)
        check_loss(out, loss, where)
        return loss

    return checked


def _forward_backward(
    model: Any, inputs: Sequence[Any], kwargs: Dict[str, Any], loss_fn: LossFn, where: str = "measure"
) -> None:
    out = model(*inputs, **kwargs)
    loss = loss_fn(out)
    check_loss(out, loss, where)
    loss.backward()


@dataclass(frozen=True)
class StepMemory:
    """The memory of one training step, as :func:`measure_memory` reads it.

    Attributes:
        peak_bytes: allocator-level peak above the start of the step.
        reserved_bytes: CUDA only: ``max_memory_reserved()`` during the step.
        activation_bytes: live-tensor bytes created in forward and alive at its end.
        by_module: those bytes per module, largest first.
    """

    peak_bytes: int
    reserved_bytes: Optional[int]
    activation_bytes: int
    by_module: Dict[str, int]


def measure_memory(
    model: Any, inputs: Sequence[Any], kwargs: Dict[str, Any], loss_fn: LossFn, device: torch.device
) -> StepMemory:
    """Peak and activation bytes of two training steps of ``model`` (one under the allocator reading, one under the
    live-tensor tracker): the memory half of :func:`measure`, shared with :func:`memsave.compare`.

    Gradients of ``model``'s parameters are set to None before each step and left from the last one; the caller
    saves and restores state (:class:`SavedStepState`).

    Args:
        model: the module (or callable) to step.
        inputs: positional inputs; kwargs: keyword inputs.
        loss_fn: output -> scalar loss.
        device: where the step runs.

    Returns:
        a :class:`StepMemory`.

    Examples:
        >>> measure_memory(model, (x,), {}, default_loss, torch.device("cpu")).activation_bytes
    """
    params = list(model.parameters()) if isinstance(model, torch.nn.Module) else []

    def clear() -> None:
        for p in params:
            p.grad = None

    clear()
    peak = step_peak_bytes(lambda: _forward_backward(model, inputs, kwargs, loss_fn), device)
    # max_memory_reserved since step_peak_bytes reset the peak statistics.
    reserved = torch.cuda.max_memory_reserved(device) if device.type == "cuda" else None
    clear()
    with LiveTensorTracker(root=model if isinstance(model, torch.nn.Module) else None) as tracker:
        out = model(*inputs, **kwargs)
        activation = tracker.live_bytes
        by_module = tracker.live_by_module()
        loss_fn(out).backward()
        del out
    return StepMemory(int(peak), reserved, int(activation), by_module)


def measure(
    model: torch.nn.Module,
    *inputs: Any,
    loss_fn: Optional[LossFn] = None,
    steps: int = 5,
    warmup: int = 1,
    device: Optional[Union[str, torch.device]] = None,
    **model_kwargs: Any,
) -> Measurement:
    """Measure the peak memory, activation memory and time of a training step of ``model`` on its inputs.

    One step is: gradients set to None, ``out = model(*inputs, **model_kwargs)``, ``loss = loss_fn(out)``,
    ``loss.backward()``. The default loss is :func:`default_loss`: ``out.float().sum()`` over the first
    floating-point tensor of the output that requires grad (a Hugging Face model called with ``labels=`` returns its
    loss first, so that is the loss). ``measure`` times ``steps`` rounds after ``warmup`` warm-up steps
    (:func:`memsave.measurement.timing.time_interleaved`), then runs one step for the peak (CUDA allocator
    statistics, or the CPU profiler's allocation events) and one under the live-tensor tracker for the activation
    bytes and their per-module attribution. The model runs in whatever mode it is in (train/eval).
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
        steps: the fewest timed rounds whose median is ``step_seconds`` (>= 1); while the median is still
            uncertain on a busy machine, up to ``4 * steps`` are timed (``Measurement.steps`` says how many).
        warmup: untimed steps run first (>= 0): lazy initialisation, allocator warm-up.
        device: the device to measure on; None infers it from the model and inputs. When given it must match them.
        **model_kwargs: keyword arguments of ``model`` (``labels=ids``, ``attention_mask=mask``).

    Returns:
        a frozen :class:`Measurement`.

    Raises:
        ValueError: ``steps`` < 1, ``warmup`` < 0, or model and inputs not on one (the given) device.
        TypeError: ``model`` or ``loss_fn`` is not callable, or the output has nothing to backpropagate.

    Warns:
        MemsaveWarning: the rounds' step times spread over 10% of their median.

    Examples:
        >>> model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU())
        >>> m = measure(model, torch.randn(64, 256))
        >>> m.activation_bytes          # ReLU's output (saved for backward, and returned)
        65536
        >>> measure(hf_lm, ids, labels=ids).peak_bytes      # keyword inputs as the model takes them
    """
    if not callable(model):
        raise TypeError(f"measure: model must be a callable nn.Module, got {type(model).__name__}")
    loss_fn = resolve_loss_fn(loss_fn, "measure")
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"measure: steps must be an int >= 1 (timed rounds for the median), got {steps!r}")
    if not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"measure: warmup must be an int >= 0, got {warmup!r}")
    dev = resolve_device(model, (inputs, model_kwargs), device)
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"measure: device type {dev.type!r} is not supported; memsave measures on 'cpu' and 'cuda'")

    state = SavedStepState(model, (inputs, model_kwargs))

    def step() -> None:
        state.clear_grads()
        _forward_backward(model, inputs, model_kwargs, loss_fn)

    try:
        timing = time_interleaved({"measure": step}, rounds=steps, warmup=warmup)["measure"]
        memory = measure_memory(model, inputs, model_kwargs, loss_fn, dev)
    finally:
        state.restore()
    message = spread_warning([timing], "measure")
    if message:
        warnings.warn(message, MemsaveWarning, stacklevel=2)
    return Measurement(
        peak_bytes=memory.peak_bytes,
        activation_bytes=memory.activation_bytes,
        step_seconds=timing.median_seconds,
        device=str(dev),
        reserved_bytes=memory.reserved_bytes,
        by_module=memory.by_module,
        steps=timing.rounds,
        step_iqr_seconds=timing.iqr_seconds,
    )
