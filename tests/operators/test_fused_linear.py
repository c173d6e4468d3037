"""memsave::layer_norm_linear, layer_norm_apply, act_linear and memsave.nn.LayerNormLinear / ActLinear: against the
unfused torch modules, plus the transformer-block saved-bytes claim."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as TF
from torch import nn

import memsave  # noqa: F401  (loads the operators)
from helpers.checks import assert_module_matches, assert_no_double_backward
from helpers.fused import (
    FLOAT32_RTOL,
    TORCH_ACTS,
    assert_low_precision_ok,
    leaf_copies,
    module_state,
    rel_err,
    saved_bytes,
)
from memsave import functional as MF
from memsave.nn import ActLinear, DeferredLayerNorm, LayerNormLinear, fuse_layer_norm_linear


def _ln_inputs(shape=(3, 5, 16), out_features=12, dtype=torch.float32, seed=0, affine=True, bias=True):
    g = torch.Generator().manual_seed(seed)
    d = shape[-1]
    x = (2 * torch.randn(shape, generator=g, dtype=dtype) + 0.5).requires_grad_()
    lw = (torch.rand(d, generator=g, dtype=dtype) + 0.5).requires_grad_() if affine else None
    lb = torch.randn(d, generator=g, dtype=dtype).requires_grad_() if affine else None
    w = (torch.randn(out_features, d, generator=g, dtype=dtype) / d**0.5).requires_grad_()
    b = torch.randn(out_features, generator=g, dtype=dtype).requires_grad_() if bias else None
    return x, lw, lb, w, b


def _grads(out, inputs, g):
    present = [t for t in inputs if t is not None]
    return torch.autograd.grad(out, present, g)


# ------------------------------------------------------------------------------------------------ layer_norm_linear
@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(3, 5, 16), (7, 16), (16,)])
def test_layer_norm_linear_matches_unfused_float32(shape, bias, affine):
    x, lw, lb, w, b = _ln_inputs(shape, affine=affine, bias=bias)
    x2, lw2, lb2, w2, b2 = leaf_copies(x, lw, lb, w, b)
    y = MF.layer_norm_linear(x, shape[-1], lw, lb, w, b)
    y2 = TF.linear(TF.layer_norm(x2, (shape[-1],), lw2, lb2), w2, b2)
    assert y.shape == y2.shape and rel_err(y, y2) <= FLOAT32_RTOL
    g = torch.randn_like(y)
    for o, r in zip(_grads(y, (x, lw, lb, w, b), g), _grads(y2, (x2, lw2, lb2, w2, b2), g)):
        assert rel_err(o, r) <= FLOAT32_RTOL


def test_layer_norm_linear_two_dim_normalized_shape_and_non_contiguous_input():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 6, 3, 8, generator=g).transpose(1, 2).requires_grad_()  # (4, 3, 6, 8) non-contiguous
    lw, lb = torch.rand(6, 8, generator=g).requires_grad_(), torch.randn(6, 8, generator=g).requires_grad_()
    w, b = torch.randn(5, 8, generator=g).requires_grad_(), torch.randn(5, generator=g).requires_grad_()
    x2, lw2, lb2, w2, b2 = leaf_copies(x, lw, lb, w, b)
    y = MF.layer_norm_linear(x, (6, 8), lw, lb, w, b, eps=1e-3)
    y2 = TF.linear(TF.layer_norm(x2, (6, 8), lw2, lb2, eps=1e-3), w2, b2)
    assert rel_err(y, y2) <= FLOAT32_RTOL
    gy = torch.randn_like(y)
    for o, r in zip(_grads(y, (x, lw, lb, w, b), gy), _grads(y2, (x2, lw2, lb2, w2, b2), gy)):
        assert rel_err(o, r) <= FLOAT32_RTOL


def test_layer_norm_linear_gradcheck_float64():
    x, lw, lb, w, b = _ln_inputs((2, 3, 5), out_features=4, dtype=torch.float64)
    torch.autograd.gradcheck(lambda *a: MF.layer_norm_linear(a[0], 5, a[1], a[2], a[3], a[4]), (x, lw, lb, w, b))
    torch.autograd.gradcheck(lambda x, w: MF.layer_norm_linear(x, 5, None, None, w), (x, w), fast_mode=True)


def test_layer_norm_linear_opcheck():
    x, lw, lb, w, b = _ln_inputs((2, 3, 8), out_features=6, dtype=torch.float64)
    for args in (
        (x, [8], lw, lb, 1e-5, w, b),
        (x, [8], None, None, 1e-5, w, None),
        (x, [3, 8], None, None, 1e-5, w, b),
    ):
        torch.library.opcheck(torch.ops.memsave.layer_norm_linear.default, args)
    out, mean, rstd = torch.ops.memsave.layer_norm_linear(x, [8], lw, lb, 1e-5, w, b)
    d = [t.detach() for t in (x, lw, lb, w)]
    gy = torch.randn_like(out)
    torch.library.opcheck(
        torch.ops.memsave.layer_norm_linear_backward.default, (gy, d[0], [8], mean, rstd, d[1], d[2], d[3], True)
    )
    torch.library.opcheck(
        torch.ops.memsave.layer_norm_linear_backward.default, (gy, d[0], [8], mean, rstd, None, None, d[3], False)
    )
    torch.library.opcheck(
        torch.ops.memsave.layer_norm_apply.default, (d[0], [8], mean, rstd, d[1], d[2], torch.float32)
    )
    torch.library.opcheck(torch.ops.memsave.layer_norm_apply.default, (d[0], [8], mean, rstd, None, None))


def test_layer_norm_apply_recomputes_the_norm():
    x = torch.randn(4, 7, 10, dtype=torch.float64)
    w, b = torch.rand(10, dtype=torch.float64), torch.randn(10, dtype=torch.float64)
    y, mean, rstd = torch.native_layer_norm(x, [10], w, b, 1e-5)
    assert rel_err(torch.ops.memsave.layer_norm_apply(x, [10], mean, rstd, w, b), y) <= 1e-14
    half = torch.ops.memsave.layer_norm_apply(x, [10], mean, rstd, w, b, torch.float16)
    assert half.dtype == torch.float16 and (half.double() - y).abs().max() <= 2**-11 * y.abs().max()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_layer_norm_linear_low_precision(dtype):
    x, lw, lb, w, b = _ln_inputs((4, 8, 32), out_features=24, seed=2)
    args = [t.detach().to(dtype).requires_grad_() for t in (x, lw, lb, w, b)]
    a64 = leaf_copies(*args, dtype=torch.float64)
    at = leaf_copies(*args)
    y = MF.layer_norm_linear(args[0], 32, *args[1:])
    yt = TF.linear(TF.layer_norm(at[0], (32,), at[1], at[2]), at[3], at[4])
    y64 = TF.linear(TF.layer_norm(a64[0], (32,), a64[1], a64[2]), a64[3], a64[4])
    assert y.dtype == dtype
    assert_low_precision_ok(y, yt, y64, "output")
    g = torch.randn(y.shape, generator=torch.Generator().manual_seed(3)).to(dtype)
    names = ("input", "ln_weight", "ln_bias", "weight", "bias")
    for name, o, t, r in zip(names, _grads(y, args, g), _grads(yt, at, g), _grads(y64, a64, g.double())):
        assert_low_precision_ok(o, t, r, f"grad {name}")


def test_layer_norm_linear_autocast_cpu_bfloat16():
    torch.manual_seed(0)
    ln, fc = nn.LayerNorm(32), nn.Linear(32, 16)
    fused = LayerNormLinear.from_modules(copy.deepcopy(ln), copy.deepcopy(fc))
    x = torch.randn(4, 32, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = fused(x)
        y2 = fc(ln(x2))
    assert y.dtype == y2.dtype == torch.bfloat16
    assert rel_err(y, y2) <= 1e-2
    g = torch.randn_like(y)
    ours = torch.autograd.grad(y, (x, fused.weight, fused.norm.weight), g)
    refs = torch.autograd.grad(y2, (x2, fc.weight, ln.weight), g)
    for o, r in zip(ours, refs):
        assert o.dtype == r.dtype == torch.float32  # float32 parameters and input keep float32 gradients
        assert rel_err(o, r) <= 2e-2


# ------------------------------------------------------------------------------------------------------ act_linear
@pytest.mark.parametrize("act", list(TORCH_ACTS))
def test_act_linear_matches_unfused_bitwise(act):
    """Same matmuls and torch's own activation backward kernels: bitwise equal on CPU float32."""
    g = torch.Generator().manual_seed(4)
    x = torch.randn(3, 5, 16, generator=g).requires_grad_()
    w, b = torch.randn(12, 16, generator=g).requires_grad_(), torch.randn(12, generator=g).requires_grad_()
    x2, w2, b2 = leaf_copies(x, w, b)
    y = MF.act_linear(x, w, b, act)
    y2 = TF.linear(TORCH_ACTS[act](x2), w2, b2)
    assert torch.equal(y, y2)
    gy = torch.randn_like(y)
    for o, r in zip(_grads(y, (x, w, b), gy), _grads(y2, (x2, w2, b2), gy)):
        assert torch.equal(o, r)


@pytest.mark.parametrize("act", ["gelu", "gelu_tanh", "silu", "relu", "leaky_relu", "elu"])
def test_act_linear_gradcheck_float64(act):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 3, 5, generator=g, dtype=torch.float64).requires_grad_()
    w = torch.randn(4, 5, generator=g, dtype=torch.float64).requires_grad_()
    b = torch.randn(4, generator=g, dtype=torch.float64).requires_grad_()
    torch.autograd.gradcheck(lambda x, w, b: MF.act_linear(x, w, b, act), (x, w, b))
    torch.autograd.gradcheck(lambda x, w: MF.act_linear(x, w, None, act), (x, w), fast_mode=True)


def test_act_linear_opcheck():
    g = torch.Generator().manual_seed(6)
    x = torch.randn(2, 3, 8, generator=g, dtype=torch.float64).requires_grad_()
    w = torch.randn(6, 8, generator=g, dtype=torch.float64).requires_grad_()
    b = torch.randn(6, generator=g, dtype=torch.float64).requires_grad_()
    torch.library.opcheck(torch.ops.memsave.act_linear.default, (x, w, b, "gelu", 0.0))
    torch.library.opcheck(torch.ops.memsave.act_linear.default, (x, w, None, "leaky_relu", 0.2))
    torch.library.opcheck(torch.ops.memsave.act_linear.default, (x.detach().float(), w.float(), b.float(), "silu", 0.0))
    gy = torch.randn(2, 3, 6, dtype=torch.float64)
    torch.library.opcheck(
        torch.ops.memsave.act_linear_backward.default, (gy, x.detach(), w.detach(), True, "gelu_tanh", 0.0)
    )
    xt = x.detach().transpose(0, 1)  # non-contiguous input: the input gradient is still contiguous
    torch.library.opcheck(
        torch.ops.memsave.act_linear_backward.default, (gy.transpose(0, 1), xt, w.detach(), False, "elu", 1.0)
    )


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("act", ["gelu", "silu"])
def test_act_linear_low_precision(dtype, act):
    g = torch.Generator().manual_seed(7)
    args = [
        torch.randn(4, 8, 32, generator=g).to(dtype).requires_grad_(),
        (torch.randn(24, 32, generator=g) / 6).to(dtype).requires_grad_(),
        torch.randn(24, generator=g).to(dtype).requires_grad_(),
    ]
    a64, at = leaf_copies(*args, dtype=torch.float64), leaf_copies(*args)
    y = MF.act_linear(*args, act=act)
    yt = TF.linear(TORCH_ACTS[act](at[0]), at[1], at[2])
    y64 = TF.linear(TORCH_ACTS[act](a64[0]), a64[1], a64[2])
    assert_low_precision_ok(y, yt, y64, "output")
    gy = torch.randn(y.shape, generator=g).to(dtype)
    for name, o, t, r in zip(
        ("input", "weight", "bias"), _grads(y, args, gy), _grads(yt, at, gy), _grads(y64, a64, gy.double())
    ):
        assert_low_precision_ok(o, t, r, f"grad {name}")


def test_act_linear_autocast_cpu_bfloat16():
    torch.manual_seed(0)
    fc = nn.Linear(32, 16)
    fused = ActLinear.from_linear(copy.deepcopy(fc), act="gelu")
    x = torch.randn(4, 32, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y, y2 = fused(x), fc(TF.gelu(x2))
    assert y.dtype == torch.bfloat16 and torch.equal(y, y2)
    gy = torch.randn_like(y)
    for o, r in zip(
        torch.autograd.grad(y, (x, fused.weight, fused.bias), gy), torch.autograd.grad(y2, (x2, fc.weight, fc.bias), gy)
    ):
        assert o.dtype == r.dtype and torch.equal(o, r)


# ----------------------------------------------------------------------------------------------------------- modules
def test_modules_construct_like_torch_and_keep_keys():
    torch.manual_seed(0)
    ref = nn.Sequential(nn.LayerNorm(16), nn.Linear(16, 8))
    torch.manual_seed(0)
    fused = LayerNormLinear(16, 8)
    assert torch.equal(fused.weight, ref[1].weight) and torch.equal(fused.bias, ref[1].bias)
    assert sorted(fused.state_dict()) == ["bias", "norm.bias", "norm.weight", "weight"]
    torch.manual_seed(0)
    lin = nn.Linear(16, 8)
    torch.manual_seed(0)
    act_lin = ActLinear(16, 8, act="silu")
    assert list(act_lin.state_dict()) == list(lin.state_dict()) and torch.equal(act_lin.weight, lin.weight)
    assert "act=silu" in repr(act_lin) and "LayerNormLinear" in repr(fused)
    x = torch.randn(3, 16)
    assert rel_err(fused(x), ref(x)) <= FLOAT32_RTOL


def test_fuse_layer_norm_linear_keeps_state_dict_keys_and_values():
    torch.manual_seed(0)
    model = nn.Sequential(nn.LayerNorm(16), nn.Linear(16, 8), nn.GELU(), nn.Linear(8, 4))
    ref = copy.deepcopy(model)
    model[0], model[1] = fuse_layer_norm_linear(model[0], model[1])
    model[2], model[3] = nn.Identity(), ActLinear.from_linear(model[3], act="gelu")
    assert isinstance(model[0], DeferredLayerNorm)
    assert list(model.state_dict()) == list(ref.state_dict())
    assert_module_matches(model, ref, torch.randn(5, 16, requires_grad=True))
    model.load_state_dict(ref.state_dict())
    copied = copy.deepcopy(model)  # the norm reference follows the copy
    assert copied[1]._norm() is copied[0]


def test_bad_input():
    with pytest.raises(ValueError, match="unknown activation"):
        ActLinear(4, 4, act="tanh")
    with pytest.raises(ValueError, match="unknown activation"):
        MF.act_linear(torch.randn(2, 4), torch.randn(3, 4), act="softplus")
    with pytest.raises(ValueError, match="unknown activation"):
        torch.ops.memsave.act_linear(torch.randn(2, 4), torch.randn(3, 4), None, "mish", 0.0)
    with pytest.raises(ValueError, match="weight must have shape"):
        MF.act_linear(torch.randn(2, 4), torch.randn(3, 5))
    with pytest.raises(ValueError, match="normalized_shape"):
        MF.layer_norm_linear(torch.randn(2, 4), 5, None, None, torch.randn(3, 4))
    with pytest.raises(ValueError, match="weight must have shape"):
        MF.layer_norm_linear(torch.randn(2, 4), 4, None, None, torch.randn(3, 5))
    with pytest.raises(ValueError, match="does not feed"):
        LayerNormLinear.from_modules(nn.LayerNorm(4), nn.Linear(5, 3))
    with pytest.raises(TypeError):
        MF.layer_norm_linear("x", 4, None, None, torch.randn(3, 4))


def test_double_backward_raises():
    x = torch.randn(2, 4, requires_grad=True)
    w = torch.randn(3, 4, requires_grad=True)
    assert_no_double_backward(
        x,
        lambda: MF.act_linear(x, w, act="gelu").square().sum(),
        lambda: MF.layer_norm_linear(x, 4, None, None, w).square().sum(),
    )


# ------------------------------------------------------------------------------------------------------ saved bytes
class _Attention(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads, self.qkv, self.proj = heads, nn.Linear(d, 3 * d), nn.Linear(d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = TF.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class _Block(nn.Module):
    """Pre-norm GPT-2 block (dropout 0: masks would be kept by both sides alike)."""

    def __init__(self, d: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.ln_1, self.attn, self.ln_2 = nn.LayerNorm(d), _Attention(d, heads), nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(approximate="tanh"), nn.Linear(4 * d, d))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


def test_transformer_block_keeps_at_most_70_percent():
    torch.manual_seed(0)
    block = _Block()
    fused = copy.deepcopy(block)
    fused.ln_1, fused.attn.qkv = fuse_layer_norm_linear(fused.ln_1, fused.attn.qkv)
    fused.ln_2, fused.mlp[0] = fuse_layer_norm_linear(fused.ln_2, fused.mlp[0])
    fused.mlp[1], fused.mlp[2] = nn.Identity(), ActLinear.from_linear(fused.mlp[2], act="gelu_tanh")
    x = torch.randn(2, 32, 64, requires_grad=True)
    eager_bytes, y_eager = saved_bytes(lambda: block(x), module_state(block))
    fused_bytes, y_fused = saved_bytes(lambda: fused(x), module_state(fused))
    # Unit U = one [2, 32, 64] float32 tensor (16 KiB). Eager keeps ~16 U, fused ~10 U (62.8%): the two
    # normalized tensors (2 U) and the GELU output (4 U) are recomputed.
    assert fused_bytes <= 0.70 * eager_bytes, (fused_bytes, eager_bytes)
    assert rel_err(y_fused, y_eager) <= FLOAT32_RTOL
    gy = torch.randn_like(y_eager)
    for o, r in zip(
        torch.autograd.grad(y_fused, [x, *fused.parameters()], gy),
        torch.autograd.grad(y_eager, [x, *block.parameters()], gy),
    ):
        assert rel_err(o, r) <= FLOAT32_RTOL


# ------------------------------------------------------------------------------------------------------------ CUDA


@pytest.mark.cuda
def test_cuda_fused_linear_matches_float64_and_autocast():
    x, lw, lb, w, b = _ln_inputs((4, 16, 64), out_features=48, seed=8)
    cu = [t.detach().cuda().requires_grad_() for t in (x, lw, lb, w, b)]
    a64 = leaf_copies(x, lw, lb, w, b, dtype=torch.float64)
    y = MF.layer_norm_linear(cu[0], 64, *cu[1:])
    y64 = TF.linear(TF.layer_norm(a64[0], (64,), a64[1], a64[2]), a64[3], a64[4])
    assert rel_err(y.cpu(), y64) <= FLOAT32_RTOL
    gy = torch.randn(y.shape, generator=torch.Generator().manual_seed(9))
    for o, r in zip(_grads(y, cu, gy.cuda()), _grads(y64, a64, gy.double())):
        assert rel_err(o.cpu(), r) <= FLOAT32_RTOL
    torch.library.opcheck(
        torch.ops.memsave.layer_norm_apply.default,
        (
            cu[0].detach().half(),
            [64],
            torch.zeros(4, 16, 1, device="cuda"),
            torch.ones(4, 16, 1, device="cuda"),
            None,
            None,
            torch.float16,
        ),
    )
    # autocast: the norm in float32, the Linear in float16, as torch does.
    ln, fc = nn.LayerNorm(64).cuda(), nn.Linear(64, 48).cuda()
    fused = LayerNormLinear.from_modules(ln, fc)
    xa = torch.randn(4, 16, 64, device="cuda")
    with torch.autocast("cuda", dtype=torch.float16):
        ya, yr = fused(xa), fc(ln(xa))
        yg = ActLinear.from_linear(fc, "gelu")(xa.half())
    assert ya.dtype == yr.dtype == yg.dtype == torch.float16 and rel_err(ya, yr) <= 2e-3
