"""memsave.checkpoint as a drop-in for torch.utils.checkpoint.checkpoint.

* torch's keyword arguments with torch's meaning, every other keyword to the region function (``name`` and
  ``strict`` included), and Hugging Face's way of calling it (``functools.partial(checkpoint, **kwargs)``);
* the behaviours of torch's non-reentrant checkpoint that memsave lacked: ``torch.autograd.grad`` inside a region,
  saved leaves handed back by identity (and never recomputed), early stop, a clear error on a double unpack, the
  default-device context replayed, argument containers snapshotted at the call.

Every comparison is bitwise, with eager or with torch's own checkpoint.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import warnings
from typing import Any, Callable, Dict, List, Tuple

import pytest
import torch
import torch.utils.checkpoint as torch_ckpt
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import memsave
from helpers import Counter, eager_step, hub, in_backward
from helpers import grads as _grads
from helpers import leaf as _leaf
from helpers.models import RunningMean
from memsave.common import compat
from memsave.errors import CheckpointError, MemsaveWarning, RecomputeMismatchError
from memsave.recompute import state as _state


def _clear(*tensors: torch.Tensor) -> None:
    for t in tensors:
        t.grad = None


# ==== torch's keywords ================================================================================


def _region(x: torch.Tensor, *, name: str = "default", strict: bool = False, scale: float = 1.0) -> torch.Tensor:
    # A region function whose own keywords collide with memsave's old region options.
    y = x.sin() * scale
    return y.exp() if (name == "encoder" and strict) else y.cos()


def test_name_and_strict_go_to_the_region_function_exactly_like_torch() -> None:
    for kwargs in ({}, {"name": "encoder", "strict": True, "scale": 2.0}, {"name": "encoder", "strict": False}):
        x1, x2 = _leaf(6), _leaf(6)
        ours = memsave.checkpoint(_region, x1, use_reentrant=False, **kwargs)
        theirs = torch_ckpt.checkpoint(_region, x2, use_reentrant=False, **kwargs)
        assert torch.equal(ours, theirs), kwargs
        ours.sum().backward()
        theirs.sum().backward()
        assert torch.equal(x1.grad, x2.grad), kwargs


def test_torch_keywords_are_accepted_with_torch_meaning() -> None:
    x = _leaf(5)
    for kw in (
        {"use_reentrant": False},
        {"use_reentrant": None},
        {"determinism_check": "none"},
        {"determinism_check": "default"},
        {"early_stop": False},
        {"early_stop": True},
        {"debug": True},
        {"preserve_rng_state": True},
        {"context_fn": torch_ckpt.noop_context_fn},
        {"context_fn": lambda: (contextlib.nullcontext(), contextlib.nullcontext())},
    ):
        results = []
        for impl, extra in ((torch_ckpt.checkpoint, {"use_reentrant": False}), (memsave.checkpoint, kw)):
            x.grad = None
            torch.manual_seed(3)
            y = impl(lambda t: nn.functional.dropout(t.sin(), 0.5).exp(), x, **extra)
            y.sum().backward()
            results.append((y.detach(), x.grad.clone()))
        assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1]), kw


def test_use_reentrant_true_runs_non_reentrant_with_a_warning() -> None:
    frozen = torch.randn(4)  # no input requires grad: reentrant torch would give no parameter gradient
    lin = nn.Linear(4, 4)
    with pytest.warns(MemsaveWarning, match="always non-reentrant"):
        y = memsave.checkpoint(lin, frozen, use_reentrant=True)
    y.sum().backward()
    assert lin.weight.grad is not None
    with pytest.warns(MemsaveWarning, match="checkpoint_sequential: use_reentrant=True"):
        memsave.checkpoint_sequential([nn.Tanh(), nn.Tanh()], 2, _leaf(3), use_reentrant=True)


def test_no_warning_in_the_plain_call() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        memsave.checkpoint(torch.sin, _leaf(2), use_reentrant=False).sum().backward()
        memsave.checkpoint_sequential([nn.Tanh(), nn.Tanh()], 2, _leaf(3), use_reentrant=False).sum().backward()


def test_bad_torch_keywords_fail_clearly() -> None:
    x = _leaf(3)
    with pytest.raises(ValueError, match="determinism_check must be one of default, none"):
        memsave.checkpoint(torch.sin, x, determinism_check="always")
    with pytest.raises(TypeError, match="bools"):
        memsave.checkpoint(torch.sin, x, early_stop="yes")
    with pytest.raises(TypeError, match="two context managers"):
        memsave.checkpoint(torch.sin, x, context_fn=lambda: contextlib.nullcontext())
    with pytest.raises(TypeError, match="context_fn must be a function"):
        memsave.checkpoint(torch.sin, x, context_fn=(contextlib.nullcontext(), contextlib.nullcontext()))


def _keep_mm() -> Tuple[Any, Any]:
    return torch_ckpt.create_selective_checkpoint_contexts([torch.ops.aten.mm.default])


def _mm_relu(t: torch.Tensor) -> torch.Tensor:
    return (t @ t).relu().sum()


def test_a_selective_region_does_not_take_memsave_s_hooks_for_the_user_s() -> None:
    # torch 2.15's selective checkpoint warns when user saved_tensors_hooks are around it; memsave's own are not.
    x = _leaf(4, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        memsave.checkpoint(_mm_relu, x, use_reentrant=False, context_fn=_keep_mm).backward()
        model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
        memsave.wrap(model, nn.Linear, context_fn=_keep_mm)(x).sum().backward()


def _saves_seen_by_user_hooks(respect: Any) -> List[torch.Size]:
    x, seen = _leaf(4, 4), []

    def pack(t: torch.Tensor) -> torch.Tensor:
        seen.append(t.shape)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = memsave.checkpoint(
            _mm_relu, x, use_reentrant=False, context_fn=_keep_mm, respect_saved_tensors_hooks=respect
        )
    y.backward()
    return seen


@pytest.mark.skipif(not compat.selective_saves_can_use_hooks(), reason="this torch has no respect_saved_tensors_hooks")
def test_respect_saved_tensors_hooks_routes_the_kept_matmul_through_the_user_s_hooks() -> None:
    assert _saves_seen_by_user_hooks(True) == [torch.Size([4, 4])]  # the mm output the policy keeps
    assert _saves_seen_by_user_hooks(False) == []
    with pytest.warns(FutureWarning, match="respect_saved_tensors_hooks"):  # torch's default, as torch warns it
        assert _saves_seen_by_user_hooks(None) == []


def test_respect_saved_tensors_hooks_bad_values_fail_clearly() -> None:
    with pytest.raises(TypeError, match="respect_saved_tensors_hooks must be None, True or False"):
        memsave.checkpoint(torch.sin, _leaf(3), use_reentrant=False, respect_saved_tensors_hooks="yes")
    if not compat.selective_saves_can_use_hooks():
        with pytest.raises(TypeError, match="respect_saved_tensors_hooks=True needs a torch"):
            memsave.checkpoint(torch.sin, _leaf(3), use_reentrant=False, respect_saved_tensors_hooks=True)


def test_context_fn_wraps_forward_and_every_recompute() -> None:
    events: List[str] = []

    @contextlib.contextmanager
    def scope(label: str) -> Any:
        events.append(f"enter {label} grad={torch.is_grad_enabled()}")
        yield
        events.append(f"exit {label}")

    class Reusable:  # the recompute context is entered once per recompute, as in torch
        def __enter__(self) -> None:
            events.append("enter recompute")

        def __exit__(self, *exc: Any) -> None:
            events.append("exit recompute")

    def f(t: torch.Tensor) -> torch.Tensor:
        events.append("backward body" if in_backward() else "forward body")
        return t.sin().exp()

    x = _leaf(4)
    y = memsave.checkpoint(f, x, use_reentrant=False, context_fn=lambda: (scope("forward"), Reusable())).sum()
    y.backward(retain_graph=True)
    y.backward()
    assert events == [
        "enter forward grad=True",
        "forward body",
        "exit forward",
        "enter recompute",
        "backward body",
        "exit recompute",
        "enter recompute",
        "backward body",
        "exit recompute",
    ]


def test_determinism_check_none_skips_the_metadata_comparison() -> None:
    # The recompute saves a (1,)-shaped tensor where the forward saved a 0-d one: same values, and mul's backward
    # broadcasts it the same way. torch's "none" accepts that; the default check reports it.
    calls = {"n": 0}

    def f(t: torch.Tensor) -> torch.Tensor:
        calls["n"] += 1
        s = torch.tensor(2.0) if calls["n"] == 1 else torch.tensor([2.0])
        return t.sin() * s

    x = _leaf(5)
    memsave.checkpoint(f, x, determinism_check="none").sum().backward()
    assert torch.equal(x.grad, 2 * x.detach().cos())
    calls["n"] = 0
    for impl in (memsave.checkpoint, torch_ckpt.checkpoint):
        calls["n"] = 0
        y = impl(f, x, use_reentrant=False)
        with pytest.raises((CheckpointError, torch_ckpt.CheckpointError), match="shape"):
            y.sum().backward()


def test_debug_lists_both_runs_saved_tensors_on_a_mismatch() -> None:
    n = {"k": 0}

    def grows(t: torch.Tensor) -> torch.Tensor:
        n["k"] += 1
        return t[: n["k"] + 2].sin().exp()

    y = memsave.checkpoint(grows, _leaf(8), use_reentrant=False, debug=True)
    with pytest.raises(
        RecomputeMismatchError,
        match=r"(?s)debug=True.*#0: forward SliceBackward0 \(3,\).*"
        r"recompute SliceBackward0 \(4,\)",
    ):
        y.sum().backward()
    n["k"] = 0
    y = memsave.checkpoint(grows, _leaf(8), use_reentrant=False)
    with pytest.raises(RecomputeMismatchError) as info:
        y.sum().backward()
    assert "debug=True" not in str(info.value)
    with torch_ckpt.set_checkpoint_debug_enabled(True):  # torch's global switch is honoured too
        n["k"] = 0
        y = memsave.checkpoint(grows, _leaf(8), use_reentrant=False)
    with pytest.raises(RecomputeMismatchError, match="debug=True"):
        y.sum().backward()


def test_region_options_through_checkpointed() -> None:
    x = _leaf(4)
    y = memsave.checkpointed(lambda t: t.sin().exp(), name="blk", strict=True)(x)
    y.sum().backward()
    assert torch.equal(x.grad, x.detach().cos() * x.detach().sin().exp())


def test_huggingface_style_partial_gives_eager_gradients() -> None:
    # What transformers installs: a partial of the checkpoint function with the user's kwargs, called as
    # func(partial(layer.forward-function, layer, **kwargs), *args) for every layer.
    torch.manual_seed(0)

    class Layer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(8, 8)
            self.norm = nn.BatchNorm1d(8)
            self.drop = nn.Dropout(0.1)

        def forward(self, h: torch.Tensor, *, scale: float = 1.0) -> torch.Tensor:
            return self.drop(self.norm(self.lin(h)).relu() * scale)

    layers = nn.ModuleList(Layer() for _ in range(3))
    twin = copy.deepcopy(layers)
    x = torch.randn(4, 8)
    func = functools.partial(memsave.checkpoint, **{"use_reentrant": False})
    torch.manual_seed(1)
    h = x
    for layer in layers:
        h = func(functools.partial(type(layer).forward, layer, scale=0.5), h)
    h.sum().backward()
    torch.manual_seed(1)
    h = x
    for layer in twin:
        h = layer(h, scale=0.5)
    h.sum().backward()
    for p, q in zip(layers.parameters(), twin.parameters()):
        assert torch.equal(p.grad, q.grad)
    for p, q in zip(layers.buffers(), twin.buffers()):
        assert torch.equal(p, q)


def _tiny_transformers_model(kind: str) -> nn.Module:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    if kind == "gpt2":
        config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, n_positions=64, vocab_size=101)
        return transformers.GPT2LMHeadModel(config).train()
    return hub.llama(2, 32, 64, heads=4, kv_heads=2, vocab=101, positions=64, use_cache=True)


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_transformers_checkpointing_through_memsave(kind: str) -> None:
    model = _tiny_transformers_model(kind)
    twin = copy.deepcopy(model)
    calls: List[Any] = []

    def memsave_checkpoint(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:  # counts the regions
        calls.append(fn)
        return memsave.checkpoint(fn, *args, **kwargs)

    # transformers' own switch, then its per-layer checkpoint function replaced by memsave's (same call convention).
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:  # transformers 4.x
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model._set_gradient_checkpointing(
        enable=True, gradient_checkpointing_func=functools.partial(memsave_checkpoint, use_reentrant=False)
    )
    ids = torch.randint(0, 101, (2, 16), generator=torch.Generator().manual_seed(1))
    torch.manual_seed(5)
    model(input_ids=ids, labels=ids).loss.backward()
    assert len(calls) == 2  # one memsave region per transformer layer
    torch.manual_seed(5)
    twin(input_ids=ids, labels=ids).loss.backward()
    for (n, p), q in zip(model.named_parameters(), twin.parameters()):
        assert (p.grad is None) == (q.grad is None), n
        assert p.grad is None or torch.equal(p.grad, q.grad), n


# ==== the peer suite's gaps ===========================================================================

# ---- torch.autograd.grad inside a region -----------------------------------------------------------------------


def _penalty_region(lin: nn.Module, bn: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    def f(t: torch.Tensor) -> torch.Tensor:
        h = nn.functional.dropout(bn(lin(t)).tanh(), 0.2)
        (g,) = torch.autograd.grad(h.pow(2).sum(), t, create_graph=True)  # needs tensors the region saved
        return h.sum(1) + g.pow(2).sum(1)  # gradient penalty

    return f


@pytest.mark.parametrize("early_stop", [True, False])
def test_autograd_grad_inside_region_gradient_penalty(early_stop: bool) -> None:
    torch.manual_seed(0)
    lin, bn = nn.Linear(6, 6), nn.BatchNorm1d(6)
    ours_lin, ours_bn = copy.deepcopy(lin), copy.deepcopy(bn)
    x = _leaf(5, 6)
    torch.manual_seed(1)
    _penalty_region(lin, bn)(x).sum().backward()
    expected = _grads(x, *lin.parameters(), *bn.parameters())
    x.grad = None
    region = Counter(_penalty_region(ours_lin, ours_bn))
    torch.manual_seed(1)
    y = memsave.checkpoint(region, x, use_reentrant=False, early_stop=early_stop)
    y.sum().backward()
    assert all(torch.equal(e, g) for e, g in zip(expected, _grads(x, *ours_lin.parameters(), *ours_bn.parameters())))
    assert all(torch.equal(a, b) for a, b in zip(bn.buffers(), ours_bn.buffers()))
    assert int(ours_bn.num_batches_tracked) == 1
    assert not _state.module_hooks_active() and not _state.tls.records and not _state.tls.calls


def test_autograd_grad_inside_region_meta_learning_step() -> None:
    # One inner SGD step on a copy of the weights inside the region, the outer loss on the adapted weights.
    torch.manual_seed(0)
    w = _leaf(4, 4, seed=1)
    x, target = torch.randn(8, 4), torch.randn(8, 4)

    def adapted_loss(weight: torch.Tensor) -> torch.Tensor:
        inner = (x @ weight).tanh().sub(target).pow(2).mean()
        (g,) = torch.autograd.grad(inner, weight, create_graph=True)
        fast = weight - 0.1 * g
        return (x @ fast).sin().pow(2).mean()

    adapted_loss(w).backward()
    expected = w.grad.clone()
    w.grad = None
    memsave.checkpoint(adapted_loss, w, use_reentrant=False).backward()
    assert torch.equal(expected, w.grad)


def test_backward_inside_a_module_call_replays_its_buffers() -> None:
    # The module updates its own buffer, then calls autograd.grad on tensors the region saved before its call ended:
    # the recompute must start from the buffer's value at the call's start, not the updated one.
    class Ema(RunningMean):
        def forward(self, t: torch.Tensor) -> torch.Tensor:
            h = (t * self.update(t)).exp()
            (g,) = torch.autograd.grad(h.sum(), t, create_graph=True)
            return h + g

    eager, ours = Ema(decay=0.5, weight=1.0, shift=1.0), Ema(decay=0.5, weight=1.0, shift=1.0)
    x = _leaf(3, 4)
    for _ in range(2):
        eager(x).sum().backward()
        expected = x.grad.clone()
        x.grad = None
        memsave.checkpoint(ours, x, use_reentrant=False).sum().backward()
        assert torch.equal(expected, x.grad)
        x.grad = None
        assert torch.equal(eager.avg, ours.avg)


# ---- saved leaves: identity, no recompute ----------------------------------------------------------------------


def test_saved_leaves_are_handed_back_by_identity() -> None:
    seen: Dict[str, Any] = {}

    class ScaleBy(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, t: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
            ctx.save_for_backward(t, scale)
            return t * scale.factor

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor) -> Tuple[torch.Tensor, None]:
            _t, scale = ctx.saved_tensors
            seen["scale"], seen["factor"] = scale, getattr(scale, "factor", None)
            return grad * scale.factor, None  # reads a Python attribute of the saved tensor

    scale = torch.ones(())
    scale.factor = 3.0  # type: ignore[attr-defined]
    w = _leaf(3, 3, seed=1)
    x = _leaf(2, 3)
    region = Counter(lambda t, s: ScaleBy.apply(t, s))
    memsave.checkpoint(region, x, scale, use_reentrant=False).sum().backward()
    assert seen["scale"] is scale and seen["factor"] == 3.0
    assert torch.equal(x.grad, torch.full_like(x, 3.0))
    # Everything the region saved is a live leaf (x, scale), handed back as is; the region still reruns once in
    # backward, as under torch's checkpoint, and that rerun stops at its first saved tensor.
    assert region.calls == 2 and region.in_backward == 1
    # Here ScaleBy saves a tensor made in the region: recomputed, with the scale argument passed to the recompute as
    # the same object (its forward reads scale.factor), and the saved scale handed back as the same object.
    x.grad = None
    seen.clear()
    region = Counter(lambda t, s: ScaleBy.apply(t @ w, s))
    memsave.checkpoint(region, x, scale, use_reentrant=False).sum().backward()
    assert seen["scale"] is scale and seen["factor"] == 3.0 and region.in_backward == 1
    eager_x = x.detach().clone().requires_grad_()
    (eager_x @ w * 3.0).sum().backward()
    assert torch.equal(x.grad, eager_x.grad)

    # A buffer saved by a module is handed back as the module's buffer object too.
    buf_seen: List[torch.Tensor] = []

    class Keep(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, t: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            ctx.save_for_backward(b)
            return t * b

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor) -> Tuple[torch.Tensor, None]:
            (b,) = ctx.saved_tensors
            buf_seen.append(b)
            return grad * b, None

    norm = nn.BatchNorm1d(3).eval()
    memsave.checkpoint(lambda t: Keep.apply(t, norm.running_var), x, use_reentrant=False).sum().backward()
    assert buf_seen[0] is norm.running_var


class _OpCounter(TorchDispatchMode):
    """Counts the aten operators that reach a kernel while it is active."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: List[Any] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops.append(func)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("early_stop", [True, False])
def test_region_saving_only_leaves_reruns_as_torch_does(early_stop: bool) -> None:
    # A frozen embedding table looked up with token ids, then a matrix product with a weight: embedding saves the
    # ids, mm its two operands, add nothing: all live leaves, handed back as they are. The region still reruns once
    # in backward, as under torch's checkpoint; with early stop that rerun ends at the first saved tensor, before
    # the embedding's kernel, so it computes nothing.
    torch.manual_seed(0)
    w = _leaf(8, 8, seed=1)
    ids = torch.randint(0, 10, (4,))
    table = nn.Embedding(10, 8)
    region = Counter(lambda i, t: table(i) + t @ w)
    x = _leaf(4, 8)
    loss = memsave.checkpoint(region, ids, x, use_reentrant=False, early_stop=early_stop).pow(2).sum()
    with _OpCounter() as counter:
        loss.backward()
    got = _grads(x, w, table.weight)
    _clear(x, w, table.weight)
    with _OpCounter() as eager_counter:
        region.fn(ids, x).pow(2).sum().backward()
    assert all(torch.equal(a, b) for a, b in zip(got, _grads(x, w, table.weight)))
    assert region.calls == 2 and region.in_backward == 1
    rerun = counter.ops.count(torch.ops.aten.embedding.default)
    assert rerun == (0 if early_stop else 1), counter.ops
    assert torch.ops.aten.embedding.default in eager_counter.ops
    # A tensor made inside the region is not alive in backward: the rerun stores it.
    region = Counter(lambda t: t.exp() @ w)
    memsave.checkpoint(region, x, use_reentrant=False).sum().backward()
    assert region.in_backward == 1


# ---- early stop ------------------------------------------------------------------------------------------------


class _Tail(nn.Module):
    """Runs after the region's last saved tensor: updates a buffer, saves nothing, counts its calls."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("seen", torch.zeros(()))
        self.calls = 0

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        self.seen = self.seen + t.detach().sum()
        return t * 2.0  # multiplication by a Python number saves nothing


@pytest.mark.parametrize("early_stop", [True, False])
def test_early_stop_skips_the_tail_and_keeps_buffers_exact(early_stop: bool) -> None:
    torch.manual_seed(0)
    block = nn.Sequential(nn.Linear(5, 5), nn.BatchNorm1d(5, momentum=None), nn.Dropout(0.3), nn.Tanh(), _Tail())
    x = _leaf(6, 5)
    ours, expected = eager_step(block, x)
    memsave.checkpoint(ours, x, use_reentrant=False, early_stop=early_stop).sum().backward()
    assert all(torch.equal(e, g) for e, g in zip(expected, _grads(x, *ours.parameters())))
    for (name, a), b in zip(block.named_buffers(), ours.buffers()):
        assert torch.equal(a, b), name
    # tanh's saved output is the last saved tensor: with early stop the recompute never reaches _Tail.
    assert ours[4].calls == (1 if early_stop else 2)


def test_set_checkpoint_early_stop_overrides_the_keyword() -> None:
    tail = _Tail()
    x = _leaf(4)
    with torch_ckpt.set_checkpoint_early_stop(False):
        y = memsave.checkpoint(lambda t: tail(t.sin().exp()), x, use_reentrant=False, early_stop=True)
    y.sum().backward()
    assert tail.calls == 2


def test_set_checkpoint_early_stop_is_read_when_a_wrapped_region_runs() -> None:
    """As torch reads its switch at each checkpoint call: a module wrapped outside the switch honours it inside."""
    block = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), _Tail())
    memsave.wrap(block, nn.Sequential)
    x = _leaf(3, 4)
    block(x).sum().backward()
    assert block[2].calls == 1  # tanh's saved output is the last saved tensor: early stop skips the tail
    with torch_ckpt.set_checkpoint_early_stop(False):
        y = block(x)
    y.sum().backward()
    assert block[2].calls == 3  # the forward, and the whole recompute


def test_early_stop_recomputes_only_up_to_the_tensor_asked_for() -> None:
    # Reading a saved tensor from Python (outside any backward) recomputes just up to it.
    steps: List[str] = []

    def f(t: torch.Tensor) -> torch.Tensor:
        a = t.sin().exp()
        steps.append("a")
        b = a.cos().exp()
        steps.append("b")
        return b

    x = _leaf(4)
    y = memsave.checkpoint(f, x, use_reentrant=False)
    a_exp = y.grad_fn.next_functions[0][0].next_functions[0][0]  # ExpBackward0 of a
    steps.clear()
    assert torch.equal(a_exp._saved_result, x.detach().sin().exp())
    assert steps == []  # stopped inside a's exp
    assert torch.equal(y.grad_fn._saved_result, y.detach())
    assert steps == ["a"]  # stopped inside b's exp
    sin = y.grad_fn.next_functions[0][0].next_functions[0][0].next_functions[0][0]
    assert torch.equal(sin._saved_self, x)  # a saved leaf: handed back without a recompute
    assert steps == ["a"]


# ---- double unpack ---------------------------------------------------------------------------------------------


class _ReadsTwice(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, t: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(t)
        return t.exp()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (t,) = ctx.saved_tensors
        (t_again,) = ctx.saved_tensors
        return grad * t.exp() + 0 * t_again


def test_double_unpack_of_a_recomputed_tensor_raises() -> None:
    x = _leaf(4)
    _ReadsTwice.apply(x.sin()).sum().backward()  # eager allows it
    y = memsave.checkpoint(lambda t: _ReadsTwice.apply(t.sin()), x, use_reentrant=False)
    with pytest.raises(CheckpointError, match="unpacked a second time in the same backward.*read it once"):
        y.sum().backward()
    y = torch_ckpt.checkpoint(lambda t: _ReadsTwice.apply(t.sin()), x, use_reentrant=False)
    with pytest.raises(torch_ckpt.CheckpointError, match="already unpacked once"):  # torch decides the same
        y.sum().backward()
    # A saved leaf is not recomputed: reading it twice is fine, as in eager.
    x.grad = None
    memsave.checkpoint(_ReadsTwice.apply, x, use_reentrant=False).sum().backward()
    assert torch.equal(x.grad, x.detach().exp())


def test_retain_graph_recomputes_per_backward_with_early_stop() -> None:
    x = _leaf(6)
    f = Counter(lambda t: t.sin().exp().cos())
    y = memsave.checkpoint(f, x, use_reentrant=False).sum()
    for _ in range(3):
        y.backward(retain_graph=True)
    assert f.calls == 4 and f.in_backward == 3
    got = x.grad.clone()
    x.grad = None
    z = f.fn(x).sum()
    for _ in range(3):
        z.backward(retain_graph=True)
    assert torch.equal(got, x.grad)


def test_graph_exec_group_shares_one_recompute() -> None:
    region = Counter(lambda t: (t[:2].sin().exp(), t[2:].cos().exp()))
    x = _leaf(5)
    a, b = memsave.checkpoint(region, x, use_reentrant=False)
    with torch_ckpt.GraphExecGroup():  # two backward calls over disjoint parts of the region: one recompute
        a.sum().backward(retain_graph=True)
        b.sum().backward(retain_graph=True)
    assert region.calls == 2 and region.in_backward == 1
    got = x.grad.clone()
    x.grad = None
    sum(o.sum() for o in region.fn(x)).backward()
    assert torch.equal(got, x.grad)
    y = memsave.checkpoint(region, x, use_reentrant=False)[0]
    with torch_ckpt.GraphExecGroup(), pytest.raises(CheckpointError, match="GraphExecGroup"):
        y[:1].sum().backward(retain_graph=True)  # both calls need exp's saved result
        y[1:].sum().backward(retain_graph=True)


# ---- default-device context ------------------------------------------------------------------------------------


def _makes_tensors(t: torch.Tensor) -> torch.Tensor:
    # torch.ones without device=: the default-device context decides where it lives; mul saves it for backward.
    return (t.sin() * torch.ones(t.shape)).exp()


def test_default_device_context_at_entry_is_reentered_for_the_recompute() -> None:
    x = _leaf(5)
    y = memsave.checkpoint(_makes_tensors, x, use_reentrant=False)
    with torch.device("meta"):  # backward under another default device: the recompute still makes CPU tensors
        y.sum().backward()
    assert torch.equal(x.grad, _eager_grad(_makes_tensors, x))

    meta_x = torch.empty(5, device="meta", requires_grad=True)
    with torch.device("meta"):  # forward under a device context, backward outside it
        y = memsave.checkpoint(_makes_tensors, meta_x, use_reentrant=False)
    y.sum().backward()
    assert meta_x.grad is not None and meta_x.grad.device.type == "meta"

    torch.set_default_device("meta")
    try:
        y = memsave.checkpoint(_makes_tensors, meta_x, use_reentrant=False)
    finally:
        torch.set_default_device(None)
    meta_x.grad = None
    y.sum().backward()
    assert meta_x.grad is not None


def _eager_grad(f: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    twin = x.detach().clone().requires_grad_()
    f(twin).sum().backward()
    return twin.grad


@pytest.mark.cuda
def test_default_device_context_cuda() -> None:
    x = torch.randn(5, device="cuda", requires_grad=True)
    with torch.device("cuda"):
        y = memsave.checkpoint(_makes_tensors, x, use_reentrant=False)
    y.sum().backward()
    assert torch.equal(x.grad, _eager_grad(_makes_tensors, x))


# ---- argument containers snapshotted at the call ---------------------------------------------------------------


class _DenseLayer(nn.Module):
    """A DenseNet layer: concatenates the list of all previous features."""

    def __init__(self, channels: int, growth: int) -> None:
        super().__init__()
        self.norm = nn.BatchNorm2d(channels)
        self.conv = nn.Conv2d(channels, growth, 3, padding=1)

    def forward(self, features: List[torch.Tensor]) -> torch.Tensor:
        return self.conv(self.norm(torch.cat(features, 1)).relu())


def test_list_argument_appended_after_the_call_does_not_change_the_recompute() -> None:
    torch.manual_seed(0)
    layers = nn.ModuleList(_DenseLayer(4 + 2 * i, 2) for i in range(3))
    ours = copy.deepcopy(layers)
    x = _leaf(2, 4, 5, 5)
    results = []
    for model, run in (
        (layers, lambda layer, feats: layer(feats)),
        (ours, lambda layer, feats: memsave.checkpoint(layer, feats, use_reentrant=False)),
    ):
        features = [x]
        for layer in model:
            features.append(run(layer, features))  # the same list object, grown after each call
        torch.cat(features, 1).pow(2).sum().backward()
        results.append([x.grad.clone(), *(p.grad for p in model.parameters()), *model.buffers()])
        x.grad = None
    assert all(torch.equal(a, b) for a, b in zip(*results))


def test_dict_and_nested_containers_are_snapshotted() -> None:
    x, y = _leaf(4, seed=1), _leaf(4, seed=2)

    def f(d: Dict[str, Any]) -> torch.Tensor:
        total = sum(t.sin() for t in d["items"]) + d["pair"][1][0].exp()
        return total.exp() * len(d)

    arg = {"items": [x], "pair": (0, [y])}
    out = memsave.checkpoint(f, arg, use_reentrant=False)
    arg["items"].append(y)  # mutate every level after the call
    arg["pair"][1][0] = x
    arg["extra"] = 1
    out.sum().backward()
    ref = {"items": [x], "pair": (0, [y])}
    gx, gy = torch.autograd.grad(f(ref).sum(), (x, y))
    assert torch.equal(x.grad, gx) and torch.equal(y.grad, gy)
