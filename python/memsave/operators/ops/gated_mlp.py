"""Gated-MLP operators (csrc/ops/gated_mlp): gated_act (``act(gate) * up``) and gated_act_linear (the down
projection applied to it).

Fake kernels and autograd formulas. Both save ``gate`` and ``up`` only (plus the down projection's weight): torch's
composition also keeps ``act(gate)`` and, for the down projection, the product.

The module holds the family's Python face: the fake kernels and autograd formulas it records for
:func:`memsave.operators.ops.register`, and the functional forms that :mod:`memsave.functional` exports.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, Tuple

import torch

from . import _transforms
from ._common import Tensor, autocast_cast, check_tensor
from ._registration import Registrations, grads_or_none, linear_output_fake

#: What this family registers with torch.library, applied by memsave.operators.ops.register().
REGISTRATIONS = Registrations()


def _check_gate_up(op: str, gate: Tensor, up: Tensor) -> None:
    torch._check(
        gate.shape == up.shape,
        lambda: f"memsave.{op}: up must have gate's shape {tuple(gate.shape)}, got {tuple(up.shape)}",
    )


# ----------------------------------------------------------------------------------------------------
# memsave::gated_act: act(gate) * up keeping gate and up.
# ----------------------------------------------------------------------------------------------------
@REGISTRATIONS.fake("memsave::gated_act")
def _gated_act_fake(gate: Tensor, up: Tensor, act: str) -> Tensor:
    _check_gate_up("gated_act", gate, up)
    return gate.new_empty(gate.shape)


@REGISTRATIONS.fake("memsave::gated_act_backward")
def _gated_act_backward_fake(grad: Tensor, gate: Tensor, up: Tensor, act: str) -> Tuple[Tensor, Tensor]:
    _check_gate_up("gated_act_backward", gate, up)
    return gate.new_empty(gate.shape), gate.new_empty(gate.shape)


def _gated_act_setup_context(ctx: Any, inputs: Tuple[Any, ...], output: Tensor) -> None:
    gate, up, act = inputs
    ctx.save_for_backward(gate, up)  # the memory win: not act(gate)
    ctx.act = act


def _gated_act_backward(ctx: Any, grad: Tensor) -> tuple:
    gate, up = ctx.saved_tensors
    grad_gate, grad_up = torch.ops.memsave.gated_act_backward(grad, gate, up, ctx.act)
    return grads_or_none(ctx.needs_input_grad, (grad_gate, grad_up, None))


def _gated_act_jvp(run: Any, primals: Sequence[Any], tangents: Sequence[Any]) -> Tensor:
    """Forward mode: the Jacobian is diagonal in each of gate and up, so the output's tangent is the backward's
    gate gradient of gate's tangent plus its up gradient of up's tangent (act'(gate) * up * t_gate + act(gate) * t_up).
    """
    out = run(*primals)
    gate, up, act = primals
    tangent: Optional[Tensor] = None
    for i, t in enumerate(tangents[:2]):
        if t is not None:
            part = torch.ops.memsave.gated_act_backward(t, gate, up, act)[i]
            tangent = part if tangent is None else tangent + part
    return _transforms.with_tangent(out, tangent)


REGISTRATIONS.autograd(
    "memsave::gated_act", _gated_act_backward, setup_context=_gated_act_setup_context, jvp=_gated_act_jvp
)
REGISTRATIONS.backward_op("memsave::gated_act_backward")


# ----------------------------------------------------------------------------------------------------
# memsave::gated_act_linear: linear(act(gate) * up) keeping gate and up.
# ----------------------------------------------------------------------------------------------------
@REGISTRATIONS.fake("memsave::gated_act_linear")
def _gated_act_linear_fake(gate: Tensor, up: Tensor, weight: Tensor, bias: Optional[Tensor], act: str) -> Tensor:
    _check_gate_up("gated_act_linear", gate, up)
    return linear_output_fake("gated_act_linear", gate, weight, "gate")


@REGISTRATIONS.fake("memsave::gated_act_linear_backward")
def _gated_act_linear_backward_fake(
    grad_out: Tensor, gate: Tensor, up: Tensor, weight: Tensor, has_bias: bool, act: str
) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    grad_bias = weight.new_empty((weight.shape[0] if has_bias else 0,))
    return gate.new_empty(gate.shape), gate.new_empty(gate.shape), weight.new_empty(weight.shape), grad_bias


def _gated_act_linear_setup_context(ctx: Any, inputs: Tuple[Any, ...], output: Tensor) -> None:
    gate, up, weight, bias, act = inputs
    ctx.save_for_backward(gate, up, weight)  # the memory win: not act(gate), not the product
    ctx.has_bias = bias is not None
    ctx.act = act


def _gated_act_linear_backward(ctx: Any, grad_out: Tensor) -> tuple:
    gate, up, weight = ctx.saved_tensors
    gg, gu, gw, gb = torch.ops.memsave.gated_act_linear_backward(grad_out, gate, up, weight, ctx.has_bias, ctx.act)
    return grads_or_none(ctx.needs_input_grad, (gg, gu, gw, gb, None))


REGISTRATIONS.autograd(
    "memsave::gated_act_linear", _gated_act_linear_backward, setup_context=_gated_act_linear_setup_context
)
REGISTRATIONS.backward_op("memsave::gated_act_linear_backward")


# ----------------------------------------------------------------------------------------------------
# The functional forms (memsave.functional).
# ----------------------------------------------------------------------------------------------------
#: Activations of a gated linear unit (:func:`gated_act`, :func:`gated_act_linear`, :class:`memsave.nn.GatedMLP`):
#: silu (SwiGLU), gelu (GeGLU), gelu_tanh (GeGLU with the tanh approximation), relu (ReGLU), identity (bilinear).
GATED_ACTIVATIONS: Tuple[str, ...] = ("silu", "gelu", "gelu_tanh", "relu", "identity")


def resolve_gated_activation(fn: str, act: str) -> str:
    """Validate a gated activation name (one of :data:`GATED_ACTIVATIONS`); ``fn`` names the caller in the error.

    Args:
        fn: the calling function's name, for the message.
        act: the activation name to check.

    Returns:
        ``act``.

    Raises:
        ValueError: unknown name.

    Examples:
        >>> resolve_gated_activation("gated_act", "silu")
        'silu'
    """
    if not isinstance(act, str) or act not in GATED_ACTIVATIONS:
        raise ValueError(
            f"memsave.functional.{fn}: unknown gated activation {act!r}; use one of {', '.join(GATED_ACTIVATIONS)}"
        )
    return act


def gated_act(gate: Tensor, up: Tensor, act: str = "silu") -> Tensor:
    """The gated linear unit ``act(gate) * up``, keeping ``gate`` and ``up`` for backward.

    torch's ``F.silu(gate) * up`` keeps ``gate``, ``silu(gate)`` and ``up``; this keeps two of the three. Each
    element is computed in float32 (float64 for float64) and rounded once.

    Args:
        gate, up: tensors of the same shape, dtype and device (floating-point).
        act: one of :data:`GATED_ACTIVATIONS` (``"silu"``: SwiGLU, ``"gelu"``: GeGLU).

    Returns:
        ``act(gate) * up`` in gate's dtype.

    Raises:
        TypeError: ``gate`` is not a floating-point tensor.
        ValueError: unknown activation, or ``up``'s shape differs from ``gate``'s.
        RuntimeError: ``up`` has another dtype or device than ``gate``.

    Examples:
        >>> h = memsave.functional.gated_act(mlp.gate_proj(x), mlp.up_proj(x), "silu")
    """
    check_tensor("gated_act", gate)
    return torch.ops.memsave.gated_act(gate, up, resolve_gated_activation("gated_act", act))


def gated_act_linear(
    gate: Tensor, up: Tensor, weight: Tensor, bias: Optional[Tensor] = None, act: str = "silu"
) -> Tensor:
    """A gated MLP's down projection ``linear(act(gate) * up, weight, bias)``, keeping ``gate`` and ``up`` only.

    torch's composition keeps ``gate``, ``act(gate)``, ``up`` and the product (four tensors of the MLP width); this
    keeps two and recomputes the product in backward for the weight gradient. Under autocast the matmul runs in the
    autocast dtype, as for a Linear.

    Args:
        gate, up: ``[..., intermediate]`` tensors of the same shape, dtype and device (the gate and up projections).
        weight: ``[out_features, intermediate]``; bias: ``[out_features]`` or None.
        act: one of :data:`GATED_ACTIVATIONS`.

    Returns:
        ``[..., out_features]`` tensor.

    Raises:
        TypeError: ``gate`` is not a floating-point tensor.
        ValueError: unknown activation or shapes that do not chain.
        RuntimeError: tensors on different devices, or ``up`` of another dtype than ``gate``.

    Examples:
        >>> y = memsave.functional.gated_act_linear(mlp.gate_proj(x), mlp.up_proj(x), mlp.down_proj.weight)
    """
    check_tensor("gated_act_linear", gate)
    act = resolve_gated_activation("gated_act_linear", act)
    weight, bias = autocast_cast(gate.device.type, weight, bias)
    return torch.ops.memsave.gated_act_linear(gate, up, weight, bias, act)
