"""memsave.amp: the fused unscale-and-check / update-scale operators and the GradScaler built on them.

References: torch._amp_foreach_non_finite_check_and_unscale_, torch._amp_update_scale_ and torch.amp.GradScaler
(which supports device="cpu"), compared with torch.equal: memsave's scaler must reproduce torch's scale, growth
tracker, skipped steps and weights exactly.
"""

from __future__ import annotations

import math
import pickle
from collections import defaultdict
from typing import Callable, Dict, List, Optional, Tuple

import pytest
import torch
from torch import nn

import memsave
import memsave.amp
from helpers import DTYPES
from memsave.amp import GradScaler, needs_grad_scaling


# ---------------------------------------------------------------------------------------------------- operators
def _torch_unscale(grads: List[torch.Tensor], found: torch.Tensor, inv: torch.Tensor) -> None:
    by_dtype: Dict[torch.dtype, List[torch.Tensor]] = defaultdict(list)
    for g in grads:
        by_dtype[g.dtype].append(g)
    for group in by_dtype.values():
        torch._amp_foreach_non_finite_check_and_unscale_(group, found, inv)


def _mixed_grads(device: str, seed: int = 0) -> List[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    sizes = [0, 1, 7, 31, 1000, 70_001, 3, 4096 + 5]
    grads = []
    for i, n in enumerate(sizes):
        dtype = DTYPES[i % len(DTYPES)]
        grads.append((torch.randn(n, generator=gen) * 300).to(dtype).to(device))
    # Wide dynamic range in 16 bits: subnormal results, and (for inv_scale > 1) results that round to inf.
    for dtype in (torch.float16, torch.bfloat16):
        wide = torch.randn(5003, generator=gen) * torch.exp(torch.randn(5003, generator=gen) * 4)
        grads.append(wide.clamp(-6e4, 6e4).to(dtype).to(device))
    # A transposed (dense, non-contiguous) and a strided (non-dense) gradient.
    grads.append((torch.randn(33, 17, generator=gen) * 300).to(device).t())
    grads.append((torch.randn(40, 9, generator=gen) * 300).to(device)[::3, 1:7])
    return grads


@pytest.mark.parametrize("inv_value", [1.0 / 1024, 1.0, 3.0 / 7.0, 4096.0])
def test_unscale_matches_torch_bitwise(device: str, inv_value: float) -> None:
    grads, ref = _mixed_grads(device), _mixed_grads(device)  # built twice: clone() would densify the strided one
    inv = torch.full((), inv_value, dtype=torch.float32, device=device)
    found, found_ref = torch.zeros((), device=device), torch.zeros((), device=device)
    torch.ops.memsave.unscale_and_check_(grads, found, inv)
    _torch_unscale(ref, found_ref, inv)
    for i, (g, r) in enumerate(zip(grads, ref)):
        assert torch.equal(g, r), f"gradient {i} ({g.dtype}, {tuple(g.shape)}) differs from torch's"
        assert g.stride() == r.stride()
    assert found.item() == 0.0 and found_ref.item() == 0.0


@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan])
def test_unscale_detects_nonfinite_in_every_dtype_and_position(device: str, bad: float) -> None:
    for dtype in DTYPES:
        for where in (0, 12_345, 69_999):  # first element, middle, last of a 70,000-element gradient
            grads = [torch.ones(10, dtype=dtype, device=device), torch.ones(70_000, dtype=dtype, device=device)]
            grads[1][where] = bad
            flags = torch.zeros(2, device=device)
            found = torch.zeros((), device=device)
            torch.ops.memsave.unscale_and_check_(grads, found, torch.full((), 0.5, device=device), flags)
            assert found.item() == 1.0, (dtype, where)
            assert flags.tolist() == [0.0, 1.0], (dtype, where)
            assert torch.equal(grads[0], torch.full((10,), 0.5, dtype=dtype, device=device))


def test_unscale_never_clears_found_inf_and_inv_one_leaves_memory_untouched() -> None:
    found = torch.ones(())
    g = torch.randn(100)
    before = g.clone()
    torch.ops.memsave.unscale_and_check_([g], found, torch.ones(()))
    assert found.item() == 1.0  # the caller zeroes it: calls share one flag
    assert torch.equal(g, before)


def test_update_scale_matches_torch_with_hysteresis_one() -> None:
    gen = torch.Generator().manual_seed(3)
    scale, tracker = torch.full((), 1024.0), torch.zeros((), dtype=torch.int32)
    scale_ref, tracker_ref = scale.clone(), tracker.clone()
    overflow = torch.zeros((), dtype=torch.int32)
    for _ in range(200):
        found = torch.full((), float(torch.rand((), generator=gen) < 0.3))
        torch.ops.memsave.amp_update_scale_(scale, tracker, overflow, found, 2.0, 0.5, 3, 1)
        torch._amp_update_scale_(scale_ref, tracker_ref, found, 2.0, 0.5, 3)
        assert torch.equal(scale, scale_ref) and torch.equal(tracker, tracker_ref)
    # Growth stops short of float32 infinity, as in torch.
    scale.fill_(3e38)
    tracker.fill_(2)
    torch.ops.memsave.amp_update_scale_(scale, tracker, overflow, torch.zeros(()), 2.0, 0.5, 3, 1)
    assert scale.item() == pytest.approx(3e38) and tracker.item() == 0


def _reference_update(
    scale: float, growth: int, overflows: int, found: bool, hysteresis: int, interval: int
) -> Tuple[float, int, int]:
    if found:
        overflows = min(overflows + 1, hysteresis)
        return (scale * 0.5 if overflows >= hysteresis else scale), 0, overflows
    growth += 1
    if growth == interval:
        return scale * 2.0, 0, 0
    return scale, growth, 0


@pytest.mark.parametrize("hysteresis", [1, 2, 3])
def test_update_scale_hysteresis_backs_off_after_n_consecutive_overflows(hysteresis: int) -> None:
    pattern = [1, 0, 1, 1, 0, 1, 1, 1, 1, 0, 0, 0, 1, 1, 1]
    int_zero = lambda: torch.zeros((), dtype=torch.int32)  # noqa: E731
    scale, tracker, overflow = torch.full((), 64.0), int_zero(), int_zero()
    fb = (torch.full((), 64.0), torch.zeros((), dtype=torch.int32), torch.zeros((), dtype=torch.int32))
    ref = (64.0, 0, 0)
    for f in pattern:
        found = torch.full((), float(f))
        torch.ops.memsave.amp_update_scale_(scale, tracker, overflow, found, 2.0, 0.5, 3, hysteresis)
        memsave.amp.grad_scaler._update_scale_fallback(
            *fb, found, 2.0, 0.5, 3, hysteresis
        )  # the op-free path for other devices
        ref = _reference_update(*ref, bool(f), hysteresis, 3)
        assert (scale.item(), tracker.item(), overflow.item()) == ref
        assert (fb[0].item(), fb[1].item(), fb[2].item()) == ref


def test_unscale_fallback_matches_op() -> None:
    grads, ref = _mixed_grads("cpu", seed=1), _mixed_grads("cpu", seed=1)
    grads[4][5] = math.nan
    ref[4][5] = math.nan
    inv = torch.full((), 0.25)
    found, found_ref = torch.zeros(()), torch.zeros(())
    flags, flags_ref = torch.zeros(len(grads)), torch.zeros(len(grads))
    memsave.amp.grad_scaler._unscale_fallback(grads, found, inv, flags)
    torch.ops.memsave.unscale_and_check_(ref, found_ref, inv, flags_ref)
    assert all(torch.equal(a, b) for a, b in zip(grads, ref) if not a.isnan().any())
    assert found.item() == found_ref.item() == 1.0 and torch.equal(flags, flags_ref)


def test_operator_errors_are_clear() -> None:
    found, inv = torch.zeros(()), torch.ones(())
    op = torch.ops.memsave.unscale_and_check_
    with pytest.raises(RuntimeError, match="only float, double, half and bfloat16"):
        op([torch.ones(3, dtype=torch.int64)], found, inv)
    with pytest.raises(RuntimeError, match="sparse gradient's values"):
        op([torch.eye(3).to_sparse()], found, inv)
    with pytest.raises(RuntimeError, match="found_inf must be Float"):
        op([torch.ones(3)], torch.zeros((), dtype=torch.float64), inv)
    with pytest.raises(RuntimeError, match="inv_scale must hold exactly one element"):
        op([torch.ones(3)], found, torch.ones(2))
    with pytest.raises(RuntimeError, match="per_tensor must be a contiguous float32 vector"):
        op([torch.ones(3)], found, inv, torch.zeros(2))
    with pytest.raises(RuntimeError, match="hysteresis must be >= 1"):
        torch.ops.memsave.amp_update_scale_(
            torch.ones(()),
            torch.zeros((), dtype=torch.int32),
            torch.zeros((), dtype=torch.int32),
            found,
            2.0,
            0.5,
            10,
            0,
        )


def test_opcheck(device: str) -> None:
    grads = [torch.randn(5, device=device), torch.randn(3, 4, device=device).half()]
    args = (grads, torch.zeros((), device=device), torch.full((), 0.5, device=device))
    torch.library.opcheck(torch.ops.memsave.unscale_and_check_.default, args)
    torch.library.opcheck(torch.ops.memsave.unscale_and_check_.default, args + (torch.zeros(2, device=device),))
    int_scalar = lambda v: torch.full((), v, dtype=torch.int32, device=device)  # noqa: E731
    torch.library.opcheck(
        torch.ops.memsave.amp_update_scale_.default,
        (
            torch.full((), 8.0, device=device),
            int_scalar(1),
            int_scalar(0),
            torch.ones((), device=device),
            2.0,
            0.5,
            2,
            2,
        ),
    )


# -------------------------------------------------------------------------------------------------- GradScaler
def _net(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))


Inject = Callable[[int, nn.Module], None]


def _inject(step: int, model: nn.Module) -> None:
    # Overflows at isolated and consecutive steps, inf and nan, in either layer.
    if step in (2, 9):
        model[0].weight.grad[1, 2] = math.inf
    elif step in (5, 6, 7):
        model[2].bias.grad[0] = math.nan
    elif step == 14:
        model[2].weight.grad[0, 0] = -math.inf


def _train(
    scaler,
    steps: int = 20,
    seed: int = 0,
    inject: Optional[Inject] = _inject,
    opt_cls=torch.optim.Adam,
    model: Optional[nn.Module] = None,
    clip: bool = False,
):
    model = model if model is not None else _net(seed)
    opt = opt_cls(model.parameters(), lr=0.01)
    data = torch.Generator().manual_seed(seed + 1)
    history = []
    for step in range(steps):
        x = torch.randn(4, 6, generator=data)
        opt.zero_grad(set_to_none=True)
        scaler.scale(model(x).pow(2).mean()).backward()
        if inject is not None:
            inject(step, model)
        before = [p.detach().clone() for p in model.parameters()]
        if clip:
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
        scaler.step(opt)
        scaler.update()
        skipped = all(torch.equal(b, p) for b, p in zip(before, model.parameters()))
        history.append((scaler.get_scale(), scaler._get_growth_tracker(), skipped))
    return history, model, opt


@pytest.mark.parametrize("clip", [False, True])
def test_scaler_sequence_equals_torch_exactly(clip: bool) -> None:
    kw = dict(init_scale=2.0**10, growth_interval=3)
    ours, m1, _ = _train(GradScaler("cpu", **kw), clip=clip)
    theirs, m2, _ = _train(torch.amp.GradScaler("cpu", **kw), clip=clip)
    assert ours == theirs
    assert sum(s for _, _, s in ours) == 6  # the six injected overflows, and nothing else, were skipped
    for p, q in zip(m1.parameters(), m2.parameters()):
        assert torch.equal(p, q)


def test_skipped_step_leaves_weights_and_optimizer_state_bitwise_untouched() -> None:
    model = _net()
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    scaler = GradScaler("cpu")
    scaler.scale(model(torch.randn(3, 6)).sum()).backward()
    scaler.step(opt)
    scaler.update()
    params = [p.detach().clone() for p in model.parameters()]
    state = {k: v.clone() for p in model.parameters() for k, v in opt.state[p].items() if torch.is_tensor(v)}
    opt.zero_grad()
    scaler.scale(model(torch.randn(3, 6)).sum()).backward()
    model[0].bias.grad[0] = math.nan
    assert scaler.step(opt) is None
    assert scaler.last_step_skipped is True
    scaler.update()
    assert all(torch.equal(a, b) for a, b in zip(params, model.parameters()))
    after = {k: v for p in model.parameters() for k, v in opt.state[p].items() if torch.is_tensor(v)}
    assert all(torch.equal(state[k], after[k]) for k in state)
    assert scaler.get_scale() == 2.0**15


def test_state_dict_moves_both_ways() -> None:
    kw = dict(init_scale=2.0**8, growth_interval=4)
    ours, theirs = GradScaler("cpu", **kw), torch.amp.GradScaler("cpu", **kw)
    _train(ours, steps=7)
    _train(theirs, steps=7)
    assert {
        k: v for k, v in ours.state_dict().items() if not k.startswith(("hysteresis", "_hysteresis"))
    } == theirs.state_dict()

    # memsave -> torch and torch -> memsave, each continued: identical to the uninterrupted runs.
    to_torch = torch.amp.GradScaler("cpu")
    to_torch.load_state_dict(ours.state_dict())
    to_ours = GradScaler("cpu")
    to_ours.load_state_dict(theirs.state_dict())
    ref = torch.amp.GradScaler("cpu")
    ref.load_state_dict(theirs.state_dict())
    a, _, _ = _train(to_torch, steps=10, seed=5)
    b, _, _ = _train(to_ours, steps=10, seed=5)
    c, _, _ = _train(ref, steps=10, seed=5)
    assert a == b == c
    # Loading before the first scale() (lazy tensors) and after it both take effect.
    late = GradScaler("cpu")
    _train(late, steps=1, inject=None)
    late.load_state_dict(theirs.state_dict())
    assert late.get_scale() == theirs.get_scale() and late._get_growth_tracker() == theirs._get_growth_tracker()
    assert late.get_growth_interval() == 4


def test_hysteresis_in_scaler_and_state_dict() -> None:
    scaler = GradScaler("cpu", init_scale=2.0**10, growth_interval=100, hysteresis=2)
    history, _, _ = _train(scaler, steps=10)
    scales = [s for s, _, _ in history]
    # Overflow at 2 (alone: kept), 5-7 (second and third back off), 9 (alone again after a clean step: kept).
    assert scales == [1024, 1024, 1024, 1024, 1024, 1024, 512, 256, 256, 256]
    assert [skip for _, _, skip in history] == [False, False, True, False, False, True, True, True, False, True]
    sd = scaler.state_dict()
    assert sd["hysteresis"] == 2 and sd["_hysteresis_tracker"] == 1
    other = GradScaler("cpu")
    other.load_state_dict(sd)
    assert other.get_hysteresis() == 2 and other._get_overflow_tracker() == 1
    # A torch state_dict carries no hysteresis: the scaler keeps its own and starts counting from zero.
    other.load_state_dict(torch.amp.GradScaler("cpu").state_dict())
    assert other.get_hysteresis() == 2 and other._get_overflow_tracker() == 0


def test_overflow_diagnostics_name_the_parameters() -> None:
    model = _net()
    scaler = GradScaler("cpu", overflow_diagnostics=model)
    _train(scaler, steps=3, model=model)  # overflow at step 2: model[0].weight
    assert scaler.last_overflow == ["0.weight"]
    _train(scaler, steps=8, model=model)  # last overflow at 7: model[2].bias
    assert scaler.last_overflow == ["2.bias"]
    unnamed = GradScaler("cpu", overflow_diagnostics=True)
    _train(unnamed, steps=3)
    assert unnamed.last_overflow == ["param_groups[0][0] (8, 6)"]
    with pytest.raises(RuntimeError, match="overflow_diagnostics=model"):
        _ = GradScaler("cpu").last_overflow


def test_bf16_needs_no_scaling_and_disabled_scaler_is_a_pass_through() -> None:
    assert needs_grad_scaling(torch.float16) and not needs_grad_scaling(torch.bfloat16)
    scaler = GradScaler.for_autocast("cpu", torch.bfloat16)
    assert not scaler.is_enabled() and scaler.get_scale() == 1.0 and scaler.state_dict() == {}
    model = _net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(torch.randn(4, 6)).float().pow(2).mean()
    assert scaler.scale(loss) is loss
    loss.backward()
    before = [p.detach().clone() for p in model.parameters()]
    scaler.unscale_(opt)
    scaler.step(opt)
    scaler.update()
    assert scaler.last_step_skipped is False
    assert not any(torch.equal(b, p) for b, p in zip(before, model.parameters()))
    assert GradScaler.for_autocast("cpu", torch.float16).is_enabled()


def test_fp16_autocast_training_matches_torch_scaler() -> None:
    def run(scaler):
        model = _net(7)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        data = torch.Generator().manual_seed(8)
        for _ in range(6):
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.float16):
                loss = model(torch.randn(4, 6, generator=data)).float().pow(2).mean()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        return [p.detach() for p in model.parameters()], scaler.get_scale()

    p1, s1 = run(GradScaler("cpu", init_scale=2.0**20))
    p2, s2 = run(torch.amp.GradScaler("cpu", init_scale=2.0**20))
    assert s1 == s2
    assert all(torch.equal(a, b) for a, b in zip(p1, p2))


def test_sparse_gradients_match_torch() -> None:
    def run(scaler, dtype=torch.float32):
        torch.manual_seed(0)
        emb = nn.Embedding(20, 4, sparse=True)
        opt = torch.optim.SGD(emb.parameters(), lr=0.5)
        for step in range(4):
            opt.zero_grad()
            idx = torch.tensor([[1, 3, 3, 7], [step, 3, 19, 0]])
            scaler.scale(emb(idx).pow(2).sum()).backward()
            if step == 2:
                emb.weight.grad._values()[0, 0] = math.inf
            scaler.step(opt)
            scaler.update()
        return emb.weight.detach(), scaler.get_scale()

    (w1, s1), (w2, s2) = run(GradScaler("cpu")), run(torch.amp.GradScaler("cpu"))
    assert s1 == s2 == 2.0**15 and torch.equal(w1, w2)


def test_scale_of_nested_outputs() -> None:
    scaler = GradScaler("cpu", init_scale=4.0)
    a, b = torch.ones(2), torch.full((3,), 2.0)
    out = scaler.scale([a, (b, a)])
    assert isinstance(out, list) and isinstance(out[1], tuple)
    assert torch.equal(out[0], a * 4) and torch.equal(out[1][0], b * 4)
    with pytest.raises(ValueError, match="iterable of Tensors"):
        scaler.scale([a, 3])


def test_pickle_round_trip() -> None:
    scaler = GradScaler("cpu", init_scale=32.0, growth_interval=5, hysteresis=3)
    _train(scaler, steps=3)
    clone = pickle.loads(pickle.dumps(scaler))
    assert clone.state_dict() == scaler.state_dict()


# -------------------------------------------------------------------------------------------------- bad input
def _backward(model: nn.Module, scaler: GradScaler) -> None:
    scaler.scale(model(torch.randn(2, 6)).sum()).backward()


def test_unscale_twice_before_step_raises() -> None:
    model, scaler = _net(), GradScaler("cpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    _backward(model, scaler)
    scaler.unscale_(opt)
    grads = [p.grad.clone() for p in model.parameters()]
    with pytest.raises(RuntimeError, match="already been called on this optimizer"):
        scaler.unscale_(opt)
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, model.parameters()))  # not divided twice
    scaler.step(opt)
    with pytest.raises(RuntimeError, match="after step"):
        scaler.unscale_(opt)
    with pytest.raises(RuntimeError, match="step\\(\\) has already been called"):
        scaler.step(opt)


def test_step_without_backward_raises() -> None:
    model, scaler = _net(), GradScaler("cpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(RuntimeError, match="before scale"):
        scaler.step(opt)
    scaler.scale(model(torch.randn(2, 6)).sum())  # forward and scale, but no backward
    with pytest.raises(RuntimeError, match="found no gradients"):
        scaler.step(opt)
    with pytest.raises(RuntimeError, match="found no inf checks"):
        scaler.update()


def test_optimizer_with_no_gradients_raises() -> None:
    model, frozen = _net(), nn.Linear(3, 3)
    scaler = GradScaler("cpu")
    opt = torch.optim.SGD(frozen.parameters(), lr=0.1)  # its parameters take no part in the loss
    _backward(model, scaler)
    with pytest.raises(RuntimeError, match="take part in the loss"):
        scaler.step(opt)


def test_scaler_for_another_device_raises_or_disables() -> None:
    scaler = GradScaler("cpu")
    with pytest.raises(ValueError, match="created for device 'cpu' but the loss is on 'meta'"):
        scaler.scale(torch.ones((), device="meta"))
    if torch.cuda.is_available():
        with pytest.raises(ValueError, match="created for device 'cpu'"):
            scaler.scale(torch.ones((), device="cuda"))
        with pytest.raises(ValueError, match="created for device 'cuda'"):
            GradScaler("cuda").scale(torch.ones(()))
    else:
        with pytest.warns(UserWarning, match="CUDA is not available"):
            cuda_scaler = GradScaler("cuda")
        assert not cuda_scaler.is_enabled()


def test_float16_parameters_and_bad_arguments_raise() -> None:
    model = _net().half()
    scaler = GradScaler("cpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler.scale(model(torch.randn(2, 6).half()).float().sum()).backward()
    with pytest.raises(ValueError, match="float16 gradients"):
        scaler.step(opt)
    with pytest.raises(ValueError, match="growth_factor"):
        GradScaler("cpu", growth_factor=1.0)
    with pytest.raises(ValueError, match="backoff_factor"):
        GradScaler("cpu", backoff_factor=1.5)
    with pytest.raises(ValueError, match="hysteresis"):
        GradScaler("cpu", hysteresis=0)
    with pytest.raises(RuntimeError, match="empty"):
        GradScaler("cpu").load_state_dict({})
    with pytest.raises(RuntimeError, match="closures"):
        s = GradScaler("cpu")
        s.scale(torch.ones(()))
        s.step(opt, closure=lambda: None)


@pytest.mark.parametrize("init_scale", [0.0, -1.0, float("nan"), float("inf"), -float("inf")])
def test_non_finite_or_non_positive_init_scale_raises(init_scale: float) -> None:
    # 0 would give NaN weights after one step and -1 would ascend the loss, both silently.
    with pytest.raises(ValueError, match="init_scale must be a finite number > 0"):
        GradScaler("cpu", init_scale=init_scale)
    GradScaler("cpu", init_scale=1e-3)  # any finite positive scale is accepted


@pytest.mark.cuda
def test_cuda_scaler_sequence_equals_torch() -> None:
    def run(scaler):
        model = _net().cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        hist = []
        for step in range(12):
            opt.zero_grad()
            with torch.autocast("cuda", dtype=torch.float16):
                loss = model(torch.randn(4, 6, device="cuda")).float().pow(2).mean()
            scaler.scale(loss).backward()
            _inject(step, model)
            scaler.step(opt)
            scaler.update()
            hist.append((scaler.get_scale(), scaler._get_growth_tracker()))
        return hist, [p.detach().cpu() for p in model.parameters()]

    torch.manual_seed(0)
    h1, p1 = run(GradScaler("cuda", growth_interval=2))
    torch.manual_seed(0)
    h2, p2 = run(torch.amp.GradScaler("cuda", growth_interval=2))
    assert h1 == h2 and all(torch.equal(a, b) for a, b in zip(p1, p2))


@pytest.mark.cuda
def test_cuda_unscale_and_update_do_not_synchronize() -> None:
    model = _net().cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = GradScaler("cuda", overflow_diagnostics=model)
    scaler.scale(model(torch.randn(4, 6, device="cuda")).sum()).backward()
    torch.cuda.synchronize()
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        scaler.unscale_(opt)
    finally:
        torch.cuda.set_sync_debug_mode(previous)
    scaler.step(opt)  # the one synchronization: whether to skip
    torch.cuda.set_sync_debug_mode("error")
    try:
        scaler.update()
    finally:
        torch.cuda.set_sync_debug_mode(previous)
    assert scaler.last_step_skipped is False


# ------------------------------------------------------------------ optimizers that unscale and skip by themselves
# torch's fused Adam/AdamW/SGD set _step_supports_amp_scaling: the scaler must not unscale their gradients nor skip
# their step, but hand them optimizer.grad_scale and optimizer.found_inf for the step. A scale that is not a power
# of two makes the difference visible: the optimizer's grad / scale and a separate grad * (1 / scale) round apart.
FUSED = {
    "Adam": lambda params: torch.optim.Adam(params, lr=0.01, fused=True),
    "AdamW": lambda params: torch.optim.AdamW(params, lr=0.01, weight_decay=0.1, fused=True),
    "SGD": lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9, fused=True),
}


def _fused_run(scaler, make_opt, clip: bool, dtype: torch.dtype = torch.float32, steps: int = 12):
    """Train with a fused optimizer; after every step: (scale, growth tracker, optimizer.step calls so far),
    parameters and gradients."""
    model = _net(3).to(dtype)
    opt = make_opt(model.parameters())
    calls = []
    opt.register_step_post_hook(lambda *_: calls.append(1))
    data = torch.Generator().manual_seed(4)
    records = []
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        scaler.scale(model(torch.randn(4, 6, generator=data).to(dtype)).float().pow(2).mean()).backward()
        _inject(step, model)
        if clip:
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
        scaler.step(opt)
        assert not hasattr(opt, "grad_scale") and not hasattr(opt, "found_inf")  # removed after the step
        scaler.update()
        records.append(
            (
                (scaler.get_scale(), scaler._get_growth_tracker(), len(calls)),
                [p.detach().clone() for p in model.parameters()],
                [p.grad.clone() for p in model.parameters()],
            )
        )
    return records


@pytest.mark.parametrize("clip", [False, True], ids=["step-unscales", "unscale_-first"])
@pytest.mark.parametrize("name", sorted(FUSED))
def test_fused_optimizer_steps_exactly_as_with_torch_scaler(name: str, clip: bool) -> None:
    kw = dict(init_scale=1000.0, growth_factor=3.0, growth_interval=3)
    ours = _fused_run(GradScaler("cpu", **kw), FUSED[name], clip)
    theirs = _fused_run(torch.amp.GradScaler("cpu", **kw), FUSED[name], clip)
    skipped = []
    for step, ((c1, p1, g1), (c2, p2, g2)) in enumerate(zip(ours, theirs)):
        # Scale and tracker as torch's, and the optimizer stepped on every iteration (it skips by itself).
        assert c1 == c2 and c1[2] == step + 1, f"step {step}: scale/tracker/calls {c1} != torch's {c2}"
        assert all(torch.equal(a, b) for a, b in zip(p1, p2)), f"step {step}: parameters differ from torch's"
        # Without unscale_, the fused kernel divides the gradients by the scale itself, as with torch's scaler;
        # exactly equal, NaN (injected) where torch's has NaN.
        same = [torch.allclose(a, b, rtol=0.0, atol=0.0, equal_nan=True) for a, b in zip(g1, g2)]
        assert all(same), f"step {step}: gradients differ from torch's"
        previous = ours[step - 1][1] if step else None
        skipped.append(previous is not None and all(torch.equal(a, b) for a, b in zip(previous, p1)))
    assert [i for i, s in enumerate(skipped) if s] == [2, 5, 6, 7, 9]  # exactly the injected overflows


def test_fused_optimizer_with_float16_parameters_matches_torch() -> None:
    # torch only checks (never divides) the gradients of a self-unscaling optimizer, so float16 ones are allowed.
    kw = dict(init_scale=1000.0, growth_interval=3)
    ours = _fused_run(GradScaler("cpu", **kw), FUSED["SGD"], False, torch.float16, steps=8)
    theirs = _fused_run(torch.amp.GradScaler("cpu", **kw), FUSED["SGD"], False, torch.float16, steps=8)
    for (c1, p1, _), (c2, p2, _) in zip(ours, theirs):
        assert c1 == c2 and all(torch.equal(a, b) for a, b in zip(p1, p2))


class _Recording(torch.optim.SGD):
    """A fused SGD that records what the scaler handed it on each step: (grad_scale, found_inf) as floats."""

    def __init__(self, params) -> None:
        super().__init__(params, lr=0.1, fused=True)
        self.seen: List[Tuple[Optional[float], float]] = []

    def step(self, closure=None):  # type: ignore[override]
        grad_scale = getattr(self, "grad_scale", None)
        self.seen.append((None if grad_scale is None else float(grad_scale), float(self.found_inf)))
        return super().step(closure)


def _protocol_run(scaler) -> Tuple[List[Tuple[Optional[float], float]], List[Optional[bool]]]:
    model = _net()
    opt = _Recording(model.parameters())
    skipped = []
    for step in range(6):
        opt.zero_grad()
        scaler.scale(model(torch.randn(2, 6, generator=torch.Generator().manual_seed(step))).sum()).backward()
        if step in (1, 4):
            model[2].bias.grad[1] = math.inf
        if step in (3, 4):
            scaler.unscale_(opt)  # already unscaled: grad_scale None, found_inf from unscale_
        if step == 5:
            opt.grad_scale = torch.full((), 0.25)  # one the optimizer holds: multiplied in, then removed
        scaler.step(opt)
        assert not hasattr(opt, "grad_scale") and not hasattr(opt, "found_inf")
        skipped.append(getattr(scaler, "last_step_skipped", None))
        scaler.update(new_scale=48.0 if step == 0 else None)
    return opt.seen, skipped


def test_fused_optimizer_is_always_stepped_with_grad_scale_and_found_inf() -> None:
    ours, skipped = _protocol_run(GradScaler("cpu", init_scale=64.0, growth_interval=100))
    theirs, _ = _protocol_run(torch.amp.GradScaler("cpu", init_scale=64.0, growth_interval=100))
    assert ours == theirs
    # Called on every step, the overflowing ones (found_inf 1) included; None after unscale_; 0.25 * the scale.
    assert ours == [(64.0, 0.0), (48.0, 1.0), (24.0, 0.0), (None, 0.0), (None, 1.0), (3.0, 0.0)]
    assert skipped == [False, True, False, False, True, False]


class _TakesGradScaler(torch.optim.SGD):
    """The older contract: step(grad_scaler=...) receives the scaler and does the checking itself."""

    _step_supports_amp_scaling = True

    def step(self, closure=None, grad_scaler=None):  # type: ignore[override]
        assert grad_scaler is not None
        found = sum(grad_scaler._check_inf_per_device(self).values())
        self.grad_scale, self.found_inf = grad_scaler._get_scale_async(), found
        try:
            return super().step(closure)
        finally:
            del self.grad_scale, self.found_inf


def test_optimizer_taking_grad_scaler_gets_the_scaler_with_a_future_warning() -> None:
    def run(scaler):
        model = _net()
        opt = _TakesGradScaler(model.parameters(), lr=0.1, fused=True)
        for step in range(4):
            opt.zero_grad()
            scaler.scale(model(torch.randn(2, 6, generator=torch.Generator().manual_seed(step))).sum()).backward()
            if step == 2:
                model[0].weight.grad[0, 0] = math.nan
            with pytest.warns(FutureWarning, match="grad_scale"):
                scaler.step(opt)
            scaler.update()
        return [p.detach() for p in model.parameters()], scaler.get_scale()

    (p1, s1), (p2, s2) = run(GradScaler("cpu", init_scale=1000.0)), run(torch.amp.GradScaler("cpu", init_scale=1000.0))
    assert s1 == s2 == 500.0 and all(torch.equal(a, b) for a, b in zip(p1, p2))


def test_fused_optimizer_without_gradients_or_twice_raises() -> None:
    model, scaler = _net(), GradScaler("cpu", init_scale=1000.0)
    opt = FUSED["Adam"](model.parameters())
    scaler.scale(model(torch.randn(2, 6)).sum())  # no backward
    with pytest.raises(RuntimeError, match="found no gradients"):
        scaler.step(opt)
    assert not hasattr(opt, "grad_scale")
    _backward(model, scaler)
    scaled = [p.grad.clone() for p in model.parameters()]
    scaler.step(opt)
    # The scaler only checked them; the fused kernel divided them by the scale (not times 1 / 1000, rounded).
    assert all(torch.equal(g / 1000.0, p.grad) for g, p in zip(scaled, model.parameters()))
    with pytest.raises(RuntimeError, match="step\\(\\) has already been called"):
        scaler.step(opt)


def test_fused_optimizer_overflow_diagnostics() -> None:
    model = _net()
    scaler = GradScaler("cpu", overflow_diagnostics=model)
    opt = FUSED["Adam"](model.parameters())
    calls = []
    opt.register_step_post_hook(lambda *_: calls.append(1))
    for step in range(3):
        opt.zero_grad()
        _backward(model, scaler)
        _inject(step, model)  # step 2: model[0].weight
        scaler.step(opt)
        scaler.update()
    assert scaler.last_overflow == ["0.weight"] and scaler.last_step_skipped is True
    assert len(calls) == 3  # the optimizer itself skipped the overflowing step


# ------------------------------------------------------------ setters, update(new_scale=), load_state_dict: checked
# Each refused value: the setting, the value, and what the constructor raises for it.
REFUSED = [
    ("scale", 0.0),
    ("scale", -1.0),
    ("scale", math.nan),
    ("scale", math.inf),
    ("scale", 1e39),  # inf in float32
    ("scale", 1e-46),  # zero in float32
    ("scale", "big"),
    ("growth_factor", 0.5),
    ("growth_factor", 1.0),
    ("growth_factor", math.inf),
    ("growth_factor", None),
    ("backoff_factor", 2.0),
    ("backoff_factor", 0.0),
    ("backoff_factor", math.nan),
    ("growth_interval", 0),
    ("growth_interval", 2.5),
    ("growth_interval", "10"),
    ("growth_interval", 2**31),
    ("hysteresis", 0),
    ("hysteresis", 1.5),
    ("hysteresis", True),
]
CONSTRUCTOR_ARGUMENT = {"scale": "init_scale"}


def _constructor_error(setting: str, value) -> BaseException:
    with pytest.raises((TypeError, ValueError)) as info:
        GradScaler("cpu", **{CONSTRUCTOR_ARGUMENT.get(setting, setting): value})
    return info.value


def _started(hysteresis: int = 2) -> Tuple[GradScaler, nn.Module]:
    scaler = GradScaler("cpu", init_scale=2.0**10, growth_interval=5, hysteresis=hysteresis)
    model = _net()
    _train(scaler, steps=3, model=model)
    return scaler, model


@pytest.mark.parametrize("setting,value", REFUSED, ids=[f"{s}={v!r}" for s, v in REFUSED])
def test_every_entry_point_refuses_what_the_constructor_refuses(setting: str, value) -> None:
    expected = _constructor_error(setting, value)
    name = CONSTRUCTOR_ARGUMENT.get(setting, setting)
    scaler, _ = _started()
    before = scaler.state_dict()
    calls = {}
    if setting == "scale":
        calls["new_scale"] = lambda: scaler.update(new_scale=value)
    else:
        calls[setting] = lambda: getattr(scaler, f"set_{setting}")(value)
    key = "scale" if setting == "scale" else setting
    calls[f"state_dict['{key}']"] = lambda: scaler.load_state_dict({**before, key: value})
    for reported, call in calls.items():
        with pytest.raises(type(expected)) as info:
            call()
        # The constructor's message, naming the argument as this entry point calls it.
        assert str(info.value) == str(expected).replace(name, reported, 1), reported
        assert scaler.state_dict() == before, f"{reported} changed the scaler"


@pytest.mark.parametrize("bad", [0.0, -2.0, math.nan, math.inf, 1e39])
def test_update_refuses_a_bad_new_scale_tensor(bad: float) -> None:
    scaler, _ = _started()
    before = scaler.state_dict()
    with pytest.raises(ValueError, match=r"new_scale must be a finite number > 0"):
        scaler.update(new_scale=torch.full((), bad, dtype=torch.float64))
    assert scaler.state_dict() == before
    with pytest.raises(TypeError, match="real number"):
        scaler.update(new_scale=torch.ones((), dtype=torch.complex64))
    scaler.update(new_scale=torch.full((), 3.0))  # a good one is taken, and the scaler goes on
    assert scaler.get_scale() == 3.0


def test_load_state_dict_is_all_or_nothing() -> None:
    scaler, _ = _started(hysteresis=3)
    before = scaler.state_dict()
    good = {**before, "scale": 8.0, "growth_factor": 4.0, "backoff_factor": 0.25, "growth_interval": 7}
    for key, bad in [("hysteresis", 0), ("_hysteresis_tracker", -1), ("_growth_tracker", 2**31), ("scale", 0)]:
        with pytest.raises(ValueError, match=rf"state_dict\['{key}'\] must be"):
            scaler.load_state_dict({**good, key: bad})
        assert scaler.state_dict() == before, key  # the good entries before the bad one were not assigned
    with pytest.raises(TypeError, match=r"state_dict\['growth_interval'\] must be an int, got str"):
        scaler.load_state_dict({**good, "growth_interval": "7"})
    scaler.load_state_dict({**good, "growth_interval": 7.0})  # a whole float is an int
    assert scaler.state_dict() == {**good, "growth_interval": 7}
    assert type(scaler.get_growth_interval()) is int


def test_scale_zero_can_no_longer_reach_the_weights() -> None:
    # The reported failure: a scale of 0 made the next step write NaN into every weight without skipping it.
    scaler, model = _started()
    for sabotage in (
        lambda: scaler.update(new_scale=0.0),
        lambda: scaler.load_state_dict({**scaler.state_dict(), "scale": 0.0}),
    ):
        with pytest.raises(ValueError):
            sabotage()
    _train(scaler, steps=2, model=model, inject=None)
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert scaler.get_scale() == 2.0**10
