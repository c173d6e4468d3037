"""Functional forms of memsave's fused recompute-in-backward operators (re-exported by :mod:`memsave.functional`).

Each fuses two torch operations into one operator that keeps less for backward and recomputes the cheap
intermediate there:

* :func:`batch_norm_act`: batch norm + activation; keeps the input and per-channel statistics.
* :func:`inplace_abn`: batch norm + invertible activation, written over the input; keeps only that output.
* :func:`batch_norm_act_conv2d`: batch norm + activation + conv2d; keeps the batch-norm input and per-channel
  statistics, not the convolution's input (the only way to save memory around a ReLU, whose output the conv keeps).
* :func:`layer_norm_linear`: layer norm + linear; keeps the input and per-row mean/rstd.
* :func:`act_linear`: activation + linear; keeps the activation's input.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple, Union

import torch

Tensor = torch.Tensor

#: Activation names the fused operators accept.
ACTIVATIONS: Tuple[str, ...] = ("identity", "relu", "leaky_relu", "elu", "gelu", "gelu_tanh", "silu")
#: Activations :func:`inplace_abn` can invert (with a positive parameter).
INVERTIBLE_ACTIVATIONS: Tuple[str, ...] = ("identity", "leaky_relu", "elu")
_DEFAULT_PARAM = {"leaky_relu": 0.01, "elu": 1.0}

__all__ = [
    "ACTIVATIONS",
    "INVERTIBLE_ACTIVATIONS",
    "act_linear",
    "batch_norm_act",
    "batch_norm_act_conv2d",
    "inplace_abn",
    "layer_norm_linear",
]


def resolve_activation(act: str, act_param: Optional[float], invertible: bool = False) -> Tuple[str, float]:
    """Validate an activation name and fill in its default parameter.

    Args:
        act: one of :data:`ACTIVATIONS`.
        act_param: ``negative_slope`` for leaky_relu (default 0.01), ``alpha`` for elu (default 1.0); ignored
            (0.0) for the others.
        invertible: require an activation :func:`inplace_abn` can invert.

    Returns:
        ``(act, act_param)`` as the operators take them.

    Raises:
        ValueError: unknown name, or a non-invertible activation where one is required.
    """
    if not isinstance(act, str) or act not in ACTIVATIONS:
        raise ValueError(f"unknown activation {act!r}; use one of {', '.join(ACTIVATIONS)}")
    param = float(act_param) if act_param is not None else _DEFAULT_PARAM.get(act, 0.0)
    if invertible:
        if act not in INVERTIBLE_ACTIVATIONS:
            raise ValueError(
                f"activation {act!r} is not invertible, so In-Place ABN cannot recover its input from its output; "
                f"use one of {', '.join(INVERTIBLE_ACTIVATIONS)}, or memsave.nn.BatchNormAct2d for {act!r}"
            )
        if act != "identity" and param <= 0:
            raise ValueError(
                f"{act} needs a positive parameter (negative_slope / alpha) to be invertible, got {param}"
            )
    return act, param


def _check_tensor(name: str, value: object) -> None:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"memsave.functional.{name} expects a torch.Tensor input, got {type(value).__name__}")


def _autocast_cast(device_type: str, *tensors: Optional[Tensor]) -> Tuple[Optional[Tensor], ...]:
    """Cast floating tensors to the autocast dtype when autocast is on for ``device_type`` (as autocast would for a
    Linear); the fused operators themselves are not autocast-aware."""
    if device_type not in ("cpu", "cuda") or not torch.is_autocast_enabled(device_type):
        return tensors
    dtype = torch.get_autocast_dtype(device_type)
    return tuple(t.to(dtype) if t is not None and t.is_floating_point() else t for t in tensors)


def batch_norm_act(
    input: Tensor,
    running_mean: Optional[Tensor],
    running_var: Optional[Tensor],
    weight: Optional[Tensor] = None,
    bias: Optional[Tensor] = None,
    training: bool = False,
    momentum: float = 0.1,
    eps: float = 1e-5,
    act: str = "relu",
    act_param: Optional[float] = None,
) -> Tensor:
    """``act(batch_norm(input))`` keeping only ``input`` and two per-channel vectors for backward.

    Same arguments and semantics as :func:`torch.nn.functional.batch_norm` (running statistics are updated in place
    in training, exactly as torch updates them) followed by the activation. The backward recomputes the
    normalization and the activation's derivative in one fused kernel.

    Args:
        input: ``[N, C, ...]`` floating-point tensor (channels_last is kept).
        running_mean, running_var: ``[C]`` buffers, or None to always use batch statistics.
        weight, bias: ``[C]`` affine parameters or None.
        training: use (and update) batch statistics.
        momentum: running-average factor (the module turns ``momentum=None`` into 1 / num_batches_tracked).
        eps: added to the variance.
        act: one of :data:`ACTIVATIONS`.
        act_param: leaky_relu's negative_slope (0.01) or elu's alpha (1.0).

    Returns:
        The activated, normalized tensor (same shape, dtype and memory format as ``input``).

    Example:
        >>> x = torch.randn(8, 16, 32, 32, requires_grad=True)
        >>> rm, rv = torch.zeros(16), torch.ones(16)
        >>> y = memsave.functional.batch_norm_act(x, rm, rv, training=True, act="silu")
    """
    _check_tensor("batch_norm_act", input)
    act, param = resolve_activation(act, act_param)
    out, _mean, _invstd = torch.ops.memsave.batch_norm_act(
        input, weight, bias, running_mean, running_var, bool(training), float(momentum), float(eps), act, param
    )
    return out


def _pair(value: Union[int, Sequence[int]], name: str) -> List[int]:
    if isinstance(value, int):
        return [value, value]
    items = [int(v) for v in value]
    if len(items) != 2:
        raise ValueError(f"{name} must be an int or a pair of ints, got {value!r}")
    return items


def batch_norm_act_conv2d(
    input: Tensor,
    running_mean: Optional[Tensor],
    running_var: Optional[Tensor],
    bn_weight: Optional[Tensor],
    bn_bias: Optional[Tensor],
    weight: Tensor,
    bias: Optional[Tensor] = None,
    training: bool = False,
    momentum: float = 0.1,
    eps: float = 1e-5,
    act: str = "relu",
    act_param: Optional[float] = None,
    stride: Union[int, Sequence[int]] = 1,
    padding: Union[int, Sequence[int]] = 0,
    dilation: Union[int, Sequence[int]] = 1,
    groups: int = 1,
) -> Tensor:
    """``conv2d(act(batch_norm(input)), weight, bias)`` keeping ``input`` and two per-channel vectors for backward.

    torch keeps the batch-norm input and the activation's output (the convolution's input), plus the activation's
    input for gelu/silu/leaky_relu/elu; this keeps the first only and recomputes the activation output in backward
    (one elementwise pass). Batch-norm semantics as :func:`batch_norm_act` (running statistics updated in place, as
    torch updates them); convolution as :func:`torch.nn.functional.conv2d` with zero padding.

    Args:
        input: ``[N, C, H, W]`` tensor.
        running_mean, running_var, bn_weight, bn_bias, training, momentum, eps, act, act_param: the batch norm and
            activation, as for :func:`batch_norm_act`.
        weight: ``[C_out, C / groups, kH, kW]`` convolution weight; bias: ``[C_out]`` or None.
        stride, padding, dilation: ints or pairs; groups: as for conv2d.

    Returns:
        The convolution's output.

    Example:
        >>> y = memsave.functional.batch_norm_act_conv2d(h, bn.running_mean, bn.running_var, bn.weight, bn.bias,
        ...                                              conv.weight, conv.bias, training=True, padding=1)
    """
    _check_tensor("batch_norm_act_conv2d", input)
    act, param = resolve_activation(act, act_param)
    weight, bias = _autocast_cast(input.device.type, weight, bias)
    out, _mean, _invstd = torch.ops.memsave.batch_norm_act_conv2d(
        input, bn_weight, bn_bias, running_mean, running_var, bool(training), float(momentum), float(eps), act, param,
        weight, bias, _pair(stride, "stride"), _pair(padding, "padding"), _pair(dilation, "dilation"), int(groups),
    )
    return out


def inplace_abn(
    input: Tensor,
    running_mean: Optional[Tensor],
    running_var: Optional[Tensor],
    weight: Optional[Tensor] = None,
    bias: Optional[Tensor] = None,
    training: bool = False,
    momentum: float = 0.1,
    eps: float = 1e-5,
    act: str = "leaky_relu",
    act_param: Optional[float] = None,
) -> Tensor:
    """In-Place Activated BatchNorm: overwrite ``input`` with ``act(batch_norm(input))``; keep only that for backward.

    The standard parametrization ``act(w * xhat + b)`` is used, so ordinary batch-norm weights apply unchanged.
    Backward inverts the activation and the affine map to recover ``xhat``; see :class:`memsave.nn.InPlaceABN2d`
    for what that implies (weights near 0, elu saturation, reduced precision).

    Args:
        input: ``[N, C, ...]`` tensor that no one else needs afterwards (it is overwritten; autograd raises if a
            saved copy of it is used later, as for any in-place op).
        running_mean, running_var, weight, bias, training, momentum, eps: as for :func:`batch_norm_act`.
        act: ``"leaky_relu"`` (default), ``"elu"`` or ``"identity"``.
        act_param: leaky_relu's negative_slope (0.01) or elu's alpha (1.0); must be > 0.

    Returns:
        ``input`` itself, now holding the output.

    Example:
        >>> h = conv(x)                       # h is needed by nothing else
        >>> h = memsave.functional.inplace_abn(h, rm, rv, w, b, training=True)
    """
    _check_tensor("inplace_abn", input)
    act, param = resolve_activation(act, act_param, invertible=True)
    torch.ops.memsave.inplace_abn(
        input, weight, bias, running_mean, running_var, bool(training), float(momentum), float(eps), act, param
    )
    return input


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

    Example:
        >>> ln, fc = torch.nn.LayerNorm(64), torch.nn.Linear(64, 256)
        >>> y = memsave.functional.layer_norm_linear(x, 64, ln.weight, ln.bias, fc.weight, fc.bias)
    """
    _check_tensor("layer_norm_linear", input)
    shape = [int(normalized_shape)] if isinstance(normalized_shape, int) else [int(s) for s in normalized_shape]
    weight, bias = _autocast_cast(input.device.type, weight, bias)
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

    Example:
        >>> h = fc1(x)
        >>> y = memsave.functional.act_linear(h, fc2.weight, fc2.bias, act="gelu")
    """
    _check_tensor("act_linear", input)
    act, param = resolve_activation(act, act_param)
    # The activation runs in input's dtype and its result is cast to the weight's, as autocast does for act -> Linear.
    weight, bias = _autocast_cast(input.device.type, weight, bias)
    return torch.ops.memsave.act_linear(input, weight, bias, act, param)
