"""Batch norm + activation operators: batch_norm_act, batch_norm_act_conv2d and inplace_abn keep the batch-norm
input (inplace_abn: its output) and per-channel statistics for backward."""

from __future__ import annotations

from typing import List, Optional, Sequence, Union

import torch

from .common import Tensor, autocast_cast, check_tensor, resolve_activation


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

    Examples:
        >>> x = torch.randn(8, 16, 32, 32, requires_grad=True)
        >>> rm, rv = torch.zeros(16), torch.ones(16)
        >>> y = memsave.functional.batch_norm_act(x, rm, rv, training=True, act="silu")
    """
    check_tensor("batch_norm_act", input)
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

    Examples:
        >>> y = memsave.functional.batch_norm_act_conv2d(h, bn.running_mean, bn.running_var, bn.weight, bn.bias,
        ...                                              conv.weight, conv.bias, training=True, padding=1)
    """
    check_tensor("batch_norm_act_conv2d", input)
    act, param = resolve_activation(act, act_param)
    weight, bias = autocast_cast(input.device.type, weight, bias)
    out, _mean, _invstd = torch.ops.memsave.batch_norm_act_conv2d(
        input,
        bn_weight,
        bn_bias,
        running_mean,
        running_var,
        bool(training),
        float(momentum),
        float(eps),
        act,
        param,
        weight,
        bias,
        _pair(stride, "stride"),
        _pair(padding, "padding"),
        _pair(dilation, "dilation"),
        int(groups),
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

    Examples:
        >>> h = conv(x)                       # h is needed by nothing else
        >>> h = memsave.functional.inplace_abn(h, rm, rv, w, b, training=True)
    """
    check_tensor("inplace_abn", input)
    act, param = resolve_activation(act, act_param, invertible=True)
    torch.ops.memsave.inplace_abn(
        input, weight, bias, running_mean, running_var, bool(training), float(momentum), float(eps), act, param
    )
    return input
