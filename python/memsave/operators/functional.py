"""Functional forms of memsave's memory-efficient operators (``torch.ops.memsave.*`` with autograd).

Each function computes what its ``torch.nn.functional`` namesake (or the composition its name spells) computes, but
keeps less for backward:

=========================  ==============================================  ==========================================
function                   memsave keeps for backward                      torch keeps
=========================  ==============================================  ==========================================
``relu``                   1 bit per element                               the output
``leaky_relu``             1 bit per element                               the input (the output when in place)
``dropout``                1 bit per element                               a mask of 1 byte (CPU: of the dtype) each
``max_pool2d``             1 byte per output element + the input's sizes   int64 indices (8 bytes) + the input
``linear_cross_entropy``   one float64 per row (its log-sum-exp); the      the [rows, classes] logits' log-softmax
                           logits exist one tile at a time                 (and the logits and their gradient)
``batch_norm_act``         the BN input + 2 per-channel vectors            the BN output and the activation output
``batch_norm_act_conv2d``  the BN input + 2 per-channel vectors            also the conv's input (activation output)
``inplace_abn``            its output only (written over its input)        BN input, output, activation output
``layer_norm_linear``      the norm's input + per-row mean/rstd            also the normalized tensor
``act_linear``             the activation's input                          its input and output
``rms_norm``               the input + one float per row                   also the float32 normalized tensor (and
                                                                           float32 copies of a 16-bit input)
``rms_norm_linear``        the norm's input (once for several weights)     also the norm's intermediates and output
``gated_act``              gate and up                                     also act(gate)
``gated_act_linear``       gate and up                                     also act(gate) and act(gate) * up
=========================  ==============================================  ==========================================

``inplace=True`` overwrites the input through a mutating operator (schema ``Tensor(a!)``) whose autograd re-bases
the input's history exactly as torch's in-place operators do, so it is safe wherever ``torch.relu_`` is; like
torch, it refuses a leaf tensor that requires grad.
"""

from __future__ import annotations

import operator
from typing import List, Optional, Sequence, Tuple, Union

import torch

from .library.pooling import argmax_input_positions

__all__ = [
    # bit-mask and byte-index operators
    "relu",
    "leaky_relu",
    "dropout",
    "max_pool2d",
    # a loss that never holds the logits
    "linear_cross_entropy",
    # fused recompute-in-backward operators
    "batch_norm_act",
    "batch_norm_act_conv2d",
    "inplace_abn",
    "layer_norm_linear",
    "act_linear",
    "rms_norm",
    "rms_norm_linear",
    "gated_act",
    "gated_act_linear",
    "GATED_ACTIVATIONS",
    "ACTIVATIONS",
    "INVERTIBLE_ACTIVATIONS",
]

Tensor = torch.Tensor

_IntOrPair = Union[int, Sequence[int]]


def _check_tensor(fn: str, input: object) -> torch.Tensor:
    if not isinstance(input, torch.Tensor):
        raise TypeError(f"memsave.functional.{fn} expects a torch.Tensor, got {type(input).__name__}")
    if not input.is_floating_point():
        raise TypeError(
            f"memsave.functional.{fn} expects a floating-point tensor (float32, float64, float16 or bfloat16), "
            f"got {input.dtype}; convert it with .float() or use torch.nn.functional.{fn}"
        )
    return input


def relu(input: torch.Tensor, inplace: bool = False) -> torch.Tensor:
    """ReLU that keeps a 1-bit mask for backward (``ceil(numel / 8)`` bytes) instead of its output.

    Outputs and gradients are bitwise equal to :func:`torch.nn.functional.relu` (``-0.0`` and NaN pass through
    unchanged; NaN passes its gradient, ``-0.0`` does not).

    Args:
        input: a floating-point tensor (float32, float64, float16 or bfloat16) on CPU or CUDA, any strides.
        inplace: overwrite ``input`` with the result (see the module docstring) and return it.

    Returns:
        ``relu(input)``: a new contiguous tensor, or ``input`` itself when ``inplace``.

    Example:
        >>> x = torch.randn(4, 8, requires_grad=True)
        >>> y = memsave.functional.relu(x)
        >>> y.sum().backward()   # x.grad == (x > 0)
    """
    _check_tensor("relu", input)
    if inplace:
        torch.ops.memsave.relu_(input)
        return input
    out, _mask = torch.ops.memsave.relu(input)
    return out


def leaky_relu(input: torch.Tensor, negative_slope: float = 0.01, inplace: bool = False) -> torch.Tensor:
    """LeakyReLU that keeps a 1-bit sign mask for backward instead of its input.

    Outputs and gradients are bitwise equal to :func:`torch.nn.functional.leaky_relu`. Unlike torch's in-place
    form, ``inplace=True`` works with any slope, negative ones included (the mask, not the output, drives backward).

    Args:
        input: a floating-point tensor (float32, float64, float16 or bfloat16) on CPU or CUDA, any strides.
        negative_slope: the slope for ``input <= 0``.
        inplace: overwrite ``input`` with the result and return it.

    Returns:
        ``input > 0 ? input : input * negative_slope``.

    Example:
        >>> y = memsave.functional.leaky_relu(torch.randn(4, 8, requires_grad=True), 0.2)
    """
    _check_tensor("leaky_relu", input)
    slope = float(negative_slope)
    if inplace:
        torch.ops.memsave.leaky_relu_(input, slope)
        return input
    out, _mask = torch.ops.memsave.leaky_relu(input, slope)
    return out


def dropout(input: torch.Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> torch.Tensor:
    """Dropout that keeps a 1-bit keep mask for backward.

    Each element is kept with probability ``1 - p`` and scaled by ``1 / (1 - p)`` (computed as torch's CPU
    dropout does); the gradient passes through the same mask and scale. The bits come from PyTorch's default
    generator of the tensor's device, so ``torch.manual_seed`` reproduces them and checkpoint recompute (which
    restores the RNG state) replays them. The stream differs from ``torch.nn.functional.dropout``'s: same
    distribution, other draws. ``p == 1`` gives exact zeros (torch gives ``input * 0``, which keeps NaN).

    Args:
        input: a floating-point tensor (float32, float64, float16 or bfloat16) on CPU or CUDA, any strides.
        p: probability of an element being zeroed, in ``[0, 1]``.
        training: apply dropout; when False, return ``input`` unchanged (as torch does).
        inplace: overwrite ``input`` with the result and return it.

    Returns:
        The dropped-out tensor (``input`` itself when not training, ``p == 0``, empty, or ``inplace``).

    Raises:
        ValueError: ``p`` outside ``[0, 1]``.

    Example:
        >>> torch.manual_seed(0)
        >>> y = memsave.functional.dropout(torch.ones(8), p=0.5)   # entries are 0.0 or 2.0
    """
    _check_tensor("dropout", input)
    p = float(p)
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"memsave.functional.dropout: dropout probability has to be between 0 and 1, but got {p}")
    if not training or p == 0.0 or input.numel() == 0:
        return input
    if inplace:
        torch.ops.memsave.dropout_(input, p)
        return input
    out, _mask = torch.ops.memsave.dropout(input, p)
    return out


def _pool_pair(fn: str, name: str, value: _IntOrPair) -> List[int]:
    """An int or a 1-/2-sequence of ints as a list of two ints (torch's convention for pooling arguments)."""
    try:
        if isinstance(value, (tuple, list, torch.Size)):
            items = [operator.index(v) for v in value]
        else:
            items = [operator.index(value)]
    except TypeError:
        items = []
    if isinstance(value, bool) or len(items) not in (1, 2):
        raise TypeError(f"memsave.functional.{fn}: {name} must be an int or a tuple of one or two ints, got {value!r}")
    return items * 2 if len(items) == 1 else items


def pool_params(
    kernel_size: _IntOrPair, stride: Optional[_IntOrPair], padding: _IntOrPair, dilation: _IntOrPair
) -> Tuple[List[int], List[int], List[int], List[int]]:
    """``max_pool2d``'s arguments as four int pairs (stride defaults to the kernel), checked as the kernel needs them.

    Raises:
        TypeError, ValueError: a value that is not an int or pair of ints, not positive, or a window over 256
            positions (the 1-byte argmax's limit).

    Example:
        >>> pool_params(2, None, 0, 1)
        ([2, 2], [2, 2], [0, 0], [1, 1])
    """
    k = _pool_pair("max_pool2d", "kernel_size", kernel_size)
    empty_stride = stride is None or (isinstance(stride, (tuple, list)) and len(stride) == 0)
    s = list(k) if empty_stride else _pool_pair("max_pool2d", "stride", stride)  # type: ignore[arg-type]
    pad = _pool_pair("max_pool2d", "padding", padding)
    d = _pool_pair("max_pool2d", "dilation", dilation)
    if min(k) <= 0 or min(s) <= 0 or min(d) <= 0:
        raise ValueError(
            f"memsave.functional.max_pool2d: kernel_size, stride and dilation must be positive, got kernel_size={k}, "
            f"stride={s}, dilation={d}"
        )
    if min(pad) < 0 or pad[0] > k[0] // 2 or pad[1] > k[1] // 2:
        raise ValueError(
            f"memsave.functional.max_pool2d: pad should be between 0 and half of kernel size, but got padding={pad} "
            f"and kernel_size={k}"
        )
    if k[0] * k[1] > 256:
        raise ValueError(
            f"memsave.functional.max_pool2d keeps the in-window argmax in one byte, so a window may hold at most 256 "
            f"positions (16x16), but kernel_size={k} has {k[0] * k[1]}; use torch.nn.functional.max_pool2d for it"
        )
    return k, s, pad, d


def _argmax_to_indices(
    argmax: torch.Tensor, input_hw: Tuple[int, int], k: List[int], s: List[int], pad: List[int], d: List[int]
) -> torch.Tensor:
    """torch-style int64 indices (``h * W + w`` within each plane) from the 1-byte in-window codes."""
    ih, iw = argmax_input_positions(argmax, k, s, pad, d)
    return ih * input_hw[1] + iw


def max_pool2d(
    input: torch.Tensor,
    kernel_size: _IntOrPair,
    stride: Optional[_IntOrPair] = None,
    padding: _IntOrPair = 0,
    dilation: _IntOrPair = 1,
    ceil_mode: bool = False,
    return_indices: bool = False,
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """2D max pooling that keeps the in-window argmax as 1 byte per output element (torch: int64 + its input).

    Takes :func:`torch.nn.functional.max_pool2d`'s arguments with its meaning; outputs and gradients are bitwise
    equal to torch's on CPU. The backward needs only the input's sizes, so the input is not kept alive by this op.

    Args:
        input: (N, C, H, W) or (C, H, W) floating-point tensor, any strides (N may be 0).
        kernel_size: window size, an int or (kH, kW); at most 256 positions (16x16).
        stride: window stride, an int or (sH, sW); default ``kernel_size``.
        padding: implicit -inf padding on each side, an int or (pH, pW), at most half the kernel size.
        dilation: spacing of window elements, an int or (dH, dW).
        ceil_mode: use ceil instead of floor for the output size, as torch.
        return_indices: also return torch-style int64 indices (``h * W + w`` within each plane), computed from
            the 1-byte codes, e.g. for ``max_unpool2d``; they are not kept for backward.

    Returns:
        The pooled tensor (contiguous), or ``(pooled, indices)`` when ``return_indices``.

    Raises:
        TypeError: non-floating input or malformed arguments. ValueError: arguments torch rejects, a window over
            256 positions, or an input that is not 3D/4D.

    Example:
        >>> y = memsave.functional.max_pool2d(torch.randn(2, 3, 8, 8, requires_grad=True), 2)
    """
    _check_tensor("max_pool2d", input)
    k, s, pad, d = pool_params(kernel_size, stride, padding, dilation)
    if input.dim() not in (3, 4):
        raise ValueError(
            f"memsave.functional.max_pool2d: expected a 3D (C, H, W) or 4D (N, C, H, W) input, got shape "
            f"{tuple(input.shape)}"
        )
    out, argmax = torch.ops.memsave.max_pool2d(input, k, s, pad, d, bool(ceil_mode))
    if return_indices:
        return out, _argmax_to_indices(argmax, (input.shape[-2], input.shape[-1]), k, s, pad, d)
    return out


_REDUCTIONS = ("mean", "sum", "none")


def linear_cross_entropy(
    hidden: Tensor,
    weight: Tensor,
    target: Tensor,
    bias: Optional[Tensor] = None,
    *,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    reduction: str = "mean",
) -> Tensor:
    """``cross_entropy(linear(hidden, weight, bias), target)`` without ever holding the logits.

    A language model's head and loss: torch's two operators build the ``[rows, num_classes]`` logits, keep their
    log-softmax for backward and make a gradient of the same size in backward -- the largest tensors of a training
    step at a large vocabulary. This computes the logits one tile at a time (at most 4 Mi of them, 16 MiB in
    float32), folds each tile into a per-row log-sum-exp (an online log-sum-exp over the classes), and keeps only
    that log-sum-exp (one float per row) for backward, which makes the logits again tile by tile and accumulates the
    weight gradient in one buffer. Costs one more matmul of the logits' size than the eager composition; saves
    about ``3 x rows x num_classes`` floats of peak memory.

    The class dimension is the last one: ``hidden [..., in_features]`` and ``target [...]`` are flattened to rows
    (for 2-D hidden this is exactly ``F.cross_entropy(F.linear(hidden, weight, bias), target, ...)``; for more
    dimensions it is that on the flattened rows, which is what Hugging Face's causal-LM loss does). 16-bit inputs are
    computed in float32 (the log-sum-exp, the softmax and the gradients' accumulation across tiles) and the loss is
    returned in the input dtype. Under autocast the matmuls run in the autocast dtype, as ``F.linear`` would, and the
    loss is float32, as autocast's cross_entropy gives it.

    Args:
        hidden: ``[..., in_features]`` floating-point tensor (float32, float64, float16 or bfloat16).
        weight: ``[num_classes, in_features]`` tensor of hidden's dtype and device (an ``lm_head.weight``).
        target: ``[...]`` int64 class indices in ``[0, num_classes)`` or ``ignore_index``, hidden's leading shape.
        bias: ``[num_classes]`` or None.
        ignore_index: target value whose rows count for nothing (loss 0, gradient 0, not in the mean's count).
        label_smoothing: in ``[0, 1]``; as :func:`torch.nn.functional.cross_entropy`'s.
        reduction: ``"mean"`` (over the rows that are not ignored; NaN when all are, as torch), ``"sum"`` or
            ``"none"`` (one loss per row, target's shape).

    Returns:
        The loss: a scalar, or target's shape for ``reduction="none"``; hidden's dtype.

    Raises:
        TypeError: hidden is not floating-point, weight or bias has another dtype, target is not int64.
        ValueError: shapes that do not fit (naming the argument), label_smoothing outside ``[0, 1]``, an unknown
            reduction.
        IndexError: a target that is neither a class index nor ``ignore_index`` (checked in forward, one device
            sync).
        RuntimeError: weight, target or bias on another device than hidden.

    Example:
        >>> hidden = model.transformer(input_ids).last_hidden_state[:, :-1]        # [batch, seq - 1, d]
        >>> loss = memsave.functional.linear_cross_entropy(hidden, model.lm_head.weight, input_ids[:, 1:])
        >>> loss.backward()
    """
    _check_tensor("linear_cross_entropy", hidden)
    for name, value in (("weight", weight), ("target", target), ("bias", bias)):
        if value is not None and not isinstance(value, torch.Tensor):
            raise TypeError(
                f"memsave.functional.linear_cross_entropy: {name} must be a torch.Tensor, got {type(value).__name__}"
            )
    if reduction not in _REDUCTIONS:
        raise ValueError(
            f"memsave.functional.linear_cross_entropy: reduction must be 'mean', 'sum' or 'none', got {reduction!r}"
        )
    device_type = hidden.device.type
    autocast = device_type in ("cpu", "cuda") and torch.is_autocast_enabled(device_type)
    hidden, weight, bias = _autocast_cast(device_type, hidden, weight, bias)
    loss, _lse = torch.ops.memsave.linear_cross_entropy(
        hidden, weight, target, bias, int(ignore_index), float(label_smoothing), reduction
    )
    # Autocast runs cross_entropy in float32 (the logits are cast up), so its loss is float32.
    return loss.float() if autocast else loss


# ----------------------------------------------------------------------------------------------------
# Fused recompute-in-backward operators (memsave.nn.BatchNormAct2d, InPlaceABN2d, BatchNormActConv2d,
# LayerNormLinear, ActLinear): each fuses two torch operations into one operator that keeps less for backward
# and recomputes the cheap intermediate there.
# ----------------------------------------------------------------------------------------------------
#: Activation names the fused operators accept.
ACTIVATIONS: Tuple[str, ...] = ("identity", "relu", "leaky_relu", "elu", "gelu", "gelu_tanh", "silu")
#: Activations :func:`inplace_abn` can invert (with a positive parameter).
INVERTIBLE_ACTIVATIONS: Tuple[str, ...] = ("identity", "leaky_relu", "elu")
_DEFAULT_PARAM = {"leaky_relu": 0.01, "elu": 1.0}


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
            raise ValueError(f"{act} needs a positive parameter (negative_slope / alpha) to be invertible, got {param}")
    return act, param


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


# ----------------------------------------------------------------------------------------------------
# Transformer operators (memsave.nn.RMSNorm, RMSNormLinear, GatedMLP): RMSNorm that keeps one float per row instead
# of float32 copies, RMSNorm -> Linear(s) that keeps the norm's input only, and the gated MLP's act(gate) * up ->
# down projection that keeps gate and up only.
# ----------------------------------------------------------------------------------------------------
#: Activations of a gated linear unit (:func:`gated_act`, :func:`gated_act_linear`, :class:`memsave.nn.GatedMLP`):
#: silu (SwiGLU), gelu (GeGLU), gelu_tanh (GeGLU with the tanh approximation), relu (ReGLU), identity (bilinear).
GATED_ACTIVATIONS: Tuple[str, ...] = ("silu", "gelu", "gelu_tanh", "relu", "identity")


def _rms_eps(input: Tensor, eps: Optional[float]) -> float:
    # eps=None is torch.nn.RMSNorm's default: the machine epsilon of the input's dtype.
    return float(torch.finfo(input.dtype).eps) if eps is None else float(eps)


def rms_norm(input: Tensor, weight: Optional[Tensor] = None, eps: Optional[float] = 1e-6) -> Tensor:
    """RMSNorm over the last dimension, keeping ``input`` and one float per row for backward.

    Computes Hugging Face's ``LlamaRMSNorm`` value for value: the mean of squares and the normalization in float32
    (float64 for float64 input), the normalized tensor rounded to the input dtype, then multiplied by ``weight``; the
    result has ``promote(input.dtype, weight.dtype)``. Eager LlamaRMSNorm keeps a float32 copy of a 16-bit input, the
    float32 normalized tensor and its rounded copy for backward; this keeps the input and the per-row reciprocal RMS.

    Args:
        input: ``[..., hidden]`` floating-point tensor (float32, float64, float16 or bfloat16), any strides.
        weight: ``[hidden]`` scale, or None.
        eps: added to the mean of squares; None means ``torch.finfo(input.dtype).eps`` (torch.nn.RMSNorm's default).

    Returns:
        The normalized tensor, ``input``'s shape.

    Raises:
        TypeError: ``input`` is not a floating-point tensor.
        ValueError: ``weight`` does not have shape ``[hidden]``, or eps < 0.
        RuntimeError: ``weight`` is on another device than ``input``.

    Example:
        >>> norm = transformers_model.model.layers[0].input_layernorm          # a LlamaRMSNorm
        >>> y = memsave.functional.rms_norm(x, norm.weight, norm.variance_epsilon)
    """
    _check_tensor("rms_norm", input)
    out, _rstd = torch.ops.memsave.rms_norm(input, weight, _rms_eps(input, eps))
    return out


def rms_norm_linear(
    input: Tensor,
    norm_weight: Optional[Tensor],
    weight: Union[Tensor, Sequence[Tensor]],
    bias: Union[Tensor, Sequence[Optional[Tensor]], None] = None,
    eps: Optional[float] = 1e-6,
) -> Union[Tensor, Tuple[Tensor, ...]]:
    """``linear(rms_norm(input), weight, bias)`` for one or several Linears, keeping only ``input`` for backward.

    The normalized tensor that the Linears read (and that torch would keep for their weight gradients) is
    recomputed in backward, together with the per-row statistic. Several Linears that read the same norm -- a Llama
    block's q/k/v or gate/up projections -- share one normalized tensor in forward and one recompute in backward.
    Under autocast the Linears run in the autocast dtype and the norm in the input's, as with the torch ops.

    Args:
        input: ``[..., hidden]`` floating-point tensor.
        norm_weight: the RMSNorm's ``[hidden]`` weight, or None.
        weight: a ``[out_features, hidden]`` Linear weight, or a sequence of them.
        bias: None, a ``[out_features]`` bias (one weight), or a sequence with one bias per weight: all tensors or
            all None.
        eps: the RMSNorm's eps (None: ``torch.finfo(input.dtype).eps``).

    Returns:
        ``[..., out_features]`` tensor, or a tuple with one per weight when ``weight`` is a sequence.

    Raises:
        TypeError: ``input`` is not a floating-point tensor.
        ValueError: shapes that do not chain, a bias list of another length or mixing tensors and None.
        RuntimeError: parameters on another device than ``input``.

    Example:
        >>> attn = block.self_attn
        >>> q, k, v = memsave.functional.rms_norm_linear(
        ...     x, block.input_layernorm.weight, [attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])
    """
    _check_tensor("rms_norm_linear", input)
    single = isinstance(weight, Tensor)
    weights = [weight] if single else list(weight)
    if bias is None or isinstance(bias, Tensor):
        biases: List[Optional[Tensor]] = [bias] if single else [None] * len(weights)
        if not single and bias is not None:
            raise ValueError(
                "memsave.functional.rms_norm_linear: give one bias per weight (a list) for several weights"
            )
    else:
        biases = list(bias)
    if len(biases) != len(weights):
        raise ValueError(
            f"memsave.functional.rms_norm_linear: {len(biases)} biases for {len(weights)} weights; give one per weight"
        )
    if any(b is None for b in biases) and any(b is not None for b in biases):
        raise ValueError(
            "memsave.functional.rms_norm_linear: the biases must be all tensors or all None (autograd sees a list "
            "mixing the two as one constant); give zero biases to the Linears without one"
        )
    cast = _autocast_cast(input.device.type, *weights, *biases)
    weights, biases = list(cast[: len(weights)]), list(cast[len(weights) :])
    outs = torch.ops.memsave.rms_norm_linear(input, norm_weight, _rms_eps(input, eps), weights, biases)
    return outs[0] if single else tuple(outs)


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

    Example:
        >>> h = memsave.functional.gated_act(mlp.gate_proj(x), mlp.up_proj(x), "silu")
    """
    _check_tensor("gated_act", gate)
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

    Example:
        >>> y = memsave.functional.gated_act_linear(mlp.gate_proj(x), mlp.up_proj(x), mlp.down_proj.weight)
    """
    _check_tensor("gated_act_linear", gate)
    act = resolve_gated_activation("gated_act_linear", act)
    weight, bias = _autocast_cast(gate.device.type, weight, bias)
    return torch.ops.memsave.gated_act_linear(gate, up, weight, bias, act)
