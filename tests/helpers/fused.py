"""Shared helpers of the fused-operator tests (operators/test_batch_norm_act, test_inplace_abn, test_fused_linear,
test_convert_fused): unfused torch references, error measures and the saved-tensor byte counter."""

from __future__ import annotations

from typing import Any, Callable, Dict, Tuple

import torch
import torch.nn.functional as TF

# Bytes autograd saves for backward, each storage once: convert's probes count them the same way.
from memsave.operators.convert.probe import saved_bytes as saved_bytes

Tensor = torch.Tensor

#: The unfused torch form of every fused activation name (with its default parameter).
TORCH_ACTS: Dict[str, Callable[[Tensor], Tensor]] = {
    "identity": lambda x: x,
    "relu": TF.relu,
    "leaky_relu": lambda x: TF.leaky_relu(x, 0.01),
    "elu": TF.elu,
    "gelu": TF.gelu,
    "gelu_tanh": lambda x: TF.gelu(x, approximate="tanh"),
    "silu": TF.silu,
}

#: float32 outputs and gradients must match the unfused torch reference to this relative error.
FLOAT32_RTOL = 1e-5


def rel_err(actual: Tensor, expected: Tensor) -> float:
    """max |actual - expected| / max |expected| (0 when both are zero)."""
    scale = expected.detach().double().abs().max().item()
    diff = (actual.detach().double() - expected.detach().double()).abs().max().item()
    return diff / scale if scale > 0 else diff


def max_abs_err(actual: Tensor, expected: Tensor) -> float:
    return (actual.detach().double() - expected.detach().double()).abs().max().item()


def assert_low_precision_ok(ours: Tensor, torchs: Tensor, ref64: Tensor, what: str) -> None:
    """flash-attention's rule: a low-precision kernel may err at most twice as much as PyTorch's own low-precision
    computation does against a float64 reference (plus half an ulp of the result's scale, for when torch happens to
    be exact)."""
    floor = 0.5 * torch.finfo(ours.dtype).eps * ref64.abs().max().item()
    err_ours, err_torch = max_abs_err(ours, ref64), max_abs_err(torchs, ref64)
    assert err_ours <= 2 * err_torch + floor, (
        f"{what}: error {err_ours:.3g} > 2 x torch's {err_torch:.3g} + {floor:.3g}"
    )


def leaf_copies(*tensors: Any, dtype: Any = None) -> Tuple[Any, ...]:
    """Detached copies (optionally cast) that require grad where the original did; None stays None."""
    out = []
    for t in tensors:
        if t is None:
            out.append(None)
            continue
        c = t.detach().clone() if dtype is None else t.detach().to(dtype)
        out.append(c.requires_grad_(t.requires_grad))
    return tuple(out)


def module_state(module: torch.nn.Module) -> Tuple[Tensor, ...]:
    """Parameters and buffers of ``module`` (to exclude from saved_bytes)."""
    return tuple(module.parameters()) + tuple(module.buffers())


#: The memory formats the batch-norm tests run the fused kernels in.
BN_FORMATS = {"contiguous": torch.contiguous_format, "channels_last": torch.channels_last}


def bn_reference(x, rm, rv, w, b, training, act, momentum=0.1, eps=1e-5):
    """torch's unfused batch norm followed by the activation named ``act``."""
    return TORCH_ACTS[act](TF.batch_norm(x, rm, rv, w, b, training, momentum, eps))


def bn_low_precision_grads(fn: Callable[..., Tensor], x: Tensor, w: Tensor, b: Tensor, dtype: Any, act: str):
    """A training-mode batch norm + ``act`` the autocast way (``x`` cast to the low-precision ``dtype``, float32
    parameters): ``fn(x, None, None, w, b, True, act=act)`` against torch's composition in ``dtype`` and a float64
    reference. Asserts the output is in ``dtype`` and within :func:`assert_low_precision_ok`; returns the input,
    weight and bias gradients of the three (ours, torch's, the reference's) for one seeded output gradient."""
    x_lp = x.detach().to(dtype).requires_grad_()
    x64, w64, b64 = leaf_copies(x_lp, w, b, dtype=torch.float64)
    xt, wt, bt = leaf_copies(x_lp, w, b)
    y = fn(x_lp, None, None, w, b, True, act=act)
    yt = bn_reference(xt, None, None, wt, bt, True, act)
    y64 = bn_reference(x64, None, None, w64, b64, True, act)
    assert y.dtype == dtype
    assert_low_precision_ok(y, yt, y64, "output")
    g = torch.randn(y.shape, generator=torch.Generator().manual_seed(4)).to(dtype)
    ours = torch.autograd.grad(y, (x_lp, w, b), g)
    torchs = torch.autograd.grad(yt, (xt, wt, bt), g)
    refs = torch.autograd.grad(y64, (x64, w64, b64), g.double())
    return ours, torchs, refs


def bn_inputs(
    shape=(4, 5, 6, 7), fmt=torch.contiguous_format, dtype=torch.float32, seed=0, bias_scale=1.0, mean_scale=1.0
):
    """Seeded (x, weight, bias, running_mean, running_var) for a batch norm; x, weight and bias require grad.
    ``bias_scale`` and ``mean_scale`` scale the bias and the running mean."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g, dtype=dtype).to(memory_format=fmt).requires_grad_()
    c = shape[1]
    w = (torch.rand(c, generator=g, dtype=dtype) + 0.5).requires_grad_()
    b = (bias_scale * torch.randn(c, generator=g, dtype=dtype)).requires_grad_()
    rm = mean_scale * torch.randn(c, generator=g, dtype=dtype)
    rv = torch.rand(c, generator=g, dtype=dtype) + 0.5
    return x, w, b, rm, rv
