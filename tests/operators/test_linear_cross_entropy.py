"""memsave::linear_cross_entropy (and its tile kernels), memsave.functional.linear_cross_entropy and
memsave.nn.LinearCrossEntropy: against torch's F.linear + F.cross_entropy in float64, float32 and 16-bit, plus the
memory claims (allocator-level, CPU) of the fused loss."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as TF
from torch import nn

import memsave  # noqa: F401  (loads the operators)
from helpers.fused import assert_low_precision_ok, leaf_copies, max_abs_err
from memsave import functional as MF
from memsave.measurement.allocator import cpu_memory_stats, cpu_peak_bytes
from memsave.nn import LinearCrossEntropy

OP = torch.ops.memsave.linear_cross_entropy
REDUCTIONS = ("mean", "sum", "none")
# (tile_rows, tile_classes): automatic, and small ragged tiles that make every row and class loop run several times.
TILES = [(0, 0), (3, 7), (5, 64)]


def _inputs(shape=(4, 5), hidden=16, classes=50, dtype=torch.float32, bias=True, seed=0, ignore=True, device="cpu"):
    """Seeded (hidden, weight, bias, target); hidden/weight/bias require grad; some targets are -100."""
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(*shape, hidden, generator=g, dtype=torch.float64)
    w = torch.randn(classes, hidden, generator=g, dtype=torch.float64) / hidden**0.5
    b = torch.randn(classes, generator=g, dtype=torch.float64) if bias else None
    t = torch.randint(0, classes, shape, generator=g)
    if ignore:
        t.view(-1)[::3] = -100
    leaves = [x.to(device=device, dtype=dtype).requires_grad_() if x is not None else None for x in (h, w, b)]
    return leaves[0], leaves[1], leaves[2], t.to(device)


def _reference(h, w, t, b=None, ignore_index=-100, label_smoothing=0.0, reduction="mean"):
    """torch's composition, classes last, rows flattened."""
    z = TF.linear(h, w, b)
    loss = TF.cross_entropy(
        z.reshape(-1, z.shape[-1]),
        t.reshape(-1),
        ignore_index=ignore_index,
        label_smoothing=label_smoothing,
        reduction=reduction,
    )
    return loss.reshape(t.shape) if reduction == "none" else loss


def _grads(loss, inputs, grad):
    present = [x for x in inputs if x is not None]
    return torch.autograd.grad(loss, present, grad)


def _ours(h, w, t, b=None, tiles=(0, 0), ignore_index=-100, label_smoothing=0.0, reduction="mean"):
    if tiles == (0, 0):
        return MF.linear_cross_entropy(
            h, w, t, b, ignore_index=ignore_index, label_smoothing=label_smoothing, reduction=reduction
        )
    return OP(h, w, t, b, ignore_index, label_smoothing, reduction, *tiles)[0]


def _check_against_float64(dtype, tiles, reduction, label_smoothing, bias, shape=(4, 5), device="cpu", seed=0):
    """The project's accuracy rule: the loss and every gradient err at most twice as much as torch's own
    composition in ``dtype`` does, both against torch's composition in float64."""
    h, w, b, t = _inputs(shape, dtype=dtype, bias=bias, seed=seed, device=device)
    kw = dict(label_smoothing=label_smoothing, reduction=reduction)
    ht, wt, bt = leaf_copies(h, w, b)
    h64, w64, b64 = leaf_copies(h, w, b, dtype=torch.float64)
    loss = _ours(h, w, t, b, tiles, **kw)
    loss_t = _reference(ht, wt, t, bt, **kw)
    loss_64 = _reference(h64, w64, t, b64, **kw)
    assert loss.dtype == dtype and loss.shape == loss_64.shape
    assert_low_precision_ok(loss, loss_t, loss_64, "loss")
    g = torch.randn(loss.shape, generator=torch.Generator().manual_seed(seed + 1), dtype=torch.float64)
    names = ("hidden", "weight", "bias")
    for name, o, r, r64 in zip(
        names,
        _grads(loss, (h, w, b), g.to(dtype)),
        _grads(loss_t, (ht, wt, bt), g.to(dtype)),
        _grads(loss_64, (h64, w64, b64), g),
    ):
        assert o.dtype == dtype and o.shape == r64.shape
        assert_low_precision_ok(o, r, r64, f"grad {name}")


# ------------------------------------------------------------------------------------------------------ accuracy
@pytest.mark.parametrize("tiles", TILES)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
@pytest.mark.parametrize("bias", [False, True])
def test_float64_matches_torch(tiles, reduction, label_smoothing, bias):
    h, w, b, t = _inputs(dtype=torch.float64, bias=bias)
    kw = dict(label_smoothing=label_smoothing, reduction=reduction)
    h2, w2, b2 = leaf_copies(h, w, b)
    loss, ref = _ours(h, w, t, b, tiles, **kw), _reference(h2, w2, t, b2, **kw)
    assert loss.shape == ref.shape and max_abs_err(loss, ref) <= 1e-12 * max(1.0, ref.abs().max().item())
    g = torch.randn_like(ref)
    for o, r in zip(_grads(loss, (h, w, b), g), _grads(ref, (h2, w2, b2), g)):
        assert max_abs_err(o, r) <= 1e-12 * max(1.0, r.abs().max().item())


@pytest.mark.parametrize("tiles", TILES)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
@pytest.mark.parametrize("bias", [False, True])
def test_float32_within_twice_torchs_error(tiles, reduction, label_smoothing, bias):
    _check_against_float64(torch.float32, tiles, reduction, label_smoothing, bias)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("tiles", [(0, 0), (3, 7)])
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_16bit_within_twice_torchs_error(dtype, tiles, reduction, label_smoothing):
    _check_against_float64(dtype, tiles, reduction, label_smoothing, bias=True, shape=(6, 11))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_large_vocabulary_within_twice_torchs_error(dtype):
    """Many class tiles (automatic sizes: 4096 classes per tile at 256 rows) and logits of a trained model's size."""
    g = torch.Generator().manual_seed(3)
    rows, hidden, classes = 256, 64, 20000
    h = (torch.randn(rows, hidden, generator=g, dtype=torch.float64) * 2).to(dtype).requires_grad_()
    w = (torch.randn(classes, hidden, generator=g, dtype=torch.float64) / 4).to(dtype).requires_grad_()
    t = torch.randint(0, classes, (rows,), generator=g)
    ht, wt = leaf_copies(h, w)
    h64, w64 = leaf_copies(h, w, dtype=torch.float64)
    loss, loss_t, loss_64 = MF.linear_cross_entropy(h, w, t), _reference(ht, wt, t), _reference(h64, w64, t)
    assert_low_precision_ok(loss, loss_t, loss_64, "loss")
    for name, o, r, r64 in zip(
        ("hidden", "weight"),
        _grads(loss, (h, w), None),
        _grads(loss_t, (ht, wt), None),
        _grads(loss_64, (h64, w64), None),
    ):
        assert_low_precision_ok(o, r, r64, f"grad {name}")


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_three_dim_hidden_and_non_contiguous_inputs(reduction):
    g = torch.Generator().manual_seed(4)
    h = torch.randn(7, 3, 16, generator=g, dtype=torch.float64).transpose(0, 1).requires_grad_()  # (3, 7, 16)
    w = torch.randn(16, 40, generator=g, dtype=torch.float64).t().requires_grad_()  # (40, 16), transposed
    t = torch.randint(0, 40, (7, 3), generator=g).t()
    h2, w2 = leaf_copies(h, w)
    loss = OP(h, w, t, None, -100, 0.0, reduction, 2, 9)[0]
    ref = _reference(h2, w2, t, reduction=reduction)
    assert loss.shape == ref.shape and max_abs_err(loss, ref) <= 1e-12
    gy = torch.randn_like(ref)
    if reduction == "none":
        gy = gy.t().contiguous().t()  # a non-contiguous incoming gradient
    for o, r in zip(_grads(loss, (h, w), gy), _grads(ref, (h2, w2), gy)):
        assert o.shape == r.shape and max_abs_err(o, r) <= 1e-12


@pytest.mark.parametrize("label_smoothing", [0.0, 0.2])
def test_ignore_index_like_torch(label_smoothing):
    h, w, b, t = _inputs(dtype=torch.float64)
    # An ignore_index that is also a class index: those rows are ignored, as in torch.
    t2 = t.clone()
    t2[t2 == -100] = 3
    for ignore_index, target in ((-100, t), (3, t2), (-1, t2)):
        for reduction in REDUCTIONS:
            kw = dict(ignore_index=ignore_index, label_smoothing=label_smoothing, reduction=reduction)
            h2, w2, b2 = leaf_copies(h, w, b)
            loss, ref = _ours(h, w, target, b, (3, 7), **kw), _reference(h2, w2, target, b2, **kw)
            assert max_abs_err(loss, ref) <= 1e-12
            gy = torch.ones_like(ref)
            for o, r in zip(_grads(loss, (h, w, b), gy), _grads(ref, (h2, w2, b2), gy)):
                assert max_abs_err(o, r) <= 1e-12


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_all_rows_ignored(label_smoothing):
    h, w, b, _ = _inputs(dtype=torch.float32)
    t = torch.full((4, 5), -100)
    for reduction in REDUCTIONS:
        loss = MF.linear_cross_entropy(h, w, t, b, label_smoothing=label_smoothing, reduction=reduction)
        ref = _reference(h, w, t, b, label_smoothing=label_smoothing, reduction=reduction)
        # mean over no rows is 0 / 0 = nan in torch, and here; the gradients are zero in both.
        assert torch.equal(loss.isnan(), ref.isnan()) and torch.equal(loss.nan_to_num(), ref.nan_to_num())
        gy = torch.ones_like(ref)
        for o in _grads(loss, (h, w, b), gy):
            assert torch.count_nonzero(o) == 0


def test_no_rows():
    h, w, _, _ = _inputs(dtype=torch.float32, bias=False)
    h0 = h[:0].detach().requires_grad_()
    t0 = torch.zeros((0, 5), dtype=torch.long)
    for reduction in REDUCTIONS:
        loss, ref = MF.linear_cross_entropy(h0, w, t0, reduction=reduction), _reference(h0, w, t0, reduction=reduction)
        assert loss.shape == ref.shape and torch.equal(loss.isnan(), ref.isnan())
        if reduction == "sum":
            gh, gw = torch.autograd.grad(loss, (h0, w))
            assert gh.shape == h0.shape and torch.count_nonzero(gw) == 0


def test_extreme_logits_like_torch():
    """-inf logits (masked classes), a huge logit, and rows whose softmax underflows everywhere but the target."""
    h = torch.zeros(3, 4, dtype=torch.float64, requires_grad=True)
    w = torch.zeros(6, 4, dtype=torch.float64)
    b = torch.tensor([0.0, -math.inf, 3.0, 1e4, -1e4, 2.0], dtype=torch.float64, requires_grad=True)
    t = torch.tensor([0, 3, 5])
    b2 = b.detach().clone().requires_grad_()
    loss, ref = OP(h, w, t, b, -100, 0.0, "none", 2, 4)[0], _reference(h, w, t, b2, reduction="none")
    assert torch.allclose(loss, ref, rtol=1e-12, atol=0)
    (gb,), (gb2,) = torch.autograd.grad(loss.sum(), (b,)), torch.autograd.grad(ref.sum(), (b2,))
    assert torch.allclose(gb, gb2, rtol=1e-12, atol=1e-300)


# ------------------------------------------------------------------------------------------- gradcheck, opcheck
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("label_smoothing", [0.0, 0.3])
def test_gradcheck_float64(reduction, label_smoothing):
    h, w, b, t = _inputs((2, 3), hidden=5, classes=9, dtype=torch.float64)
    fn = lambda h, w, b: OP(h, w, t, b, -100, label_smoothing, reduction, 2, 4)[0]  # noqa: E731
    torch.autograd.gradcheck(fn, (h, w, b))
    torch.autograd.gradcheck(
        lambda h, w: MF.linear_cross_entropy(h, w, t, reduction=reduction, label_smoothing=label_smoothing), (h, w)
    )


def test_opcheck():
    h, w, b, t = _inputs((2, 3), hidden=8, classes=20, dtype=torch.float64)
    for args in (
        (h, w, t, b, -100, 0.0, "mean", 0, 0),
        (h, w, t, None, -100, 0.1, "none", 2, 6),
        (h.float(), w.float(), t.clamp(min=1), None, 1, 0.0, "sum", 0, 0),
    ):
        torch.library.opcheck(OP.default, args)
    loss, lse = OP(h, w, t, b, -100, 0.1, "none", 2, 6)
    d = [x.detach() for x in (h, w, b)]
    gy = torch.randn_like(loss)
    bwd = torch.ops.memsave.linear_cross_entropy_backward.default
    torch.library.opcheck(bwd, (gy, d[0], d[1], t, d[2], lse, -100, 0.1, "none", [True, True, True], 2, 6))
    torch.library.opcheck(bwd, (gy.sum(), d[0], d[1], t, None, lse, -100, 0.0, "sum", [True, False, False]))
    torch.library.opcheck(bwd, (gy.sum(), d[0], d[1], t, d[2], lse, -100, 0.0, "mean", [False, True, True]))
    logits = TF.linear(d[0], d[1]).reshape(-1, 20)[:, 4:12].contiguous()
    rows = logits.shape[0]
    state = torch.zeros(rows, 3, dtype=torch.float64)
    state[:, 0] = -math.inf
    tf = t.reshape(-1)
    torch.library.opcheck(torch.ops.memsave.cross_entropy_tile_lse_.default, (logits, tf, state, 4, 20, -100, 0.1))
    torch.library.opcheck(
        torch.ops.memsave.cross_entropy_tile_grad_.default,
        (logits.clone(), tf, lse, torch.ones(1, dtype=torch.float64), 4, 20, -100, 0.1),
    )


def test_double_backward_raises():
    h, w, b, t = _inputs(dtype=torch.float64)
    loss = MF.linear_cross_entropy(h, w, t, b)
    (gh,) = torch.autograd.grad(loss, (h,), create_graph=True)
    with pytest.raises(NotImplementedError, match="double backward"):
        gh.sum().backward()


def test_only_needed_gradients_are_computed():
    h, w, _b, t = _inputs(dtype=torch.float64)
    w_frozen = w.detach()
    loss = MF.linear_cross_entropy(h, w_frozen, t)
    (gh,) = torch.autograd.grad(loss, (h,))
    h2 = h.detach().clone().requires_grad_()
    (gh2,) = torch.autograd.grad(_reference(h2, w_frozen, t), (h2,))
    assert max_abs_err(gh, gh2) <= 1e-12
    out = torch.ops.memsave.linear_cross_entropy_backward(
        torch.tensor(1.0, dtype=torch.float64),
        h.detach(),
        w_frozen,
        t,
        None,
        OP(h.detach(), w_frozen, t)[1],
        -100,
        0.0,
        "mean",
        [False, True, False],
    )
    assert out[0].numel() == 0 and out[1].shape == w.shape and out[2].numel() == 0


def test_torch_compile_fullgraph_cpu():
    torch._dynamo.reset()
    h, w, b, t = _inputs(dtype=torch.float32)

    def f(h, w, b):  # the fake kernels give inductor the shapes; the operators run as they are
        return MF.linear_cross_entropy(h * 2, w, t, b, label_smoothing=0.1)

    results = []
    for fn in (f, torch.compile(f, fullgraph=True)):
        h.grad = w.grad = b.grad = None
        loss = fn(h, w, b)
        loss.backward()
        results.append((loss.detach(), h.grad.clone(), w.grad.clone(), b.grad.clone()))
    for a, c in zip(*results):
        assert torch.allclose(a, c, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------------------------- tile kernels
def test_tile_lse_is_an_online_log_sum_exp():
    g = torch.Generator().manual_seed(5)
    z = torch.randn(6, 37, generator=g) * 10
    t = torch.tensor([0, 5, 36, -100, 20, 11])
    state = torch.zeros(6, 3, dtype=torch.float64)
    state[:, 0] = -math.inf
    for c0 in range(0, 37, 10):  # four tiles, the last one narrow
        torch.ops.memsave.cross_entropy_tile_lse_(z[:, c0 : c0 + 10].contiguous(), t, state, c0, 37, -100, 0.0)
    lse = state[:, 0] + state[:, 1].log()
    keep = t != -100
    assert torch.allclose(lse[keep], torch.logsumexp(z.double(), 1)[keep], rtol=1e-6)
    assert torch.equal(state[~keep], torch.tensor([[-math.inf, 0.0, 0.0]], dtype=torch.float64))
    assert torch.equal(state[keep, 2], z[keep, t[keep]].double())  # the linear part without smoothing: z_target


def test_softmax_exp_within_two_ulp_and_special_values():
    """cross_entropy_tile_grad_ with lse 0, scale 1 and a target outside the tile computes exp(z) itself: the
    polynomial exp that the CPU and CUDA kernels share."""
    z = torch.cat(
        [
            torch.linspace(-87.0, 88.0, 200001),
            torch.tensor([0.0, -1e-8, 1e-8, -87.5, -100.0, 89.0, 1e30, -math.inf, math.inf, math.nan]),
        ]
    )
    rows = z.reshape(1, -1).contiguous()
    out = rows.clone()
    torch.ops.memsave.cross_entropy_tile_grad_(
        out,
        torch.tensor([rows.shape[1]]),
        torch.zeros(1, dtype=torch.float64),
        torch.ones(1),
        0,
        rows.shape[1] + 1,
        -100,
        0.0,
    )
    out = out[0]
    ref = torch.exp(z.double())
    finite = (z >= -87.3) & (z <= 88.0)  # below -87.34 it returns 0 (documented)
    ulp = torch.finfo(torch.float32).eps * ref[finite]
    assert ((out[finite].double() - ref[finite]).abs() <= 2 * ulp).all()
    special = out[-10:]
    assert special[0] == 1.0 and special[4] == 0.0 and special[7] == 0.0  # exp(0), underflow, exp(-inf)
    assert special[5] == math.inf and special[6] == math.inf and special[8] == math.inf and special[9].isnan()


_ISA_SCRIPT = """
import os, sys, torch, memsave
from memsave import functional as MF
sys.path[:0] = [sys.argv[1], os.path.dirname(sys.argv[1])]  # this folder, and tests/ for helpers
import test_linear_cross_entropy as T
for dtype in (torch.float32, torch.bfloat16):
    for tiles in ((0, 0), (3, 7)):
        T._check_against_float64(dtype, tiles, "mean", 0.1, True, shape=(6, 11))
h, w, b, t = T._inputs(dtype=torch.float32)
print(repr(MF.linear_cross_entropy(h, w, t, b, label_smoothing=0.1).item()))
"""


@pytest.mark.parametrize("capability", ["default", "avx2"])
def test_every_cpu_instruction_set_variant(capability):
    """The row loops are compiled for the baseline, AVX2 and AVX-512 and picked at run time (capped by
    ATEN_CPU_CAPABILITY, as ATen's kernels are): each variant meets the accuracy rule and gives this process's
    loss up to float32 rounding."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, ATEN_CPU_CAPABILITY=capability)
    here = os.path.dirname(os.path.abspath(__file__))
    out = subprocess.run([sys.executable, "-c", _ISA_SCRIPT, here], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    h, w, b, t = _inputs(dtype=torch.float32)
    loss = MF.linear_cross_entropy(h, w, t, b, label_smoothing=0.1).item()
    assert abs(float(out.stdout.strip().splitlines()[-1]) - loss) <= 1e-6 * abs(loss)


# ------------------------------------------------------------------------------------------------------ errors
def test_bad_arguments_name_the_argument():
    h, w, b, t = _inputs(dtype=torch.float32)
    with pytest.raises(ValueError, match="weight must have shape"):
        MF.linear_cross_entropy(h, w[:, :8], t)
    with pytest.raises(ValueError, match="target must have hidden's leading shape"):
        MF.linear_cross_entropy(h, w, t[:, :2])
    with pytest.raises(ValueError, match="bias must have shape"):
        MF.linear_cross_entropy(h, w, t, b[:3])
    with pytest.raises(TypeError, match="target must hold int64"):
        MF.linear_cross_entropy(h, w, t.int())
    with pytest.raises(TypeError, match="weight has dtype"):
        MF.linear_cross_entropy(h, w.double(), t)
    with pytest.raises(TypeError, match="bias has dtype"):
        MF.linear_cross_entropy(h, w, t, b.double())
    with pytest.raises(TypeError, match="floating-point"):
        MF.linear_cross_entropy(t, w, t)
    with pytest.raises(IndexError, match=r"target holds 50 at \(flattened\) index 1"):
        bad = t.clone()
        bad[0, 1] = 50
        MF.linear_cross_entropy(h, w, bad)
    with pytest.raises(IndexError, match="target holds -1"):
        MF.linear_cross_entropy(h, w, torch.full_like(t, -1))
    with pytest.raises(ValueError, match="reduction must be"):
        MF.linear_cross_entropy(h, w, t, reduction="avg")
    with pytest.raises(ValueError, match="reduction must be"):
        OP(h, w, t, None, -100, 0.0, "avg")
    with pytest.raises(ValueError, match=r"label_smoothing must be in \[0, 1\]"):
        MF.linear_cross_entropy(h, w, t, label_smoothing=1.5)
    with pytest.raises(RuntimeError, match="weight is on meta"):
        OP(h, w.to("meta"), t)
    with pytest.raises(RuntimeError, match="target is on meta"):
        OP(h, w, t.to("meta"))


# ------------------------------------------------------------------------------------------------------ memory
def test_after_forward_it_holds_one_float_per_row_not_the_logits():
    rows, hidden, classes = 512, 64, 8000
    g = torch.Generator().manual_seed(6)
    h = torch.randn(rows, hidden, generator=g, requires_grad=True)
    w = torch.randn(classes, hidden, generator=g, requires_grad=True)
    t = torch.randint(0, classes, (rows,), generator=g)
    stats = cpu_memory_stats(lambda: MF.linear_cross_entropy(h, w, t))
    logits_bytes = rows * classes * 4
    # What forward leaves alive: the loss and the saved log-sum-exp (one float64 per row), nothing of the logits.
    assert stats.net_bytes <= rows * 8 + 64, stats
    eager = cpu_memory_stats(lambda: _reference(h, w, t))
    assert eager.net_bytes >= logits_bytes  # torch keeps the log-softmax
    # One tile of logits, no larger than hidden itself (at least 64 Ki logits), and small change.
    assert stats.peak_bytes <= max(rows * hidden, 2**16) * 4 + 64 * 1024, stats


def test_forward_backward_peak_is_under_a_quarter_of_eager():
    """Acceptance size: N=1024, hidden 256, V=32000, CPU, float32, allocator-level."""
    rows, hidden, classes = 1024, 256, 32000
    g = torch.Generator().manual_seed(7)
    h = torch.randn(rows, hidden, generator=g, requires_grad=True)
    w = (torch.randn(classes, hidden, generator=g) / 16).requires_grad_()
    t = torch.randint(0, classes, (rows,), generator=g)

    def step(fn):
        def run():
            h.grad = w.grad = None
            fn(h, w, t).backward()

        return run

    step(_reference)()  # warm-up: first-call allocations are not part of a step
    step(MF.linear_cross_entropy)()
    h.grad = w.grad = None
    eager = cpu_peak_bytes(step(_reference))
    h.grad = w.grad = None
    ours = cpu_peak_bytes(step(MF.linear_cross_entropy))
    assert ours <= eager / 4, (ours, eager)
    # What it is made of: the weight gradient (32.8 MB), the input gradient and one tile of logits no larger than
    # the input (1 MiB: as a chunked loss whose chunks match the input, torch's F.linear_cross_entropy with options).
    assert ours <= classes * hidden * 4 + 2 * rows * hidden * 4 + 256 * 1024, (ours, eager)


# ------------------------------------------------------------------------------------------------------ module
def test_module_constructs_like_linear_and_loads_an_lm_head():
    torch.manual_seed(0)
    lin = nn.Linear(16, 50)
    torch.manual_seed(0)
    head = LinearCrossEntropy(16, 50)
    assert torch.equal(head.weight, lin.weight) and torch.equal(head.bias, lin.bias)
    assert list(head.state_dict()) == list(lin.state_dict()) == ["weight", "bias"]
    no_bias = LinearCrossEntropy(16, 50, bias=False, label_smoothing=0.1, ignore_index=0, reduction="sum")
    no_bias.load_state_dict(nn.Linear(16, 50, bias=False).state_dict())
    assert "num_classes=50" in repr(no_bias) and "label_smoothing=0.1" in repr(no_bias)
    h, _, _, t = _inputs(dtype=torch.float32)
    h2 = h.detach().clone().requires_grad_()
    loss = head(h, t)
    ref = TF.cross_entropy(lin(h2).reshape(-1, 50), t.reshape(-1))
    assert max_abs_err(loss, ref) <= 1e-5
    for o, r in zip(
        torch.autograd.grad(loss, (h, head.weight, head.bias)), torch.autograd.grad(ref, (h2, lin.weight, lin.bias))
    ):
        assert max_abs_err(o, r) <= 1e-5 * max(1.0, r.abs().max().item())
    with pytest.raises(ValueError, match="reduction"):
        LinearCrossEntropy(16, 50, reduction="avg")
    with pytest.raises(ValueError, match="label_smoothing"):
        LinearCrossEntropy(16, 50, label_smoothing=-0.1)


def test_from_linear_shares_a_tied_head():
    emb = nn.Embedding(50, 16)
    lm_head = nn.Linear(16, 50, bias=False)
    lm_head.weight = emb.weight  # tied, as GPT-2's
    head = LinearCrossEntropy.from_linear(lm_head, ignore_index=-1)
    assert head.weight is emb.weight and head.bias is None and head.ignore_index == -1
    h, _, _, t = _inputs(dtype=torch.float32, bias=False)
    head(h, t.clamp(min=0)).backward()
    assert emb.weight.grad is not None and emb.weight.grad.shape == (50, 16)
    with pytest.raises(TypeError, match="nn.Linear"):
        LinearCrossEntropy.from_linear(emb)


def test_autocast_cpu_bfloat16():
    h, w, b, t = _inputs(dtype=torch.float32)
    h2, w2, b2 = leaf_copies(h, w, b)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = MF.linear_cross_entropy(h, w, t, b)
        ref = TF.cross_entropy(TF.linear(h2, w2, b2).reshape(-1, 50).float(), t.reshape(-1))
    assert loss.dtype == torch.float32
    assert abs(loss.item() - ref.item()) <= 2e-2 * abs(ref.item())
    for o, r in zip(torch.autograd.grad(loss, (h, w, b)), torch.autograd.grad(ref, (h2, w2, b2))):
        assert o.dtype == torch.float32 and max_abs_err(o, r) <= 3e-2 * r.abs().max().item()


# -------------------------------------------------------------------------------------------------------- CUDA
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_device_float32_within_twice_torchs_error(device, reduction):
    _check_against_float64(torch.float32, (0, 0), reduction, 0.1, True, shape=(8, 9), device=device)
    _check_against_float64(torch.float32, (3, 7), reduction, 0.0, False, shape=(8, 9), device=device)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cuda_16bit_within_twice_torchs_error(dtype):
    _check_against_float64(dtype, (0, 0), "mean", 0.1, True, shape=(64, 33), device="cuda")


@pytest.mark.cuda
def test_cuda_matches_cpu_kernels():
    h, w, b, t = _inputs((16, 9), classes=1000, dtype=torch.float32)
    loss_cpu, lse_cpu = OP(h.detach(), w.detach(), t, b.detach(), -100, 0.1, "none", 5, 300)
    loss_gpu, lse_gpu = OP(h.detach().cuda(), w.detach().cuda(), t.cuda(), b.detach().cuda(), -100, 0.1, "none", 5, 300)
    keep = t.reshape(-1) != -100
    assert torch.allclose(lse_gpu.cpu()[keep], lse_cpu[keep], rtol=1e-5)
    assert torch.allclose(loss_gpu.cpu(), loss_cpu, rtol=1e-5, atol=1e-5)
    with pytest.raises(IndexError, match="target holds"):
        OP(h.detach().cuda(), w.detach().cuda(), torch.full_like(t, 1000).cuda())
