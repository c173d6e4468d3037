"""memsave::rms_norm, rms_norm_linear and memsave.nn.RMSNorm / RMSNormLinear / fuse_rms_norm_linear: against
Hugging Face's LlamaRMSNorm formula (the eager composition) and a float64 reference, plus what each keeps."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as TF
from torch import nn

import memsave  # noqa: F401  (loads the operators)
from helpers.checks import assert_module_matches, assert_no_double_backward
from helpers.eager import LlamaRMSNorm, pre_norm_layer
from helpers.fused import FLOAT32_RTOL, assert_low_precision_ok, leaf_copies, module_state, rel_err, saved_bytes
from memsave import functional as MF
from memsave.measurement.allocator import cpu_memory_stats
from memsave.nn import DeferredRMSNorm, RMSNorm, RMSNormLinear, fuse_rms_norm_linear


def hf_rms_norm(x, w, eps=1e-6):
    """LlamaRMSNorm's forward as a function (w may be None)."""
    dt = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return h.to(dt) if w is None else w * h.to(dt)


def ref_rms_norm(x, w, eps=1e-6):
    """The float64 reference: no rounding anywhere."""
    h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return h if w is None else w * h


def _inputs(shape=(3, 5, 16), dtype=torch.float32, seed=0, weight=True):
    g = torch.Generator().manual_seed(seed)
    d = shape[-1]
    x = (2 * torch.randn(shape, generator=g) + 0.3).to(dtype).requires_grad_()
    w = (torch.rand(d, generator=g) + 0.5).to(dtype).requires_grad_() if weight else None
    return x, w


def _grads(out, inputs, g):
    return torch.autograd.grad(out, [t for t in inputs if t is not None], g)


# ---------------------------------------------------------------------------------------------------------- rms_norm
@pytest.mark.parametrize("weight", [True, False])
@pytest.mark.parametrize("shape", [(3, 5, 16), (7, 33), (16,), (2, 0, 8)])
def test_rms_norm_matches_llama_float32(shape, weight):
    x, w = _inputs(shape, weight=weight)
    x2, w2 = leaf_copies(x, w)
    y, y2 = MF.rms_norm(x, w), hf_rms_norm(x2, w2)
    assert y.shape == y2.shape and y.dtype == y2.dtype
    if y.numel() == 0:  # no rows: empty output, zero weight gradient
        y.sum().backward()
        assert x.grad.shape == x.shape and (w is None or torch.equal(w.grad, torch.zeros_like(w)))
        return
    assert rel_err(y, y2) <= FLOAT32_RTOL
    g = torch.randn_like(y)
    for o, r in zip(_grads(y, (x, w), g), _grads(y2, (x2, w2), g)):
        assert rel_err(o, r) <= FLOAT32_RTOL


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_rms_norm_error_at_most_twice_torchs(dtype):
    """Against a float64 reference, memsave's error (output and both gradients) is at most 2x that of the eager
    LlamaRMSNorm composition run in the same dtype."""
    x, w = _inputs((4, 64, 512), dtype=dtype, seed=1)
    x64, w64 = leaf_copies(x, w, dtype=torch.float64)
    xt, wt = leaf_copies(x, w)
    y, yt, y64 = MF.rms_norm(x, w), hf_rms_norm(xt, wt), ref_rms_norm(x64, w64)
    assert y.dtype == dtype
    assert_low_precision_ok(y, yt, y64, "output")
    g = torch.randn(y.shape, generator=torch.Generator().manual_seed(2)).to(dtype)
    for name, o, t, r in zip(
        ("input", "weight"), _grads(y, (x, w), g), _grads(yt, (xt, wt), g), _grads(y64, (x64, w64), g.double())
    ):
        assert_low_precision_ok(o, t, r, f"grad {name}")


def test_rms_norm_bfloat16_output_is_llamas_rounding():
    """The normalized value is rounded to the input dtype before the weight multiplies it, as in LlamaRMSNorm:
    the outputs agree to the last bit but for a rare one-ulp tie from the mean's summation order."""
    x, w = _inputs((8, 256), dtype=torch.bfloat16, seed=3)
    y, y2 = MF.rms_norm(x, w), hf_rms_norm(x, w)
    ulp = torch.finfo(torch.bfloat16).eps
    assert ((y.float() - y2.float()).abs() <= ulp * y2.float().abs()).all()
    assert (y == y2).float().mean() > 0.99


def test_rms_norm_mixed_dtypes_promote_like_llama():
    x = torch.randn(4, 32, dtype=torch.bfloat16)
    w = torch.rand(32) + 0.5  # a float32 weight on a bfloat16 activation: LlamaRMSNorm returns float32
    y, y2 = MF.rms_norm(x, w), hf_rms_norm(x, w)
    assert y.dtype == y2.dtype == torch.float32 and rel_err(y, y2) <= FLOAT32_RTOL
    assert MF.rms_norm(torch.randn(3, 8), torch.ones(8, dtype=torch.bfloat16)).dtype == torch.float32


def test_rms_norm_non_contiguous_input_and_eps_none():
    x = torch.randn(4, 6, 8).transpose(0, 1).requires_grad_()
    w = torch.rand(8, requires_grad=True)
    y = MF.rms_norm(x, w, eps=None)
    y2 = hf_rms_norm(x, w, eps=torch.finfo(torch.float32).eps)
    assert rel_err(y, y2) <= FLOAT32_RTOL
    gy = torch.randn_like(y)
    for o, r in zip(_grads(y, (x, w), gy), _grads(y2, (x, w), gy)):
        assert rel_err(o, r) <= FLOAT32_RTOL


def test_rms_norm_gradcheck_float64():
    x, w = _inputs((2, 3, 5), dtype=torch.float64)
    torch.autograd.gradcheck(lambda x, w: MF.rms_norm(x, w, 1e-3), (x, w))
    torch.autograd.gradcheck(lambda x: MF.rms_norm(x, None), (x,))
    torch.autograd.gradcheck(lambda w: MF.rms_norm(x.detach(), w), (w,))  # frozen input: weight gradient only


def test_rms_norm_opcheck():
    x, w = _inputs((2, 3, 8), dtype=torch.float64)
    for args in (
        (x, w, 1e-6),
        (x, None, 1e-5),
        (x.detach().float(), w.detach().float(), 1e-6),
        (x.detach().bfloat16(), w.detach().float(), 1e-6),
    ):
        torch.library.opcheck(torch.ops.memsave.rms_norm.default, args)
    out, rstd = torch.ops.memsave.rms_norm(x.detach(), w.detach(), 1e-6)
    assert rstd.shape == (2, 3) and rstd.dtype == torch.float64
    gy = torch.randn_like(out)
    for mask in ([True, True], [True, False], [False, True]):
        torch.library.opcheck(torch.ops.memsave.rms_norm_backward.default, (gy, x.detach(), rstd, w.detach(), mask))
    torch.library.opcheck(torch.ops.memsave.rms_norm_backward.default, (gy, x.detach(), rstd, None, [True, True]))


def test_rms_norm_saves_input_and_one_float_per_row():
    """Allocator level (every CPU allocation minus every free during forward) and autograd's saved tensors."""
    for dtype, eager_extra in ((torch.float32, 4), (torch.bfloat16, 6)):
        norm = RMSNorm(512).to(dtype)
        eager = LlamaRMSNorm(512).to(dtype)
        x = torch.randn(8, 128, 512, dtype=dtype, requires_grad=True)
        n, rows, size = x.numel(), x.numel() // 512, x.element_size()
        ours_saved, _ = saved_bytes(lambda: norm(x), module_state(norm))
        assert ours_saved == n * size + 4 * rows  # the input and a float32 rstd per row
        eager_saved, _ = saved_bytes(lambda: eager(x), module_state(eager))
        assert eager_saved >= ours_saved + eager_extra * n - n * size  # float32: h; bfloat16: float32 copy + h
        ours_net = cpu_memory_stats(lambda: norm(x)).net_bytes  # what forward leaves allocated (output + saved)
        eager_net = cpu_memory_stats(lambda: eager(x)).net_bytes
        assert ours_net <= n * size + 4 * rows + 1024, (dtype, ours_net)
        assert eager_net - ours_net >= eager_extra * n, (dtype, eager_net, ours_net)


# -------------------------------------------------------------------------------------------------- rms_norm_linear
def _linears(d=16, outs=(12, 6, 6), bias=False, dtype=torch.float32, seed=4):
    g = torch.Generator().manual_seed(seed)
    ws = [(torch.randn(o, d, generator=g) / d**0.5).to(dtype).requires_grad_() for o in outs]
    bs = [torch.randn(o, generator=g).to(dtype).requires_grad_() for o in outs] if bias else [None] * len(outs)
    return ws, bs


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("n_linears", [1, 3])
def test_rms_norm_linear_matches_unfused_float32(n_linears, bias):
    x, w = _inputs((3, 5, 16))
    ws, bs = _linears(outs=(12, 6, 6)[:n_linears], bias=bias)
    x2, w2, *rest = leaf_copies(x, w, *ws, *bs)
    ws2, bs2 = rest[:n_linears], rest[n_linears:]
    ys = MF.rms_norm_linear(x, w, ws, bs if bias else None)
    h = hf_rms_norm(x2, w2)
    ys2 = [TF.linear(h, a, b) for a, b in zip(ws2, bs2)]
    assert isinstance(ys, tuple) and len(ys) == n_linears
    for y, y2 in zip(ys, ys2):
        assert rel_err(y, y2) <= FLOAT32_RTOL
    gs = [torch.randn_like(y) for y in ys]
    params = [x, w, *ws, *(bs if bias else [])]
    params2 = [x2, w2, *ws2, *(bs2 if bias else [])]
    for o, r in zip(torch.autograd.grad(ys, params, gs), torch.autograd.grad(ys2, params2, gs)):
        assert rel_err(o, r) <= FLOAT32_RTOL


def test_rms_norm_linear_single_weight_returns_a_tensor_and_unused_outputs_get_zero_grads():
    x, w = _inputs((4, 16))
    ws, _ = _linears(outs=(8, 4))
    y = MF.rms_norm_linear(x, w, ws[0])
    assert isinstance(y, torch.Tensor) and y.shape == (4, 8)
    q, _k = MF.rms_norm_linear(x, w, ws)
    q.sum().backward()  # k unused: its weight gets a zero gradient, the rest as for q alone
    assert torch.equal(ws[1].grad, torch.zeros_like(ws[1]))
    x2, w2, a2 = leaf_copies(x, w, ws[0])
    TF.linear(hf_rms_norm(x2, w2), a2).sum().backward()
    assert rel_err(x.grad, x2.grad) <= FLOAT32_RTOL and rel_err(ws[0].grad, a2.grad) <= FLOAT32_RTOL


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_rms_norm_linear_error_at_most_twice_torchs(dtype):
    x, w = _inputs((4, 32, 256), dtype=dtype, seed=5)
    ws, bs = _linears(d=256, outs=(192, 64), bias=True, dtype=dtype, seed=6)
    args = [x, w, *ws, *bs]
    a64, at = leaf_copies(*args, dtype=torch.float64), leaf_copies(*args)
    ys = MF.rms_norm_linear(x, w, ws, bs)
    ht, h64 = hf_rms_norm(at[0], at[1]), ref_rms_norm(a64[0], a64[1])
    yts = [TF.linear(ht, at[2], at[4]), TF.linear(ht, at[3], at[5])]
    y64s = [TF.linear(h64, a64[2], a64[4]), TF.linear(h64, a64[3], a64[5])]
    for i, (y, yt, y64) in enumerate(zip(ys, yts, y64s)):
        assert y.dtype == dtype
        assert_low_precision_ok(y, yt, y64, f"output {i}")
    g = torch.Generator().manual_seed(7)
    gs = [torch.randn(y.shape, generator=g).to(dtype) for y in ys]
    names = ("input", "norm_weight", "weight0", "weight1", "bias0", "bias1")
    for name, o, t, r in zip(
        names,
        torch.autograd.grad(ys, args, gs),
        torch.autograd.grad(yts, at, gs),
        torch.autograd.grad(y64s, a64, [t.double() for t in gs]),
    ):
        assert_low_precision_ok(o, t, r, f"grad {name}")


def test_rms_norm_linear_gradcheck_float64():
    x, w = _inputs((2, 3, 5), dtype=torch.float64)
    ws, bs = _linears(d=5, outs=(4, 3), bias=True, dtype=torch.float64)
    torch.autograd.gradcheck(
        lambda x, w, a, b, c, d: MF.rms_norm_linear(x, w, [a, b], [c, d], eps=1e-3), (x, w, *ws, *bs)
    )
    torch.autograd.gradcheck(lambda x, a: MF.rms_norm_linear(x, None, a), (x, ws[0]), fast_mode=True)


def test_rms_norm_linear_opcheck():
    x, w = _inputs((2, 3, 8), dtype=torch.float64)
    ws, bs = _linears(d=8, outs=(6, 4), bias=True, dtype=torch.float64)
    for args in ((x, w, 1e-6, ws, bs), (x, None, 1e-6, ws[:1], [None]), (x, w, 1e-5, ws, [None, None])):
        torch.library.opcheck(torch.ops.memsave.rms_norm_linear.default, args)
    d = [t.detach() for t in (x, w, *ws)]
    gys = [torch.randn(2, 3, 6, dtype=torch.float64), torch.randn(2, 3, 4, dtype=torch.float64)]
    torch.library.opcheck(
        torch.ops.memsave.rms_norm_linear_backward.default, (gys, d[0], d[1], 1e-6, d[2:], [True, False])
    )
    torch.library.opcheck(
        torch.ops.memsave.rms_norm_linear_backward.default, ([gys[0], None], d[0], None, 1e-6, d[2:], [False, False])
    )


def test_rms_norm_linear_autocast_cpu_bfloat16():
    torch.manual_seed(0)
    norm, fc = LlamaRMSNorm(32), nn.Linear(32, 16)
    fused = RMSNormLinear.from_modules(copy.deepcopy(norm), copy.deepcopy(fc))
    x = torch.randn(4, 32, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y, y2 = fused(x), fc(norm(x2))
    assert y.dtype == y2.dtype == torch.bfloat16 and rel_err(y, y2) <= 1e-2
    g = torch.randn_like(y)
    for o, r in zip(
        torch.autograd.grad(y, (x, fused.weight, fused.norm.weight), g),
        torch.autograd.grad(y2, (x2, fc.weight, norm.weight), g),
    ):
        assert o.dtype == r.dtype == torch.float32 and rel_err(o, r) <= 2e-2


# ----------------------------------------------------------------------------------------------------------- modules
def test_rms_norm_module_loads_llama_weights_and_keys():
    eager = LlamaRMSNorm(16, eps=1e-5)
    with torch.no_grad():
        eager.weight.uniform_(0.5, 1.5)
    ours = RMSNorm(16, eps=1e-5)
    assert list(ours.state_dict()) == list(eager.state_dict()) == ["weight"]
    ours.load_state_dict(eager.state_dict())
    shared = RMSNorm.from_module(eager)
    assert shared.weight is eager.weight and shared.eps == shared.variance_epsilon == 1e-5
    x = torch.randn(3, 16)
    assert rel_err(ours(x), eager(x)) <= FLOAT32_RTOL and torch.equal(ours(x), shared(x))
    torch_norm = nn.RMSNorm(16, eps=None)
    assert (
        RMSNorm.from_module(torch_norm).eps is None
        and rel_err(RMSNorm.from_module(torch_norm)(x), torch_norm(x)) <= 1e-6
    )
    assert RMSNorm(8, elementwise_affine=False).weight is None and "eps=1e-06" in repr(RMSNorm(8))


def test_fuse_rms_norm_linear_llama_attention_keeps_keys_and_values():
    """A Llama-style attention input: input_layernorm -> q/k/v_proj, each called with the norm's output."""

    class Attention(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.q_proj, self.k_proj, self.v_proj = (
                nn.Linear(d, d, bias=False),
                nn.Linear(d, 8, bias=False),
                nn.Linear(d, 8, bias=False),
            )

        def forward(self, h):
            return (self.q_proj(h).sum(-1) + self.k_proj(h).sum(-1) * self.v_proj(h).mean(-1)).unsqueeze(-1)

    layer, ref = pre_norm_layer("input_layernorm", "self_attn", lambda: Attention(16), 16)
    attn = layer.self_attn
    layer.input_layernorm, (attn.q_proj, attn.k_proj, attn.v_proj) = fuse_rms_norm_linear(
        layer.input_layernorm, attn.q_proj, attn.k_proj, attn.v_proj
    )
    assert isinstance(layer.input_layernorm, DeferredRMSNorm) and isinstance(attn.k_proj, RMSNormLinear)
    assert list(layer.state_dict()) == list(ref.state_dict())
    x = torch.randn(2, 5, 16, requires_grad=True)
    _, y2 = assert_module_matches(layer, ref, x)
    layer.load_state_dict(ref.state_dict())
    copied = copy.deepcopy(layer)
    assert copied.self_attn.v_proj._norm() is copied.input_layernorm
    assert rel_err(copied(x), y2) <= FLOAT32_RTOL
    # One fused Linear: the single-module form.
    _deferred, fused = fuse_rms_norm_linear(LlamaRMSNorm(16), nn.Linear(16, 4))
    assert isinstance(fused, RMSNormLinear) and "preceding DeferredRMSNorm" in repr(fused)


def test_rms_norm_linear_module_constructs_like_torch():
    torch.manual_seed(0)
    lin = nn.Linear(16, 8, bias=False)
    torch.manual_seed(0)
    fused = RMSNormLinear(16, 8)
    assert torch.equal(fused.weight, lin.weight) and fused.bias is None
    assert sorted(fused.state_dict()) == ["norm.weight", "weight"]


def test_rms_norm_saved_bytes_in_a_llama_attention_input():
    """RMSNorm -> q/k/v: eager keeps x, the normalized tensor and the norm's output (float32: 3 units); the fused
    operator keeps x only."""
    torch.manual_seed(0)
    norm, q, k, v = (
        LlamaRMSNorm(256),
        nn.Linear(256, 256, bias=False),
        nn.Linear(256, 64, bias=False),
        nn.Linear(256, 64, bias=False),
    )
    x = torch.randn(4, 64, 256, requires_grad=True)

    def eager():
        h = norm(x)
        return q(h), k(h), v(h)

    deferred, fused = fuse_rms_norm_linear(norm, q, k, v)

    def ours():
        h = deferred(x)
        return tuple(m(h) for m in fused)

    params = (*module_state(norm), q.weight, k.weight, v.weight)
    eager_bytes, _ = saved_bytes(eager, params)
    ours_bytes, _ = saved_bytes(ours, params)
    unit = x.numel() * 4
    assert ours_bytes == unit and eager_bytes >= 3 * unit, (ours_bytes, eager_bytes)


def test_bad_input():
    x = torch.randn(2, 8)
    with pytest.raises(ValueError, match="weight must have shape \\[8\\]"):
        MF.rms_norm(x, torch.ones(7))
    with pytest.raises(ValueError, match="eps"):
        MF.rms_norm(x, None, -1.0)
    with pytest.raises(TypeError, match="floating-point"):
        MF.rms_norm(torch.ones(2, 8, dtype=torch.int64), None)
    with pytest.raises(RuntimeError, match="rstd must be"):
        torch.ops.memsave.rms_norm_backward(x, x, torch.ones(2, dtype=torch.float64), None, [True, True])
    with pytest.raises(ValueError, match="grad_out must have the input's shape"):
        torch.ops.memsave.rms_norm_backward(torch.ones(2, 4), x, torch.ones(2), None, [True, True])
    with pytest.raises(ValueError, match=r"weights\[1\] must have shape"):
        MF.rms_norm_linear(x, None, [torch.randn(3, 8), torch.randn(3, 9)])
    with pytest.raises(ValueError, match="all tensors or all None"):
        MF.rms_norm_linear(x, None, [torch.randn(3, 8), torch.randn(3, 8)], [torch.zeros(3), None])
    with pytest.raises(ValueError, match="biases"):
        MF.rms_norm_linear(x, None, [torch.randn(3, 8)], [None, None])
    with pytest.raises(ValueError, match="normalizes the last dimension only"):
        RMSNorm((4, 8))
    with pytest.raises(ValueError, match="does not feed"):
        RMSNormLinear.from_modules(LlamaRMSNorm(4), nn.Linear(5, 3))
    with pytest.raises(TypeError, match="RMSNorm"):
        RMSNorm.from_module(nn.Linear(4, 4))
    with pytest.raises(ValueError, match="at least one Linear"):
        fuse_rms_norm_linear(LlamaRMSNorm(4))


def test_double_backward_raises():
    x = torch.randn(2, 4, requires_grad=True)
    w = torch.randn(3, 4, requires_grad=True)
    assert_no_double_backward(
        x, lambda: MF.rms_norm(x, None).square().sum(), lambda: MF.rms_norm_linear(x, None, w).square().sum()
    )


# ------------------------------------------------------------------------------------------------------------ CUDA
@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_cuda_rms_norm_error_at_most_twice_torchs_and_matches_cpu(dtype):
    x, w = _inputs((4, 64, 1000), dtype=dtype, seed=8)  # 1000: not a multiple of the block size
    xc, wc = [t.detach().cuda().requires_grad_() for t in (x, w)]
    xt, wt = [t.detach().cuda().requires_grad_() for t in (x, w)]
    x64, w64 = leaf_copies(x, w, dtype=torch.float64)
    y, yt, y64 = MF.rms_norm(xc, wc), hf_rms_norm(xt, wt), ref_rms_norm(x64, w64)
    assert_low_precision_ok(y.cpu(), yt.cpu(), y64, "output")
    g = torch.randn(y.shape, generator=torch.Generator().manual_seed(9)).to(dtype)
    for name, o, t, r in zip(
        ("input", "weight"),
        _grads(y, (xc, wc), g.cuda()),
        _grads(yt, (xt, wt), g.cuda()),
        _grads(y64, (x64, w64), g.double()),
    ):
        assert_low_precision_ok(o.cpu(), t.cpu(), r, f"grad {name}")
    # The same per-element math as the CPU kernel: equal up to the reductions' summation order.
    assert rel_err(y.cpu().double(), MF.rms_norm(x.detach(), w.detach()).double()) <= 2 * torch.finfo(dtype).eps
    torch.library.opcheck(torch.ops.memsave.rms_norm.default, (xc.detach(), wc.detach(), 1e-6))


@pytest.mark.cuda
def test_cuda_rms_norm_linear_matches_float64():
    x, w = _inputs((4, 16, 64), seed=10)
    ws, bs = _linears(d=64, outs=(48, 16), bias=True, seed=11)
    cu = [t.detach().cuda().requires_grad_() for t in (x, w, *ws, *bs)]
    a64 = leaf_copies(x, w, *ws, *bs, dtype=torch.float64)
    ys = MF.rms_norm_linear(cu[0], cu[1], cu[2:4], cu[4:6])
    h64 = ref_rms_norm(a64[0], a64[1])
    y64s = [TF.linear(h64, a64[2], a64[4]), TF.linear(h64, a64[3], a64[5])]
    for y, y64 in zip(ys, y64s):
        assert rel_err(y.cpu(), y64) <= FLOAT32_RTOL
    gs = [torch.ones_like(y) for y in ys]
    for o, r in zip(torch.autograd.grad(ys, cu, gs), torch.autograd.grad(y64s, a64, [g.cpu().double() for g in gs])):
        assert rel_err(o.cpu(), r) <= FLOAT32_RTOL
