"""memsave::gated_act, gated_act_linear and memsave.nn.GatedMLP: against the eager composition
``down(act(gate(x)) * up(x))`` (Hugging Face's LlamaMLP) and a float64 reference, plus what each keeps."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as TF
from torch import nn

import memsave  # noqa: F401  (loads the operators)
from helpers.checks import assert_module_matches, assert_no_double_backward
from helpers.eager import LlamaMLP, pre_norm_layer
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
from memsave.measurement.allocator import cpu_memory_stats
from memsave.nn import GatedMLP

GATED = ("silu", "gelu", "gelu_tanh", "relu", "identity")


def _gate_up(shape=(3, 5, 16), dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple((1.5 * torch.randn(shape, generator=g)).to(dtype).requires_grad_() for _ in range(2))


def _down(d_in=16, d_out=12, dtype=torch.float32, seed=1, bias=True):
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(d_out, d_in, generator=g) / d_in**0.5).to(dtype).requires_grad_()
    b = torch.randn(d_out, generator=g).to(dtype).requires_grad_() if bias else None
    return w, b


def _grads(out, inputs, g):
    return torch.autograd.grad(out, [t for t in inputs if t is not None], g)


# --------------------------------------------------------------------------------------------------------- gated_act
@pytest.mark.parametrize("act", GATED)
def test_gated_act_matches_unfused_float32(act):
    gate, up = _gate_up()
    g2, u2 = leaf_copies(gate, up)
    y, y2 = MF.gated_act(gate, up, act), TORCH_ACTS[act](g2) * u2
    assert rel_err(y, y2) <= FLOAT32_RTOL
    gy = torch.randn_like(y)
    for o, r in zip(_grads(y, (gate, up), gy), _grads(y2, (g2, u2), gy)):
        assert rel_err(o, r) <= FLOAT32_RTOL


@pytest.mark.parametrize("act", GATED)
def test_gated_act_gradcheck_float64(act):
    gate, up = _gate_up((2, 3, 5), dtype=torch.float64)
    torch.autograd.gradcheck(lambda g, u: MF.gated_act(g, u, act), (gate, up))


def test_gated_act_opcheck():
    gate, up = _gate_up((2, 3, 8), dtype=torch.float64)
    for act in ("silu", "gelu_tanh"):
        torch.library.opcheck(torch.ops.memsave.gated_act.default, (gate, up, act))
    torch.library.opcheck(
        torch.ops.memsave.gated_act.default, (gate.detach().bfloat16(), up.detach().bfloat16(), "gelu")
    )
    gy = torch.randn(2, 3, 8, dtype=torch.float64)
    torch.library.opcheck(torch.ops.memsave.gated_act_backward.default, (gy, gate.detach(), up.detach(), "silu"))
    gt, ut = gate.detach().transpose(0, 1), up.detach().transpose(0, 1)  # non-contiguous
    torch.library.opcheck(torch.ops.memsave.gated_act_backward.default, (gy.transpose(0, 1), gt, ut, "gelu"))


# -------------------------------------------------------------------------------------------------- gated_act_linear
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("act", GATED)
def test_gated_act_linear_matches_unfused_float32(act, bias):
    gate, up = _gate_up()
    w, b = _down(bias=bias)
    g2, u2, w2, b2 = leaf_copies(gate, up, w, b)
    y = MF.gated_act_linear(gate, up, w, b, act)
    y2 = TF.linear(TORCH_ACTS[act](g2) * u2, w2, b2)
    assert rel_err(y, y2) <= FLOAT32_RTOL
    gy = torch.randn_like(y)
    for o, r in zip(_grads(y, (gate, up, w, b), gy), _grads(y2, (g2, u2, w2, b2), gy)):
        assert rel_err(o, r) <= FLOAT32_RTOL


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("act", ["silu", "gelu", "gelu_tanh"])
def test_gated_act_linear_error_at_most_twice_torchs(dtype, act):
    """Against a float64 reference, memsave's error (output and all four gradients) is at most 2x that of the eager
    composition run in the same dtype."""
    gate, up = _gate_up((4, 32, 256), dtype=dtype, seed=2)
    w, b = _down(256, 128, dtype=dtype, seed=3)
    args = [gate, up, w, b]
    a64, at = leaf_copies(*args, dtype=torch.float64), leaf_copies(*args)
    y = MF.gated_act_linear(*args, act=act)
    yt = TF.linear(TORCH_ACTS[act](at[0]) * at[1], at[2], at[3])
    y64 = TF.linear(TORCH_ACTS[act](a64[0]) * a64[1], a64[2], a64[3])
    assert y.dtype == dtype
    assert_low_precision_ok(y, yt, y64, "output")
    gy = torch.randn(y.shape, generator=torch.Generator().manual_seed(4)).to(dtype)
    for name, o, t, r in zip(
        ("gate", "up", "weight", "bias"), _grads(y, args, gy), _grads(yt, at, gy), _grads(y64, a64, gy.double())
    ):
        assert_low_precision_ok(o, t, r, f"grad {name}")


def test_gated_act_linear_gradcheck_float64():
    gate, up = _gate_up((2, 3, 5), dtype=torch.float64)
    w, b = _down(5, 4, dtype=torch.float64)
    for act in ("silu", "gelu"):
        torch.autograd.gradcheck(lambda g, u, w, b: MF.gated_act_linear(g, u, w, b, act), (gate, up, w, b))
    torch.autograd.gradcheck(
        lambda g, u, w: MF.gated_act_linear(g, u, w, None, "gelu_tanh"), (gate, up, w), fast_mode=True
    )


def test_gated_act_linear_opcheck():
    gate, up = _gate_up((2, 3, 8), dtype=torch.float64)
    w, b = _down(8, 6, dtype=torch.float64)
    torch.library.opcheck(torch.ops.memsave.gated_act_linear.default, (gate, up, w, b, "silu"))
    torch.library.opcheck(torch.ops.memsave.gated_act_linear.default, (gate, up, w, None, "gelu"))
    d = [t.detach() for t in (gate, up, w)]
    gy = torch.randn(2, 3, 6, dtype=torch.float64)
    torch.library.opcheck(torch.ops.memsave.gated_act_linear_backward.default, (gy, *d, True, "silu"))
    torch.library.opcheck(torch.ops.memsave.gated_act_linear_backward.default, (gy, *d, False, "gelu_tanh"))


def test_gated_act_linear_autocast_cpu_bfloat16():
    torch.manual_seed(0)
    eager = LlamaMLP(32, 64)
    ours = GatedMLP.from_modules(*copy.deepcopy([eager.gate_proj, eager.up_proj, eager.down_proj]), act="silu")
    x = torch.randn(4, 32, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y, y2 = ours(x), eager(x2)
    assert y.dtype == y2.dtype == torch.bfloat16 and rel_err(y, y2) <= 1e-2
    g = torch.randn_like(y)
    for o, r in zip(
        torch.autograd.grad(y, [x, *ours.parameters()], g), torch.autograd.grad(y2, [x2, *eager.parameters()], g)
    ):
        assert o.dtype == r.dtype == torch.float32 and rel_err(o, r) <= 2e-2


# ----------------------------------------------------------------------------------------------------------- modules
def test_gated_mlp_has_llama_keys_and_shares_modules():
    torch.manual_seed(0)
    eager = LlamaMLP(16, 40)
    torch.manual_seed(0)
    ours = GatedMLP(16, 40)
    assert (
        list(ours.state_dict())
        == list(eager.state_dict())
        == ["gate_proj.weight", "up_proj.weight", "down_proj.weight"]
    )
    for a, b in zip(ours.parameters(), eager.parameters()):
        assert torch.equal(a, b)  # same initialization as the nn.Linear layers
    shared = GatedMLP.from_modules(eager.gate_proj, eager.up_proj, eager.down_proj, act="silu")
    assert shared.gate_proj is eager.gate_proj and shared.down_proj.weight is eager.down_proj.weight
    assert_module_matches(shared, eager, torch.randn(2, 7, 16, requires_grad=True))
    biased = GatedMLP(8, 12, act="gelu", bias=True)
    assert sorted(biased.state_dict()) == sorted(
        f"{p}_proj.{k}" for p in ("gate", "up", "down") for k in ("weight", "bias")
    )
    assert "act=gelu" in repr(biased)


def test_gated_mlp_keeps_two_tensors_of_the_mlp_width():
    """Eager keeps x, gate, act(gate), up and the product; memsave keeps x, gate and up. Checked on autograd's saved
    tensors and at allocator level (every CPU allocation minus every free during forward)."""
    torch.manual_seed(0)
    eager = LlamaMLP(256, 704)
    ours = GatedMLP.from_modules(eager.gate_proj, eager.up_proj, eager.down_proj)
    x = torch.randn(4, 64, 256, requires_grad=True)
    rows = 4 * 64
    unit_x, unit_m = rows * 256 * 4, rows * 704 * 4
    eager_saved, _ = saved_bytes(lambda: eager(x), module_state(eager))
    ours_saved, _ = saved_bytes(lambda: ours(x), module_state(ours))
    assert eager_saved == unit_x + 4 * unit_m and ours_saved == unit_x + 2 * unit_m, (eager_saved, ours_saved)
    eager_net = cpu_memory_stats(lambda: eager(x)).net_bytes  # saved tensors + the output
    ours_net = cpu_memory_stats(lambda: ours(x)).net_bytes
    assert eager_net - ours_net >= 2 * unit_m and ours_net <= 2 * unit_m + unit_x + 4096, (eager_net, ours_net)


def test_bad_input():
    gate = torch.randn(2, 8)
    with pytest.raises(ValueError, match="unknown gated activation"):
        MF.gated_act(gate, gate, "tanh")
    with pytest.raises(ValueError, match="act must be one of"):
        torch.ops.memsave.gated_act(gate, gate, "leaky_relu")
    with pytest.raises(ValueError, match="up must have gate's shape"):
        MF.gated_act(gate, torch.randn(2, 7))
    with pytest.raises(RuntimeError, match="up must have gate's dtype"):
        MF.gated_act(gate, gate.double())
    with pytest.raises(ValueError, match="weight must have shape"):
        MF.gated_act_linear(gate, gate, torch.randn(3, 7))
    with pytest.raises(ValueError, match="bias must have shape"):
        MF.gated_act_linear(gate, gate, torch.randn(3, 8), torch.randn(4))
    with pytest.raises(TypeError, match="floating-point"):
        MF.gated_act(torch.ones(2, 8, dtype=torch.int32), torch.ones(2, 8, dtype=torch.int32))
    with pytest.raises(ValueError, match="unknown gated activation"):
        GatedMLP(4, 8, act="softplus")
    with pytest.raises(TypeError, match="down_proj must be an nn.Linear"):
        GatedMLP.from_modules(nn.Linear(4, 8), nn.Linear(4, 8), nn.Identity())


def test_double_backward_raises():
    gate, up = _gate_up((2, 4))
    w, _ = _down(4, 3)
    assert_no_double_backward(
        gate, lambda: MF.gated_act(gate, up).square().sum(), lambda: MF.gated_act_linear(gate, up, w).square().sum()
    )


# ------------------------------------------------------------------------------------------------------------ CUDA
@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_cuda_gated_act_linear_error_at_most_twice_torchs_and_matches_cpu(dtype):
    gate, up = _gate_up((4, 64, 704), dtype=dtype, seed=5)
    w, b = _down(704, 256, dtype=dtype, seed=6)
    cu = [t.detach().cuda().requires_grad_() for t in (gate, up, w, b)]
    ct = [t.detach().cuda().requires_grad_() for t in (gate, up, w, b)]
    a64 = leaf_copies(gate, up, w, b, dtype=torch.float64)
    y = MF.gated_act_linear(*cu, act="silu")
    yt = TF.linear(TF.silu(ct[0]) * ct[1], ct[2], ct[3])
    y64 = TF.linear(TF.silu(a64[0]) * a64[1], a64[2], a64[3])
    assert_low_precision_ok(y.cpu(), yt.cpu(), y64, "output")
    gy = torch.randn(y.shape, generator=torch.Generator().manual_seed(7)).to(dtype)
    for name, o, t, r in zip(
        ("gate", "up", "weight", "bias"),
        _grads(y, cu, gy.cuda()),
        _grads(yt, ct, gy.cuda()),
        _grads(y64, a64, gy.double()),
    ):
        assert_low_precision_ok(o.cpu(), t.cpu(), r, f"grad {name}")
    # The same per-element math as the CPU kernel.
    p_cpu = MF.gated_act(gate.detach(), up.detach(), "gelu")
    p_cuda = MF.gated_act(cu[0].detach(), cu[1].detach(), "gelu").cpu()
    assert rel_err(p_cuda.double(), p_cpu.double()) <= torch.finfo(dtype).eps
    torch.library.opcheck(torch.ops.memsave.gated_act.default, (cu[0].detach(), cu[1].detach(), "silu"))


def test_llama_mlp_block_with_fused_norm_keeps_keys_values_and_three_tensors():
    """post_attention_layernorm -> GatedMLP whose gate/up are fused with the norm (README's Llama recipe): the same
    state_dict keys and values as eager, and forward keeps x, gate and up only."""
    from memsave.nn import fuse_rms_norm_linear

    layer, ref = pre_norm_layer("post_attention_layernorm", "mlp", lambda: LlamaMLP(64, 176), 64)
    mlp = layer.mlp
    layer.post_attention_layernorm, (gate, up) = fuse_rms_norm_linear(
        layer.post_attention_layernorm, mlp.gate_proj, mlp.up_proj
    )
    layer.mlp = GatedMLP.from_modules(gate, up, mlp.down_proj, act="silu")
    assert list(layer.state_dict()) == list(ref.state_dict())
    x = torch.randn(2, 8, 64, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    kept, y = saved_bytes(lambda: layer(x), module_state(layer))
    y2 = ref(x2)
    assert kept == x.numel() * 4 + 2 * 2 * 8 * 176 * 4  # x, gate, up
    assert rel_err(y, y2) <= FLOAT32_RTOL
    gy = torch.randn_like(y)
    for o, r in zip(
        torch.autograd.grad(y, [x, *layer.parameters()], gy), torch.autograd.grad(y2, [x2, *ref.parameters()], gy)
    ):
        assert rel_err(o, r) <= FLOAT32_RTOL
