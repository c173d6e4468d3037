"""Behaviour of memsave.checkpoint / checkpointed / checkpoint_sequential beyond the model-level exactness suite:
argument kinds, nesting, autograd entry points, RNG and autocast replay, state replay, and every error."""

from __future__ import annotations

import copy
import gc
import random
import weakref
from collections import OrderedDict, namedtuple
from typing import Any, Dict, List, Tuple

import pytest
import torch
from torch import nn

from helpers import Counter, eager_step, in_backward
from helpers import grads as _grads
from helpers import leaf as _leaf
from helpers.models import RunningMean
from memsave.errors import InplaceModificationError, RecomputeMismatchError
from memsave.recompute import state as _state
from memsave.recompute.region import checkpoint, checkpoint_sequential, checkpointed

# ---- recompute really happens, activations really are dropped ----------------------------------------------


def test_recompute_runs_in_backward_and_drops_activations() -> None:
    x = _leaf(64, 64)
    inner: List["weakref.ref[torch.Tensor]"] = []

    def body(t: torch.Tensor) -> torch.Tensor:
        h = t.sin()  # saved by cos in eager
        if not in_backward():
            inner.append(weakref.ref(h))
        return h.cos()

    region = Counter(body)
    y = checkpoint(region, x)
    assert region.calls == 1 and region.in_backward == 0
    gc.collect()
    assert inner[0]() is None, "the region's intermediate tensor is still alive: it was saved, not dropped"
    # Eager keeps it alive (saved by exp): the probe itself is sound.
    eager_probe: List["weakref.ref[torch.Tensor]"] = []
    h = x.sin()
    eager_probe.append(weakref.ref(h))
    z = h.cos()
    del h
    assert eager_probe[0]() is not None
    y.sum().backward()
    assert region.calls == 2 and region.in_backward == 1
    grad = x.grad.clone()
    x.grad = None
    z.sum().backward()
    assert torch.equal(grad, x.grad)


def test_grad_mode_off_just_calls_fn_and_hooks_are_released() -> None:
    region = Counter(lambda t: t * 2)
    with torch.no_grad():
        y = checkpoint(region, _leaf(3))
    assert region.calls == 1 and y.grad_fn is None
    y = checkpoint(region, _leaf(3))
    assert not _state.module_hooks_active(), "global module hooks must only be registered during a region"
    assert y.grad_fn is not None


# ---- argument and output kinds -----------------------------------------------------------------------------


def test_integer_inputs_token_ids_into_embedding() -> None:
    torch.manual_seed(0)
    emb = nn.Embedding(20, 8)
    ours = copy.deepcopy(emb)
    ids = torch.randint(0, 20, (3, 5))

    def f(e: nn.Embedding, i: torch.Tensor) -> torch.Tensor:
        return e(i).tanh()

    f(emb, ids).sum().backward()
    checkpoint(f, ours, ids).sum().backward()
    assert torch.equal(emb.weight.grad, ours.weight.grad)


def test_kwargs_nested_containers_and_non_tensors() -> None:
    Pair = namedtuple("Pair", "a b")
    a, b, c, d = (_leaf(4, seed=i) for i in range(4))

    def f(
        x: Dict[str, Any],
        pair: Pair,
        items: List[Any],
        scale: float,
        tag: str,
        nothing: None,
        *,
        bias: torch.Tensor,
        mode: str = "sum",
    ) -> Dict[str, Any]:
        assert tag == "hello" and nothing is None and mode == "mul"
        h = x["first"].sin() * scale + pair.a.cos() * pair.b + items[0].exp() * items[1]
        return {
            "out": (h * bias, [h.tanh(), None]),
            "count": 3,
            "name": tag,
            "none": None,
            "ordered": OrderedDict(z=h.sigmoid()),
        }

    def loss(out: Dict[str, Any]) -> torch.Tensor:
        return out["out"][0].sum() + out["out"][1][0].pow(2).sum() + out["ordered"]["z"].sum()

    args = ({"first": a}, Pair(b, c), [d, 2], 0.5, "hello", None)
    loss(f(*args, bias=a, mode="mul")).backward()
    expected = _grads(a, b, c, d)
    for t in (a, b, c, d):
        t.grad = None
    out = checkpoint(f, *args, bias=a, mode="mul")
    assert out["count"] == 3 and out["name"] == "hello" and out["none"] is None and out["out"][1][1] is None
    assert isinstance(out["ordered"], OrderedDict)
    loss(out).backward()
    assert all(torch.equal(e, g) for e, g in zip(expected, _grads(a, b, c, d)))


def test_outputs_without_grad_and_inputs_returned_as_outputs() -> None:
    x = _leaf(5)

    def f(t: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
        return t, t.sin(), (t > 0).long(), 7

    same, s, mask, seven = checkpoint(f, x)
    assert same is x and seven == 7 and mask.dtype == torch.long
    (s * 3).sum().backward()
    assert torch.equal(x.grad, 3 * x.detach().cos())


# ---- nesting, repetition, autograd entry points --------------------------------------------------------------


def test_nested_regions() -> None:
    torch.manual_seed(0)
    lin1, lin2, lin3 = nn.Linear(6, 6), nn.Linear(6, 6), nn.Linear(6, 6)
    x = _leaf(4, 6)
    inner = Counter(lambda h: lin2(h).relu())
    outer = Counter(lambda h: lin3(checkpoint(inner, lin1(h).tanh())).sigmoid())

    params = [x, *lin1.parameters(), *lin2.parameters(), *lin3.parameters()]
    lin3(lin2(lin1(x).tanh()).relu()).sigmoid().sum().backward()
    expected = _grads(*params)
    for p in params:
        p.grad = None
    y = checkpoint(outer, x)
    y.sum().backward()
    assert all(torch.equal(e, g) for e, g in zip(expected, _grads(*params)))
    assert outer.calls == 2 and outer.in_backward == 1
    # inner: forward, again inside outer's recompute, and its own recompute.
    assert inner.calls == 3 and inner.in_backward == 2


def test_same_region_called_several_times_in_one_forward() -> None:
    torch.manual_seed(0)
    block = nn.Sequential(nn.Linear(5, 5), nn.BatchNorm1d(5), nn.GELU(), nn.Dropout(0.3))
    ours = copy.deepcopy(block)
    x = _leaf(8, 5)
    torch.manual_seed(1)
    h = x
    for _ in range(3):
        h = block(h)
    h.sum().backward()
    expected = _grads(x, *block.parameters())
    x.grad = None
    torch.manual_seed(1)
    h = x
    for _ in range(3):
        h = checkpoint(ours, h)
    h.sum().backward()
    assert all(torch.equal(e, g) for e, g in zip(expected, _grads(x, *ours.parameters())))
    assert all(torch.equal(a, b) for a, b in zip(block.buffers(), ours.buffers()))
    assert int(ours[1].num_batches_tracked) == 3


def test_autograd_grad_and_backward_inputs() -> None:
    torch.manual_seed(0)
    lin = nn.Linear(4, 4)
    x = _leaf(3, 4)
    f = lambda t: lin(t).tanh().pow(2)  # noqa: E731
    gx_ref, gw_ref = torch.autograd.grad(f(x).sum(), (x, lin.weight))
    gx, gw = torch.autograd.grad(checkpoint(f, x).sum(), (x, lin.weight))
    assert torch.equal(gx, gx_ref) and torch.equal(gw, gw_ref)
    assert x.grad is None and lin.weight.grad is None
    checkpoint(f, x).sum().backward(inputs=[lin.bias])
    assert x.grad is None and lin.weight.grad is None
    bias_grad = lin.bias.grad.clone()
    lin.bias.grad = None
    f(x).sum().backward(inputs=[lin.bias])
    assert torch.equal(bias_grad, lin.bias.grad)


def test_retain_graph_double_backward_recomputes_again() -> None:
    x = _leaf(6)
    f = Counter(lambda t: t.sin().exp())
    y = checkpoint(f, x).sum()
    y.backward(retain_graph=True)
    y.backward()
    assert f.calls == 3 and f.in_backward == 2
    got = x.grad.clone()
    x.grad = None
    z = f.fn(x).sum()
    z.backward(retain_graph=True)
    z.backward()
    assert torch.equal(got, x.grad)


def test_retain_graph_with_batchnorm_updates_buffers_once() -> None:
    torch.manual_seed(0)
    block = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4, momentum=None), nn.Dropout(0.5))
    ours = copy.deepcopy(block)
    x = _leaf(6, 4)
    results = []
    for model, run in ((block, lambda t: block(t)), (ours, lambda t: checkpoint(ours, t))):
        torch.manual_seed(4)
        y = run(x).pow(2).sum()
        y.backward(retain_graph=True)
        y.backward()
        results.append([x.grad.clone(), *(p.grad.clone() for p in model.parameters()), *model.buffers()])
        x.grad = None
    assert all(torch.equal(a, b) for a, b in zip(*results))
    assert int(ours[1].num_batches_tracked) == 1
    assert not _state.module_hooks_active()


def test_higher_order_gradients() -> None:
    x = _leaf(6)
    f = lambda t: t.sin().exp() * t  # noqa: E731
    (g,) = torch.autograd.grad(checkpoint(f, x).sum(), x, create_graph=True)
    (gg,) = torch.autograd.grad(g.pow(2).sum(), x)
    (g_ref,) = torch.autograd.grad(f(x).sum(), x, create_graph=True)
    (gg_ref,) = torch.autograd.grad(g_ref.pow(2).sum(), x)
    assert torch.equal(g, g_ref) and torch.equal(gg, gg_ref)


# ---- RNG, autocast, training flag ----------------------------------------------------------------------------


def test_rng_replayed_and_caller_stream_untouched() -> None:
    x = _leaf(1000)
    f = lambda t: torch.nn.functional.dropout(t, 0.5) * torch.rand(1000)  # noqa: E731
    torch.manual_seed(5)
    f(x).sum().backward()
    expected, state_after_eager = x.grad.clone(), torch.get_rng_state()
    x.grad = None
    torch.manual_seed(5)
    y = checkpoint(f, x)
    state_after_forward = torch.get_rng_state()
    y.sum().backward()
    assert torch.equal(expected, x.grad)
    assert torch.equal(state_after_forward, state_after_eager)
    assert torch.equal(torch.get_rng_state(), state_after_eager), "the recompute consumed the caller's RNG"


def test_without_preserve_rng_state_dropout_differs() -> None:
    x = _leaf(1000)
    f = lambda t: torch.nn.functional.dropout(t, 0.5)  # noqa: E731
    torch.manual_seed(5)
    f(x).sum().backward()
    expected = x.grad.clone()
    x.grad = None
    torch.manual_seed(5)
    checkpoint(f, x, preserve_rng_state=False).sum().backward()
    assert not torch.equal(expected, x.grad)


def test_autocast_state_replayed() -> None:
    torch.manual_seed(0)
    lin = nn.Linear(8, 8)
    ours = copy.deepcopy(lin)
    x = _leaf(4, 8)
    seen: List[Tuple[bool, torch.dtype]] = []

    def f(layer: nn.Linear, t: torch.Tensor) -> torch.Tensor:
        seen.append((torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")))
        return layer(t).relu()

    with torch.autocast("cpu", dtype=torch.bfloat16):
        y_ref = f(lin, x)
    y_ref.float().sum().backward()
    expected = _grads(x, lin.weight)
    x.grad = None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = checkpoint(f, ours, x)
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()  # backward outside autocast: the recompute must re-enter it
    assert seen[-1] == (True, torch.bfloat16) and len(seen) == 3
    assert torch.equal(y_ref, y)
    assert all(torch.equal(e, g) for e, g in zip(expected, _grads(x, ours.weight)))
    # And the opposite: a region run without autocast is recomputed without it even if backward runs inside one.
    x.grad = None
    y = checkpoint(f, ours, x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y.sum().backward()
    assert seen[-1][0] is False


def test_training_flag_flipped_between_forward_and_backward() -> None:
    torch.manual_seed(0)
    block = nn.Sequential(nn.Linear(6, 6), nn.Dropout(0.5), nn.BatchNorm1d(6))
    x = _leaf(5, 6)
    ours, expected = eager_step(block, x)
    y = checkpoint(ours, x)
    ours.eval()  # e.g. a validation call between forward and backward
    y.sum().backward()
    assert not ours.training and not ours[1].training
    assert all(torch.equal(e, g) for e, g in zip(expected, _grads(x, *ours.parameters())))


def test_buffers_momentum_none_and_instance_norm() -> None:
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(2, 4, 3),
        nn.BatchNorm2d(4, momentum=None),
        nn.InstanceNorm2d(4, affine=True, track_running_stats=True),
        nn.ReLU(),
    )
    ours = copy.deepcopy(net)
    x = _leaf(3, 2, 6, 6)
    for _ in range(3):
        net(x).sum().backward()
        checkpoint(ours, x).sum().backward()
    for (bname, a), b in zip(net.named_buffers(), ours.buffers()):
        assert torch.equal(a, b), bname
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(net.parameters(), ours.parameters()))


def test_buffer_replaced_by_assignment_is_replayed() -> None:
    class Ema(RunningMean):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * self.update(x)  # replaces the buffer object; depends on the updated value

    eager, ours = Ema(), Ema()
    x = _leaf(3, 4)
    for _ in range(2):
        eager(x).sum().backward()
        checkpoint(ours, x).sum().backward()
    assert torch.equal(eager.avg, ours.avg)


# ---- checkpointed --------------------------------------------------------------------------------------------


def test_checkpointed_bare_with_options_and_on_methods() -> None:
    runs: List[str] = []

    # Each body saves a tensor it computed (exp's result), so each is recomputed once in backward.
    @checkpointed
    def bare(t: torch.Tensor) -> torch.Tensor:
        runs.append("bare")
        return t.sin().exp()

    @checkpointed(name="custom", strict=True)
    def with_options(t: torch.Tensor, *, k: int) -> torch.Tensor:
        runs.append("opts")
        return t.cos().exp() * k

    assert bare.__name__ == "bare" and with_options.__name__ == "with_options"
    x = _leaf(4)
    (bare(x) + with_options(x, k=2)).sum().backward()
    ref = x.detach().clone().requires_grad_()
    (ref.sin().exp() + ref.cos().exp() * 2).sum().backward()
    assert torch.equal(x.grad, ref.grad)
    assert runs.count("bare") == 2 and runs.count("opts") == 2

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(3, 3)
            self.bn = nn.BatchNorm1d(3)
            self.calls = 0

        @checkpointed
        def forward(self, t: torch.Tensor) -> torch.Tensor:
            self.calls += 1
            return self.bn(self.lin(t)).tanh()

    a, b = Block(), Block()  # applies to every instance
    x = _leaf(4, 3)
    (a(x) + b(x)).sum().backward()
    assert a.calls == 2 and b.calls == 2
    assert int(a.bn.num_batches_tracked) == 1


def test_checkpointed_on_module_with_its_own_buffers() -> None:
    # The decorated forward belongs to the module that owns the buffer: its pre-hook ran outside the region.
    class Norm(nn.BatchNorm1d):
        forward = checkpointed(nn.BatchNorm1d.forward)

    torch.manual_seed(0)
    eager = nn.BatchNorm1d(4, momentum=None)
    ours = Norm(4, momentum=None)
    x = _leaf(6, 4)
    for _ in range(2):
        eager(x).pow(2).sum().backward()
        ours(x).pow(2).sum().backward()
    assert all(torch.equal(p, q) for p, q in zip(eager.buffers(), ours.buffers()))


def test_bound_method_region_watches_its_module() -> None:
    torch.manual_seed(0)
    eager = nn.BatchNorm1d(4)
    ours = copy.deepcopy(eager)
    x = _leaf(6, 4)
    eager(x).pow(2).sum().backward()
    checkpoint(ours.forward, x).pow(2).sum().backward()
    assert all(torch.equal(p, q) for p, q in zip(eager.buffers(), ours.buffers()))


# ---- checkpoint_sequential -----------------------------------------------------------------------------------


class _Split(nn.Module):
    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        return x.sin(), x.cos()


class _Merge(nn.Module):
    def forward(self, pair: Tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return pair[0] * pair[1]


@pytest.mark.parametrize("container", ["sequential", "modulelist", "list"])
def test_checkpoint_sequential_tuples_and_containers(container: str) -> None:
    torch.manual_seed(0)
    mods = [nn.Linear(4, 4), _Split(), _Merge(), nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 2)]
    seq = nn.Sequential(*copy.deepcopy(mods))
    x = _leaf(3, 4)
    seq(x).sum().backward()
    expected = _grads(x, *seq.parameters())
    x.grad = None
    make = {"sequential": lambda ms: nn.Sequential(*ms), "modulelist": nn.ModuleList, "list": list}[container]
    ours = make(copy.deepcopy(mods))
    params = [p for m in ours for p in m.parameters()]
    checkpoint_sequential(ours, 3, x).sum().backward()
    assert all(torch.equal(e, g) for e, g in zip(expected, _grads(x, *params)))


def test_checkpoint_sequential_segments_and_last_segment_eager() -> None:
    counters = [Counter(nn.Tanh()) for _ in range(7)]
    x = _leaf(5)
    checkpoint_sequential(counters, 3, x).sum().backward()
    # 7 // 3 = 2 modules per segment; segments [0:2], [2:4] checkpointed, [4:7] eager.
    assert [c.in_backward for c in counters] == [1, 1, 1, 1, 0, 0, 0]
    for c in counters:
        c.calls = c.in_backward = 0
    checkpoint_sequential(counters, 1, x).sum().backward()
    assert all(c.in_backward == 0 for c in counters)  # one segment = the last one = nothing checkpointed


def test_checkpoint_sequential_peels_leading_inplace_modules() -> None:
    # VGG-like: with 2 segments the second segment starts with ReLU(inplace=True).
    torch.manual_seed(0)
    vgg = nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1),
        nn.ReLU(inplace=True),
        nn.Conv2d(4, 4, 3, padding=1),
        nn.ReLU(inplace=True),
        nn.Conv2d(4, 4, 3, padding=1),
        nn.ReLU(inplace=True),
        nn.Conv2d(4, 4, 3, padding=1),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(2),
    )
    ours = copy.deepcopy(vgg)
    x = _leaf(2, 3, 8, 8)
    vgg(x).sum().backward()
    expected = _grads(x, *vgg.parameters())
    x.grad = None
    checkpoint_sequential(ours, 3, x).sum().backward()  # segments start at 0, 3 (ReLU inplace), 6
    assert all(torch.equal(e, g) for e, g in zip(expected, _grads(x, *ours.parameters())))


# ---- errors ----------------------------------------------------------------------------------------------------


def test_non_callable_fn() -> None:
    x = _leaf(3)
    with pytest.raises(TypeError, match="fn must be callable.*checkpoint\\(fn, \\*args"):
        checkpoint(x, x)
    with pytest.raises(TypeError, match="must be callable"):
        checkpointed(42)  # type: ignore[arg-type]
    with torch.no_grad(), pytest.raises(TypeError):
        checkpoint("not a function", x)


@pytest.mark.parametrize("segments", [0, -1, 4])
def test_bad_segments(segments: int) -> None:
    mods = [nn.Tanh(), nn.Tanh(), nn.Tanh()]
    with pytest.raises(ValueError, match="between 1 and the number of modules \\(3\\)"):
        checkpoint_sequential(mods, segments, _leaf(2))


def test_bad_sequential_arguments() -> None:
    with pytest.raises(TypeError, match="segments must be an int"):
        checkpoint_sequential([nn.Tanh()], 1.5, _leaf(2))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="nn.Sequential"):
        checkpoint_sequential(nn.Tanh(), 1, _leaf(2))  # type: ignore[arg-type]


def test_recompute_mismatch_names_region() -> None:
    state = {"n": 0}

    def grows(t: torch.Tensor) -> torch.Tensor:
        state["n"] += 1  # output shape depends on a global counter
        return t[: state["n"] + 2].sin()

    y = checkpointed(grows, name="encoder.block3")(_leaf(8))
    with pytest.raises(RecomputeMismatchError, match="region 'encoder.block3'.*shape \\(4,\\).*shape \\(3,\\)"):
        y.sum().backward()

    flag = {"skip": False}

    def branches(t: torch.Tensor) -> torch.Tensor:
        h = t.sin()
        return h if flag["skip"] else h.exp()  # exp's saved result is what backward needs recomputed

    y = checkpoint(branches, _leaf(8))
    flag["skip"] = True
    with pytest.raises(RecomputeMismatchError, match="'test_recompute_mismatch_names_region.<locals>.branches'"):
        y.sum().backward()


def test_strict_mode_compares_values() -> None:
    rng = random.Random(0)

    def noisy(t: torch.Tensor) -> torch.Tensor:
        return (t * rng.random()).sin()  # randomness outside torch's generators: not replayed

    x = _leaf(5)
    checkpoint(noisy, x).sum().backward()  # shapes match: only strict mode can see it
    with pytest.raises(RecomputeMismatchError, match="strict check failed.*max abs difference"):
        checkpointed(noisy, strict=True, name="noisy")(x).sum().backward()
    checkpointed(lambda t: t.sin().cos(), strict=True)(x).sum().backward()  # deterministic: passes


def test_inplace_change_of_input_between_forward_and_backward() -> None:
    x = _leaf(4)
    h = x * 2
    y = checkpointed(lambda t: t.sin(), name="blk")(h)
    h.add_(1)
    with pytest.raises(
        InplaceModificationError,
        match="modified by an inplace operation: argument args\\[0\\] of checkpointed region 'blk'",
    ):
        y.sum().backward()
    # Eager reports the same situation:
    h = x * 2
    y = h.sin()
    h.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def test_inplace_change_of_nested_input_and_parameter() -> None:
    torch.manual_seed(0)
    lin = nn.Linear(3, 3)
    x = _leaf(2, 3)
    h = x * 1
    y = checkpoint(lambda d: lin(d["x"]).relu(), {"x": h})
    h.mul_(2)
    with pytest.raises(InplaceModificationError, match="argument args\\[0\\]\\['x'\\]"):
        y.sum().backward()
    y = checkpoint(lin, x)
    with torch.no_grad():
        lin.weight.add_(1)  # e.g. optimizer.step() before backward
    with pytest.raises(InplaceModificationError, match="parameter 'weight' of Linear"):
        y.sum().backward()


def test_inplace_change_of_closure_tensor() -> None:
    x = _leaf(4)
    h = x.exp()
    y = checkpoint(lambda t: t * h, x)  # h is saved by mul but is not an argument
    h.mul_(2)
    with pytest.raises(InplaceModificationError, match="modified by an inplace operation"):
        y.sum().backward()


def test_region_modifying_its_argument_fails_at_forward() -> None:
    x = _leaf(4)
    h = x * 1
    with pytest.raises(InplaceModificationError, match="modified its argument args\\[0\\].*in place during forward"):
        checkpoint(nn.ReLU(inplace=True), h)


def test_saved_tensor_modified_inside_region_fails_like_eager() -> None:
    w = torch.randn(4, requires_grad=True)
    buf = torch.ones(4)

    def f(t: torch.Tensor) -> torch.Tensor:
        out = t * buf  # saves buf
        buf.mul_(2)  # then modifies it: eager cannot backward either
        return out

    y = checkpoint(f, w)
    with pytest.raises(InplaceModificationError, match="modified .*inside the region"):
        y.sum().backward()


def test_backward_inside_region_works_like_eager() -> None:
    # torch.autograd.grad inside the region on tensors the region saved: it recomputes from the region's arguments
    # while the forward is still running (exp's saved result is not a leaf), and the outer backward goes through
    # the double-backward graph built inside the region.
    x = _leaf(3)
    region = Counter(lambda t: torch.autograd.grad(t.sin().exp().sum(), t, create_graph=True)[0])
    g = checkpoint(region, x)
    assert region.calls == 2 and region.in_backward == 1  # the forward, and the recompute for its inner grad
    assert not _state.module_hooks_active() and not _state.tls.records
    g.pow(2).sum().backward()
    got = x.grad.clone()
    x.grad = None
    region.fn(x).pow(2).sum().backward()
    assert torch.equal(got, x.grad)
    assert torch.equal(g, region.fn(x))


def test_frames_are_freed_with_the_graph() -> None:
    from memsave.recompute.region import _Frame

    def live_probe_frames() -> int:
        gc.collect()
        return sum(1 for o in gc.get_objects() if type(o) is _Frame and o.name == "probe")

    x = _leaf(16)
    y = checkpointed(lambda t: t.sin().exp(), name="probe")(x)
    assert live_probe_frames() == 1
    y.sum().backward()
    del y
    assert live_probe_frames() == 0
    y = checkpointed(lambda t: t.sin().exp(), name="probe")(x)
    del y  # graph dropped without backward
    assert live_probe_frames() == 0


# ---- CUDA (skipped without a GPU) ----------------------------------------------------------------------------


@pytest.mark.cuda
def test_cuda_rng_replayed_on_every_device() -> None:
    devices = [torch.device("cuda", i) for i in range(min(torch.cuda.device_count(), 2))]

    def f(*ts: torch.Tensor) -> List[torch.Tensor]:
        # Dropout on each device and on the CPU: every generator must be replayed.
        return [torch.nn.functional.dropout(t.sin(), 0.5) * torch.rand_like(t) for t in ts]

    xs = [torch.randn(4096, device=d, requires_grad=True) for d in devices] + [_leaf(64)]
    torch.manual_seed(9)
    sum(o.sum().cpu() for o in f(*xs)).backward()
    expected = [x.grad.clone() for x in xs]
    states = [torch.cuda.get_rng_state(d.index) for d in devices]
    for x in xs:
        x.grad = None
    torch.manual_seed(9)
    sum(o.sum().cpu() for o in checkpoint(f, *xs)).backward()
    assert all(torch.equal(e, x.grad) for e, x in zip(expected, xs))
    assert all(torch.equal(s, torch.cuda.get_rng_state(d.index)) for s, d in zip(states, devices))


@pytest.mark.cuda
def test_cuda_batchnorm_dropout_block_matches_eager() -> None:
    torch.manual_seed(0)
    block = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8, momentum=None), nn.ReLU(), nn.Dropout(0.3)
    ).cuda()
    ours = copy.deepcopy(block)
    x = torch.randn(4, 3, 16, 16, device="cuda", requires_grad=True)
    with torch.backends.cudnn.flags(deterministic=True, benchmark=False):
        torch.manual_seed(1)
        block(x).pow(2).sum().backward()
        expected = _grads(x, *block.parameters())
        x.grad = None
        torch.manual_seed(1)
        checkpoint(ours, x).pow(2).sum().backward()
    assert all(torch.equal(e, g) for e, g in zip(expected, _grads(x, *ours.parameters())))
    assert all(torch.equal(a, b) for a, b in zip(block.buffers(), ours.buffers()))
