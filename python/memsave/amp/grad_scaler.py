"""Mixed precision: dynamic loss scaling with a fused unscale-and-check operator.

:class:`GradScaler` is a drop-in replacement for :class:`torch.amp.GradScaler` (same methods, same state_dict, so
checkpoints move between the two both ways). It differs in three ways:

* every gradient of a device is unscaled and checked for inf/NaN in one pass by ``torch.ops.memsave.unscale_and_check_``
  (C++ on CPU, a multi-tensor CUDA kernel on GPU); the only host synchronization is the one in :meth:`GradScaler.step`
  that decides whether to skip the optimizer step;
* ``hysteresis=N`` backs the scale off only after N consecutive overflowing steps (then on each further one), so a
  single spike does not halve the scale; ``hysteresis=1`` is torch's behaviour, bit for bit;
* ``overflow_diagnostics=model`` (or ``True``) records which parameters had non-finite gradients at the last
  overflow: :attr:`GradScaler.last_overflow`.

**bfloat16 needs no loss scaling.** bfloat16 has float32's exponent range, so gradients neither underflow nor
overflow where float32 would not; scaling only costs time. Use ``GradScaler(..., enabled=needs_grad_scaling(dtype))``
or :meth:`GradScaler.for_autocast`: a disabled scaler is a pass-through (``scale`` returns the loss itself, ``step``
calls ``optimizer.step()``, ``update`` does nothing) that costs no kernel launch and no synchronization.

Examples:
    >>> scaler = memsave.amp.GradScaler("cuda")
    >>> with torch.autocast("cuda", dtype=torch.float16):
    ...     loss = loss_fn(model(x), y)
    >>> scaler.scale(loss).backward()
    >>> scaler.unscale_(optimizer)                      # optional: only to clip or inspect gradients
    >>> torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    >>> scaler.step(optimizer)                          # skipped when a gradient was inf/NaN
    >>> scaler.update()
"""

from __future__ import annotations

import functools
import inspect
import math
import numbers
import warnings
from collections import defaultdict
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple, Union

import torch
from torch.amp.grad_scaler import OptState

from ..extension import build_info

__all__ = ["GradScaler", "needs_grad_scaling"]


def needs_grad_scaling(dtype: torch.dtype) -> bool:
    """Whether autocast in ``dtype`` needs dynamic loss scaling.

    Only float16 does: its 5 exponent bits underflow small gradients. bfloat16 keeps float32's 8 exponent bits, and
    float32/float64 need nothing.

    Args:
        dtype: the autocast dtype (``torch.float16``, ``torch.bfloat16``, ...).

    Returns:
        True for ``torch.float16``, False otherwise.

    Examples:
        >>> scaler = memsave.amp.GradScaler("cpu", enabled=memsave.amp.needs_grad_scaling(torch.bfloat16))
        >>> scaler.is_enabled()
        False
    """
    return dtype == torch.float16


# torch's own stages and per-optimizer state layout, so that code reading ``_per_optimizer_states`` (torch's tests,
# libraries that check the stage) sees what torch.amp.GradScaler keeps there.
_Stage = OptState


def _fresh_optimizer_state() -> Dict[str, Any]:
    # found_inf_per_device: device -> float32 flag (torch.amp.grad_scaler._refresh_per_optimizer_state's layout).
    return {"stage": _Stage.READY, "found_inf_per_device": {}}


_INT32_MAX = 2**31 - 1  # the trackers are int32 tensors


def _as_int(name: str, value: Any, low: int, rule: str) -> int:
    # An int, or a float holding a whole number (2000.0); 2.5 is refused rather than truncated.
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if isinstance(value, numbers.Integral):
        whole = int(value)
    elif math.isfinite(float(value)) and float(value).is_integer():
        whole = int(float(value))
    else:
        raise ValueError(f"{name} must be {rule}, got {value}")
    if not low <= whole <= _INT32_MAX:
        raise ValueError(f"{name} must be {rule}, got {value}")
    return whole


def _as_float(name: str, value: Any, example: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number (e.g. {example}), got {type(value).__name__}")
    try:
        return float(value)
    except OverflowError:  # an int too large for a double
        return math.inf


def _check_scale(name: str, value: Any) -> float:
    number = _as_float(name, value, "2.0**16")
    # The scale lives in a float32 tensor: 1e39 would become inf there and 1e-46 zero.
    as_float32 = float(torch.tensor(number, dtype=torch.float64).float()) if math.isfinite(number) else number
    if not (math.isfinite(as_float32) and as_float32 > 0.0):
        # 0 turns every gradient into NaN after one step; a negative scale silently ascends the loss.
        detail = f" ({as_float32} in float32)" if as_float32 != number else ""
        raise ValueError(f"{name} must be a finite number > 0 (e.g. 2.0**16), got {value}{detail}")
    return number


def _check_growth_factor(name: str, value: Any) -> float:
    number = _as_float(name, value, "2.0")
    if not (number > 1.0 and math.isfinite(number)):
        raise ValueError(f"{name} must be > 1.0 and finite, got {value}")
    return number


def _check_backoff_factor(name: str, value: Any) -> float:
    number = _as_float(name, value, "0.5")
    if not 0.0 < number < 1.0:
        raise ValueError(f"{name} must be in (0, 1), got {value}")
    return number


_SETTINGS: Dict[str, Any] = {
    "scale": _check_scale,
    "growth_factor": _check_growth_factor,
    "backoff_factor": _check_backoff_factor,
    "growth_interval": lambda name, v: _as_int(name, v, 1, ">= 1 (an int, at most 2**31 - 1)"),
    "hysteresis": lambda name, v: _as_int(name, v, 1, "an int in [1, 2**31 - 1]"),
    "growth_tracker": lambda name, v: _as_int(name, v, 0, "an int in [0, 2**31 - 1]"),
    "overflow_tracker": lambda name, v: _as_int(name, v, 0, "an int in [0, 2**31 - 1]"),
}


def _validated(settings: Mapping[str, Tuple[str, Any]]) -> Dict[str, Any]:
    """The one check of GradScaler settings, used by the constructor, the setters, update(new_scale=) and
    load_state_dict.

    ``settings`` maps a setting (a key of ``_SETTINGS``) to ``(the name to report, the value given)``. Every value is
    checked before anything is returned, so a caller that assigns only the result changes nothing on error.

    Returns:
        the values as float (scale, factors) or int (interval, hysteresis, trackers), by setting.

    Raises:
        TypeError: for a value that is not a number (an int where an int is needed).
        ValueError: for a number out of the setting's range, naming it as given.
    """
    return {key: _SETTINGS[key](name, value) for key, (name, value) in settings.items()}


@functools.lru_cache(maxsize=None)
def _check_optimizer(optimizer: Any, what: str) -> None:
    """TypeError unless ``optimizer`` looks like a ``torch.optim.Optimizer`` (its ``param_groups`` and ``step``),
    checked before the scaler keeps any state for it."""
    if not (hasattr(optimizer, "param_groups") and callable(getattr(optimizer, "step", None))):
        raise TypeError(
            f"GradScaler.{what}: optimizer must be a torch.optim.Optimizer (with param_groups and step()), got "
            f"{type(optimizer).__name__}"
        )


def _kernel_device_types() -> Tuple[str, ...]:

    return ("cpu", "cuda") if build_info()["cuda"] else ("cpu",)


class GradScaler:
    """Dynamic loss scaling for float16 mixed precision; the interface of :class:`torch.amp.GradScaler`.

    Args:
        device: device type of the loss and the scale ("cuda", "cpu", ...). As in torch, "cuda" without an
            available GPU warns and disables the scaler.
        init_scale: initial scale factor.
        growth_factor: factor (> 1) the scale is multiplied by after ``growth_interval`` consecutive clean steps.
        backoff_factor: factor (< 1) the scale is multiplied by when a step overflows.
        growth_interval: number of consecutive clean steps before the scale grows.
        enabled: False makes every method a pass-through (use it for bfloat16, see :func:`needs_grad_scaling`).
        hysteresis: number of consecutive overflowing steps before the scale backs off (1 = torch's behaviour).
            Every overflowing step is still skipped and resets the growth tracker.
        overflow_diagnostics: False (default), True, or a module whose parameter names to report. When on, each
            unscale also records which gradients held inf/NaN (no extra pass, no extra synchronization on clean
            steps), and :attr:`last_overflow` names them after an overflow.

    Raises:
        TypeError: for a setting that is not a number (growth_interval and hysteresis: not an int), or ``enabled``
            that is not a bool.
        ValueError: for a device that is not a torch device type, an init_scale that is not a finite number > 0
            (in float32), a growth factor <= 1 or infinite, a backoff factor outside (0, 1), or a growth interval or
            hysteresis that is not a whole number in [1, 2**31 - 1]. The setters, ``update(new_scale=...)`` and
            :meth:`load_state_dict` check their values the same way.

    Examples:
        >>> scaler = memsave.amp.GradScaler("cuda", hysteresis=2, overflow_diagnostics=model)
        >>> scaler.scale(loss).backward()
        >>> scaler.step(optimizer); scaler.update()
        >>> scaler.last_overflow          # e.g. ['decoder.3.weight'] after a step with an inf gradient
    """

    def __init__(
        self,
        device: Union[str, torch.device] = "cuda",
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        enabled: bool = True,
        hysteresis: int = 1,
        *,
        overflow_diagnostics: Union[bool, torch.nn.Module] = False,
    ) -> None:
        try:
            self._device = torch.device(device).type
        except (RuntimeError, TypeError) as exc:
            raise ValueError(f"device must be a torch device type such as 'cuda' or 'cpu', got {device!r}") from exc
        checked = _validated(
            {
                "scale": ("init_scale", init_scale),
                "growth_factor": ("growth_factor", growth_factor),
                "backoff_factor": ("backoff_factor", backoff_factor),
                "growth_interval": ("growth_interval", growth_interval),
                "hysteresis": ("hysteresis", hysteresis),
            }
        )
        if not isinstance(enabled, bool):
            raise TypeError(f"GradScaler: enabled must be True or False, got {enabled!r}")
        self._enabled = enabled
        if self._device == "cuda" and self._enabled and not torch.cuda.is_available():
            warnings.warn(
                "memsave.amp.GradScaler(device='cuda') is enabled but CUDA is not available; disabling it (as "
                "torch.amp.GradScaler does). Create it with device='cpu' to scale a CPU float16 loss.",
                stacklevel=2,
            )
            self._enabled = False
        self._init_scale: float = checked["scale"]
        self._growth_factor: float = checked["growth_factor"]
        self._backoff_factor: float = checked["backoff_factor"]
        self._growth_interval: int = checked["growth_interval"]
        self._hysteresis: int = checked["hysteresis"]
        self._init_growth_tracker = 0
        self._init_overflow_tracker = 0
        # Created lazily on the loss's device by the first scale(), as in torch.
        self._scale: Optional[torch.Tensor] = None
        self._growth_tracker: Optional[torch.Tensor] = None
        self._overflow_tracker: Optional[torch.Tensor] = None
        self._per_optimizer_states: Dict[int, Dict[str, Any]] = defaultdict(_fresh_optimizer_state)
        # overflow_diagnostics: per optimizer, (names, per-tensor flags) per device group, until update().
        self._overflow_flags: Dict[int, List[Tuple[List[str], torch.Tensor]]] = defaultdict(list)
        self._diagnostics = isinstance(overflow_diagnostics, torch.nn.Module) or bool(overflow_diagnostics)
        self._param_names: Dict[int, str] = {}
        if isinstance(overflow_diagnostics, torch.nn.Module):
            self._param_names = {id(p): n for n, p in overflow_diagnostics.named_parameters(remove_duplicate=False)}
        self._last_overflow: List[str] = []
        self._overflow_in_iteration = False
        # A bool, or the found_inf flag of a self-skipping optimizer's step (read when asked).
        self._last_step_skipped: Union[bool, torch.Tensor, None] = None

    # ------------------------------------------------------------------------------------------------ constructors
    @classmethod
    def for_autocast(cls, device: Union[str, torch.device], dtype: torch.dtype, **kwargs: Any) -> "GradScaler":
        """A scaler for autocast in ``dtype``: enabled for float16, a pass-through for bfloat16 and wider types.

        Args:
            device: device type of the loss.
            dtype: the autocast dtype.
            **kwargs: further :class:`GradScaler` arguments (``enabled`` is decided here and must not be passed).

        Returns:
            GradScaler: with ``enabled=needs_grad_scaling(dtype)``.

        Examples:
            >>> scaler = memsave.amp.GradScaler.for_autocast("cpu", torch.bfloat16)   # pass-through
        """
        if "enabled" in kwargs:
            raise TypeError("for_autocast decides `enabled` from the dtype; construct GradScaler(...) directly")
        return cls(device, enabled=needs_grad_scaling(dtype), **kwargs)

    # ------------------------------------------------------------------------------------------------------ scale
    def _lazy_init(self, device: torch.device) -> None:
        self._scale = torch.full((), self._init_scale, dtype=torch.float32, device=device)
        self._growth_tracker = torch.full((), self._init_growth_tracker, dtype=torch.int32, device=device)
        self._overflow_tracker = torch.full((), self._init_overflow_tracker, dtype=torch.int32, device=device)

    def _check_device(self, t: torch.Tensor) -> None:
        if t.device.type != self._device:
            raise ValueError(
                f"this GradScaler was created for device '{self._device}' but the loss is on '{t.device}'; create "
                f"the scaler with memsave.amp.GradScaler('{t.device.type}')"
            )

    def scale(self, outputs: Union[torch.Tensor, Iterable[Any]]) -> Union[torch.Tensor, Iterable[Any]]:
        """Multiply a loss (or a nested list/tuple of tensors) by the current scale.

        Args:
            outputs: a tensor or an iterable of tensors (nested lists/tuples keep their type).

        Returns:
            The scaled outputs; ``outputs`` itself when the scaler is disabled.

        Raises:
            ValueError: when a tensor is on a device of another type than the scaler's, or outputs is not a tensor
                or an iterable of tensors.

        Examples:
            >>> scaler.scale(loss).backward()
        """
        if not self._enabled:
            return outputs
        if isinstance(outputs, torch.Tensor):
            self._check_device(outputs)
            if self._scale is None:
                self._lazy_init(outputs.device)
            assert self._scale is not None
            return outputs * self._scale.to(device=outputs.device, non_blocking=True)

        copies: Dict[torch.device, torch.Tensor] = {}

        def apply(value: Any) -> Any:
            if isinstance(value, torch.Tensor):
                self._check_device(value)
                if self._scale is None:
                    self._lazy_init(value.device)
                assert self._scale is not None
                if value.device not in copies:
                    copies[value.device] = self._scale.to(device=value.device, non_blocking=True)
                return value * copies[value.device]
            if isinstance(value, (list, tuple)):
                return type(value)(apply(v) for v in value)
            if isinstance(value, Iterable) and not isinstance(value, (str, bytes)):
                return map(apply, value)
            raise ValueError(f"outputs must be a Tensor or an iterable of Tensors, got {type(value).__name__}")

        return apply(outputs)

    # ---------------------------------------------------------------------------------------------------- unscale
    def _require_scale(self, what: str) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self._scale is None or self._growth_tracker is None or self._overflow_tracker is None:
            raise RuntimeError(
                f"GradScaler.{what}() was called before scale(): run scaler.scale(loss).backward() first in "
                "each iteration"
            )
        return self._scale, self._growth_tracker, self._overflow_tracker

    def _unscale_grads_(
        self, optimizer: torch.optim.Optimizer, inv_scale: torch.Tensor, found_inf: torch.Tensor, allow_fp16: bool
    ) -> Dict[torch.device, torch.Tensor]:
        # One list per device (the operator groups by dtype itself), in parameter order.
        grads: Dict[torch.device, List[torch.Tensor]] = defaultdict(list)
        names: Dict[torch.device, List[str]] = defaultdict(list)
        with torch.no_grad():
            for gi, group in enumerate(optimizer.param_groups):
                for pi, param in enumerate(group["params"]):
                    if param.grad is None:
                        continue
                    if not allow_fp16 and param.grad.dtype == torch.float16:
                        raise ValueError(
                            "cannot unscale float16 gradients: the parameters themselves are float16. Keep the "
                            "parameters in float32 and let autocast run the float16 math (or use bfloat16)."
                        )
                    if param.grad.is_sparse:
                        # Duplicate indices of an uncoalesced float16 grad could sum past the float16 range:
                        # coalesce first so the values we check are the values the optimizer will see.
                        if param.grad.dtype == torch.float16:
                            param.grad = param.grad.coalesce()
                        target = param.grad._values()
                    elif param.grad.layout != torch.strided:
                        raise TypeError(
                            f"gradient of parameter {self._name(param, gi, pi)} has layout {param.grad.layout}; "
                            "GradScaler unscales dense (strided) and sparse COO gradients only"
                        )
                    else:
                        target = param.grad
                    grads[target.device].append(target)
                    if self._diagnostics:
                        names[target.device].append(self._name(param, gi, pi))

            found_per_device: Dict[torch.device, torch.Tensor] = {}
            state_diag = self._overflow_flags[id(optimizer)]
            kernel_types = _kernel_device_types()
            for device, device_grads in grads.items():
                found = found_inf if found_inf.device == device else found_inf.to(device, copy=True)
                inv = inv_scale if inv_scale.device == device else inv_scale.to(device)
                flags = None
                if self._diagnostics:
                    flags = torch.zeros(len(device_grads), dtype=torch.float32, device=device)
                if device.type in kernel_types:
                    torch.ops.memsave.unscale_and_check_(device_grads, found, inv, flags)
                else:
                    _unscale_fallback(device_grads, found, inv, flags)
                found_per_device[device] = found
                if flags is not None:
                    state_diag.append((names[device], flags))
        return found_per_device

    def _name(self, param: torch.Tensor, group: int, index: int) -> str:
        return self._param_names.get(id(param), f"param_groups[{group}][{index}] {tuple(param.shape)}")

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Divide the optimizer's gradients by the scale, in place, and record whether any was inf/NaN.

        Optional: :meth:`step` unscales when it was not called. Call it before clipping or inspecting gradients.
        No host synchronization.

        Args:
            optimizer: the optimizer whose parameters' gradients to unscale.

        Raises:
            RuntimeError: when called twice for one optimizer before :meth:`update`, after :meth:`step`, or before
                :meth:`scale`.
            TypeError: ``optimizer`` is not an optimizer.

        Examples:
            >>> scaler.unscale_(optimizer)
            >>> torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        """
        _check_optimizer(optimizer, "unscale_")
        if not self._enabled:
            return
        scale, _, _ = self._require_scale("unscale_")
        state = self._per_optimizer_states[id(optimizer)]
        if state["stage"] is _Stage.UNSCALED:
            raise RuntimeError(
                "unscale_() has already been called on this optimizer since the last update(); unscaling twice "
                "would divide the gradients by the scale twice. Call it once per iteration, before step()."
            )
        if state["stage"] is _Stage.STEPPED:
            raise RuntimeError("unscale_() was called after step(); call it between backward() and step()")
        # The reciprocal in double, rounded once to float: torch's exact inverse scale.
        inv_scale = scale.double().reciprocal().float()
        found_inf = torch.zeros((), dtype=torch.float32, device=scale.device)
        state["found_inf_per_device"] = self._unscale_grads_(optimizer, inv_scale, found_inf, allow_fp16=False)
        state["stage"] = _Stage.UNSCALED

    # -------------------------------------------------------------------------------------------------------- step
    def step(self, optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Optional[Any]:
        """Unscale (unless :meth:`unscale_` was called) and run ``optimizer.step()`` unless a gradient was inf/NaN.

        This is the one place that synchronizes with the device (to decide whether to skip).

        An optimizer that unscales and skips by itself (``optimizer._step_supports_amp_scaling = True``: torch's
        ``fused=True`` Adam, AdamW, SGD, ...) is always stepped, as by torch.amp.GradScaler: the scaler only checks
        its gradients for inf/NaN (without dividing them, unless :meth:`unscale_` already did) and hands it, for the
        duration of ``optimizer.step``, two attributes: ``optimizer.grad_scale`` (the scale tensor, times any
        ``grad_scale`` the optimizer already had; None when :meth:`unscale_` was called) and ``optimizer.found_inf``
        (the sum of the inf/NaN flags). Such a step does not synchronize (with ``overflow_diagnostics`` on, it does
        once), and :attr:`last_step_skipped` reads the flag when asked. An optimizer whose ``step`` takes a
        ``grad_scaler`` argument gets the scaler itself instead, with a ``FutureWarning``, as torch does.

        Args:
            optimizer: the optimizer to step.
            *args: forwarded to ``optimizer.step``.
            **kwargs: forwarded to ``optimizer.step`` (a ``closure`` is not supported while enabled).

        Returns:
            What ``optimizer.step`` returned, or None when the step was skipped.

        Raises:
            RuntimeError: when called twice before :meth:`update`, before :meth:`scale`, with a closure, or when the
                optimizer has no gradients (backward was not run, or none of its parameters took part in the loss).
            TypeError: ``optimizer`` is not an optimizer.

        Examples:
            >>> scaler.step(optimizer)
        """
        _check_optimizer(optimizer, "step")
        if not self._enabled:
            self._last_step_skipped = False
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs:
            raise RuntimeError("closures are not supported by an enabled GradScaler; call backward() yourself")
        self._require_scale("step")
        state = self._per_optimizer_states[id(optimizer)]
        if state["stage"] is _Stage.STEPPED:
            raise RuntimeError("step() has already been called for this optimizer since the last update()")
        if getattr(optimizer, "_step_supports_amp_scaling", False):
            return self._step_scaling_optimizer(optimizer, state, args, kwargs)
        if state["stage"] is _Stage.READY:
            self.unscale_(optimizer)
        found_per_device = self._require_found(state)
        skipped = _any_found(found_per_device.values())
        result = None
        if not skipped:
            result = optimizer.step(*args, **kwargs)
        else:
            self._record_overflow(optimizer)
        state["stage"] = _Stage.STEPPED
        self._last_step_skipped = skipped
        return result

    def _require_found(self, state: Dict[str, Any]) -> Dict[torch.device, torch.Tensor]:
        found_per_device: Dict[torch.device, torch.Tensor] = state["found_inf_per_device"]
        if not found_per_device:
            state["stage"] = _Stage.READY
            raise RuntimeError(
                "GradScaler.step() found no gradients in this optimizer: run scaler.scale(loss).backward() before "
                "step(), and check that the optimizer's parameters take part in the loss (requires_grad=True)"
            )
        return found_per_device

    def _record_overflow(self, optimizer: torch.optim.Optimizer) -> None:
        if not self._diagnostics:
            return
        flagged = self._overflow_flags[id(optimizer)]
        names = [name for names, flags in flagged for name, bad in zip(names, flags.tolist()) if bad]
        # Several optimizers overflowing in one iteration report together.
        self._last_overflow = self._last_overflow + names if self._overflow_in_iteration else names
        self._overflow_in_iteration = True

    def _step_scaling_optimizer(
        self, optimizer: torch.optim.Optimizer, state: Dict[str, Any], args: Tuple[Any, ...], kwargs: Dict[str, Any]
    ) -> Any:
        """step() of an optimizer that unscales and skips by itself: it is always stepped (see :meth:`step`)."""
        scale, _, _ = self._require_scale("step")
        if _step_takes_grad_scaler(optimizer):
            # The older contract: the optimizer gets the scaler and does everything itself (torch warns too).
            warnings.warn(
                "GradScaler will stop passing itself to optimizer.step(grad_scaler=...): like torch.amp.GradScaler, "
                "it is moving to setting `optimizer.grad_scale` and `optimizer.found_inf` (tensors) for the "
                "optimizer to use. Update the optimizer to read those attributes.",
                FutureWarning,
                stacklevel=3,
            )
            result = optimizer.step(*args, **{**kwargs, "grad_scaler": self})
            state["stage"] = _Stage.STEPPED
            found = state["found_inf_per_device"]
            self._last_step_skipped = _sum_flags(found.values(), scale.device) if found else None
            return result
        if state["stage"] is _Stage.READY:
            self._check_inf_per_device(optimizer)
        found_inf = _sum_flags(self._require_found(state).values(), scale.device)
        if state["stage"] is _Stage.UNSCALED:
            grad_scale = getattr(optimizer, "grad_scale", None)  # the gradients are already divided
        else:
            # Multiplied into a scale the optimizer already holds (a fresh tensor either way, never the scaler's).
            held = getattr(optimizer, "grad_scale", None)
            grad_scale = scale * (1 if held is None else held)
        optimizer.grad_scale = grad_scale  # type: ignore[attr-defined]
        optimizer.found_inf = found_inf  # type: ignore[attr-defined]
        try:
            result = optimizer.step(*args, **kwargs)
        finally:
            # Also on error: a stale grad_scale would be multiplied into the next step's.
            for attribute in ("grad_scale", "found_inf"):
                if attribute in vars(optimizer):
                    delattr(optimizer, attribute)
        state["stage"] = _Stage.STEPPED
        if self._diagnostics:  # naming the parameters needs to know now: one synchronization
            self._last_step_skipped = bool(found_inf.item())
            if self._last_step_skipped:
                self._record_overflow(optimizer)
        else:
            self._last_step_skipped = found_inf  # read (one synchronization) by last_step_skipped when asked
        return result

    def _check_inf_per_device(self, optimizer: torch.optim.Optimizer) -> Dict[torch.device, torch.Tensor]:
        """Check the optimizer's gradients for inf/NaN without dividing them (inverse scale 1; float16 allowed).

        For optimizers that unscale by themselves; also called by those that take ``grad_scaler=`` (torch's name).
        """
        scale, _, _ = self._require_scale("step")
        state = self._per_optimizer_states[id(optimizer)]
        self._overflow_flags[id(optimizer)] = []
        one = torch.ones((), dtype=torch.float32, device=scale.device)
        found_inf = torch.zeros((), dtype=torch.float32, device=scale.device)
        state["found_inf_per_device"] = self._unscale_grads_(optimizer, one, found_inf, allow_fp16=True)
        return state["found_inf_per_device"]

    def _found_inf_per_device(self, optimizer: torch.optim.Optimizer) -> Dict[torch.device, torch.Tensor]:
        """The inf/NaN flags recorded for ``optimizer`` this iteration, by device (torch's name)."""
        found: Dict[torch.device, torch.Tensor] = self._per_optimizer_states[id(optimizer)]["found_inf_per_device"]
        return found

    def _get_scale_async(self) -> Optional[torch.Tensor]:
        """The scale tensor itself, without synchronizing (None before the first :meth:`scale`; torch's name)."""
        return self._scale

    # ------------------------------------------------------------------------------------------------------ update
    def update(self, new_scale: Optional[Union[float, torch.Tensor]] = None) -> None:
        """Update the scale after the iteration's :meth:`step` calls (no host synchronization).

        Backs off by ``backoff_factor`` when an optimizer's gradients overflowed (after ``hysteresis`` consecutive
        overflowing iterations), grows by ``growth_factor`` after ``growth_interval`` consecutive clean ones.

        Args:
            new_scale: set the scale to this value instead (a float or a one-element float32 tensor on the
                scaler's device), checked like ``init_scale`` (a tensor's value is read: one synchronization).

        Raises:
            RuntimeError: when no optimizer was unscaled or stepped since the last update.
            TypeError: for a ``new_scale`` that is not a number or a real tensor.
            ValueError: for a ``new_scale`` that is not a finite number > 0 (in float32), or a tensor with more than
                one element, on another device type or requiring grad. The scaler is unchanged then.

        Examples:
            >>> scaler.step(optimizer)
            >>> scaler.update()
        """
        if not self._enabled:
            return
        scale, growth_tracker, overflow_tracker = self._require_scale("update")
        if new_scale is not None:
            if isinstance(new_scale, torch.Tensor):
                if new_scale.numel() != 1 or new_scale.requires_grad or new_scale.device.type != self._device:
                    raise ValueError(
                        "new_scale must be a float or a one-element tensor on the scaler's device with "
                        "requires_grad=False"
                    )
                if new_scale.is_complex() or new_scale.dtype == torch.bool:
                    raise TypeError(f"new_scale must hold a real number, got a {new_scale.dtype} tensor")
                # Checking the value reads it: one synchronization, on this rare call only.
                _validated({"scale": ("new_scale", new_scale.detach().reshape(()).item())})
                scale.copy_(new_scale.detach().reshape(()))
            else:
                scale.fill_(_validated({"scale": ("new_scale", new_scale)})["scale"])
        else:
            found = [
                f.to(scale.device, non_blocking=True)
                for state in self._per_optimizer_states.values()
                for f in state["found_inf_per_device"].values()
            ]
            if not found:
                raise RuntimeError(
                    "GradScaler.update() found no inf checks: call step(optimizer) (or unscale_) for at least one "
                    "optimizer with gradients before update()"
                )
            combined = found[0]
            for f in found[1:]:
                combined = combined + f
            has_kernel = scale.device.type in _kernel_device_types()
            update_scale = torch.ops.memsave.amp_update_scale_ if has_kernel else _update_scale_fallback
            update_scale(
                scale,
                growth_tracker,
                overflow_tracker,
                combined,
                self._growth_factor,
                self._backoff_factor,
                self._growth_interval,
                self._hysteresis,
            )
        self._per_optimizer_states = defaultdict(_fresh_optimizer_state)
        self._overflow_flags = defaultdict(list)
        self._overflow_in_iteration = False

    # ------------------------------------------------------------------------------------------ getters / setters
    def get_scale(self) -> float:
        """The current scale as a Python float (1.0 when disabled); synchronizes with the device."""
        if not self._enabled:
            return 1.0
        return self._init_scale if self._scale is None else float(self._scale.item())

    def get_growth_factor(self) -> float:
        """The factor the scale grows by after ``growth_interval`` clean steps."""
        return self._growth_factor

    def set_growth_factor(self, new_factor: float) -> None:
        """Set the growth factor (a finite number > 1, checked as by the constructor)."""
        self._growth_factor = _validated({"growth_factor": ("growth_factor", new_factor)})["growth_factor"]

    def get_backoff_factor(self) -> float:
        """The factor the scale backs off by after an overflow."""
        return self._backoff_factor

    def set_backoff_factor(self, new_factor: float) -> None:
        """Set the backoff factor (in (0, 1), checked as by the constructor)."""
        self._backoff_factor = _validated({"backoff_factor": ("backoff_factor", new_factor)})["backoff_factor"]

    def get_growth_interval(self) -> int:
        """The number of consecutive clean steps before the scale grows."""
        return self._growth_interval

    def set_growth_interval(self, new_interval: int) -> None:
        """Set the growth interval (an int >= 1, checked as by the constructor)."""
        self._growth_interval = _validated({"growth_interval": ("growth_interval", new_interval)})["growth_interval"]

    def get_hysteresis(self) -> int:
        """The number of consecutive overflowing steps before the scale backs off."""
        return self._hysteresis

    def set_hysteresis(self, hysteresis: int) -> None:
        """Set the hysteresis (an int >= 1, checked as by the constructor)."""
        self._hysteresis = _validated({"hysteresis": ("hysteresis", hysteresis)})["hysteresis"]

    def _get_growth_tracker(self) -> int:
        if not self._enabled:
            return 0
        return self._init_growth_tracker if self._growth_tracker is None else int(self._growth_tracker.item())

    def _get_overflow_tracker(self) -> int:
        if not self._enabled:
            return 0
        return self._init_overflow_tracker if self._overflow_tracker is None else int(self._overflow_tracker.item())

    def is_enabled(self) -> bool:
        """Whether the scaler scales (False: every method is a pass-through)."""
        return self._enabled

    @property
    def last_overflow(self) -> List[str]:
        """Names of the parameters whose gradients were inf/NaN at the last skipped step (needs
        ``overflow_diagnostics``; empty before the first overflow). Parameters the scaler was not given names for
        are shown as ``param_groups[g][i] (shape)``."""
        if not self._diagnostics:
            raise RuntimeError(
                "overflow diagnostics are off: create the scaler with overflow_diagnostics=model (or True)"
            )
        return list(self._last_overflow)

    @property
    def last_step_skipped(self) -> Optional[bool]:
        """Whether the last :meth:`step` skipped the optimizer step (None before the first step). After the step of
        an optimizer that skips by itself (``fused=True``) this reads its inf/NaN flag: one synchronization."""
        if isinstance(self._last_step_skipped, torch.Tensor):
            self._last_step_skipped = bool(self._last_step_skipped.item())
        return self._last_step_skipped

    # ------------------------------------------------------------------------------------------------ state_dict
    def state_dict(self) -> Dict[str, Any]:
        """The scaler's state: torch.amp.GradScaler's five entries plus ``hysteresis`` and ``_hysteresis_tracker``.

        torch.amp.GradScaler.load_state_dict reads the five entries it knows and ignores the others, so the dict
        loads into either scaler. Empty when the scaler is disabled (as in torch).

        Returns:
            dict with ``scale``, ``growth_factor``, ``backoff_factor``, ``growth_interval``, ``_growth_tracker``,
            ``hysteresis`` and ``_hysteresis_tracker`` (consecutive overflows so far).

        Examples:
            >>> torch.amp.GradScaler("cpu").load_state_dict(memsave_scaler.state_dict())
        """
        if not self._enabled:
            return {}
        return {
            "scale": self.get_scale(),
            "growth_factor": self._growth_factor,
            "backoff_factor": self._backoff_factor,
            "growth_interval": self._growth_interval,
            "_growth_tracker": self._get_growth_tracker(),
            "hysteresis": self._hysteresis,
            "_hysteresis_tracker": self._get_overflow_tracker(),
        }

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Load a state from :meth:`state_dict` of this class or of torch.amp.GradScaler.

        A torch state_dict has no hysteresis entries: the scaler keeps its own hysteresis and starts counting
        overflows from zero. A no-op when the scaler is disabled.

        Args:
            state_dict: the state to load.

        Raises:
            TypeError: when ``state_dict`` is not a mapping, or an entry is not a number (an int where the
                constructor needs one).
            RuntimeError: for an empty dict (saved from a disabled scaler).
            KeyError: when one of torch's five entries is missing.
            ValueError: for an entry the constructor would refuse (scale 0, growth_factor 0.5, ...) or a tracker
                outside [0, 2**31 - 1]. Nothing is loaded then: every entry is checked before any is assigned.

        Examples:
            >>> scaler.load_state_dict(torch_scaler.state_dict())
        """
        if not isinstance(state_dict, Mapping):
            raise TypeError(
                f"state_dict must be the dict GradScaler.state_dict() returned, got {type(state_dict).__name__}"
            )
        if not self._enabled:
            return
        if len(state_dict) == 0:
            raise RuntimeError(
                "the GradScaler state_dict is empty, probably saved from a disabled scaler; nothing to load"
            )
        missing = [
            k
            for k in ("scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker")
            if k not in state_dict
        ]
        if missing:
            raise KeyError(f"GradScaler state_dict lacks {missing}; pass the dict GradScaler.state_dict() returned")
        # Every entry is checked (as the constructor checks its arguments) before any is assigned.
        entries = {
            "scale": "scale",
            "growth_factor": "growth_factor",
            "backoff_factor": "backoff_factor",
            "growth_interval": "growth_interval",
            "growth_tracker": "_growth_tracker",
            "hysteresis": "hysteresis",
            "overflow_tracker": "_hysteresis_tracker",
        }
        checked = _validated(
            {
                setting: (f"state_dict[{key!r}]", state_dict[key])
                for setting, key in entries.items()
                if key in state_dict
            }
        )
        self._init_scale = checked["scale"]
        self._growth_factor = checked["growth_factor"]
        self._backoff_factor = checked["backoff_factor"]
        self._growth_interval = checked["growth_interval"]
        self._init_growth_tracker = checked["growth_tracker"]
        self._hysteresis = checked.get("hysteresis", self._hysteresis)
        self._init_overflow_tracker = checked.get("overflow_tracker", 0)
        if self._scale is not None:
            self._scale.fill_(self._init_scale)
        if self._growth_tracker is not None:
            self._growth_tracker.fill_(self._init_growth_tracker)
        if self._overflow_tracker is not None:
            self._overflow_tracker.fill_(self._init_overflow_tracker)

    def __getstate__(self) -> Dict[str, Any]:
        state = self.__dict__.copy()
        if self._enabled:
            if len(self._per_optimizer_states) != 0:
                raise RuntimeError(
                    "a GradScaler can only be pickled at the start of an iteration or after update(), not between "
                    "unscale_/step and update"
                )
            # Tensors are re-created lazily on load, on the device of the first scaled loss.
            state["_init_scale"] = self.get_scale()
            state["_init_growth_tracker"] = self._get_growth_tracker()
            state["_init_overflow_tracker"] = self._get_overflow_tracker()
            state["_scale"] = None
            state["_growth_tracker"] = None
            state["_overflow_tracker"] = None
        state["_per_optimizer_states"] = None
        state["_overflow_flags"] = None
        state["_last_step_skipped"] = self.last_step_skipped
        return state

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._per_optimizer_states = defaultdict(_fresh_optimizer_state)
        self._overflow_flags = defaultdict(list)

    def __repr__(self) -> str:
        if not self._enabled:
            return f"GradScaler(device={self._device!r}, enabled=False)"
        return (
            f"GradScaler(device={self._device!r}, scale={self.get_scale()}, growth_factor={self._growth_factor}, "
            f"backoff_factor={self._backoff_factor}, growth_interval={self._growth_interval}, "
            f"hysteresis={self._hysteresis})"
        )


def _step_takes_grad_scaler(optimizer: torch.optim.Optimizer) -> bool:
    try:
        return "grad_scaler" in inspect.signature(optimizer.step).parameters
    except (TypeError, ValueError):  # a step without an inspectable signature
        return False


def _sum_flags(flags: Iterable[torch.Tensor], device: torch.device) -> torch.Tensor:
    """The per-device found_inf flags added up on ``device``, in a new tensor (no synchronization)."""
    total: Optional[torch.Tensor] = None
    for flag in flags:
        flag = flag.to(device, non_blocking=True)
        total = flag.clone() if total is None else total + flag
    assert total is not None
    return total


def _any_found(flags: Iterable[torch.Tensor]) -> bool:
    """Whether any per-device found_inf flag is set: the one host synchronization of a scaled step."""
    flags = list(flags)
    if len(flags) == 1:
        return bool(flags[0].item())
    dev = flags[0].device
    return bool(torch.stack([f.to(dev, non_blocking=True) for f in flags]).sum().item())


def _unscale_fallback(
    grads: List[torch.Tensor], found_inf: torch.Tensor, inv_scale: torch.Tensor, flags: Optional[torch.Tensor]
) -> None:
    """unscale_and_check_ for device types memsave has no kernel for (MPS, XPU, ...): torch's foreach op per dtype."""
    if flags is not None:
        flags.copy_(torch.stack([~torch.isfinite(g).all() for g in grads]).float())
    by_dtype: Dict[torch.dtype, List[torch.Tensor]] = defaultdict(list)
    for g in grads:
        by_dtype[g.dtype].append(g)
    for group in by_dtype.values():
        torch._amp_foreach_non_finite_check_and_unscale_(group, found_inf, inv_scale)


def _update_scale_fallback(
    scale: torch.Tensor,
    growth_tracker: torch.Tensor,
    overflow_tracker: torch.Tensor,
    found_inf: torch.Tensor,
    growth_factor: float,
    backoff_factor: float,
    growth_interval: int,
    hysteresis: int,
) -> None:
    """amp_update_scale_ written with tensor ops (device-side, no synchronization) for devices without a kernel."""
    found = found_inf != 0
    overflows = torch.clamp(overflow_tracker + 1, max=hysteresis)
    back_off = found & (overflows >= hysteresis)
    successful = growth_tracker + 1
    at_interval = successful == growth_interval
    grown = (scale.double() * growth_factor).float()
    grow = ~found & at_interval & torch.isfinite(grown)
    shrunk = (scale.double() * backoff_factor).float()
    scale.copy_(torch.where(back_off, shrunk, torch.where(grow, grown, scale)))
    growth_tracker.copy_(torch.where(found | at_interval, torch.zeros_like(successful), successful))
    overflow_tracker.copy_(torch.where(found, overflows, torch.zeros_like(overflows)))
