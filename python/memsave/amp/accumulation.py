"""Gradient accumulation that gets the order of operations right.

Accumulating ``steps`` micro-batches emulates one batch ``steps`` times larger when only the small one fits in
memory. The usual mistakes this object rules out: forgetting to divide the loss (or dividing twice), clipping
scaled gradients, stepping or updating the scaler on every micro-batch, and all-reducing gradients under
DistributedDataParallel on every micro-step instead of once per window.

Examples:
    >>> acc = memsave.accumulate(model, optimizer, steps=4, scaler=scaler, clip_grad_norm=1.0)
    >>> for x, y in loader:
    ...     with torch.autocast("cuda", dtype=torch.float16):
    ...         loss = loss_fn(model(x), y)
    ...     acc.backward(loss)          # True on every 4th call: it unscaled, clipped, stepped, updated, zeroed
    >>> acc.flush()                     # steps a last partial window, if any
"""

from __future__ import annotations

import contextlib
from typing import Any, Dict, List, Optional, Tuple, cast

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

__all__ = ["Accumulator", "accumulate"]


# What the accumulator calls on a scaler (torch.amp.GradScaler and memsave.amp.GradScaler both have them).
_SCALER_METHODS = ("scale", "unscale_", "step", "update")


class Accumulator:
    """Runs ``steps`` micro-batch backward passes per optimizer step. Create it with :func:`accumulate`.

    Attributes:
        steps: micro-batches per optimizer step.
        micro_step: micro-batches accumulated in the current window (0 right after a step).

    Examples:
        >>> with memsave.accumulate(model, optimizer, steps=4) as acc:
        ...     for x, y in loader:
        ...         stepped = acc.backward(loss_fn(model(x), y))   # True on every 4th micro-batch
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        steps: int,
        scaler: Optional[Any] = None,
        clip_grad_norm: Optional[float] = None,
    ) -> None:
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(f"steps must be an int >= 1 (micro-batches per optimizer step), got {steps!r}")
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"model must be the torch.nn.Module being trained, got {type(model).__name__}")
        if clip_grad_norm is not None and (
            isinstance(clip_grad_norm, bool) or not isinstance(clip_grad_norm, (int, float))
        ):
            raise TypeError(
                f"clip_grad_norm must be a number (a max norm) or None, got {type(clip_grad_norm).__name__}"
            )
        if scaler is not None and not all(callable(getattr(scaler, m, None)) for m in _SCALER_METHODS):
            raise TypeError(
                f"scaler must be a memsave.amp.GradScaler or torch.amp.GradScaler (with {', '.join(_SCALER_METHODS)}), "
                f"got {type(scaler).__name__}"
            )
        if clip_grad_norm is not None and not clip_grad_norm > 0:
            raise ValueError(f"clip_grad_norm must be a positive max norm or None, got {clip_grad_norm!r}")
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
        _check_optimizer_of(model, optimizer)
        self.model = model
        self.optimizer = optimizer
        self.steps = steps
        self.scaler = scaler
        self.clip_grad_norm = clip_grad_norm
        self.micro_step = 0
        self._ddp = isinstance(model, DistributedDataParallel)
        self._no_sync: Optional[contextlib.AbstractContextManager] = None
        self._last_skipped: Optional[bool] = None
        self._enter_no_sync()

    # DDP decides in forward whether the coming backward all-reduces, so the switch must be set before the
    # forward of each micro-step: no_sync is entered at the start of every window and left before the forward of
    # its final micro-step, i.e. right after the backward of the one before.
    def _enter_no_sync(self) -> None:
        if self._ddp and self.steps > 1 and self._no_sync is None:
            self._no_sync = cast(Any, self.model).no_sync()
            self._no_sync.__enter__()

    def _exit_no_sync(self) -> None:
        if self._no_sync is not None:
            ctx, self._no_sync = self._no_sync, None
            ctx.__exit__(None, None, None)

    def backward(self, loss: torch.Tensor, **backward_kwargs: Any) -> bool:
        """Backward of one micro-batch's loss; steps the optimizer at the end of each window of ``steps``.

        Divides ``loss`` by ``steps`` (scales it when a scaler was given) and runs backward. On the final micro-step
        it unscales the gradients, clips them if asked, steps the optimizer (through the scaler, which skips the
        step on inf/NaN gradients), updates the scale and zeroes the gradients.

        Args:
            loss: the micro-batch's loss, averaged over the micro-batch (as for a normal step).
            **backward_kwargs: forwarded to ``Tensor.backward`` (e.g. ``retain_graph``).

        Returns:
            True when this call ended a window and stepped (see :attr:`last_skipped` for whether the scaler skipped
            the optimizer step), False otherwise.

        Examples:
            >>> if acc.backward(loss):
            ...     lr_scheduler.step()
        """
        if not isinstance(loss, torch.Tensor):
            raise TypeError(f"backward expects the loss tensor, got {type(loss).__name__}")
        # Checked before counting the micro-step: a refused call must leave the window as it was.
        if loss.numel() != 1:
            raise ValueError(
                f"backward expects a scalar loss (one value, averaged over the micro-batch), got a tensor of shape "
                f"{tuple(loss.shape)}; reduce it first (loss.mean())"
            )
        if not loss.requires_grad:
            raise ValueError(
                "backward: the loss does not require grad (computed under torch.no_grad(), detached, or from nothing "
                "that requires grad), so it has no gradients to accumulate"
            )
        self.micro_step += 1
        scaled = loss / self.steps
        if self.scaler is not None:
            scaled = self.scaler.scale(scaled)
        scaled.backward(**backward_kwargs)
        if self.micro_step == self.steps:
            self._step(self.micro_step)
            return True
        if self.micro_step == self.steps - 1:
            self._exit_no_sync()  # the next forward belongs to the final micro-step: it must all-reduce
        return False

    def flush(self) -> bool:
        """Step a partial window (fewer than ``steps`` micro-batches since the last step), e.g. at the end of an epoch.

        The gradients are rescaled by ``steps / k`` for the k micro-batches accumulated, so they are the mean over
        those k (micro-batches of equal size assumed), as a full window's are over ``steps``. Under DDP the partial
        window ran under no_sync, so its gradients are all-reduced (averaged over the process group) here.

        Returns:
            True when it stepped, False when there was nothing to step.

        Examples:
            >>> for x, y in loader:
            ...     acc.backward(loss_fn(model(x), y))
            >>> acc.flush()
        """
        if self.micro_step == 0:
            return False
        if self._ddp and self.steps > 1:
            self._all_reduce_grads()
        self._step(self.micro_step)
        return True

    def _params(self) -> List[torch.Tensor]:
        return [p for group in self.optimizer.param_groups for p in group["params"]]

    def _step(self, k: int) -> None:
        self._exit_no_sync()
        # Clipping and the partial-window rescale act on true gradients: unscale first.
        if self.scaler is not None and (self.clip_grad_norm is not None or k != self.steps):
            self.scaler.unscale_(self.optimizer)
        if k != self.steps:
            _scale_grads(self._params(), self.steps / k)
        if self.clip_grad_norm is not None:
            # The optimizer's parameters: the gradients the scaler unscaled and the step will use.
            torch.nn.utils.clip_grad_norm_(self._params(), self.clip_grad_norm)
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
            self._last_skipped = getattr(self.scaler, "last_step_skipped", None)
        else:
            self.optimizer.step()
            self._last_skipped = False
        self.optimizer.zero_grad(set_to_none=True)
        self.micro_step = 0
        self._enter_no_sync()

    def _all_reduce_grads(self) -> None:
        group = getattr(self.model, "process_group", None)
        world = dist.get_world_size(group)
        params = [p for p in self.model.parameters() if p.requires_grad]
        buckets: Dict[Tuple[torch.device, torch.dtype], List[torch.Tensor]] = {}
        for p in params:
            if p.grad is None:  # every rank must contribute the same buffer layout
                p.grad = torch.zeros_like(p)
            buckets.setdefault((p.grad.device, p.grad.dtype), []).append(p.grad)
        for grads in buckets.values():
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat, group=group)
            flat.div_(world)
            offset = 0
            for g in grads:
                g.copy_(flat[offset : offset + g.numel()].view_as(g))
                offset += g.numel()

    @property
    def last_skipped(self) -> Optional[bool]:
        """Whether the last step was skipped by the scaler for inf/NaN gradients (None if unknown: no step yet, or a
        scaler without ``last_step_skipped`` such as torch.amp.GradScaler)."""
        return self._last_skipped

    def close(self) -> None:
        """Leave DDP's no_sync (restoring gradient synchronization) without stepping; pending gradients stay."""
        self._exit_no_sync()

    def __enter__(self) -> "Accumulator":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        scaler = type(self.scaler).__name__ if self.scaler is not None else None
        return (
            f"Accumulator(steps={self.steps}, micro_step={self.micro_step}, scaler={scaler}, "
            f"clip_grad_norm={self.clip_grad_norm}, ddp={self._ddp})"
        )


def _scale_grads(params: List[torch.Tensor], factor: float) -> None:
    dense = [p.grad for p in params if p.grad is not None and not p.grad.is_sparse]
    if dense:
        torch._foreach_mul_(dense, factor)
    for p in params:
        if p.grad is not None and p.grad.is_sparse:
            p.grad.mul_(factor)


def _check_optimizer_of(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Refuse an optimizer that holds none of ``model``'s parameters (another model's): its steps would never change
    the model being trained. A subset (frozen layers) or extra parameters (a learnable loss) are fine."""
    own = {id(p) for p in model.parameters()}
    held = [p for group in optimizer.param_groups for p in group["params"]]
    if own and held and not any(id(p) in own for p in held):
        raise ValueError(
            f"optimizer holds none of the parameters of the model given ({type(model).__name__}): it belongs to "
            "another model, and its steps would never change this one; create it from this model's parameters "
            "(torch.optim.AdamW(model.parameters()))"
        )


def accumulate(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    steps: int,
    scaler: Optional[Any] = None,
    clip_grad_norm: Optional[float] = None,
) -> Accumulator:
    """Accumulate gradients over ``steps`` micro-batches per optimizer step.

    Create it before the first forward pass: under DistributedDataParallel it enters ``model.no_sync()`` at once, so
    that the non-final micro-steps of each window skip the gradient all-reduce, and leaves it before the forward of
    the final micro-step (DDP decides during forward whether the following backward synchronizes). Use it as a
    context manager, or call :meth:`Accumulator.close`, to restore synchronization if you stop mid-window.

    Args:
        model: the model (a ``DistributedDataParallel`` one is detected).
        optimizer: its optimizer.
        steps: micro-batches per optimizer step (>= 1).
        scaler: an optional :class:`memsave.amp.GradScaler` (or torch.amp.GradScaler): the loss is scaled, and the
            final micro-step unscales, steps through the scaler and updates the scale once per window.
        clip_grad_norm: optional max norm; the optimizer's gradients are clipped after unscaling.

    Returns:
        Accumulator: call ``acc.backward(loss)`` once per micro-batch and ``acc.flush()`` at the end.

    Raises:
        ValueError: for ``steps`` < 1, a non-positive ``clip_grad_norm``, or an ``optimizer`` that holds none of
            ``model``'s parameters (another model's).
        TypeError: for a ``model`` that is not a Module, an ``optimizer`` that is not an Optimizer, a
            ``clip_grad_norm`` that is not a number, or a ``scaler`` without scale/unscale_/step/update.

    Examples:
        >>> acc = memsave.accumulate(model, optimizer, steps=8, scaler=memsave.amp.GradScaler("cuda"))
        >>> for x, y in loader:
        ...     acc.backward(loss_fn(model(x), y))
        >>> acc.flush()
    """
    return Accumulator(model, optimizer, steps, scaler=scaler, clip_grad_norm=clip_grad_norm)
