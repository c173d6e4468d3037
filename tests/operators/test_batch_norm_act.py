"""memsave::batch_norm_act and memsave.nn.BatchNormAct2d: against torch's unfused batch norm + activation."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as TF
from torch import nn

import memsave  # noqa: F401  (loads the operators)
from helpers.checks import assert_no_double_backward
from helpers.fused import (
    BN_FORMATS,
    FLOAT32_RTOL,
    TORCH_ACTS,
    assert_low_precision_ok,
    bn_inputs,
    bn_low_precision_grads,
    bn_reference,
    leaf_copies,
    module_state,
    rel_err,
    saved_bytes,
)
from memsave import functional as MF
from memsave.nn import BatchNormAct2d

ACTS = list(TORCH_ACTS)
FORMATS = BN_FORMATS
_inputs = bn_inputs


@pytest.mark.parametrize(
    "act, fmt", [(a, "contiguous") for a in ACTS] + [(a, "channels_last") for a in ("relu", "gelu", "leaky_relu")]
)
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_matches_unfused_float32(act, training, fmt):
    x, w, b, rm, rv = _inputs(fmt=FORMATS[fmt])
    x2, w2, b2 = leaf_copies(x, w, b)
    rm2, rv2 = rm.clone(), rv.clone()
    y = MF.batch_norm_act(x, rm, rv, w, b, training, 0.1, 1e-5, act)
    y2 = bn_reference(x2, rm2, rv2, w2, b2, training, act)
    # Forward: torch's own batch-norm kernel followed by the activation, so bitwise equal; stats too.
    assert torch.equal(y, y2)
    assert torch.equal(rm, rm2) and torch.equal(rv, rv2)
    assert y.is_contiguous(memory_format=FORMATS[fmt])
    g = torch.randn_like(y)
    y.backward(g)
    y2.backward(g)
    for ours, ref in ((x.grad, x2.grad), (w.grad, w2.grad), (b.grad, b2.grad)):
        assert rel_err(ours, ref) <= FLOAT32_RTOL
    assert x.grad.is_contiguous(memory_format=FORMATS[fmt])


@pytest.mark.parametrize("affine", [True, False])
def test_no_running_stats_and_no_affine(affine):
    x, w, b, _, _ = _inputs(shape=(3, 4, 5, 5))
    w, b = (w, b) if affine else (None, None)
    x2, w2, b2 = leaf_copies(x, w, b)
    y = MF.batch_norm_act(x, None, None, w, b, True, act="silu")
    y2 = bn_reference(x2, None, None, w2, b2, True, "silu")
    assert torch.equal(y, y2)
    g = torch.randn_like(y)
    ours = torch.autograd.grad(y, [t for t in (x, w, b) if t is not None], g)
    refs = torch.autograd.grad(y2, [t for t in (x2, w2, b2) if t is not None], g)
    for o, r in zip(ours, refs):
        assert rel_err(o, r) <= FLOAT32_RTOL


@pytest.mark.parametrize("act", ACTS)
def test_gradcheck_float64(act):
    x, w, b, rm, rv = _inputs(shape=(3, 2, 3, 2), dtype=torch.float64, seed=1)
    torch.autograd.gradcheck(lambda x, w, b: MF.batch_norm_act(x, None, None, w, b, True, act=act), (x, w, b))
    # Eval and non-affine: the same kernel with other coefficients; fast mode (random projections) suffices.
    torch.autograd.gradcheck(
        lambda x, w, b: MF.batch_norm_act(x, rm, rv, w, b, False, act=act), (x, w, b), fast_mode=True
    )
    torch.autograd.gradcheck(
        lambda x: MF.batch_norm_act(x, None, None, None, None, True, act=act), (x,), fast_mode=True
    )


def test_gradcheck_float64_channels_last():
    x, w, b, _, _ = _inputs(shape=(2, 3, 2, 3), fmt=torch.channels_last, dtype=torch.float64, seed=2)
    torch.autograd.gradcheck(lambda x, w, b: MF.batch_norm_act(x, None, None, w, b, True, act="gelu"), (x, w, b))


@pytest.mark.parametrize(
    "case",
    ["train", "eval", "no_affine_no_stats", "channels_last", "bfloat16_input_float32_params"],
)
def test_opcheck(case):
    x, w, b, rm, rv = _inputs(shape=(3, 4, 3, 3), dtype=torch.float64)
    args = (x, w, b, rm, rv, True, 0.1, 1e-5, "gelu", 0.0)
    if case == "eval":
        args = (x, w, b, rm, rv, False, 0.1, 1e-5, "leaky_relu", 0.2)
    elif case == "no_affine_no_stats":
        args = (x, None, None, None, None, True, 0.1, 1e-5, "relu", 0.0)
    elif case == "channels_last":
        xc = x.detach().to(memory_format=torch.channels_last).requires_grad_()
        args = (xc, w, b, rm, rv, True, 0.1, 1e-5, "silu", 0.0)
    elif case == "bfloat16_input_float32_params":
        w32, b32 = (t.detach().float().requires_grad_() for t in (w, b))
        args = (x.detach().bfloat16().requires_grad_(), w32, b32, rm.float(), rv.float(), True, 0.1, 1e-5, "elu", 1.0)
    torch.library.opcheck(torch.ops.memsave.batch_norm_act.default, args)
    out, mean, invstd = torch.ops.memsave.batch_norm_act(*args)
    xin = args[0].detach()
    bwd = (torch.randn_like(out), xin, args[1], args[2], mean, invstd, args[5], args[8], args[9])
    bwd = tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in bwd)
    torch.library.opcheck(torch.ops.memsave.batch_norm_act_backward.default, bwd)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("act", ["relu", "gelu", "silu"])
def test_low_precision_error_at_most_twice_torchs(dtype, act):
    # Autocast-style inputs: low-precision activations, float32 parameters.
    x, w, b, _, _ = _inputs(shape=(4, 6, 8, 8), seed=3)
    ours, torchs, refs = bn_low_precision_grads(MF.batch_norm_act, x, w, b, dtype, act)
    assert ours[1].dtype == torch.float32  # parameter gradients stay in the parameters' dtype
    for name, o, t, r in zip(("input", "weight", "bias"), ours, torchs, refs):
        assert_low_precision_ok(o.to(t.dtype), t, r, f"grad {name}")


def test_double_backward_raises():
    x, w, b, _, _ = _inputs(shape=(2, 3, 2, 2))
    assert_no_double_backward(x, lambda: MF.batch_norm_act(x, None, None, w, b, True, act="gelu").sum())


# ---------------------------------------------------------------------------------------------------------- module
def _pair(act="relu", **kwargs):
    torch.manual_seed(0)
    bn = nn.BatchNorm2d(5, **kwargs)
    fused = BatchNormAct2d(5, act=act, **kwargs)
    if bn.affine:
        with torch.no_grad():
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.normal_()
    fused.load_state_dict(bn.state_dict())
    return bn, fused


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"momentum": None}, {"track_running_stats": False}, {"affine": False}, {"momentum": 0.3, "eps": 1e-3}],
    ids=["default", "cumulative", "no_stats", "no_affine", "momentum_eps"],
)
def test_module_matches_batchnorm2d_running_stats_and_state_dict(kwargs):
    bn, fused = _pair("leaky_relu", **kwargs)
    assert list(fused.state_dict()) == list(bn.state_dict())
    act = TORCH_ACTS["leaky_relu"]
    for step in range(3):
        x = torch.randn(4, 5, 3, 3, generator=torch.Generator().manual_seed(step))
        assert torch.equal(fused(x), act(bn(x)))
    for key, value in bn.state_dict().items():
        assert torch.equal(fused.state_dict()[key], value), key
    bn.eval()
    fused.eval()
    x = torch.randn(2, 5, 3, 3)
    assert torch.equal(fused(x), act(bn(x)))


def test_module_training_gradients_and_eval_mode():
    bn, fused = _pair("gelu")
    x = torch.randn(4, 5, 4, 4, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    for train in (True, False):
        bn.train(train)
        fused.train(train)
        y, y2 = fused(x), TF.gelu(bn(x2))
        g = torch.randn_like(y)
        ours = torch.autograd.grad(y, (x, fused.weight, fused.bias), g)
        refs = torch.autograd.grad(y2, (x2, bn.weight, bn.bias), g)
        for o, r in zip(ours, refs):
            assert rel_err(o, r) <= FLOAT32_RTOL


def test_from_batchnorm_shares_tensors_and_rejects_syncbatchnorm():
    bn = nn.BatchNorm2d(3, momentum=0.2)
    fused = BatchNormAct2d.from_batchnorm(bn, act="silu")
    assert fused.weight is bn.weight and fused.running_mean is bn.running_mean and fused.momentum == 0.2
    assert BatchNormAct2d.from_batchnorm(bn.eval()).training is False
    back = fused.to_batchnorm()
    assert back.weight is bn.weight and back.running_var is bn.running_var
    with pytest.raises(TypeError, match="SyncBatchNorm"):
        BatchNormAct2d.from_batchnorm(nn.SyncBatchNorm(3))
    with pytest.raises(TypeError, match="BatchNorm2d"):
        BatchNormAct2d.from_batchnorm(nn.BatchNorm1d(3))


def test_old_checkpoint_without_num_batches_tracked_loads():
    state = nn.BatchNorm2d(4).state_dict()
    del state["num_batches_tracked"]
    fused = BatchNormAct2d(4)
    fused.load_state_dict(state, strict=False)
    assert fused.num_batches_tracked.item() == 0


def test_autocast_cpu_bfloat16():
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 6, 3, padding=1)
    bn = nn.BatchNorm2d(6)
    fused = BatchNormAct2d(6, act="silu")
    fused.load_state_dict(bn.state_dict())
    x = torch.randn(2, 3, 8, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = fused(conv(x))
        y2 = TF.silu(bn(conv(x)))
    assert y.dtype == torch.bfloat16 and torch.equal(y, y2)
    g = torch.randn_like(y)
    ours = torch.autograd.grad(y, (conv.weight, fused.weight), g)
    refs = torch.autograd.grad(y2, (conv.weight, bn.weight), g)
    assert ours[1].dtype == torch.float32
    for o, r in zip(ours, refs):
        assert rel_err(o, r) <= 2e-2  # bfloat16 activations: both sides round at 8 bits


# ------------------------------------------------------------------------------------------------------- bad input
def test_bad_input():
    with pytest.raises(ValueError, match="unknown activation"):
        BatchNormAct2d(4, act="tanh")
    with pytest.raises(ValueError, match="unknown activation"):
        MF.batch_norm_act(torch.randn(2, 4, 3, 3), None, None, training=True, act="swish")
    with pytest.raises(ValueError, match="unknown activation"):
        torch.ops.memsave.batch_norm_act(torch.randn(2, 4, 3, 3), None, None, None, None, True, 0.1, 1e-5, "x", 0.0)
    with pytest.raises(ValueError, match="expected 4D input"):
        BatchNormAct2d(4)(torch.randn(2, 4, 3))
    with pytest.raises(ValueError, match="channels"):
        BatchNormAct2d(4)(torch.randn(2, 3, 3, 3))
    with pytest.raises(ValueError, match="at least 2-D"):
        MF.batch_norm_act(torch.randn(4), None, None, training=True)
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        BatchNormAct2d(4)(torch.randn(1, 4, 1, 1))
    with pytest.raises(ValueError, match="shape \\[4\\]"):
        MF.batch_norm_act(torch.randn(2, 4, 3, 3), None, None, torch.ones(3), None, training=True)
    with pytest.raises(ValueError, match="eval mode"):
        MF.batch_norm_act(torch.randn(2, 4, 3, 3), None, None, training=False)
    with pytest.raises(TypeError):
        MF.batch_norm_act([1.0, 2.0], None, None)


# ---------------------------------------------------------------------------------------------------- saved bytes
@pytest.mark.parametrize("act", ["relu", "leaky_relu", "gelu", "silu"])
def test_conv_bnact_conv_saves_a_full_tensor(act):
    """conv -> BatchNormAct2d -> conv keeps one full tensor fewer than conv -> BN -> act -> conv, for activations
    that keep their input (leaky_relu, gelu, silu). relu keeps only its output, which the next conv keeps anyway,
    so there the two are equal: fusing into the conv (test below) is what saves a tensor around a relu."""
    torch.manual_seed(0)
    conv1, conv2 = nn.Conv2d(8, 16, 3, padding=1), nn.Conv2d(16, 8, 3, padding=1)
    bn, act_mod = (
        nn.BatchNorm2d(16),
        {"relu": nn.ReLU(), "leaky_relu": nn.LeakyReLU(0.01), "gelu": nn.GELU(), "silu": nn.SiLU()}[act],
    )
    eager = nn.Sequential(conv1, bn, act_mod, conv2)
    fused = nn.Sequential(conv1, BatchNormAct2d.from_batchnorm(bn, act=act), conv2)
    x = torch.randn(4, 8, 16, 16, requires_grad=True)
    full = 4 * 16 * 16 * 16 * 4  # one float32 tensor of the BN's shape
    eager_bytes, y_eager = saved_bytes(lambda: eager(x), module_state(eager))
    fused_bytes, y_fused = saved_bytes(lambda: fused(x), module_state(fused))
    if act == "relu":
        assert fused_bytes == eager_bytes
    else:
        assert eager_bytes - fused_bytes >= full
    assert rel_err(y_fused, y_eager) == 0.0


# ------------------------------------------------------------------------------------------------------------ CUDA


@pytest.mark.cuda
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("act", ["relu", "gelu", "silu", "leaky_relu"])
def test_cuda_matches_float64_reference(act, fmt):
    x, w, b, rm, rv = _inputs(shape=(8, 32, 12, 12), fmt=FORMATS[fmt], seed=5)
    xc, wc, bc = (t.detach().cuda().requires_grad_() for t in (x, w, b))
    xc = xc.detach().to(memory_format=FORMATS[fmt]).requires_grad_()
    rmc, rvc = rm.cuda(), rv.cuda()
    y = MF.batch_norm_act(xc, rmc, rvc, wc, bc, True, act=act)
    x64, w64, b64 = leaf_copies(x, w, b, dtype=torch.float64)
    rm64, rv64 = rm.double(), rv.double()
    y64 = bn_reference(x64, rm64, rv64, w64, b64, True, act)
    assert rel_err(y.cpu(), y64) <= FLOAT32_RTOL
    assert rel_err(rmc.cpu(), rm64) <= FLOAT32_RTOL and rel_err(rvc.cpu(), rv64) <= FLOAT32_RTOL
    g = torch.randn(y.shape, generator=torch.Generator().manual_seed(6))
    ours = torch.autograd.grad(y, (xc, wc, bc), g.cuda().to(memory_format=FORMATS[fmt]))
    refs = torch.autograd.grad(y64, (x64, w64, b64), g.double())
    for o, r in zip(ours, refs):
        assert rel_err(o.cpu(), r) <= FLOAT32_RTOL
    assert ours[0].is_contiguous(memory_format=FORMATS[fmt])


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cuda_low_precision_and_opcheck(dtype):
    x, w, b, _, _ = _inputs(shape=(8, 16, 10, 10), seed=7)
    x_lp = x.detach().to(dtype).cuda().requires_grad_()
    wc, bc = (t.detach().cuda().requires_grad_() for t in (w, b))
    xt, wt, bt = leaf_copies(x_lp, wc, bc)
    x64, w64, b64 = leaf_copies(x_lp, wc, bc, dtype=torch.float64)
    y = MF.batch_norm_act(x_lp, None, None, wc, bc, True, act="gelu")
    yt = bn_reference(xt, None, None, wt, bt, True, "gelu")
    y64 = bn_reference(x64, None, None, w64, b64, True, "gelu")
    assert_low_precision_ok(y, yt, y64, "output")
    g = torch.randn_like(y)
    for name, o, t, r in zip(
        ("input", "weight", "bias"),
        torch.autograd.grad(y, (x_lp, wc, bc), g),
        torch.autograd.grad(yt, (xt, wt, bt), g),
        torch.autograd.grad(y64, (x64, w64, b64), g.double()),
    ):
        assert_low_precision_ok(o.to(t.dtype), t, r, f"grad {name}")
    torch.library.opcheck(
        torch.ops.memsave.batch_norm_act.default, (x_lp, wc, bc, None, None, True, 0.1, 1e-5, "silu", 0.0)
    )


# ------------------------------------------------------------------------------------- batch_norm_act_conv2d
CONV_CASES = {
    "3x3": dict(stride=1, padding=1, dilation=1, groups=1, bias=True, fmt="contiguous"),
    "strided_grouped": dict(stride=2, padding=0, dilation=1, groups=2, bias=False, fmt="contiguous"),
    "dilated_channels_last": dict(stride=1, padding=2, dilation=2, groups=1, bias=True, fmt="channels_last"),
}


def _conv_reference(x, rm, rv, bw, bb, w, b, training, act, conv):
    h = bn_reference(x, rm, rv, bw, bb, training, act)
    return TF.conv2d(h, w, b, conv["stride"], conv["padding"], conv["dilation"], conv["groups"])


def _conv_params(c_in, c_out, conv, dtype=torch.float32, seed=10):
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(c_out, c_in // conv["groups"], 3, 3, generator=g, dtype=dtype) / 3).requires_grad_()
    b = torch.randn(c_out, generator=g, dtype=dtype).requires_grad_() if conv["bias"] else None
    return w, b


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("act", ["relu", "gelu"])
@pytest.mark.parametrize("conv", CONV_CASES)
def test_bn_act_conv_matches_unfused_float32(conv, act, training):
    spec = CONV_CASES[conv]
    x, bw, bb, rm, rv = _inputs(shape=(3, 4, 9, 8), fmt=FORMATS[spec["fmt"]])
    w, b = _conv_params(4, 6, spec)
    x2, bw2, bb2, w2, b2 = leaf_copies(x, bw, bb, w, b)
    rm2, rv2 = rm.clone(), rv.clone()
    y = MF.batch_norm_act_conv2d(
        x,
        rm,
        rv,
        bw,
        bb,
        w,
        b,
        training,
        0.1,
        1e-5,
        act,
        None,
        spec["stride"],
        spec["padding"],
        spec["dilation"],
        spec["groups"],
    )
    y2 = _conv_reference(x2, rm2, rv2, bw2, bb2, w2, b2, training, act, spec)
    assert y.shape == y2.shape and rel_err(y, y2) <= FLOAT32_RTOL
    assert torch.equal(rm, rm2) and torch.equal(rv, rv2)
    g = torch.randn_like(y2)
    ours = torch.autograd.grad(y, [t for t in (x, bw, bb, w, b) if t is not None], g)
    refs = torch.autograd.grad(y2, [t for t in (x2, bw2, bb2, w2, b2) if t is not None], g)
    for o, r in zip(ours, refs):
        assert rel_err(o, r) <= FLOAT32_RTOL


@pytest.mark.parametrize("act", ["relu", "silu"])
def test_bn_act_conv_gradcheck_float64(act):
    spec = CONV_CASES["3x3"]
    x, bw, bb, _, _ = _inputs(shape=(2, 2, 4, 3), dtype=torch.float64, seed=11)
    w, b = _conv_params(2, 3, spec, dtype=torch.float64)
    torch.autograd.gradcheck(
        lambda x, bw, bb, w, b: MF.batch_norm_act_conv2d(x, None, None, bw, bb, w, b, True, act=act, padding=1),
        (x, bw, bb, w, b),
        fast_mode=act != "relu",  # the silu case exercises the same path; random projections
    )


def test_bn_act_conv_opcheck():
    x, bw, bb, rm, rv = _inputs(shape=(2, 4, 5, 5), dtype=torch.float64)
    w, b = _conv_params(4, 6, CONV_CASES["3x3"], dtype=torch.float64)
    w2, _ = _conv_params(4, 6, CONV_CASES["strided_grouped"], dtype=torch.float64)
    cases = [
        (x, bw, bb, rm, rv, True, 0.1, 1e-5, "relu", 0.0, w, b, [1, 1], [1, 1], [1, 1], 1),
        (x, None, None, None, None, True, 0.1, 1e-5, "gelu", 0.0, w2, None, [2, 2], [0, 0], [1, 1], 2),
        (
            x.detach().to(memory_format=torch.channels_last).requires_grad_(),
            bw,
            bb,
            rm,
            rv,
            False,
            0.1,
            1e-5,
            "leaky_relu",
            0.1,
            w,
            b,
            [1, 1],
            [2, 2],
            [2, 2],
            1,
        ),
    ]
    for args in cases:
        torch.library.opcheck(torch.ops.memsave.batch_norm_act_conv2d.default, args)
    args = cases[0]
    out, mean, invstd = torch.ops.memsave.batch_norm_act_conv2d(*args)
    plain = [a.detach() if isinstance(a, torch.Tensor) else a for a in args]
    torch.library.opcheck(
        torch.ops.memsave.batch_norm_act_conv2d_backward.default,
        (
            torch.randn_like(out),
            plain[0],
            plain[1],
            plain[2],
            mean,
            invstd,
            True,
            "relu",
            0.0,
            plain[10],
            True,
            [1, 1],
            [1, 1],
            [1, 1],
            1,
        ),
    )
    torch.library.opcheck(
        torch.ops.memsave.batch_norm_act_apply.default, (plain[0], mean, invstd, plain[1], plain[2], "silu", 0.0)
    )


def test_batch_norm_act_apply_recomputes_the_output():
    x, bw, bb, _, _ = _inputs(shape=(3, 4, 5, 5), dtype=torch.float64)
    y, mean, invstd = torch.ops.memsave.batch_norm_act(
        x.detach(), bw.detach(), bb.detach(), None, None, True, 0.1, 1e-5, "gelu", 0.0
    )
    again = torch.ops.memsave.batch_norm_act_apply(x.detach(), mean, invstd, bw.detach(), bb.detach(), "gelu", 0.0)
    assert rel_err(again, y) <= 1e-14


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_bn_act_conv_low_precision(dtype):
    spec = CONV_CASES["3x3"]
    x, bw, bb, _, _ = _inputs(shape=(2, 4, 8, 8), seed=12)
    w, b = _conv_params(4, 6, spec)
    x_lp, w_lp, b_lp = (t.detach().to(dtype).requires_grad_() for t in (x, w, b))
    args = (x_lp, bw, bb, w_lp, b_lp)
    at, a64 = leaf_copies(*args), leaf_copies(*args, dtype=torch.float64)
    y = MF.batch_norm_act_conv2d(x_lp, None, None, bw, bb, w_lp, b_lp, True, act="relu", padding=1)
    yt = _conv_reference(at[0], None, None, at[1], at[2], at[3], at[4], True, "relu", spec)
    y64 = _conv_reference(a64[0], None, None, a64[1], a64[2], a64[3], a64[4], True, "relu", spec)
    assert_low_precision_ok(y, yt, y64, "output")
    g = torch.randn(y.shape, generator=torch.Generator().manual_seed(13)).to(dtype)
    names = ("input", "bn weight", "bn bias", "conv weight", "conv bias")
    for name, o, t, r in zip(
        names,
        torch.autograd.grad(y, args, g),
        torch.autograd.grad(yt, at, g),
        torch.autograd.grad(y64, a64, g.double()),
    ):
        assert_low_precision_ok(o.to(t.dtype), t, r, f"grad {name}")


def test_fuse_batch_norm_act_conv2d_module_keys_stats_and_modes():
    from memsave.nn import BatchNormActConv2d, DeferredBatchNormAct2d, fuse_batch_norm_act_conv2d

    torch.manual_seed(0)
    ref = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8, momentum=None), nn.ReLU(), nn.Conv2d(8, 4, 3, padding=1)
    )
    model = copy.deepcopy(ref)
    model[1], model[3] = fuse_batch_norm_act_conv2d(model[1], model[2], model[3])
    model[2] = nn.Identity()
    assert isinstance(model[1], DeferredBatchNormAct2d) and isinstance(model[3], BatchNormActConv2d)
    assert list(model.state_dict()) == list(ref.state_dict())
    for train in (True, True, False):
        model.train(train)
        ref.train(train)
        x = torch.randn(2, 3, 6, 6)
        y, y2 = model(x), ref(x)
        assert rel_err(y, y2) <= FLOAT32_RTOL
    for (k, v), v2 in zip(model.state_dict().items(), ref.state_dict().values()):
        assert torch.equal(v, v2), k
    standalone = BatchNormActConv2d(8, 4, 3, padding=1, act="silu")
    assert sorted(standalone.state_dict()) == sorted(
        ["weight", "bias", "bn.weight", "bn.bias", "bn.running_mean", "bn.running_var", "bn.num_batches_tracked"]
    )
    assert standalone(torch.randn(2, 8, 5, 5)).shape == (2, 4, 5, 5)
    with pytest.raises(ValueError, match="padding"):
        fuse_batch_norm_act_conv2d(nn.BatchNorm2d(8), "relu", nn.Conv2d(8, 4, 3, padding="same"))
    with pytest.raises(ValueError, match="does not feed"):
        fuse_batch_norm_act_conv2d(nn.BatchNorm2d(8), "relu", nn.Conv2d(6, 4, 3))


@pytest.mark.parametrize("act", ["relu", "gelu"])
def test_conv_bn_act_conv_fused_into_the_conv_saves_a_full_tensor(act):
    """The acceptance claim for every activation, relu included: conv -> BN -> act -> conv with the BN and
    activation fused into the second conv keeps at least one full tensor fewer than torch."""
    from memsave.nn import fuse_batch_norm_act_conv2d

    torch.manual_seed(0)
    eager = nn.Sequential(
        nn.Conv2d(8, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        {"relu": nn.ReLU(), "gelu": nn.GELU()}[act],
        nn.Conv2d(16, 8, 3, padding=1),
    )
    fused = copy.deepcopy(eager)
    fused[1], fused[3] = fuse_batch_norm_act_conv2d(fused[1], fused[2], fused[3])
    fused[2] = nn.Identity()
    x = torch.randn(4, 8, 16, 16, requires_grad=True)
    full = 4 * 16 * 16 * 16 * 4
    eager_bytes, y_eager = saved_bytes(lambda: eager(x), module_state(eager))
    fused_bytes, y_fused = saved_bytes(lambda: fused(x), module_state(fused))
    assert eager_bytes - fused_bytes >= (1 if act == "relu" else 2) * full
    assert rel_err(y_fused, y_eager) <= FLOAT32_RTOL
