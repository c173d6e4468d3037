"""Plumbing shared by the operator registrations of every family: the checks fake kernels repeat, and the
Autograd kernels of operators that mutate their arguments.

``torch.library.register_autograd`` accepts functional schemas only, and ``batch_norm_act``/``inplace_abn`` mutate
arguments (the running statistics; inplace_abn also its input). Their Autograd kernels are built here the way
``register_autograd`` builds one: an ``autograd.Function`` whose forward redispatches the operator below autograd.
The two private ``torch._C`` names this needs (``_AutoDispatchBelowAutograd``, ``_after_autograd_keyset``) are the
ones torch.library itself uses; they exist unchanged since torch 2.1 and are checked at import.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Dict, Optional, Sequence, Tuple, Type

import torch

from ...common import compat


# ----------------------------------------------------------------------------------------------------
# Helpers shared by the operator registrations.
# ----------------------------------------------------------------------------------------------------
def packed_mask_bytes(numel: int) -> int:
    """Bytes of a bit-packed mask over ``numel`` elements (element i is bit i % 8 of byte i // 8)."""
    return (numel + 7) // 8


def is_dense(t: torch.Tensor) -> bool:
    """Whether ``t`` covers its memory without gaps or overlaps (any order of dimensions): ATen's
    ``is_non_overlapping_and_dense``.

    Examples:
        >>> is_dense(torch.ones(4, 6).t()), is_dense(torch.ones(4, 6)[:, ::2])
        (True, False)
    """
    expected = 1
    for size, stride in sorted((p for p in zip(t.shape, t.stride()) if p[0] != 1), key=lambda p: p[1]):
        if stride != expected:
            return False
        expected *= size
    return True


def with_strides(t: torch.Tensor, strides: Sequence[int]) -> torch.Tensor:
    """``t`` with exactly ``strides``: ``t`` itself when it has them, else a copy (the values are unchanged).

    Examples:
        >>> with_strides(torch.ones(2, 3), (1, 2)).stride()
        (1, 2)
    """
    if t.stride() == tuple(strides):
        return t
    return torch.empty_strided(t.shape, tuple(strides), dtype=t.dtype, device=t.device).copy_(t)


def check_devices(op: str, schema: Any, args: Sequence[Any], kwargs: Dict[str, Any]) -> None:
    """What every memsave kernel checks first: all tensor arguments (list elements too) on one device.

    Fake kernels run it too: a meta tensor among real ones outranks them in the dispatcher, so without the check
    the fake kernel would answer a mixed call with uninitialised memory on the real tensors' device.

    Args:
        op: the operator's name in the ``memsave`` namespace, for the message.
        schema: the operator's ``torch._C.FunctionSchema`` (names the arguments).
        args, kwargs: the call's arguments.

    Raises:
        RuntimeError: naming the first argument on another device than the first tensor argument.

    Examples:
        >>> check_devices("rms_norm", schema, (x, w.to("meta"), 1e-6), {})  # doctest: +SKIP
        RuntimeError: memsave.rms_norm: expected all tensors to be on the same device, but weight is on meta ...
    """
    names = [a.name for a in schema.arguments]
    values = list(args) + [kwargs[n] for n in names[len(args) :] if n in kwargs]
    first: Optional[Tuple[str, torch.device]] = None
    for name, value in zip(names, values):
        items = value if isinstance(value, (list, tuple)) else [value]
        for i, t in enumerate(items):
            if not isinstance(t, torch.Tensor):
                continue
            label = f"{name}[{i}]" if isinstance(value, (list, tuple)) else name
            if first is None:
                first = (label, t.device)
            elif t.device != first[1]:
                raise RuntimeError(
                    f"memsave.{op}: expected all tensors to be on the same device, but {label} is on {t.device} "
                    f"and {first[0]} is on {first[1]}; move them to one device (a meta tensor is a parameter that "
                    f"was never loaded)"
                )


def register_fake(qualname: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``torch.library.register_fake`` for a memsave operator, with :func:`check_devices` run before the fake kernel.

    Args:
        qualname: ``"memsave::name"``.

    Returns:
        A decorator that registers the fake kernel and returns it unchanged.

    Examples:
        >>> @register_fake("memsave::rms_norm")  # doctest: +SKIP
        ... def _fake(input, weight, eps): ...
    """
    name = qualname.split("::", 1)[1]

    def decorate(fake: Callable[..., Any]) -> Callable[..., Any]:
        schema = getattr(torch.ops.memsave, name).default._schema

        @functools.wraps(fake)
        def checked(*args: Any, **kwargs: Any) -> Any:
            check_devices(name, schema, args, kwargs)
            return fake(*args, **kwargs)

        torch.library.register_fake(qualname, checked)
        return fake

    return decorate


def linear_output_fake(op: str, input: torch.Tensor, weight: torch.Tensor, input_name: str = "input") -> torch.Tensor:
    """The fake output of an operator ending in ``linear(..., weight)`` over ``input``'s last dimension: checks that
    ``weight`` is ``[out_features, input.shape[-1]]`` and returns an empty ``[..., out_features]`` tensor in
    ``weight``'s dtype.

    Args:
        op: the operator's name, for the message.
        input: the tensor whose last dimension the Linear reads; input_name: its name in the message.
        weight: the Linear's weight.

    Returns:
        The empty output tensor.

    Raises:
        RuntimeError: ``weight`` does not fit ``input`` (``torch._check``).

    Examples:
        >>> linear_output_fake("act_linear", torch.empty(2, 8, device="meta"), torch.empty(4, 8)).shape
        torch.Size([2, 4])
    """
    torch._check(
        weight.dim() == 2 and input.dim() >= 1 and weight.shape[1] == input.shape[-1],
        lambda: f"memsave.{op}: weight {tuple(weight.shape)} does not fit {input_name} {tuple(input.shape)}",
    )
    return input.new_empty((*input.shape[:-1], weight.shape[0]), dtype=weight.dtype)


def register_no_output_fakes(*qualnames: str) -> None:
    """Register the fake kernel of operators that only write into their arguments (schemas returning ``()``): it
    checks the devices (:func:`register_fake`) and returns None.

    Args:
        qualnames: ``"memsave::name"`` of each such operator.

    Examples:
        >>> register_no_output_fakes("memsave::amp_update_scale_")  # doctest: +SKIP
    """

    def no_output(*args: Any, **kwargs: Any) -> None:
        return None

    for qualname in qualnames:
        register_fake(qualname)(no_output)


# ----------------------------------------------------------------------------------------------------
# Autograd plumbing shared by the fused operators (batch_norm_act, inplace_abn, layer_norm_linear, act_linear).
# ----------------------------------------------------------------------------------------------------
compat.require_autograd_redispatch()

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
