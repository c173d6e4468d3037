"""memsave::max_pool2d / max_pool2d_backward: opcheck, gradcheck, bitwise equality with torch over random arguments
and strides, the 1-byte saved argmax, and the arguments it refuses."""

from __future__ import annotations

import math
import random

import pytest
import torch
import torch.nn.functional as TF

import memsave  # noqa: F401  (loads the operators)
import memsave.functional as MF
import memsave.nn as mnn
from helpers import DTYPES
from helpers.masks import assert_matches_torch, saved_bytes


def op_args(k, s, p, d, ceil):
    pair = lambda v: [v, v] if isinstance(v, int) else list(v)  # noqa: E731
    return pair(k), pair(s), pair(p), pair(d), ceil


@pytest.mark.parametrize("dtype", DTYPES)
def test_opcheck(device, dtype):
    x = torch.randn(2, 3, 9, 8, dtype=dtype, device=device)
    for args in [op_args(2, 2, 0, 1, False), op_args(3, (2, 1), 1, (1, 2), True)]:
        torch.library.opcheck(torch.ops.memsave.max_pool2d.default, (x.clone().requires_grad_(), *args))
    torch.library.opcheck(
        torch.ops.memsave.max_pool2d.default, (x[0].transpose(1, 2).requires_grad_(), *op_args(3, 2, 1, 1, False))
    )  # 3D, strided
    k, s, p, d, ceil = op_args(3, 2, 1, 1, True)
    out, argmax = torch.ops.memsave.max_pool2d(x, k, s, p, d, ceil)
    torch.library.opcheck(
        torch.ops.memsave.max_pool2d_backward.default,
        (torch.randn_like(out).requires_grad_(), argmax, list(x.shape), k, s, p, d),
    )


def test_gradcheck_float64(device):
    x = torch.randn(2, 2, 7, 6, dtype=torch.float64, device=device, requires_grad=True)
    for k, s, p, d, ceil in [(2, 2, 0, 1, False), (3, 1, 1, 1, False), (3, 2, 1, 2, True)]:
        fn = lambda t: MF.max_pool2d(t, k, s, p, d, ceil)  # noqa: E731
        assert torch.autograd.gradcheck(fn, (x,))
        assert torch.autograd.gradgradcheck(fn, (x,))


def random_case(rng: random.Random):
    kh, kw = rng.randint(1, 5), rng.randint(1, 5)
    sh, sw = rng.randint(1, 3), rng.randint(1, 3)
    ph, pw = rng.randint(0, kh // 2), rng.randint(0, kw // 2)
    dh, dw = rng.randint(1, 2), rng.randint(1, 2)
    ceil = rng.random() < 0.5
    h = rng.randint((kh - 1) * dh + 1, 14)
    w = rng.randint((kw - 1) * dw + 1, 14)
    batch = rng.choice([None, 1, 3])
    c = rng.randint(1, 4)
    return (kh, kw), (sh, sw), (ph, pw), (dh, dw), ceil, ((c, h, w) if batch is None else (batch, c, h, w))


def layouts(x: torch.Tensor):
    yield "contiguous", x
    if x.dim() == 4:
        yield "channels_last", x.contiguous(memory_format=torch.channels_last)
    big = torch.randn(*x.shape[:-1], x.shape[-1] * 2)
    big[..., ::2] = x
    yield "stepped", big[..., ::2]
    yield "transposed-copy", x.transpose(-1, -2).contiguous().transpose(-1, -2)


@pytest.mark.parametrize("seed", range(12))
def test_bitwise_equal_to_torch_cpu_float32(seed):
    rng = random.Random(seed)
    k, s, p, d, ceil, shape = random_case(rng)
    torch.manual_seed(seed)
    base = torch.randn(shape)
    if seed % 3 == 0:  # ties, -inf and NaN: torch's first-maximum / NaN-wins order must be kept
        base = torch.randint(-2, 3, shape).float()
        base.view(-1)[:: max(1, base.numel() // 5)] = -math.inf
    if seed % 4 == 1:
        base.view(-1)[3] = math.nan
    for label, x in layouts(base):
        assert_matches_torch(
            lambda t: MF.max_pool2d(t, k, s, p, d, ceil),
            lambda t: TF.max_pool2d(t, k, s, p, d, ceil),
            x,
            lambda y: torch.randn(y.shape),
            (label, k, s, p, d, ceil, shape),
        )


@pytest.mark.parametrize("dtype", DTYPES)
def test_all_dtypes_match_torch(dtype):
    x = torch.randn(2, 3, 11, 10).to(dtype)
    assert_matches_torch(
        lambda t: MF.max_pool2d(t, 3, 2, 1),
        lambda t: TF.max_pool2d(t, 3, 2, 1),
        x,
        lambda y: torch.randn(y.shape).to(dtype),
    )


def test_largest_window_and_return_indices():
    x = torch.randn(2, 3, 40, 37, requires_grad=True)
    for args in [(16, 16, 0, 1, False), ((16, 16), (5, 3), (8, 7), 1, True), ((8, 32), 4, (4, 16), 1, False)]:
        y, idx = MF.max_pool2d(x, *args, return_indices=True)
        y2, idx2 = TF.max_pool2d(x, *args, return_indices=True)
        assert torch.equal(y, y2) and torch.equal(idx, idx2)
        g = torch.randn(y.shape)
        (a,) = torch.autograd.grad(y, x, g)
        (b,) = torch.autograd.grad(y2, x, g)
        assert torch.equal(a, b)


def test_argument_forms_like_torch():
    x = torch.randn(1, 2, 9, 9)
    for kwargs in [
        dict(kernel_size=3),
        dict(kernel_size=(3,)),
        dict(kernel_size=[2, 3], stride=()),
        dict(kernel_size=3, stride=[2], padding=(1,), dilation=(2,)),
        dict(kernel_size=2, stride=None),
    ]:
        assert torch.equal(MF.max_pool2d(x, **kwargs), TF.max_pool2d(x, **kwargs)), kwargs


def test_empty_batch():
    x = torch.randn(0, 3, 8, 8, requires_grad=True)
    y = MF.max_pool2d(x, 2)
    assert y.shape == (0, 3, 4, 4)
    y.sum().backward()
    assert x.grad.shape == x.shape


def test_saved_bytes_one_per_output_element_and_not_the_input():
    x = torch.randn(2, 3, 16, 16, requires_grad=True)
    n_out = 2 * 3 * 8 * 8
    assert saved_bytes(lambda t: MF.max_pool2d(t, 2), x) == n_out
    # torch keeps its input (float32) and int64 indices
    assert saved_bytes(lambda t: TF.max_pool2d(t, 2), x) == x.numel() * 4 + n_out * 8


def test_module_matches_torch_module():
    torch.manual_seed(0)
    ours = mnn.MaxPool2d(3, stride=2, padding=1, ceil_mode=True)
    ref = torch.nn.MaxPool2d(3, stride=2, padding=1, ceil_mode=True)
    assert isinstance(ours, torch.nn.MaxPool2d)
    assert ours.extra_repr() == ref.extra_repr() and ours.state_dict().keys() == ref.state_dict().keys()
    x = torch.randn(2, 4, 13, 13)
    assert torch.equal(ours(x), ref(x))
    ours_i = mnn.MaxPool2d(2, return_indices=True)
    _y, idx = ours_i(x)
    assert torch.equal(idx, torch.nn.MaxPool2d(2, return_indices=True)(x)[1])


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        (dict(kernel_size=17), ValueError, "256 positions"),
        (dict(kernel_size=(4, 65)), ValueError, "256 positions"),
        (dict(kernel_size=3, padding=2), ValueError, "half of kernel size"),
        (dict(kernel_size=0), ValueError, "positive"),
        (dict(kernel_size=2, stride=0), ValueError, "positive"),
        (dict(kernel_size=2, dilation=0), ValueError, "positive"),
        (dict(kernel_size=(1, 2, 3)), TypeError, "one or two ints"),
        (dict(kernel_size=2.5), TypeError, "one or two ints"),
    ],
)
def test_unsupported_arguments(kwargs, exc, match):
    x = torch.randn(1, 1, 20, 20)
    with pytest.raises(exc, match=match):
        MF.max_pool2d(x, **kwargs)
    if exc is ValueError:
        with pytest.raises(exc, match=match):
            mnn.MaxPool2d(**kwargs)


def test_bad_inputs():
    with pytest.raises(ValueError, match="3D"):
        MF.max_pool2d(torch.randn(1, 1, 1, 8, 8), 2)
    with pytest.raises(TypeError, match="floating-point"):
        MF.max_pool2d(torch.ones(1, 1, 8, 8, dtype=torch.int64), 2)
    with pytest.raises(RuntimeError, match="floating-point"):
        torch.ops.memsave.max_pool2d(torch.ones(1, 1, 8, 8, dtype=torch.int32), *op_args(2, 2, 0, 1, False))
    with pytest.raises(RuntimeError, match="too small"):
        MF.max_pool2d(torch.randn(1, 1, 2, 2), 3)
    with pytest.raises(RuntimeError, match="256 positions"):
        torch.ops.memsave.max_pool2d(torch.randn(1, 1, 20, 20), *op_args(17, 1, 0, 1, False))
    with pytest.raises(RuntimeError, match="half of kernel"):
        torch.ops.memsave.max_pool2d(torch.randn(1, 1, 20, 20), *op_args(2, 1, 2, 1, False))
    out, argmax = torch.ops.memsave.max_pool2d(torch.randn(1, 2, 8, 8), *op_args(2, 2, 0, 1, False))
    k, s, p, d, _ = op_args(2, 2, 0, 1, False)
    with pytest.raises(RuntimeError, match="argmax to be Byte"):
        torch.ops.memsave.max_pool2d_backward(out, argmax.long(), [1, 2, 8, 8], k, s, p, d)
    with pytest.raises(RuntimeError):
        torch.ops.memsave.max_pool2d_backward(out, argmax.to("meta"), [1, 2, 8, 8], k, s, p, d)


@pytest.mark.cuda
def test_cuda_matches_torch():
    rng = random.Random(0)
    for _ in range(6):
        k, s, p, d, ceil, shape = random_case(rng)
        for dtype in DTYPES:
            x = torch.randn(shape, device="cuda").to(dtype)
            a = x.clone().requires_grad_()
            b = x.clone().requires_grad_()
            ya, yb = MF.max_pool2d(a, k, s, p, d, ceil), TF.max_pool2d(b, k, s, p, d, ceil)
            assert torch.equal(ya, yb)
            g = torch.randn(ya.shape, device="cuda").to(dtype)
            ya.backward(g)
            yb.backward(g)
            tol = dict(rtol=0, atol=0) if dtype in (torch.float32, torch.float64) else dict(rtol=1e-2, atol=1e-2)
            torch.testing.assert_close(a.grad, b.grad, **tol)
