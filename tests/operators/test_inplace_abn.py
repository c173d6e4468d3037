"""memsave::inplace_abn and memsave.nn.InPlaceABN2d: against torch's unfused batch norm + activation."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as TF
from torch import nn

import memsave  # noqa: F401  (loads the operators)
from helpers.checks import assert_no_double_backward
from helpers.fused import (
    BN_FORMATS,
    FLOAT32_RTOL,
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
from memsave.nn import InPlaceABN2d

ACTS = ["leaky_relu", "elu", "identity"]
FORMATS = BN_FORMATS


def _inputs(shape=(4, 5, 6, 7), fmt=torch.contiguous_format, dtype=torch.float32, seed=0):
    return bn_inputs(shape, fmt, dtype, seed, bias_scale=0.5, mean_scale=0.1)


def _abn(x, *args, **kwargs):
    """inplace_abn on a non-leaf copy of x (in-place ops refuse leaves that require grad)."""
    return MF.inplace_abn(x * 1.0, *args, **kwargs)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("act", ACTS)
def test_matches_unfused_float32(act, training, fmt):
    x, w, b, rm, rv = _inputs(fmt=FORMATS[fmt])
    x2, w2, b2 = leaf_copies(x, w, b)
    rm2, rv2 = rm.clone(), rv.clone()
    h = x * 1.0
    y = MF.inplace_abn(h, rm, rv, w, b, training, 0.1, 1e-5, act)
    assert y is h  # in place: the input tensor now holds the output
    y2 = bn_reference(x2, rm2, rv2, w2, b2, training, act)
    assert rel_err(y, y2) <= FLOAT32_RTOL
    assert torch.equal(rm, rm2) and torch.equal(rv, rv2)  # torch's own statistics kernel and update
    assert y.is_contiguous(memory_format=FORMATS[fmt])
    g = torch.randn_like(y)
    y.backward(g)
    y2.backward(g)
    for ours, ref in ((x.grad, x2.grad), (w.grad, w2.grad), (b.grad, b2.grad)):
        assert rel_err(ours, ref) <= FLOAT32_RTOL


@pytest.mark.parametrize("act", ACTS)
def test_gradcheck_float64(act):
    x, w, b, rm, rv = _inputs(shape=(3, 2, 3, 2), dtype=torch.float64, seed=1)
    torch.autograd.gradcheck(lambda x, w, b: _abn(x, None, None, w, b, True, act=act), (x, w, b))
    torch.autograd.gradcheck(lambda x, w, b: _abn(x, rm, rv, w, b, False, act=act), (x, w, b), fast_mode=True)
    torch.autograd.gradcheck(lambda x: _abn(x, None, None, None, None, True, act=act), (x,), fast_mode=True)


def test_gradcheck_float64_channels_last():
    x, w, b, _, _ = _inputs(shape=(2, 3, 2, 3), fmt=torch.channels_last, dtype=torch.float64, seed=2)
    torch.autograd.gradcheck(lambda x, w, b: _abn(x, None, None, w, b, True, act="elu"), (x, w, b))


@pytest.mark.parametrize("case", ["train", "eval", "no_affine_no_stats", "channels_last", "non_dense"])
def test_opcheck(case):
    x, w, b, rm, rv = _inputs(shape=(3, 4, 3, 3), dtype=torch.float64)
    # The mutated input cannot be a leaf that requires grad; the parameters carry requires_grad.
    x = x.detach()
    args = (x, w, b, rm, rv, True, 0.1, 1e-5, "leaky_relu", 0.01)
    if case == "eval":
        args = (x, w, b, rm, rv, False, 0.1, 1e-5, "elu", 1.0)
    elif case == "no_affine_no_stats":
        args = (x, None, None, None, None, True, 0.1, 1e-5, "identity", 0.0)
    elif case == "channels_last":
        args = (x.to(memory_format=torch.channels_last), w, b, rm, rv, True, 0.1, 1e-5, "elu", 0.5)
    elif case == "non_dense":
        args = (
            torch.randn(3, 4, 3, 6, dtype=torch.float64)[..., ::2],
            w,
            b,
            rm,
            rv,
            True,
            0.1,
            1e-5,
            "leaky_relu",
            0.1,
        )
    torch.library.opcheck(torch.ops.memsave.inplace_abn.default, args)
    out = args[0].clone()
    _, invstd = torch.ops.memsave.inplace_abn(out, *args[1:])
    out = out.detach()  # it now has the op's grad_fn; the backward operator is checked on plain tensors
    wd = args[1].detach() if args[1] is not None else None
    bd = args[2].detach() if args[2] is not None else None
    torch.library.opcheck(
        torch.ops.memsave.inplace_abn_backward.default,
        (torch.randn_like(out), out, wd, bd, invstd, args[5], args[8], args[9]),
    )


def test_non_dense_input_is_written_back():
    base = torch.randn(2, 3, 4, 8)
    view = base[..., ::2]
    expected = TF.leaky_relu(TF.batch_norm(view.clone(), None, None, training=True), 0.01)
    out = MF.inplace_abn(view, None, None, training=True)
    assert out is view and rel_err(base[..., ::2], expected) <= FLOAT32_RTOL
    assert torch.equal(base[..., 1::2], base[..., 1::2])  # untouched elements stay


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("act", ["leaky_relu", "identity"])
def test_low_precision_error_at_most_twice_torchs(dtype, act):
    """Output, input and bias gradients: within twice torch's own low-precision error. The weight gradient
    sums g * xhat with xhat recovered from the stored low-precision output, so it carries that rounding: relative
    error up to the dtype's epsilon, where torch (which keeps the exact input) is far more accurate. Documented on
    InPlaceABN2d; BatchNormAct2d has no such limit."""
    x, w, b, _, _ = _inputs(shape=(4, 6, 8, 8), seed=3)
    ours, torchs, refs = bn_low_precision_grads(_abn, x, w, b, dtype, act)
    assert_low_precision_ok(ours[0], torchs[0], refs[0], "grad input")
    assert_low_precision_ok(ours[2], torchs[2], refs[2], "grad bias")
    assert rel_err(ours[1], refs[1]) <= torch.finfo(dtype).eps


# ------------------------------------------------------------------------------------------- documented limits
def test_zero_gamma_channel():
    """gamma == 0 loses xhat: input gradient 0 (exact), bias gradient exact, weight gradient NaN (documented)."""
    x, w, b, _, _ = _inputs(shape=(4, 3, 5, 5), seed=5)
    with torch.no_grad():
        w[1] = 0.0
    x2, w2, b2 = leaf_copies(x, w, b)
    y = _abn(x, None, None, w, b, True, act="leaky_relu")
    y2 = bn_reference(x2, None, None, w2, b2, True, "leaky_relu")
    g = torch.randn_like(y)
    gx, gw, gb = torch.autograd.grad(y, (x, w, b), g)
    rx, rw, rb = torch.autograd.grad(y2, (x2, w2, b2), g)
    assert torch.all(gx[:, 1] == 0) and torch.allclose(rx[:, 1], torch.zeros_like(rx[:, 1]))
    assert rel_err(gx, rx) <= FLOAT32_RTOL and rel_err(gb, rb) <= FLOAT32_RTOL
    assert math.isnan(gw[1].item())
    assert rel_err(gw[[0, 2]], rw[[0, 2]]) <= FLOAT32_RTOL


def test_small_gamma_float64_stays_accurate():
    x, w, b, _, _ = _inputs(shape=(4, 3, 5, 5), dtype=torch.float64, seed=6)
    with torch.no_grad():
        w.copy_(torch.tensor([1e-3, -1e-4, 2.0], dtype=torch.float64))
    x2, w2, b2 = leaf_copies(x, w, b)
    y = _abn(x, None, None, w, b, True, act="elu")
    y2 = bn_reference(x2, None, None, w2, b2, True, "elu")
    g = torch.randn_like(y)
    for o, r in zip(torch.autograd.grad(y, (x, w, b), g), torch.autograd.grad(y2, (x2, w2, b2), g)):
        assert rel_err(o, r) <= 1e-9


def test_autograd_in_place_rules():
    a = torch.randn(2, 3, 4, 4, requires_grad=True)
    s = torch.sigmoid(a)  # sigmoid keeps its output, which inplace_abn then overwrites
    MF.inplace_abn(s, None, None, training=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        s.sum().backward()
    with pytest.raises(RuntimeError, match="leaf Variable"):
        MF.inplace_abn(torch.randn(2, 3, 4, 4, requires_grad=True), None, None, training=True)


def test_double_backward_raises():
    x, w, b, _, _ = _inputs(shape=(2, 3, 2, 2))
    assert_no_double_backward(x, lambda: _abn(x, None, None, w, b, True).sum())


# ---------------------------------------------------------------------------------------------------------- module
@pytest.mark.parametrize(
    "kwargs",
    [{}, {"momentum": None}, {"track_running_stats": False}, {"affine": False}],
    ids=["default", "cumulative", "no_stats", "no_affine"],
)
def test_module_loads_batchnorm2d_weights_and_matches(kwargs):
    torch.manual_seed(0)
    bn = nn.BatchNorm2d(5, **kwargs)
    if bn.affine:
        with torch.no_grad():
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.normal_()
    abn = InPlaceABN2d(5, act="leaky_relu", act_param=0.1, **kwargs)
    abn.load_state_dict(bn.state_dict())  # the standard parametrization: BatchNorm2d weights load unchanged
    assert list(abn.state_dict()) == list(bn.state_dict())
    for step in range(3):
        x = torch.randn(4, 5, 3, 3, generator=torch.Generator().manual_seed(step))
        ref = TF.leaky_relu(bn(x), 0.1)
        assert rel_err(abn(x.clone()), ref) <= FLOAT32_RTOL
    for key, value in bn.state_dict().items():
        assert torch.equal(abn.state_dict()[key], value), key
    bn.eval()
    abn.eval()
    x = torch.randn(2, 5, 3, 3)
    assert rel_err(abn(x.clone()), TF.leaky_relu(bn(x), 0.1)) <= FLOAT32_RTOL


def test_module_gradients_in_a_conv_block():
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 6, 3, padding=1)
    bn = nn.BatchNorm2d(6)
    abn = InPlaceABN2d.from_batchnorm(bn, act="elu")
    assert abn.weight is bn.weight
    x = torch.randn(2, 3, 8, 8)
    y, y2 = abn(conv(x)), TF.elu(bn(conv(x)))
    g = torch.randn_like(y)
    ours = torch.autograd.grad(y, (conv.weight, abn.weight, abn.bias), g)
    refs = torch.autograd.grad(y2, (conv.weight, bn.weight, bn.bias), g)
    for o, r in zip(ours, refs):
        assert rel_err(o, r) <= FLOAT32_RTOL


def test_bad_input():
    for act in ("relu", "gelu", "silu"):
        with pytest.raises(ValueError, match="not invertible"):
            InPlaceABN2d(4, act=act)
    with pytest.raises(ValueError, match="positive"):
        InPlaceABN2d(4, act="leaky_relu", act_param=0.0)
    with pytest.raises(ValueError, match="not invertible"):
        MF.inplace_abn(torch.randn(2, 4, 3, 3), None, None, training=True, act="relu")
    with pytest.raises(ValueError, match="not invertible"):
        torch.ops.memsave.inplace_abn(torch.randn(2, 4, 3, 3), None, None, None, None, True, 0.1, 1e-5, "gelu", 0.0)
    with pytest.raises(ValueError, match="unknown activation"):
        InPlaceABN2d(4, act="prelu")
    with pytest.raises(ValueError, match="expected 4D input"):
        InPlaceABN2d(4)(torch.randn(2, 4))
    with pytest.raises(TypeError, match="SyncBatchNorm"):
        InPlaceABN2d.from_batchnorm(nn.SyncBatchNorm(4))


def test_conv_abn_conv_saved_bytes():
    """conv -> InPlaceABN2d -> conv keeps only the ABN output (which the next conv keeps anyway): two full tensors
    fewer than conv -> BN -> LeakyReLU -> conv (BN input, LeakyReLU input)."""
    torch.manual_seed(0)
    conv1, conv2, bn = nn.Conv2d(8, 16, 3, padding=1), nn.Conv2d(16, 8, 3, padding=1), nn.BatchNorm2d(16)
    eager = nn.Sequential(conv1, bn, nn.LeakyReLU(0.01), conv2)
    fused = nn.Sequential(conv1, InPlaceABN2d.from_batchnorm(bn, act="leaky_relu"), conv2)
    x = torch.randn(4, 8, 16, 16, requires_grad=True)
    full = 4 * 16 * 16 * 16 * 4
    eager_bytes, y_eager = saved_bytes(lambda: eager(x), module_state(eager))
    fused_bytes, y_fused = saved_bytes(lambda: fused(x), module_state(fused))
    assert eager_bytes - fused_bytes >= 2 * full
    assert rel_err(y_fused, y_eager) <= FLOAT32_RTOL


# ------------------------------------------------------------------------------------------------------------ CUDA


@pytest.mark.cuda
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("act", ACTS)
def test_cuda_matches_float64_reference(act, fmt):
    x, w, b, rm, rv = _inputs(shape=(8, 32, 12, 12), fmt=FORMATS[fmt], seed=7)
    xc = x.detach().cuda().to(memory_format=FORMATS[fmt]).requires_grad_()
    wc, bc = (t.detach().cuda().requires_grad_() for t in (w, b))
    rmc, rvc = rm.cuda(), rv.cuda()
    y = _abn(xc, rmc, rvc, wc, bc, True, act=act)
    x64, w64, b64 = leaf_copies(x, w, b, dtype=torch.float64)
    rm64, rv64 = rm.double(), rv.double()
    y64 = bn_reference(x64, rm64, rv64, w64, b64, True, act)
    assert rel_err(y.cpu(), y64) <= FLOAT32_RTOL
    assert rel_err(rmc.cpu(), rm64) <= FLOAT32_RTOL and rel_err(rvc.cpu(), rv64) <= FLOAT32_RTOL
    g = torch.randn(y.shape, generator=torch.Generator().manual_seed(8))
    ours = torch.autograd.grad(y, (xc, wc, bc), g.cuda())
    refs = torch.autograd.grad(y64, (x64, w64, b64), g.double())
    for o, r in zip(ours, refs):
        assert rel_err(o.cpu(), r) <= FLOAT32_RTOL


@pytest.mark.cuda
def test_cuda_opcheck_half():
    x, w, b, _, _ = _inputs(shape=(4, 8, 6, 6), seed=9)
    args = (
        x.detach().half().cuda(),
        w.detach().cuda().requires_grad_(),
        b.detach().cuda().requires_grad_(),
        None,
        None,
        True,
        0.1,
        1e-5,
        "leaky_relu",
        0.01,
    )
    torch.library.opcheck(torch.ops.memsave.inplace_abn.default, args)
