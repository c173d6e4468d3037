"""Functional forms of memsave's memory-efficient operators (``torch.ops.memsave.*`` with autograd).

Each function computes exactly what its ``torch.nn.functional`` namesake computes, but keeps less for backward.
"""
from __future__ import annotations

import torch

__all__ = ["relu"]


def relu(input: torch.Tensor) -> torch.Tensor:
    """ReLU that keeps a 1-bit mask for backward (``ceil(numel / 8)`` bytes) instead of its output.

    Outputs and gradients are bitwise equal to :func:`torch.nn.functional.relu`.

    Args:
        input: a floating-point tensor (float32, float64, float16 or bfloat16) on CPU or CUDA.

    Returns:
        ``max(input, 0)`` with NaN propagated, as torch does.

    Example:
        >>> x = torch.randn(4, 8, requires_grad=True)
        >>> y = memsave.functional.relu(x)
        >>> y.sum().backward()   # x.grad == (x > 0)
    """
    if not isinstance(input, torch.Tensor):
        raise TypeError(f"memsave.functional.relu expects a torch.Tensor, got {type(input).__name__}")
    out, _mask = torch.ops.memsave.relu(input)
    return out


# The fused recompute-in-backward operators (memsave.nn.BatchNormAct2d, InPlaceABN2d, LayerNormLinear, ActLinear).
from ._fused_functional import act_linear, batch_norm_act, inplace_abn, layer_norm_linear  # noqa: E402

__all__ += ["batch_norm_act", "inplace_abn", "layer_norm_linear", "act_linear"]
