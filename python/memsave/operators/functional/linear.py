"""Norm / activation -> Linear operators: layer_norm_linear and act_linear keep the Linear's pre-normalization or
pre-activation input."""

from __future__ import annotations

from typing import Optional, Sequence, Union

import torch

from .common import Tensor, autocast_cast, check_tensor, resolve_activation


def layer_norm_linear(
    input: Tensor,
    normalized_shape: Union[int, Sequence[int]],
    ln_weight: Optional[Tensor],
    ln_bias: Optional[Tensor],
    weight: Tensor,
    bias: Optional[Tensor] = None,
    eps: float = 1e-5,
) -> Tensor:
    """``linear(layer_norm(input), weight, bias)`` keeping ``input`` and per-row mean/rstd, not the normalized tensor.

    Under autocast the Linear runs in the autocast dtype and the norm in ``promote(input, ln_weight)``, as with the
    two torch ops (torch's CUDA autocast runs layer_norm in float32).

    Args:
        input: ``[..., *normalized_shape]`` tensor; the Linear acts on the last dimension.
        normalized_shape: the trailing shape to normalize over (an int for the last dimension).
        ln_weight, ln_bias: the norm's affine parameters (shape ``normalized_shape``) or None.
        weight: ``[out_features, input.shape[-1]]``; bias: ``[out_features]`` or None.
        eps: added to the variance.

    Returns:
        ``[..., out_features]`` tensor.

    Examples:
        >>> ln, fc = torch.nn.LayerNorm(64), torch.nn.Linear(64, 256)
        >>> y = memsave.functional.layer_norm_linear(x, 64, ln.weight, ln.bias, fc.weight, fc.bias)
    """
    check_tensor("layer_norm_linear", input)
    shape = [int(normalized_shape)] if isinstance(normalized_shape, int) else [int(s) for s in normalized_shape]
    weight, bias = autocast_cast(input.device.type, weight, bias)
    out, _mean, _rstd = torch.ops.memsave.layer_norm_linear(input, shape, ln_weight, ln_bias, float(eps), weight, bias)
    return out


def act_linear(
    input: Tensor,
    weight: Tensor,
    bias: Optional[Tensor] = None,
    act: str = "gelu",
    act_param: Optional[float] = None,
) -> Tensor:
    """``linear(act(input), weight, bias)`` keeping only ``input`` for backward.

    torch keeps both the activation's input and its output here (for gelu, silu, leaky_relu, elu); this keeps one
    tensor. For relu there is no gain (torch's relu and linear share relu's output), but it is accepted.

    Args:
        input: ``[..., in_features]`` tensor.
        weight: ``[out_features, in_features]``; bias: ``[out_features]`` or None.
        act: one of :data:`ACTIVATIONS` (``"gelu_tanh"`` is ``nn.GELU(approximate="tanh")``).
        act_param: leaky_relu's negative_slope (0.01) or elu's alpha (1.0).

    Returns:
        ``[..., out_features]`` tensor.

    Examples:
        >>> h = fc1(x)
        >>> y = memsave.functional.act_linear(h, fc2.weight, fc2.bias, act="gelu")
    """
    check_tensor("act_linear", input)
    act, param = resolve_activation(act, act_param)
    # The activation runs in input's dtype and its result is cast to the weight's, as autocast does for act -> Linear.
    weight, bias = autocast_cast(input.device.type, weight, bias)
    return torch.ops.memsave.act_linear(input, weight, bias, act, param)
