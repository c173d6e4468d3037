"""memsave::leaky_relu and memsave::dropout (the other 1-bit mask operators), and what all mask operators share:
torch.compile(fullgraph=True), autocast and checkpoint recompute."""

from __future__ import annotations

import math

import pytest
import torch

import memsave
import memsave.functional as MF
from helpers import DTYPES
from helpers.masks import assert_matches_torch, bits_equal, saved_bytes, special_values, strided_views

OPMATH = {
    torch.float32: torch.float32,
    torch.float64: torch.float64,
    torch.float16: torch.float32,
    torch.bfloat16: torch.float32,
}


def unpack_mask(mask: torch.Tensor, n: int) -> torch.Tensor:
    """Bit i of byte i // 8 as a bool tensor of n elements."""
    bits = (mask.long().unsqueeze(-1) >> torch.arange(8, device=mask.device)) & 1
    return bits.flatten()[:n].bool()


# ---- leaky_relu ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_leaky_relu_opcheck(device, dtype):
    x = torch.randn(3, 5, 7, dtype=dtype, device=device)
    torch.library.opcheck(torch.ops.memsave.leaky_relu.default, (x.clone().requires_grad_(), 0.1))
    torch.library.opcheck(torch.ops.memsave.leaky_relu.default, (x.transpose(0, 2).requires_grad_(), -0.3))
    torch.library.opcheck(torch.ops.memsave.leaky_relu_.default, (x.clone(), 0.1))
    torch.library.opcheck(torch.ops.memsave.leaky_relu_.default, (x.clone().requires_grad_() * 1, 0.2))
    _, mask = torch.ops.memsave.leaky_relu(x, 0.1)
    torch.library.opcheck(
        torch.ops.memsave.leaky_relu_backward.default, (torch.randn_like(x).requires_grad_(), mask, 0.1)
    )


def test_leaky_relu_gradcheck_float64(device):
    x = torch.randn(4, 9, dtype=torch.float64, device=device)
    x = torch.where(x.abs() < 1e-3, torch.full_like(x, 0.5), x).requires_grad_()
    assert torch.autograd.gradcheck(lambda t: MF.leaky_relu(t, 0.2), (x,))
    assert torch.autograd.gradgradcheck(lambda t: MF.leaky_relu(t, 0.2), (x,))
    assert torch.autograd.gradcheck(lambda t: MF.leaky_relu(t * 1, -0.7, inplace=True), (x,))


@pytest.mark.parametrize("slope", [0.01, 0.2, 0.0, -0.5, 1.5])
@pytest.mark.parametrize("shape", [(9,), (3, 17), (2, 3, 5, 11)])
def test_leaky_relu_bitwise_equal_to_torch_cpu_float32(shape, slope):
    base = special_values(math.prod(shape), torch.float32, seed=shape[-1]).view(shape)
    for label, x in strided_views(base):
        g = special_values(x.numel(), torch.float32, seed=9).view(x.shape)
        assert_matches_torch(
            lambda t: MF.leaky_relu(t, slope), lambda t: torch.nn.functional.leaky_relu(t, slope), x, g, label
        )


@pytest.mark.parametrize("dtype", DTYPES)
def test_leaky_relu_all_dtypes_match_torch(dtype):
    x = special_values(1000, dtype, seed=4).view(10, 100)
    assert_matches_torch(
        lambda t: MF.leaky_relu(t, 0.1),
        lambda t: torch.nn.functional.leaky_relu(t, 0.1),
        x,
        torch.randn(10, 100).to(dtype),
    )


def test_leaky_relu_inplace_any_slope_and_saved_bytes():
    x = torch.randn(10, 13, requires_grad=True)
    h = x * 1
    out = MF.leaky_relu(h, -0.5, inplace=True)  # torch refuses a negative slope in place
    assert out is h
    assert torch.equal(h, torch.nn.functional.leaky_relu(x.detach(), -0.5))
    g = torch.randn(10, 13)
    h.backward(g)
    assert torch.equal(x.grad, torch.where(x.detach() > 0, g, g * -0.5))
    n = 1001
    t = torch.randn(n, requires_grad=True)
    assert saved_bytes(lambda v: MF.leaky_relu(v, 0.1), t) == math.ceil(n / 8)
    assert saved_bytes(lambda v: torch.nn.functional.leaky_relu(v, 0.1), t) == 4 * n


def test_leaky_relu_bad_input():
    with pytest.raises(TypeError, match="floating-point"):
        MF.leaky_relu(torch.ones(3, dtype=torch.int64))
    with pytest.raises(RuntimeError, match="floating-point"):
        torch.ops.memsave.leaky_relu(torch.ones(3, dtype=torch.int32), 0.1)
    with pytest.raises(RuntimeError, match="bytes"):
        torch.ops.memsave.leaky_relu_backward(torch.randn(9), torch.zeros(1, dtype=torch.uint8), 0.1)
    with pytest.raises(RuntimeError):
        torch.ops.memsave.leaky_relu_backward(torch.randn(8), torch.zeros(1, dtype=torch.uint8, device="meta"), 0.1)


# ---- dropout ---------------------------------------------------------------------------------------------------


def expected_dropout(x: torch.Tensor, keep: torch.Tensor, p: float) -> torch.Tensor:
    """torch's CPU arithmetic: scale = dtype(1 / (1 - p)) computed in op-math, out = dtype(x * scale)."""
    om = OPMATH[x.dtype]
    scale = (torch.tensor(1.0, dtype=om) / torch.tensor(1.0 - p, dtype=om)).to(x.dtype).to(om)
    return torch.where(keep.view(x.shape), (x.to(om) * scale).to(x.dtype), torch.zeros((), dtype=x.dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_dropout_opcheck(device, dtype):
    x = torch.randn(3, 5, 7, dtype=dtype, device=device)
    torch.library.opcheck(torch.ops.memsave.dropout.default, (x.clone().requires_grad_(), 0.3))
    torch.library.opcheck(torch.ops.memsave.dropout.default, (x.transpose(0, 2).requires_grad_(), 0.7))
    torch.library.opcheck(torch.ops.memsave.dropout_.default, (x.clone(), 0.3))
    torch.library.opcheck(torch.ops.memsave.dropout_.default, (x.clone().requires_grad_() * 1, 0.5))
    _, mask = torch.ops.memsave.dropout(x, 0.3)
    torch.library.opcheck(torch.ops.memsave.dropout_backward.default, (torch.randn_like(x).requires_grad_(), mask, 0.3))


def test_dropout_gradcheck_float64(device):
    x = torch.randn(4, 9, dtype=torch.float64, device=device, requires_grad=True)

    def seeded(t, inplace=False):
        torch.manual_seed(1234)
        return MF.dropout(t * 1 if inplace else t, 0.4, inplace=inplace)

    assert torch.autograd.gradcheck(seeded, (x,))
    assert torch.autograd.gradgradcheck(seeded, (x,))
    assert torch.autograd.gradcheck(lambda t: seeded(t, inplace=True), (x,))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_dropout_output_and_grad_follow_own_mask(dtype, p):
    x = torch.randn(37, 29).to(dtype)
    torch.manual_seed(7)
    out, mask = torch.ops.memsave.dropout(x, p)
    keep = unpack_mask(mask, x.numel())
    assert bits_equal(out, expected_dropout(x, keep, p))
    assert mask[-1].item() >> (x.numel() % 8) == 0  # unused trailing bits are zero
    # the functional form draws the same bits after the same seed, and its gradient uses them
    a = x.clone().requires_grad_()
    torch.manual_seed(7)
    y = MF.dropout(a, p)
    assert bits_equal(y, out)
    g = torch.randn(37, 29).to(dtype)
    y.backward(g)
    assert bits_equal(a.grad, expected_dropout(g, keep, p))


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_dropout_keep_rate(p):
    n = 1_000_000
    torch.manual_seed(0)
    _, mask = torch.ops.memsave.dropout(torch.ones(n), p)
    keep = unpack_mask(mask, n).float()
    sigma = math.sqrt(p * (1 - p) / n)
    assert abs(keep.mean().item() - (1 - p)) < 5 * sigma
    per_bit = keep.view(-1, 8).mean(0)  # every bit position of a byte, each over 125000 elements
    assert (per_bit - (1 - p)).abs().max().item() < 5 * math.sqrt(p * (1 - p) / (n / 8))
    # neighbours are independent: P(both kept) ~ (1 - p)^2
    both = (keep[:-1] * keep[1:]).mean().item()
    assert abs(both - (1 - p) ** 2) < 6 * math.sqrt((1 - p) ** 2 * (1 - (1 - p) ** 2) / n)


def test_dropout_rng_stream():
    x = torch.ones(10_000)
    torch.manual_seed(3)
    state = torch.get_rng_state()
    _, m1 = torch.ops.memsave.dropout(x, 0.5)
    _, m2 = torch.ops.memsave.dropout(x, 0.5)
    assert not torch.equal(m1, m2)  # the generator advances
    assert not torch.equal(torch.get_rng_state(), state)
    torch.set_rng_state(state)
    _, m1b = torch.ops.memsave.dropout(x, 0.5)
    assert torch.equal(m1, m1b)  # restoring the state replays the mask
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        torch.set_rng_state(state)
        _, m1c = torch.ops.memsave.dropout(torch.ones(1_000_003), 0.5)
        torch.set_num_threads(max(2, threads))
        torch.set_rng_state(state)
        _, m1d = torch.ops.memsave.dropout(torch.ones(1_000_003), 0.5)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(m1c, m1d)  # independent of the thread count
    assert torch.equal(m1c[: m1.numel() - 1], m1[:-1])  # element i's bit depends on i alone


def test_dropout_edge_probabilities_and_modes():
    x = torch.randn(100, requires_grad=True)
    assert MF.dropout(x, 0.0) is x
    assert MF.dropout(x, 0.5, training=False) is x
    state = torch.get_rng_state()
    y = MF.dropout(x, 1.0)
    assert torch.equal(y, torch.zeros(100))
    assert torch.equal(torch.get_rng_state(), state)  # p == 1 draws nothing, as torch
    y.sum().backward()
    assert torch.equal(x.grad, torch.zeros(100))
    e = torch.empty(0, 3, requires_grad=True)
    assert MF.dropout(e, 0.5).shape == (0, 3)


def test_dropout_inplace_matches_out_of_place():
    """The mask is drawn in the input's memory order (as torch's bernoulli_ on an input-shaped tensor does), so in
    place on a transposed view of a non-leaf, out of place on that view and out of place on the memory itself draw
    the same bits."""
    x = torch.randn(33, 17)
    b = x.clone().requires_grad_()
    hb = b * 1
    view = hb.t()  # a non-contiguous view of a non-leaf
    torch.manual_seed(5)
    assert MF.dropout(view, 0.3, inplace=True) is view
    torch.manual_seed(5)
    ref = MF.dropout(x, 0.3)  # same seed, same memory order: same bits
    assert bits_equal(hb, ref)
    torch.manual_seed(5)
    assert bits_equal(MF.dropout(x.t(), 0.3), ref.t())
    g = torch.randn(17, 33)
    hb.t().backward(g)
    assert bits_equal(b.grad, expected_dropout(g.t(), ref != 0, 0.3))


def test_dropout_saved_bytes_and_bad_input():
    n = 4001
    t = torch.randn(n, requires_grad=True)
    assert saved_bytes(lambda v: MF.dropout(v, 0.5), t) == math.ceil(n / 8)
    with pytest.raises(ValueError, match="between 0 and 1"):
        MF.dropout(t, 1.5)
    with pytest.raises(RuntimeError, match="between 0 and 1"):
        torch.ops.memsave.dropout(t, -0.1)
    with pytest.raises(TypeError, match="floating-point"):
        MF.dropout(torch.ones(4, dtype=torch.int64), 0.5)
    with pytest.raises(RuntimeError, match="floating-point"):
        torch.ops.memsave.dropout(torch.ones(4, dtype=torch.int32), 0.5)


# ---- checkpoint, autocast, torch.compile -------------------------------------------------------------------------


def _block(lin1, lin2, x, inplace=False):
    h = MF.leaky_relu(lin1(x), 0.1)
    h = MF.dropout(h, 0.3, inplace=inplace)
    return lin2(MF.relu(h, inplace=inplace))


@pytest.mark.parametrize("inplace", [False, True])
@pytest.mark.parametrize("which", ["memsave", "torch"])
def test_checkpointed_dropout_equals_uncheckpointed(which, inplace):
    torch.manual_seed(0)
    lin1, lin2 = torch.nn.Linear(16, 32), torch.nn.Linear(32, 8)
    x = torch.randn(64, 16, requires_grad=True)

    def run(ckpt):
        for p in (*lin1.parameters(), *lin2.parameters(), x):
            p.grad = None
        torch.manual_seed(42)
        if not ckpt:
            y = _block(lin1, lin2, x, inplace)
        elif which == "memsave":
            y = memsave.checkpoint(_block, lin1, lin2, x, inplace)
        else:
            y = torch.utils.checkpoint.checkpoint(_block, lin1, lin2, x, inplace, use_reentrant=False)
        torch.randn(5)  # RNG use between forward and backward must not change the recomputed mask
        y.pow(2).sum().backward()
        return y.detach(), [t.grad.clone() for t in (*lin1.parameters(), *lin2.parameters(), x)]

    y0, g0 = run(False)
    y1, g1 = run(True)
    assert torch.equal(y0, y1)
    for a, b in zip(g0, g1):
        assert torch.equal(a, b)


def test_autocast_cpu_bfloat16_matches_torch():
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 8, 3)
    x = torch.randn(2, 3, 12, 12, requires_grad=True)

    def run(relu, leaky, pool):
        x.grad = None
        conv.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h = relu(conv(x))
            h = pool(leaky(h), 2)
        h.float().sum().backward()
        return h, x.grad.clone(), conv.weight.grad.clone()

    ours = run(MF.relu, lambda t: MF.leaky_relu(t, 0.1), MF.max_pool2d)
    ref = run(torch.relu, lambda t: torch.nn.functional.leaky_relu(t, 0.1), torch.nn.functional.max_pool2d)
    assert ours[0].dtype == torch.bfloat16
    for a, b in zip(ours, ref):
        assert torch.equal(a, b)


def test_torch_compile_fullgraph_cpu():
    torch._dynamo.reset()

    def f(x, w):  # small on purpose: every extra kernel inductor generates costs seconds of C++ compile
        h = MF.relu(x @ w)
        h = MF.leaky_relu(h, 0.2)
        h = MF.dropout(h, 0.25)
        MF.relu(h, inplace=True)
        return MF.max_pool2d(h.view(2, 1, 8, 8), 2, 2)

    x = torch.randn(2, 8, 8, requires_grad=True)
    w = torch.randn(8, 8, requires_grad=True)
    compiled = torch.compile(f, fullgraph=True)
    results = []
    for fn in (f, compiled):
        x.grad = w.grad = None
        torch.manual_seed(11)
        y = fn(x, w)
        y.backward(torch.arange(y.numel(), dtype=y.dtype).view(y.shape))
        results.append((y.detach(), x.grad.clone(), w.grad.clone()))
    for a, b in zip(*results):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6)  # inductor may fuse the matmul epilogue differently


@pytest.mark.cuda
def test_cuda_leaky_relu_and_dropout():
    for dtype in DTYPES:
        x = special_values(10_001, dtype, "cuda", seed=6)
        leaky = (lambda t: MF.leaky_relu(t, 0.1), lambda t: torch.nn.functional.leaky_relu(t, 0.1))
        assert_matches_torch(*leaky, x, torch.ones_like(x), dtype)
        y = torch.randn(1001, device="cuda").to(dtype)
        torch.manual_seed(3)
        out, mask = torch.ops.memsave.dropout(y, 0.3)
        keep = unpack_mask(mask, y.numel())
        assert bits_equal(out.cpu(), expected_dropout(y.cpu(), keep.cpu(), 0.3))
        torch.manual_seed(3)
        assert bits_equal(torch.ops.memsave.dropout(y, 0.3)[0], out)
    n = 1 << 22
    _, mask = torch.ops.memsave.dropout(torch.ones(n, device="cuda"), 0.5)
    assert abs(unpack_mask(mask, n).float().mean().item() - 0.5) < 5 * math.sqrt(0.25 / n)
