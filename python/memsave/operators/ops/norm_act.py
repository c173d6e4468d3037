"""Batch norm + activation operators (csrc/ops/norm_act): batch_norm_act, batch_norm_act_conv2d (with its
recompute kernel batch_norm_act_apply) and inplace_abn.

Each registers its fake kernels and its Autograd kernel. All three update the running statistics (inplace_abn also
overwrites its input), so their Autograd kernels are ``autograd.Function`` classes registered through
:meth:`Registrations.mutating_autograd <memsave.operators.ops._registration.Registrations.mutating_autograd>`.

The module holds the family's Python face: the fake kernels and autograd formulas it records for
:func:`memsave.operators.ops.register`, and the functional forms that :mod:`memsave.functional` exports.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple, Type, Union

import torch

from ._common import Tensor, autocast_cast, check_tensor, resolve_activation
from ._registration import Registrations, grads_or_none

#: What this family registers with torch.library, applied by memsave.operators.ops.register().
REGISTRATIONS = Registrations()

# ----------------------------------------------------------------------------------------------------
# memsave::batch_norm_act: batch norm + activation keeping only the batch-norm input and per-channel statistics.
# ----------------------------------------------------------------------------------------------------


def kernel_memory_format(x: Tensor) -> torch.memory_format:
    """The layout the C++ kernels use for ``x`` (mirrors ``bn_memory_format`` in csrc/ops/norm_act/bn_act_common.h)."""
    if x.is_contiguous():
        return torch.contiguous_format
    if x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last):
        return torch.channels_last
    if x.dim() == 5 and x.is_contiguous(memory_format=torch.channels_last_3d):
        return torch.channels_last_3d
    return torch.contiguous_format


def stat_dtype(x: Tensor) -> torch.dtype:
    """Per-channel statistics are float32, or float64 for float64 inputs."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def empty_in_kernel_layout(x: Tensor) -> Tensor:
    """An uninitialised tensor like ``x`` in the memory format the C++ kernels give their outputs."""
    return torch.empty_like(x.contiguous(memory_format=kernel_memory_format(x)))


def bn_backward_fake(x: Tensor, weight: Optional[Tensor]) -> Tuple[Tensor, Tensor, Tensor]:
    """Fake (grad_input, grad_weight, grad_bias) of the fused batch-norm backward kernels for the saved tensor ``x``:
    the parameter gradients take the weight's dtype, or the statistics dtype without affine parameters."""
    param_dtype = weight.dtype if weight is not None else stat_dtype(x)
    grad_weight = x.new_empty((x.shape[1],), dtype=param_dtype)
    return empty_in_kernel_layout(x), grad_weight, torch.empty_like(grad_weight)


def _bn_act_stats_fake(op: str, x: Tensor) -> Tuple[Tensor, Tensor]:
    """Fake per-channel (mean, invstd) of batch_norm_act and inplace_abn for the input ``x``."""
    torch._check(x.dim() >= 2, lambda: f"memsave.{op}: expected [N, C, ...] input, got {x.dim()}-D")
    mean = x.new_empty((x.shape[1],), dtype=stat_dtype(x))
    return mean, torch.empty_like(mean)


# batch_norm_act and inplace_abn take the same arguments (input, weight, bias, running_mean, running_var, training,
# momentum, eps, act, act_param); their backwards take (grad_out, input or output, weight, bias, ...).
@REGISTRATIONS.fake("memsave::batch_norm_act")
def _batch_norm_act_fake(input: Tensor, *args: Any) -> Tuple[Tensor, Tensor, Tensor]:
    return (empty_in_kernel_layout(input), *_bn_act_stats_fake("batch_norm_act", input))


@REGISTRATIONS.fake("memsave::inplace_abn")
def _inplace_abn_fake(self: Tensor, *args: Any) -> Tuple[Tensor, Tensor]:
    return _bn_act_stats_fake("inplace_abn", self)


def _bn_act_backward_fake(grad_out: Tensor, x: Tensor, weight: Optional[Tensor], *args: Any) -> Tuple[Tensor, ...]:
    return bn_backward_fake(x, weight)


REGISTRATIONS.fake("memsave::batch_norm_act_backward")(_bn_act_backward_fake)
REGISTRATIONS.fake("memsave::inplace_abn_backward")(_bn_act_backward_fake)


def _bn_act_forward(ctx: Any, redispatch: Any, args: Sequence[Any], inplace: bool) -> Any:
    """Forward of batch_norm_act and inplace_abn (the same ten arguments: input, weight, bias, running_mean,
    running_var, training, momentum, eps, act, act_param).

    inplace_abn returns only the mutated input: autograd refuses a Function that modifies a view (a channel slice)
    in place and returns more than one tensor. Its (mean, invstd), which need no gradient, are left on
    ``redispatch.stats`` for the Autograd kernel to return.
    """
    x, weight, bias = args[:3]
    ctx.training, ctx.act, ctx.act_param = args[5], args[8], args[9]
    if inplace:
        mean, invstd = redispatch.stats = redispatch(*args)
        ctx.mark_dirty(x)
        # The memory win: x now holds the output, which backward inverts; nothing else of full size is kept.
        ctx.save_for_backward(x, weight, bias, invstd)
        return x
    out, mean, invstd = redispatch(*args)
    # The memory win: the input and two per-channel vectors, not the normalized tensor or activation input.
    ctx.save_for_backward(x, weight, bias, mean, invstd)
    ctx.mark_non_differentiable(mean, invstd)
    return out, mean, invstd


def _bn_act_backward(ctx: Any, grad_out: Optional[Tensor], inplace: bool) -> tuple:
    """Backward of batch_norm_act and inplace_abn: gradients for input, weight and bias only."""
    needs = ctx.needs_input_grad
    if grad_out is None or not any(needs[1:4]):
        return (None,) * 11
    saved, tail = ctx.saved_tensors, (ctx.training, ctx.act, ctx.act_param)
    if inplace:
        grads = torch.ops.memsave.inplace_abn_backward(grad_out, *saved, *tail)
    else:
        grads = torch.ops.memsave.batch_norm_act_backward(grad_out, *saved, *tail)
    return (None,) + grads_or_none(needs[1:4], grads) + (None,) * 7


def _bn_act_function(inplace: bool) -> Type[torch.autograd.Function]:
    """The ``autograd.Function`` of batch_norm_act (``inplace=False``) or inplace_abn (``inplace=True``)."""

    class Function(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, redispatch: Any, *args: Any) -> Any:
            return _bn_act_forward(ctx, redispatch, args, inplace=inplace)

        @staticmethod
        def backward(ctx: Any, grad_out: Optional[Tensor], *_grad_stats: Any) -> tuple:
            return _bn_act_backward(ctx, grad_out, inplace=inplace)

    Function.__name__ = Function.__qualname__ = "_InPlaceABNFunction" if inplace else "_BatchNormActFunction"
    return Function


# ----------------------------------------------------------------------------------------------------
# memsave::batch_norm_act_conv2d: BatchNorm2d -> activation -> Conv2d keeping the batch-norm input and 2 vectors.
# ----------------------------------------------------------------------------------------------------


def conv2d_output_shape(
    input: Tensor, weight: Tensor, stride: List[int], padding: List[int], dilation: List[int]
) -> Tuple[int, int, int, int]:
    """Shape of ``conv2d(input, weight)`` with zero padding."""
    n, _, h, w = input.shape
    kh, kw = weight.shape[2], weight.shape[3]
    ho = (h + 2 * padding[0] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    wo = (w + 2 * padding[1] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    return n, weight.shape[0], ho, wo


@REGISTRATIONS.fake("memsave::batch_norm_act_apply")
def _batch_norm_act_apply_fake(
    input: Tensor,
    mean: Tensor,
    invstd: Tensor,
    weight: Optional[Tensor],
    bias: Optional[Tensor],
    act: str,
    act_param: float,
) -> Tensor:
    return empty_in_kernel_layout(input)


@REGISTRATIONS.fake("memsave::batch_norm_act_conv2d")
def _batch_norm_act_conv2d_fake(
    input: Tensor,
    bn_weight: Optional[Tensor],
    bn_bias: Optional[Tensor],
    running_mean: Optional[Tensor],
    running_var: Optional[Tensor],
    training: bool,
    momentum: float,
    eps: float,
    act: str,
    act_param: float,
    weight: Tensor,
    bias: Optional[Tensor],
    stride: List[int],
    padding: List[int],
    dilation: List[int],
    groups: int,
) -> Tuple[Tensor, Tensor, Tensor]:
    torch._check(input.dim() == 4, lambda: f"memsave.batch_norm_act_conv2d: expected 4-D input, got {input.dim()}-D")
    shape = conv2d_output_shape(input, weight, stride, padding, dilation)
    out = input.new_empty(shape, dtype=weight.dtype).contiguous(memory_format=kernel_memory_format(input))
    mean = input.new_empty((input.shape[1],), dtype=stat_dtype(input))
    return out, mean, torch.empty_like(mean)


@REGISTRATIONS.fake("memsave::batch_norm_act_conv2d_backward")
def _batch_norm_act_conv2d_backward_fake(
    grad_out: Tensor,
    input: Tensor,
    bn_weight: Optional[Tensor],
    bn_bias: Optional[Tensor],
    mean: Tensor,
    invstd: Tensor,
    training: bool,
    act: str,
    act_param: float,
    weight: Tensor,
    has_bias: bool,
    stride: List[int],
    padding: List[int],
    dilation: List[int],
    groups: int,
) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    grad_input, grad_bn_weight, grad_bn_bias = bn_backward_fake(input, bn_weight)
    grad_weight = torch.empty_like(weight).contiguous(memory_format=kernel_memory_format(weight))
    grad_bias = weight.new_empty((weight.shape[0] if has_bias else 0,))
    return grad_input, grad_bn_weight, grad_bn_bias, grad_weight, grad_bias


class _BatchNormActConv2dFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, redispatch: Any, *args: Any) -> Tuple[Tensor, Tensor, Tensor]:
        # args: input, bn_weight, bn_bias, running_mean, running_var, training, momentum, eps, act, act_param,
        # weight, bias, stride, padding, dilation, groups (the schema's order)
        out, mean, invstd = redispatch(*args)
        input, bn_weight, bn_bias = args[:3]
        weight, bias, stride, padding, dilation, groups = args[10:]
        # The memory win: the batch-norm input and two per-channel vectors; not the convolution's input.
        ctx.save_for_backward(input, bn_weight, bn_bias, mean, invstd, weight)
        ctx.training, ctx.act, ctx.act_param = args[5], args[8], args[9]
        ctx.conv = (bias is not None, list(stride), list(padding), list(dilation), groups)
        ctx.mark_non_differentiable(mean, invstd)
        return out, mean, invstd

    @staticmethod
    def backward(ctx: Any, grad_out: Optional[Tensor], _grad_mean: Any, _grad_invstd: Any) -> tuple:
        input, bn_weight, bn_bias, mean, invstd, weight = ctx.saved_tensors
        needs = ctx.needs_input_grad
        if grad_out is None:
            return (None,) * 17
        gi, gbw, gbb, gw, gb = torch.ops.memsave.batch_norm_act_conv2d_backward(
            grad_out, input, bn_weight, bn_bias, mean, invstd, ctx.training, ctx.act, ctx.act_param, weight, *ctx.conv
        )
        head = grads_or_none(needs[1:4], (gi, gbw, gbb))
        tail = grads_or_none(needs[11:13], (gw, gb))
        return (None,) + head + (None,) * 7 + tail + (None,) * 4


REGISTRATIONS.mutating_autograd("memsave::batch_norm_act_conv2d", _BatchNormActConv2dFunction)
REGISTRATIONS.backward_op("memsave::batch_norm_act_conv2d_backward")
REGISTRATIONS.backward_op("memsave::batch_norm_act_apply")


# ----------------------------------------------------------------------------------------------------
# batch_norm_act and inplace_abn (In-Place Activated BatchNorm, keeping only its output, written over its input):
# one registration for both.
# ----------------------------------------------------------------------------------------------------
# inplace_abn's schema returns (mean, invstd); its Function returns the mutated input only (so that autograd rebases
# its history, a view's included) and leaves the statistics on the Redispatch.
for _name, _inplace, _unpack in (
    ("batch_norm_act", False, lambda result, redispatch: result),
    ("inplace_abn", True, lambda result, redispatch: redispatch.stats),
):
    REGISTRATIONS.mutating_autograd(f"memsave::{_name}", _bn_act_function(_inplace), unpack=_unpack)
    REGISTRATIONS.backward_op(f"memsave::{_name}_backward")


# ----------------------------------------------------------------------------------------------------
# The functional forms (memsave.functional).
# ----------------------------------------------------------------------------------------------------
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
