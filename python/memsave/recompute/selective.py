"""Selective recompute: keep the outputs of the expensive operators of a region, recompute only the cheap ones.

A region run with a selective ``context_fn`` (torch's ``create_selective_checkpoint_contexts`` semantics) keeps, in
forward, the outputs of the operators its policy marks saved, and in backward its recompute reads them back instead of
running those operators again; every other operator is recomputed as in a whole region. Matrix products and
convolutions are most of a transformer's or CNN's compute but a small share of its activation bytes (norms,
activations, dropout masks, softmax and residual sums are the rest), so saving only their outputs keeps most of a
checkpoint's memory saving for a fraction of its recompute time. ``alternate_matmul`` keeps every other matrix
product's output (the 1st, 3rd, 5th, ... of each region call, torchtitan's rule): in a transformer block those are
the projections that feed attention and the activation, whose outputs a recompute of the cheap operators needs, while
the products that feed residual sums are run again.

:func:`selective` builds such a ``context_fn`` from operator classes (:data:`OPERATOR_CLASSES`); torch's own
policies (``create_selective_checkpoint_contexts(policy_fn)``) work the same way with :func:`memsave.checkpoint`
and :func:`memsave.wrap`.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Dict, List, Tuple

import torch
from torch.utils import checkpoint as torch_checkpoint

__all__ = ["ALTERNATE", "OPERATOR_CLASSES", "operators_of", "selective"]

_aten = torch.ops.aten

# Operator classes by the ATen operators a training step dispatches for them (dense CPU and CUDA kernels; a
# composite such as F.linear or torch.matmul reaches the dispatcher as one of these).
OPERATOR_CLASSES: Dict[str, Tuple[str, ...]] = {
    "matmul": ("mm", "addmm", "bmm", "baddbmm", "_addmm_activation"),
    "conv": ("convolution", "_convolution", "convolution_overrideable"),
    # The products of "matmul", every other one kept (see ALTERNATE); the two are never kept together.
    "alternate_matmul": ("mm", "addmm", "bmm", "baddbmm", "_addmm_activation"),
    "attention": (
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "_flash_attention_forward",
        "_efficient_attention_forward",
    ),
}


#: The class kept by position rather than by operator: of its operators, a region keeps the outputs of the 1st, 3rd,
#: 5th, ... it dispatches in each call (counted apart in the forward and in the recompute, so that both keep the same).
ALTERNATE = "alternate_matmul"


def _overloads(operator_class: str) -> Tuple[Any, ...]:
    ops: List[Any] = []
    for op_name in OPERATOR_CLASSES[operator_class]:
        packet = getattr(_aten, op_name, None)
        if packet is not None:  # None: an operator this torch build does not have
            ops.extend(getattr(packet, overload) for overload in packet.overloads())
    return tuple(ops)


# Resolved once at import, so that selective() called inside a compiled function only reads constants.
_OVERLOADS: Dict[str, Tuple[Any, ...]] = {name: _overloads(name) for name in OPERATOR_CLASSES}


def operators_of(operator_class: str) -> Tuple[Any, ...]:
    """The ATen operator overloads of one class of :data:`OPERATOR_CLASSES` (what :func:`selective` keeps for it).

    Args:
        operator_class: ``"matmul"``, ``"conv"`` or ``"attention"``.

    Returns:
        A tuple of ``torch._ops.OpOverload`` (operators this torch build lacks are left out).

    Raises:
        ValueError: an unknown class name.

    Examples:
        >>> torch.ops.aten.mm.default in memsave.recompute.selective.operators_of("matmul")
        True
    """
    if operator_class not in _OVERLOADS:
        raise ValueError(
            f"memsave.selective: unknown operator class {operator_class!r}; the classes are "
            f"{', '.join(OPERATOR_CLASSES)}"
        )
    return _OVERLOADS[operator_class]


def selective(*operator_classes: str) -> Callable[[], Tuple[Any, Any]]:
    """A ``context_fn`` that keeps the outputs of the given operator classes and recomputes everything else.

    Pass it wherever torch's ``context_fn`` goes: :func:`memsave.checkpoint`, :func:`memsave.wrap`, or
    ``torch.utils.checkpoint.checkpoint``. It is torch's ``create_selective_checkpoint_contexts`` with the operators
    of the classes marked ``MUST_SAVE`` and all others ``PREFER_RECOMPUTE``, so it also works under
    ``torch.compile``. Gradients, buffers and the RNG stream stay bitwise eager's: a kept output is the forward's
    own value. As in torch, a region recomputed with a selective context may be backpropagated through once (a
    second backward with ``retain_graph=True`` raises torch's ``RuntimeError``).

    Args:
        *operator_classes: names from :data:`OPERATOR_CLASSES`: ``"matmul"`` (``mm``, ``addmm``, ``bmm``, ...: every
            ``nn.Linear`` and attention score product), ``"alternate_matmul"`` (the 1st, 3rd, 5th, ... of those
            products in each region call: torchtitan's selective rule), ``"conv"`` (every convolution),
            ``"attention"`` (fused scaled-dot-product attention kernels). At least one.

    Returns:
        A function returning ``(forward context, recompute context)``, new ones on each call.

    Raises:
        ValueError: no class, an unknown class name, or both ``"matmul"`` and ``"alternate_matmul"`` (the first
            keeps every product the second keeps).
        TypeError: the classes given as one list instead of separate arguments.

    Examples:
        >>> keep_matmuls = memsave.selective("matmul", "attention")
        >>> y = memsave.checkpoint(block, x, use_reentrant=False, context_fn=keep_matmuls)
        >>> memsave.wrap(model, context_fn=keep_matmuls)      # every block: recompute only the cheap operators
        >>> memsave.wrap(model, context_fn=memsave.selective("alternate_matmul", "attention"))  # torchtitan's rule
    """
    if not operator_classes:
        raise ValueError(f"memsave.selective: name at least one operator class to keep: {', '.join(OPERATOR_CLASSES)}")
    if len(operator_classes) == 1 and isinstance(operator_classes[0], (list, tuple, set)):
        raise TypeError(
            f"memsave.selective: give the operator classes as separate arguments, selective('matmul', 'conv'), not "
            f"one {type(operator_classes[0]).__name__} ({operator_classes[0]!r}); write "
            f"selective(*{list(operator_classes[0])!r})"
        )
    unknown = [c for c in operator_classes if not isinstance(c, str) or c not in OPERATOR_CLASSES]
    if unknown:
        raise ValueError(
            f"memsave.selective: unknown operator class {unknown[0]!r}; the classes are {', '.join(OPERATOR_CLASSES)}"
        )
    if "matmul" in operator_classes and ALTERNATE in operator_classes:
        raise ValueError(
            f"memsave.selective: 'matmul' keeps every matrix product, {ALTERNATE!r} every other one; name one of them"
        )
    names = dict.fromkeys(c for c in operator_classes if c != ALTERNATE)
    ops = tuple(op for name in names for op in _OVERLOADS[name])
    # A partial of a module-level function: dynamo (torch.compile) recognises it and calls it at compile time.
    if ALTERNATE in operator_classes:
        return functools.partial(_alternating_contexts, ops, _OVERLOADS[ALTERNATE])
    return functools.partial(torch_checkpoint.create_selective_checkpoint_contexts, list(ops))


_MUST_SAVE = torch_checkpoint.CheckpointPolicy.MUST_SAVE
_PREFER_RECOMPUTE = torch_checkpoint.CheckpointPolicy.PREFER_RECOMPUTE


class _AlternatingPolicy:
    """One region call's policy: ``saved`` operators kept, every other ``alternating`` operator kept (the 1st, 3rd,
    ...), the rest recomputed. The forward and the recompute count apart, so both keep the same products."""

    def __init__(self, saved: Tuple[Any, ...], alternating: Tuple[Any, ...]) -> None:
        self.saved, self.alternating = frozenset(saved), frozenset(alternating)
        self.seen = {False: 0, True: 0}  # by ctx.is_recompute

    def __call__(self, ctx: Any, op: Any, *args: Any, **kwargs: Any) -> torch_checkpoint.CheckpointPolicy:
        if op in self.alternating:
            self.seen[ctx.is_recompute] += 1
            keep = self.seen[ctx.is_recompute] % 2 == 1
        else:
            keep = op in self.saved
        return _MUST_SAVE if keep else _PREFER_RECOMPUTE


def _alternating_contexts(saved: Tuple[Any, ...], alternating: Tuple[Any, ...]) -> Tuple[Any, Any]:
    """torch's selective contexts under a fresh :class:`_AlternatingPolicy` (a new count for every region call)."""
    return torch_checkpoint.create_selective_checkpoint_contexts(_AlternatingPolicy(saved, alternating))
