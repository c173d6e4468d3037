"""RMSNorm operators: rms_norm keeps its input and one float per row, rms_norm_linear the norm's input only."""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple, Union

import torch

from .common import Tensor, autocast_cast, check_tensor


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

    Examples:
        >>> norm = transformers_model.model.layers[0].input_layernorm          # a LlamaRMSNorm
        >>> y = memsave.functional.rms_norm(x, norm.weight, norm.variance_epsilon)
    """
    check_tensor("rms_norm", input)
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

    Examples:
        >>> attn = block.self_attn
        >>> q, k, v = memsave.functional.rms_norm_linear(
        ...     x, block.input_layernorm.weight, [attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])
    """
    check_tensor("rms_norm_linear", input)
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
    cast = autocast_cast(input.device.type, *weights, *biases)
    weights, biases = list(cast[: len(weights)]), list(cast[len(weights) :])
    outs = torch.ops.memsave.rms_norm_linear(input, norm_weight, _rms_eps(input, eps), weights, biases)
    return outs[0] if single else tuple(outs)
