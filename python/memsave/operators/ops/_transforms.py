"""Forward-mode AD and torch.func transforms through the memsave operators' Autograd kernels.

An operator registered with ``torch.library.register_autograd`` has no forward-mode rule: under
``torch.autograd.forward_ad`` or ``torch.func.jvp`` its kernel runs below autograd when no input requires grad, and the
output silently gets no tangent (a converted Linear-ReLU-Linear gives a zero jvp). And its ``autograd.Function`` has
no ``setup_context``, so ``torch.func.grad`` / ``vjp`` fail with a message naming neither memsave nor the operator.

:func:`guard` wraps each Autograd kernel: when an argument carries a forward-mode tangent, the operator's jvp rule
computes the output's tangent (elementwise operators: the backward operator applied to the tangent, which is exact
because their Jacobian is diagonal; max_pool2d: the tangent gathered at the window maxima), or, without a rule,
:class:`~memsave.errors.UnsupportedTransformError` names the operator and what to use instead. Under a torch.func
transform that differentiates (``grad``, ``vjp``, ``jacrev``, ...) the same error is raised before torch's own.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence, Tuple

import torch
import torch.autograd.forward_ad as fwAD

from ...errors import UnsupportedTransformError

#: A jvp rule: ``rule(run, primals, tangents)`` returns the operator's output with tangents attached
#: (``fwAD.make_dual``); ``run(*primals)`` computes the output with reverse-mode autograd as usual; ``tangents``
#: follows the arguments (None where an argument has no tangent; a list for a list argument).
JvpRule = Callable[[Callable[..., Any], Sequence[Any], Sequence[Any]], Any]


def _split(value: Any) -> Tuple[Any, Any]:
    """(primal, tangent) of one argument: a tensor, a list of tensors, or anything else (no tangent)."""
    if isinstance(value, torch.Tensor):
        primal, tangent = fwAD.unpack_dual(value)
        return (value, None) if tangent is None else (primal, tangent)
    if isinstance(value, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in value):
        pairs = [_split(v) for v in value]
        tangents = [t for _, t in pairs]
        if all(t is None for t in tangents):
            return value, None
        return type(value)(p for p, _ in pairs), tangents
    return value, None


def split_duals(args: Sequence[Any]) -> Optional[Tuple[List[Any], List[Any]]]:
    """``(primals, tangents)`` of an operator's arguments when any carries a forward-mode tangent, else None.

    Args:
        args: the arguments the dispatcher passed to the Autograd kernel.

    Returns:
        None without tangents (the usual case: no dual level is active); else the arguments with their tangents
        removed and the tangents (None where an argument has none).

    Examples:
        >>> with fwAD.dual_level():
        ...     primals, tangents = split_duals((fwAD.make_dual(x, t), 0.1))
        >>> tangents[1] is None
        True
    """
    pairs = [_split(a) for a in args]
    if all(t is None for _, t in pairs):
        return None
    return [p for p, _ in pairs], [t for _, t in pairs]


def _requires_grad(args: Sequence[Any]) -> bool:
    for a in args:
        items = a if isinstance(a, (list, tuple)) else (a,)
        if any(isinstance(t, torch.Tensor) and t.requires_grad for t in items):
            return True
    return False


def differentiating_transform(args: Sequence[Any]) -> bool:
    """Whether a torch.func transform is active and would differentiate through these arguments (torch.func.grad,
    vjp, jacrev, hessian: an autograd.Function without ``setup_context`` cannot run under them)."""
    return torch._C._are_functorch_transforms_active() and torch.is_grad_enabled() and _requires_grad(args)


def forward_ad_error(op: str) -> UnsupportedTransformError:
    """The error of an operator without a forward-mode rule whose argument carries a tangent.

    Examples:
        >>> str(forward_ad_error("rms_norm")).startswith("memsave.rms_norm has no forward-mode AD rule")
        True
    """
    return UnsupportedTransformError(
        f"memsave.{op} has no forward-mode AD rule (torch.func.jvp, torch.func.jacfwd, torch.autograd.forward_ad): "
        f"its output would get no tangent. For forward-mode AD use the torch modules it replaces (the model before "
        f"memsave.convert, or torch.nn.functional), or reverse mode (.backward(), torch.autograd.grad) with memsave."
    )


def transform_error(op: str) -> UnsupportedTransformError:
    """The error of an operator differentiated under a torch.func transform (grad, vjp, jacrev, hessian)."""
    return UnsupportedTransformError(
        f"memsave.{op} cannot be differentiated under torch.func transforms (torch.func.grad, vjp, jacrev, hessian, "
        f"functional_call inside them): its autograd formula is a custom operator's, which those transforms do not "
        f"run. Use torch.autograd.grad or .backward() with memsave, or the torch modules it replaces (the model "
        f"before memsave.convert) with torch.func."
    )


def guard(op: str, kernel: Callable[..., Any], jvp: Optional[JvpRule] = None) -> Callable[..., Any]:
    """``kernel`` (an Autograd kernel taking the dispatch keyset first) with forward-mode AD and torch.func handled.

    Args:
        op: the operator's name in the ``memsave`` namespace, for the messages.
        kernel: the Autograd kernel (``kernel(keyset, *args, **kwargs)``).
        jvp: the operator's jvp rule, or None when it has none.

    Returns:
        The kernel to register for the Autograd key.

    Raises:
        UnsupportedTransformError: (when the returned kernel runs) an argument carries a tangent and ``jvp`` is None,
            or a torch.func transform differentiates through the operator.

    Examples:
        >>> lib.impl("rms_norm", guard("rms_norm", kernel), "Autograd", with_keyset=True)  # doctest: +SKIP
    """

    def guarded(keyset: Any, *args: Any, **kwargs: Any) -> Any:
        split = split_duals(args)
        if split is not None:
            if jvp is None:
                raise forward_ad_error(op)
            primals, tangents = split
            return jvp(lambda *a: kernel(keyset, *a, **kwargs), primals, tangents)
        if differentiating_transform(args):
            raise transform_error(op)
        return kernel(keyset, *args, **kwargs)

    return guarded


def needs_out_of_place(input: torch.Tensor) -> bool:
    """Whether an in-place memsave operator (relu_, leaky_relu_, dropout_, whose autograd is a C++ Function without
    forward-mode AD or torch.func support) must run as its out-of-place form copied back into ``input``: ``input``
    carries a tangent, or a torch.func transform differentiates through it."""
    return fwAD.unpack_dual(input).tangent is not None or differentiating_transform((input,))


def with_tangent(output: torch.Tensor, tangent: Optional[torch.Tensor]) -> torch.Tensor:
    """``output`` carrying ``tangent`` (``output`` itself without one)."""
    return output if tangent is None else fwAD.make_dual(output, tangent)
