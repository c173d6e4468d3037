"""Round four of unusual calls that must work as eager PyTorch does (the wrong calls of that round, which must raise,
are cases in the files of their areas): forward-mode AD through the operators that have a jvp rule, explicit
``torch.Generator`` objects inside a recompute region, zero-width and empty tensors through the fused operators,
inplace_abn on an empty batch and on a channel slice, gated_act's relu gate gradient where ``grad * up`` overflows,
a chunked MLP on 2-d input, and a selective context with ``allow_cache_entry_mutation=True``."""

from __future__ import annotations

import copy
import functools
from typing import Any, Callable, List, Tuple

import pytest
import torch
import torch.autograd.forward_ad as fwAD
import torch.nn.functional as TF
from torch import nn
from torch.utils import checkpoint as torch_checkpoint

import memsave
from bad_input.checking import rand
from memsave import functional as F


def _leaf(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).requires_grad_()


# ------------------------------------------------------------------------------------------ forward-mode AD
def _linear_relu_linear() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def _with_memsave_relu(model: nn.Sequential) -> nn.Sequential:
    """``model`` with its ReLU swapped for memsave.nn.ReLU, as memsave.convert swaps it where the mask pays."""
    copied = copy.deepcopy(model)
    copied[1] = memsave.nn.ReLU(inplace=model[1].inplace)
    return copied


@pytest.mark.parametrize("inplace", [False, True])
def test_jvp_through_linear_memsave_relu_linear_equals_eager(inplace: bool) -> None:
    eager = _linear_relu_linear()
    eager[1].inplace = inplace
    converted = _with_memsave_relu(eager)
    x, t = rand(5, 8), torch.randn(5, 8, generator=torch.Generator().manual_seed(3))
    out_e, tan_e = torch.func.jvp(eager, (x,), (t,))
    out_m, tan_m = torch.func.jvp(converted, (x,), (t,))
    assert torch.equal(out_m, out_e) and torch.equal(tan_m, tan_e)
    assert tan_m.abs().sum() > 0  # the defect: a zero tangent


def _dual_run(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, t: torch.Tensor) -> Tuple[Any, Any]:
    with fwAD.dual_level():
        out = fn(fwAD.make_dual(x, t))
        primal, tangent = fwAD.unpack_dual(out)
        return primal.detach().clone(), tangent.detach().clone()


MASK_OPS = {
    "relu": (lambda x: F.relu(x), TF.relu),
    "relu-inplace": (lambda x: F.relu(x.clone(), inplace=True), lambda x: TF.relu(x.clone(), inplace=True)),
    "leaky_relu": (lambda x: F.leaky_relu(x, 0.2), lambda x: TF.leaky_relu(x, 0.2)),
    "leaky_relu-inplace": (
        lambda x: F.leaky_relu(x.clone(), 0.2, inplace=True),
        lambda x: TF.leaky_relu(x.clone(), 0.2, inplace=True),
    ),
    "max_pool2d": (lambda x: F.max_pool2d(x, 2), lambda x: TF.max_pool2d(x, 2)),
    "max_pool2d-padded-dilated": (
        lambda x: F.max_pool2d(x, 3, 2, 1, 2, ceil_mode=True),
        lambda x: TF.max_pool2d(x, 3, 2, 1, 2, ceil_mode=True),
    ),
}


@pytest.mark.parametrize("name", sorted(MASK_OPS))
def test_forward_ad_tangent_equals_eager(name: str) -> None:
    ours, theirs = MASK_OPS[name]
    x, t = rand(2, 3, 8, 8), torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(4))
    out, tangent = _dual_run(ours, x, t)
    out_e, tangent_e = _dual_run(theirs, x, t)
    assert torch.equal(out, out_e) and torch.equal(tangent, tangent_e)


@pytest.mark.parametrize("inplace", [False, True])
def test_forward_ad_dropout_tangent_follows_its_mask(inplace: bool) -> None:
    x, t = rand(64, 32) + 5.0, torch.randn(64, 32, generator=torch.Generator().manual_seed(5))  # no zero inputs
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        out, tangent = _dual_run(lambda d: F.dropout(d.clone(), 0.3, inplace=inplace), x, t)
    kept = out != 0
    assert 0 < kept.sum() < kept.numel()
    assert torch.allclose(tangent, torch.where(kept, t / 0.7, torch.zeros(())), rtol=1e-6, atol=0)


@pytest.mark.parametrize("act", ["silu", "gelu", "gelu_tanh", "relu", "identity"])
def test_jvp_gated_act_equals_eager(act: str) -> None:
    eager_act = {
        "silu": TF.silu,
        "gelu": TF.gelu,
        "gelu_tanh": functools.partial(TF.gelu, approximate="tanh"),
        "relu": TF.relu,
        "identity": lambda g: g,
    }[act]
    gate, up = rand(4, 16), torch.randn(4, 16, generator=torch.Generator().manual_seed(6))
    tg, tu = torch.randn(4, 16, generator=torch.Generator().manual_seed(7)), rand(4, 16) * 0.5
    out, tangent = torch.func.jvp(lambda g, u: F.gated_act(g, u, act=act), (gate, up), (tg, tu))
    out_e, tangent_e = torch.func.jvp(lambda g, u: eager_act(g) * u, (gate, up), (tg, tu))
    torch.testing.assert_close(out, out_e)
    torch.testing.assert_close(tangent, tangent_e)


def test_forward_ad_and_backward_together_equal_eager() -> None:
    eager = _linear_relu_linear()
    converted = _with_memsave_relu(eager)
    x, t = rand(5, 8), torch.randn(5, 8, generator=torch.Generator().manual_seed(8))
    tangents = []
    for model in (eager, converted):
        with fwAD.dual_level():
            out = model(fwAD.make_dual(x, t))
            tangents.append(fwAD.unpack_dual(out).tangent.detach().clone())
            out.sum().backward()
    assert torch.equal(tangents[0], tangents[1])
    for a, b in zip(eager.parameters(), converted.parameters()):
        assert torch.equal(a.grad, b.grad)


def test_forward_ad_of_the_mask_backward_operator_is_linear_in_grad_out() -> None:
    x = rand(6, 5)
    _out, mask = torch.ops.memsave.relu(x)
    g, tg = rand(6, 5), torch.randn(6, 5, generator=torch.Generator().manual_seed(9))
    with fwAD.dual_level():
        grad_in = torch.ops.memsave.relu_backward(fwAD.make_dual(g, tg), mask)
        tangent = fwAD.unpack_dual(grad_in).tangent
    assert torch.equal(tangent, torch.where(x > 0, tg, torch.zeros(())))


# ------------------------------------------------------------------------------------------ explicit generators
def _noisy_block(g: torch.Generator) -> Callable[[torch.Tensor], torch.Tensor]:
    torch.manual_seed(0)
    lin = nn.Linear(8, 8)

    def block(x: torch.Tensor) -> torch.Tensor:
        h = lin(x)
        keep = torch.rand(h.shape, generator=g) > 0.3
        h = h * keep + torch.randn(h.shape, generator=g) * 0.1
        noise = torch.empty_like(h).normal_(0.0, 0.5, generator=g)
        order = torch.randperm(h.shape[1], generator=g)
        return (h + noise)[:, order].tanh()

    block.lin = lin  # type: ignore[attr-defined]
    return block


def _run_generator_block(checkpointed: Callable[..., Any], draw_between: bool) -> List[torch.Tensor]:
    g = torch.Generator().manual_seed(42)
    block = _noisy_block(g)
    x = _leaf(4, 8)
    y = checkpointed(block, x)
    if draw_between:  # the generator is used again between forward and backward
        torch.rand(3, generator=g)
    y.square().sum().backward()
    return [y.detach(), x.grad, block.lin.weight.grad, block.lin.bias.grad, g.get_state()]  # type: ignore


REGIONS = {
    "checkpoint": memsave.checkpoint,
    "checkpoint-early_stop-False": functools.partial(memsave.checkpoint, early_stop=False),
    "checkpointed": lambda fn, x: memsave.checkpointed(fn, name="noisy")(x),
    "nested": lambda fn, x: memsave.checkpoint(lambda z: memsave.checkpoint(fn, z) * 1.0, x),
}


@pytest.mark.parametrize("draw_between", [False, True])
@pytest.mark.parametrize("region", sorted(REGIONS))
def test_explicit_generator_is_replayed_bitwise(region: str, draw_between: bool) -> None:
    eager = _run_generator_block(lambda fn, x: fn(x), draw_between)
    ours = _run_generator_block(REGIONS[region], draw_between)
    assert all(torch.equal(a, b) for a, b in zip(eager, ours))  # values, gradients and the generator's final state


class _NoisyLayer(nn.Module):
    """Dropout-like noise from a generator the module owns: wrap's regions must replay it."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)
        self.gen = torch.Generator().manual_seed(7)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.linear(x)
        return h * (torch.rand(h.shape, generator=self.gen) > 0.5) * 2.0


def _noisy_model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(_NoisyLayer(), nn.ReLU(), _NoisyLayer(), nn.ReLU(), nn.Linear(8, 2))


@pytest.mark.parametrize("how", ["wrap", "checkpoint_sequential"])
def test_generator_owned_by_modules_is_replayed_by_wrap_and_sequential(how: str) -> None:
    eager, model = _noisy_model(), _noisy_model()
    x = rand(4, 8)
    eager(x).sum().backward()
    if how == "wrap":
        memsave.wrap(model, _NoisyLayer)
        model(x).sum().backward()
    else:
        memsave.checkpoint_sequential(model, 2, x).sum().backward()
    for a, b in zip(eager.parameters(), model.parameters()):
        assert torch.equal(a.grad, b.grad)
    for a, b in zip([eager[0].gen, eager[2].gen], [model[0].gen, model[2].gen]):
        assert torch.equal(a.get_state(), b.get_state())


def test_generator_without_rng_replay_differs_as_documented() -> None:
    """preserve_rng_state=False opts out of every replay, explicit generators included: the test can fail."""
    eager = _run_generator_block(lambda fn, x: fn(x), False)
    ours = _run_generator_block(functools.partial(memsave.checkpoint, preserve_rng_state=False), False)
    assert not torch.equal(eager[2], ours[2])


# ------------------------------------------------------------------------------------------ zero-width tensors
def _grads(fn: Callable[..., torch.Tensor], *inputs: torch.Tensor) -> List[Any]:
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    out = fn(*leaves)
    out.float().sum().backward()
    return [out.detach()] + [t.grad for t in leaves]


def _assert_same(ours: List[Any], eager: List[Any]) -> None:
    assert len(ours) == len(eager)
    for a, b in zip(ours, eager):
        assert a is not None and b is not None and a.shape == b.shape and a.dtype == b.dtype
        assert torch.equal(a, b)


ZERO_WIDTH = {
    "rms_norm-hidden-0": (
        lambda x, w: F.rms_norm(x, w),
        lambda x, w: TF.rms_norm(x, (0,), w, 1e-6),
        (rand(3, 0), torch.ones(0)),
    ),
    "rms_norm-rows-0": (
        lambda x, w: F.rms_norm(x, w),
        lambda x, w: TF.rms_norm(x, (8,), w, 1e-6),
        (rand(0, 8), torch.ones(8)),
    ),
    "act_linear-out-0-gelu": (
        lambda x, w, b: F.act_linear(x, w, b, act="gelu"),
        lambda x, w, b: TF.linear(TF.gelu(x), w, b),
        (rand(3, 4), rand(0, 4), rand(0)),
    ),
    "act_linear-out-0-relu": (
        lambda x, w, b: F.act_linear(x, w, b, act="relu"),
        lambda x, w, b: TF.linear(TF.relu(x), w, b),
        (rand(2, 3, 4), rand(0, 4), rand(0)),
    ),
    "act_linear-in-0": (
        lambda x, w, b: F.act_linear(x, w, b, act="silu"),
        lambda x, w, b: TF.linear(TF.silu(x), w, b),
        (rand(3, 0), rand(5, 0), rand(5)),
    ),
    "gated_act_linear-out-0": (
        lambda g, u, w: F.gated_act_linear(g, u, w),
        lambda g, u, w: TF.linear(TF.silu(g) * u, w),
        (rand(3, 4), rand(3, 4), rand(0, 4)),
    ),
    "gated_act_linear-in-0": (
        lambda g, u, w: F.gated_act_linear(g, u, w, act="gelu"),
        lambda g, u, w: TF.linear(TF.gelu(g) * u, w),
        (rand(3, 0), rand(3, 0), rand(5, 0)),
    ),
    "rms_norm_linear-out-0": (
        lambda x, nw, w: F.rms_norm_linear(x, nw, w),
        lambda x, nw, w: TF.linear(TF.rms_norm(x, (4,), nw, 1e-6), w),
        (rand(3, 4), torch.ones(4), rand(0, 4)),
    ),
    "layer_norm_linear-normalized-0": (
        lambda x, w: F.layer_norm_linear(x, 0, None, None, w),
        lambda x, w: TF.linear(TF.layer_norm(x, (0,)), w),
        (rand(3, 0), rand(5, 0)),
    ),
    "rms_norm_linear-in-0": (
        lambda x, w: F.rms_norm_linear(x, None, w),
        lambda x, w: TF.linear(TF.rms_norm(x, (0,), None, 1e-6), w),
        (rand(3, 0), rand(5, 0)),
    ),
    "linear_cross_entropy-hidden-0": (
        lambda h, w: F.linear_cross_entropy(h, w, torch.tensor([0, 2, 1, 2])),
        lambda h, w: TF.cross_entropy(TF.linear(h, w), torch.tensor([0, 2, 1, 2])),
        (rand(4, 0), rand(3, 0)),
    ),
    "batch_norm_act_conv2d-empty-batch": (
        lambda x, w: F.batch_norm_act_conv2d(x, None, None, None, None, w, training=True),
        lambda x, w: TF.conv2d(TF.relu(TF.batch_norm(x, None, None, training=True)), w),
        (rand(0, 3, 4, 4), rand(4, 3, 1, 1)),
    ),
    "layer_norm_linear-out-0": (
        lambda x, w: F.layer_norm_linear(x, 4, None, None, w),
        lambda x, w: TF.linear(TF.layer_norm(x, (4,)), w),
        (rand(3, 4), rand(0, 4)),
    ),
}


@pytest.mark.parametrize("name", sorted(ZERO_WIDTH))
def test_zero_width_forward_and_backward_equal_eager(name: str) -> None:
    ours, eager, inputs = ZERO_WIDTH[name]
    _assert_same(_grads(ours, *inputs), _grads(eager, *inputs))


def _bn_state() -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return _leaf(3, seed=1), _leaf(3, seed=2), torch.zeros(3), torch.ones(3)


def test_inplace_abn_on_an_empty_batch_is_batch_norm_act() -> None:
    results = []
    for op in (F.inplace_abn, F.batch_norm_act):
        w, b, rm, rv = _bn_state()
        x = _leaf(0, 3, 4, 4)
        y = op(x * 1.0, rm, rv, w, b, training=True, act="leaky_relu")
        y.sum().backward()
        results.append([y.detach(), x.grad, w.grad, b.grad, rm, rv])
    _assert_same(results[0], results[1])
    assert torch.equal(results[0][4], torch.zeros(3)) and torch.equal(results[0][5], torch.ones(3))


def test_inplace_abn_on_a_channel_slice_matches_batch_norm() -> None:
    base_ours, base_eager = _leaf(2, 6, 4, 4), _leaf(2, 6, 4, 4)
    weights = rand(2, 6, 4, 4)
    w, b, rm, rv = _bn_state()
    h = base_ours * 1.0
    out = F.inplace_abn(h[:, :3], rm, rv, w, b, training=True, act="leaky_relu", act_param=0.1)
    assert out._base is h  # a view, written in place
    (h * weights).sum().backward()
    w2, b2, rm2, rv2 = _bn_state()
    h2 = base_eager * 1.0
    ref = TF.leaky_relu(TF.batch_norm(h2[:, :3], rm2, rv2, w2, b2, training=True), 0.1)
    (torch.cat([ref, h2[:, 3:]], 1) * weights).sum().backward()
    torch.testing.assert_close(h.detach(), torch.cat([ref, h2[:, 3:]], 1).detach())
    torch.testing.assert_close(base_ours.grad, base_eager.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(w.grad, w2.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(rm, rm2)  # the slice is normalized from a contiguous copy: its own sum order
    torch.testing.assert_close(rv, rv2)


# ------------------------------------------------------------------------------------------ gated relu gradients
def test_gated_act_relu_gate_gradient_is_eagers_where_grad_times_up_overflows() -> None:
    gate = torch.tensor([0.0, -0.0, -1.0, -1e30, -3e38, 2.0, 1e-30, 5.0])
    up = torch.tensor([1e30, -1e30, 3e38, 1e30, 3e38, 1e30, 2.0, float("inf")])
    grad = torch.tensor([1e10, 1e10, 1e10, 1.0, 1e10, 1.0, 1.0, 1.0])
    ours = _grads(lambda g, u: F.gated_act(g, u, act="relu") * grad, gate, up)
    eager = _grads(lambda g, u: TF.relu(g) * u * grad, gate, up)
    assert not torch.isnan(ours[1]).any()  # the defect: inf * 0 = NaN for gates <= 0
    assert torch.equal(ours[1], eager[1])


# ------------------------------------------------------------------------------------------ chunked on 2-d input
def test_chunked_mlp_on_2d_input_slices_the_rows() -> None:
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 8))
    chunked = memsave.chunked(copy.deepcopy(mlp), 3)
    x = rand(10, 8)
    ours, eager = _grads(chunked, x), _grads(mlp, x)
    for a, b in zip(ours, eager):
        torch.testing.assert_close(a, b)


# ------------------------------------------------------------------------------------------ selective contexts
def _mutating_region(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    y = x @ w
    z = y.sigmoid()
    y.mul_(2.0)  # modifies the cached product in place
    return (z * y).sum()


def _keep_mm(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
    keep = op == torch.ops.aten.mm.default
    return torch_checkpoint.CheckpointPolicy.MUST_SAVE if keep else torch_checkpoint.CheckpointPolicy.PREFER_RECOMPUTE


def test_allow_cache_entry_mutation_is_honoured_as_torch_does() -> None:
    context_fn = functools.partial(
        torch_checkpoint.create_selective_checkpoint_contexts, _keep_mm, allow_cache_entry_mutation=True
    )
    grads = []
    for run in (
        functools.partial(torch_checkpoint.checkpoint, use_reentrant=False),
        memsave.checkpoint,
    ):
        x, w = _leaf(4, 4, seed=1), _leaf(4, 4, seed=2)
        run(_mutating_region, x, w, context_fn=context_fn).backward()
        grads.append((x.grad, w.grad))
    assert torch.equal(grads[0][0], grads[1][0]) and torch.equal(grads[0][1], grads[1][1])
