"""Gated-MLP operators: gated_act (act(gate) * up) and gated_act_linear keep gate and up only."""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from .common import Tensor, autocast_cast, check_tensor

#: Activations of a gated linear unit (:func:`gated_act`, :func:`gated_act_linear`, :class:`memsave.nn.GatedMLP`):
#: silu (SwiGLU), gelu (GeGLU), gelu_tanh (GeGLU with the tanh approximation), relu (ReGLU), identity (bilinear).
GATED_ACTIVATIONS: Tuple[str, ...] = ("silu", "gelu", "gelu_tanh", "relu", "identity")


def resolve_gated_activation(fn: str, act: str) -> str:
    """Validate a gated activation name (one of :data:`GATED_ACTIVATIONS`); ``fn`` names the caller in the error.

    Raises:
        ValueError: unknown name.
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
