"""Plumbing shared by the operator registrations of every family: :class:`Registrations` (what a family registers
with torch.library, collected when its module is imported and applied by one explicit call), the checks fake kernels
repeat, and the Autograd kernels of operators that mutate their arguments.

Importing a family's module registers nothing: ``memsave/__init__.py`` calls :func:`memsave.operators.ops.register`
once, after the compiled extension has defined the schemas, so the order of imports never matters.

``torch.library.register_autograd`` accepts functional schemas only, and ``batch_norm_act``/``inplace_abn`` mutate
arguments (the running statistics; inplace_abn also its input). Their Autograd kernels are built here the way
``register_autograd`` builds one: an ``autograd.Function`` whose forward redispatches the operator below autograd.
The two private ``torch._C`` names this needs (``_AutoDispatchBelowAutograd``, ``_after_autograd_keyset``) are the
ones torch.library itself uses; they exist unchanged since torch 2.1 and are checked when registering.

Every Autograd kernel is wrapped by :func:`memsave.operators.ops._transforms.guard` (forward-mode AD through the
operator's jvp rule, or a clear error; a clear error under torch.func's differentiating transforms). So the kernels of
functional operators are made as ``register_autograd`` makes them (``torch._library.autograd.make_autograd_impl``,
reached through :func:`memsave.common.compat.custom_op_autograd_kernel`) and registered wrapped.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Type

import torch

from ...common import compat
from . import _transforms


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


# ----------------------------------------------------------------------------------------------------
# Autograd plumbing shared by the fused operators (batch_norm_act, inplace_abn, layer_norm_linear, act_linear).
# ----------------------------------------------------------------------------------------------------
class Redispatch:
    """Calls an operator below the Autograd key with the keyset the dispatcher handed to the Autograd kernel.

    Attributes:
        stats: what a Function keeps here of the operator's results that it does not return (inplace_abn's
            statistics), or None.
    """

    def __init__(self, op: torch._ops.OpOverload, keyset: Any) -> None:
        self._op = op
        self._keyset = keyset & torch._C._after_autograd_keyset
        self.stats: Any = None

    def __call__(self, *args: Any) -> Any:
        with torch._C._AutoDispatchBelowAutograd():
            return self._op.redispatch(self._keyset, *args)


def _no_double_backward(name: str) -> Callable[..., Any]:
    def backward(ctx: Any, *grads: Any) -> Any:
        raise NotImplementedError(
            f"memsave.{name} has no double backward (its backward is a fused kernel); "
            f"use the unfused torch modules for higher-order gradients"
        )

    return backward


def grads_or_none(needs: Sequence[bool], grads: Sequence[Any]) -> tuple:
    """``grads`` with ``None`` wherever autograd does not need the gradient."""
    return tuple(g if n else None for n, g in zip(needs, grads))


def _checked_fake(qualname: str, fake: Callable[..., Any]) -> Callable[..., Any]:
    """``fake`` with :func:`check_devices` run first (the schema is read when registering: it needs the extension)."""
    name = qualname.split("::", 1)[1]
    schema = getattr(torch.ops.memsave, name).default._schema

    @functools.wraps(fake)
    def checked(*args: Any, **kwargs: Any) -> Any:
        check_devices(name, schema, args, kwargs)
        return fake(*args, **kwargs)

    return checked


def _no_output(*args: Any, **kwargs: Any) -> None:
    return None


def _mutating_autograd_kernel(
    qualname: str, function: Type[torch.autograd.Function], unpack: Callable[[Any, Redispatch], Any]
) -> Callable[..., Any]:
    namespace, name = qualname.split("::", 1)
    op = getattr(getattr(torch.ops, namespace), name).default

    def autograd_kernel(keyset: Any, *args: Any) -> Any:
        if torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
            redispatch = Redispatch(op, keyset)
            return unpack(function.apply(redispatch, *args), redispatch)
        return Redispatch(op, keyset)(*args)

    return _transforms.guard(name, autograd_kernel)


def _register_autograd(
    lib: torch.library.Library,
    qualname: str,
    backward: Callable[..., Any],
    setup_context: Optional[Callable[..., Any]],
    jvp: Optional[_transforms.JvpRule],
) -> None:
    """What ``torch.library.register_autograd`` does, with the kernel wrapped by :func:`_transforms.guard`."""
    namespace, name = qualname.split("::", 1)
    op = getattr(getattr(torch.ops, namespace), name).default
    kernel = compat.custom_op_autograd_kernel(op, backward, setup_context)
    lib.impl(name, _transforms.guard(name, kernel, jvp), "Autograd", with_keyset=True)


class Registrations:
    """What one operator family registers with ``torch.library``: recorded by the methods below when the family's
    module is imported (which registers nothing), registered by :meth:`apply`, called once per family by
    :func:`memsave.operators.ops.register`.

    Examples:
        >>> REGISTRATIONS = Registrations()
        >>> @REGISTRATIONS.fake("memsave::rms_norm")  # doctest: +SKIP
        ... def _fake(input, weight, eps): ...
        >>> REGISTRATIONS.autograd("memsave::rms_norm", backward, setup_context)  # doctest: +SKIP
        >>> REGISTRATIONS.apply()  # doctest: +SKIP
    """

    def __init__(self) -> None:
        self._steps: List[Callable[[Any], None]] = []
        self._applied = False

    def fake(self, qualname: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """A decorator recording ``fake`` as the fake kernel of ``qualname`` (``"memsave::name"``), with
        :func:`check_devices` run before it; returns ``fake`` unchanged."""

        def decorate(fake: Callable[..., Any]) -> Callable[..., Any]:
            self._steps.append(lambda lib: torch.library.register_fake(qualname, _checked_fake(qualname, fake)))
            return fake

        return decorate

    def no_output_fakes(self, *qualnames: str) -> None:
        """Record the fake kernel of operators that only write into their arguments (schemas returning ``()``)."""
        for qualname in qualnames:
            self.fake(qualname)(_no_output)

    def autograd(
        self,
        qualname: str,
        backward: Callable[..., Any],
        setup_context: Optional[Callable[..., Any]],
        jvp: Optional[_transforms.JvpRule] = None,
    ) -> None:
        """Record the Autograd kernel ``torch.library.register_autograd(qualname, backward, setup_context=...)``
        would register, guarded for forward-mode AD and torch.func (:func:`_transforms.guard`).

        Args:
            qualname: ``"memsave::name"``.
            backward, setup_context: as for ``torch.library.register_autograd``.
            jvp: the operator's forward-mode rule (see :data:`_transforms.JvpRule`), or None: forward-mode AD
                through the operator then raises :class:`~memsave.errors.UnsupportedTransformError`.
        """
        self._steps.append(lambda lib: _register_autograd(lib, qualname, backward, setup_context, jvp))

    def backward_op(self, qualname: str) -> None:
        """Record an Autograd kernel for the ``*_backward`` operator ``qualname`` that raises on double backward.

        Without it, differentiating through the backward (``create_graph=True``) would silently give wrong results.
        """
        self.autograd(qualname, _no_double_backward(qualname.split("::", 1)[1]), setup_context=None)

    def mutating_autograd(
        self,
        qualname: str,
        function: Type[torch.autograd.Function],
        unpack: Callable[[Any, Redispatch], Any] = lambda result, redispatch: result,
    ) -> None:
        """Record ``function`` as the Autograd kernel of the (mutating) operator ``qualname``.

        Args:
            qualname: ``"memsave::name"``.
            function: an ``autograd.Function`` whose ``forward(ctx, redispatch, *op_args)`` runs the operator through
                ``redispatch`` and whose ``backward`` returns one gradient per ``forward`` argument.
            unpack: maps ``function.apply``'s result and the call's :class:`Redispatch` to the operator's return
                value (inplace_abn's Function returns the mutated input, which the schema does not, and leaves the
                statistics the schema returns on the Redispatch).
        """
        name = qualname.split("::", 1)[1]
        self._steps.append(
            lambda lib: lib.impl(
                name, _mutating_autograd_kernel(qualname, function, unpack), "Autograd", with_keyset=True
            )
        )

    def apply(self, lib: torch.library.Library) -> None:
        """Register everything recorded (once; a second call does nothing).

        Args:
            lib: the ``memsave`` FRAGMENT library the Autograd kernels of mutating operators are added to.
        """
        if self._applied:
            return
        for step in self._steps:
            step(lib)
        self._applied = True
