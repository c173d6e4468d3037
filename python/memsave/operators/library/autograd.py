"""Plumbing shared by the operator registrations of every family: the checks fake kernels repeat, and the
Autograd kernels of operators that mutate their arguments.

``torch.library.register_autograd`` accepts functional schemas only, and ``batch_norm_act``/``inplace_abn`` mutate
arguments (the running statistics; inplace_abn also its input). Their Autograd kernels are built here the way
``register_autograd`` builds one: an ``autograd.Function`` whose forward redispatches the operator below autograd.
The two private ``torch._C`` names this needs (``_AutoDispatchBelowAutograd``, ``_after_autograd_keyset``) are the
ones torch.library itself uses; they exist unchanged since torch 2.1 and are checked at import.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence, Type

import torch


# ----------------------------------------------------------------------------------------------------
# Helpers shared by the operator registrations.
# ----------------------------------------------------------------------------------------------------
def packed_mask_bytes(numel: int) -> int:
    """Bytes of a bit-packed mask over ``numel`` elements (element i is bit i % 8 of byte i // 8)."""
    return (numel + 7) // 8


def check_same_device(op: str, grad: torch.Tensor, saved: torch.Tensor) -> None:
    """Fake kernels check what the real ones check: a backward's saved tensor lives on the gradient's device."""
    torch._check(
        saved.device == grad.device,
        lambda: f"memsave.{op}: the saved tensor is on {saved.device} but the gradient is on {grad.device}",
    )


# ----------------------------------------------------------------------------------------------------
# Autograd plumbing shared by the fused operators (batch_norm_act, inplace_abn, layer_norm_linear, act_linear).
# ----------------------------------------------------------------------------------------------------
if not hasattr(torch._C, "_AutoDispatchBelowAutograd") or not hasattr(torch._C, "_after_autograd_keyset"):
    raise ImportError(
        f"memsave's fused operators need torch._C._AutoDispatchBelowAutograd and torch._C._after_autograd_keyset, "
        f"which torch {torch.__version__} lacks; use torch >= 2.5"
    )

_LIB = torch.library.Library("memsave", "FRAGMENT")


class Redispatch:
    """Calls an operator below the Autograd key with the keyset the dispatcher handed to the Autograd kernel."""

    def __init__(self, op: torch._ops.OpOverload, keyset: Any) -> None:
        self._op = op
        self._keyset = keyset & torch._C._after_autograd_keyset

    def __call__(self, *args: Any) -> Any:
        with torch._C._AutoDispatchBelowAutograd():
            return self._op.redispatch(self._keyset, *args)


def register_mutating_autograd(
    qualname: str,
    function: Type[torch.autograd.Function],
    unpack: Callable[[Any], Any] = lambda result: result,
) -> None:
    """Register ``function`` as the Autograd kernel of the (mutating) operator ``qualname``.

    Args:
        qualname: ``"memsave::name"``.
        function: an ``autograd.Function`` whose ``forward(ctx, redispatch, *op_args)`` runs the operator through
            ``redispatch`` and whose ``backward`` returns one gradient per ``forward`` argument.
        unpack: maps ``function.apply``'s result to the operator's return value (inplace_abn's Function also returns
            the mutated input, which the schema does not).
    """
    namespace, name = qualname.split("::", 1)
    op = getattr(getattr(torch.ops, namespace), name).default

    def autograd_kernel(keyset: Any, *args: Any) -> Any:
        if torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
            return unpack(function.apply(Redispatch(op, keyset), *args))
        return Redispatch(op, keyset)(*args)

    _LIB.impl(name, autograd_kernel, "Autograd", with_keyset=True)


def _no_double_backward(name: str) -> Callable[..., Any]:
    def backward(ctx: Any, *grads: Any) -> Any:
        raise NotImplementedError(
            f"memsave.{name} has no double backward (its backward is a fused kernel); "
            f"use the unfused torch modules for higher-order gradients"
        )

    return backward


def register_backward_op_autograd(qualname: str) -> None:
    """Register an Autograd kernel for a ``*_backward`` operator that raises on double backward.

    Without it, differentiating through the backward (``create_graph=True``) would silently give wrong results.
    """
    torch.library.register_autograd(qualname, _no_double_backward(qualname.split("::", 1)[1]), setup_context=None)


def grads_or_none(needs: Sequence[bool], grads: Sequence[Any]) -> tuple:
    """``grads`` with ``None`` wherever autograd does not need the gradient."""
    return tuple(g if n else None for n, g in zip(needs, grads))
