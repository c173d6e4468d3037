"""Selective recompute through memsave's regions: torch's ``create_selective_checkpoint_contexts`` policies and
:func:`memsave.selective` with :func:`memsave.checkpoint`, :func:`memsave.checkpointed` and :func:`memsave.wrap`.

Exact (bitwise gradients, buffers and RNG stream against eager, CPU float32), the operators a policy saves are not
run again in backward (counted at the dispatcher), and the memory and recompute work land between a whole region's
and eager's.
"""

from __future__ import annotations

import copy
import functools
from collections import Counter
from typing import Any, Callable, Dict

import pytest
import torch
from torch import nn
from torch.utils import checkpoint as torch_ckpt
from torch.utils._python_dispatch import TorchDispatchMode

import memsave
from memsave.common import compat

aten = torch.ops.aten


class _CountOps(TorchDispatchMode):
    """Counts the ATen operators that actually run (a cached output read back by a selective recompute does not)."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.counts[func.overloadpacket] += 1
        return func(*args, **(kwargs or {}))


def _block() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.Dropout(0.3), nn.GELU(), nn.Linear(32, 16), nn.BatchNorm1d(16))


def _state(model: nn.Module, x: torch.Tensor) -> Dict[str, Any]:
    return {
        "x": x.grad.clone(),
        "grads": [p.grad.clone() for p in model.parameters()],
        "buffers": [b.clone() for b in model.buffers()],
        "rng": torch.get_rng_state(),
    }


def _assert_bitwise(got: Dict[str, Any], want: Dict[str, Any]) -> None:
    assert torch.equal(got["x"], want["x"])
    assert all(torch.equal(a, b) for a, b in zip(got["grads"], want["grads"]))
    assert all(torch.equal(a, b) for a, b in zip(got["buffers"], want["buffers"]))
    assert torch.equal(got["rng"], want["rng"])


def _eager(x: torch.Tensor) -> Dict[str, Any]:
    block = _block()
    x = x.detach().requires_grad_()
    torch.manual_seed(7)
    block(x).square().sum().backward()
    return _state(block, x)


def _save_addmm(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
    return (
        torch_ckpt.CheckpointPolicy.MUST_SAVE
        if op is aten.addmm.default
        else torch_ckpt.CheckpointPolicy.PREFER_RECOMPUTE
    )


@pytest.mark.parametrize(
    "context_fn",
    [
        functools.partial(torch_ckpt.create_selective_checkpoint_contexts, _save_addmm),
        functools.partial(torch_ckpt.create_selective_checkpoint_contexts, [aten.addmm.default]),
        memsave.selective("matmul"),
    ],
    ids=["torch-policy-fn", "torch-op-list", "memsave.selective"],
)
def test_selective_checkpoint_is_exact_and_skips_saved_operators(context_fn: Callable[[], Any]) -> None:
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1))
    want = _eager(x)
    block = _block()
    xs = x.detach().requires_grad_()
    torch.manual_seed(7)
    y = memsave.checkpoint(block, xs, use_reentrant=False, context_fn=context_fn)
    with _CountOps() as ops:
        y.square().sum().backward()
    _assert_bitwise(_state(block, xs), want)
    assert ops.counts[aten.addmm] == 0  # both Linear forwards read back, not run (their backward uses mm)
    assert ops.counts[aten.gelu] == 1 and ops.counts[aten.bernoulli_] == 1  # the cheap operators are recomputed


def test_alternate_matmul_keeps_the_first_product_and_recomputes_the_second() -> None:
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1))
    want = _eager(x)
    block = _block()
    xs = x.detach().requires_grad_()
    torch.manual_seed(7)
    y = memsave.checkpoint(block, xs, use_reentrant=False, context_fn=memsave.selective("alternate_matmul"))
    with _CountOps() as ops:
        y.square().sum().backward()
    _assert_bitwise(_state(block, xs), want)
    # The second Linear's output is BatchNorm's saved input: the recompute runs it; the first is read back.
    assert ops.counts[aten.addmm] == 1 and ops.counts[aten.gelu] == 1


def test_selective_rejects_both_matmul_classes() -> None:
    with pytest.raises(ValueError, match="name one of them"):
        memsave.selective("matmul", "alternate_matmul")


def test_whole_region_recomputes_what_selective_keeps() -> None:
    x = torch.randn(8, 16, requires_grad=True)
    y = memsave.checkpoint(_block(), x, use_reentrant=False)
    with _CountOps() as ops:
        y.square().sum().backward()
    assert ops.counts[aten.addmm] == 2  # the check above can fail: without a policy both products run again


def test_checkpointed_decorator_takes_context_fn() -> None:
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1))
    want = _eager(x)
    block = _block()
    run = memsave.checkpointed(block, context_fn=memsave.selective("matmul"))
    xs = x.detach().requires_grad_()
    torch.manual_seed(7)
    run(xs).square().sum().backward()
    _assert_bitwise(_state(block, xs), want)


def test_second_backward_through_a_selective_region_raises_as_in_torch() -> None:
    x = torch.randn(8, 16, requires_grad=True)
    y = memsave.checkpoint(_block(), x, use_reentrant=False, context_fn=memsave.selective("matmul"))
    y.sum().backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="backward an extra time"):
        y.sum().backward()


def test_selective_rejects_unknown_classes_and_bad_context_fns() -> None:
    with pytest.raises(ValueError, match="at least one operator class"):
        memsave.selective()
    with pytest.raises(ValueError, match="unknown operator class 'softmax'"):
        memsave.selective("matmul", "softmax")
    model = _block()
    with pytest.raises(TypeError, match="context_fn must be a function"):
        memsave.wrap(model, nn.Linear, context_fn=42)
    assert not any(memsave.recompute.is_wrapped(m) for m in model.modules())  # nothing half-wrapped


# ------------------------------------------------------------------------------------------------ GPT-2
def _gpt2() -> nn.Module:
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=64, vocab_size=96)  # dropout 0.1
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config).train()


def _gpt2_step(model: nn.Module, ids: torch.Tensor, count: bool = False) -> Dict[str, Any]:
    torch.manual_seed(3)
    loss = model(input_ids=ids, labels=ids).loss
    with _CountOps() as ops, compat.count_flops() as flops:
        loss.backward()
    return {
        "loss": loss.detach(),
        "grads": {n: p.grad for n, p in model.named_parameters()},
        "addmm": ops.counts[aten.addmm],
        "flops": flops.total,
    }


def test_wrap_with_selective_context_on_gpt2_is_exact_and_recomputes_less() -> None:
    ids = torch.randint(0, 96, (2, 32), generator=torch.Generator().manual_seed(1))
    eager = _gpt2()
    whole = memsave.wrap(copy.deepcopy(eager))
    selective = memsave.wrap(copy.deepcopy(eager), context_fn=memsave.selective("matmul", "attention"))
    want, got_whole, got = (_gpt2_step(m, ids) for m in (eager, whole, selective))
    assert torch.equal(got["loss"], want["loss"])
    for name, grad in want["grads"].items():
        assert torch.equal(got["grads"][name], grad), name
    # GPT-2's Conv1D layers are addmm: 4 per block, all run again by whole regions, none by selective ones.
    assert got_whole["addmm"] == want["addmm"] + 8 and got["addmm"] == want["addmm"]
    # count_flops counts matrix products, convolutions and attention: the selective recompute runs none of them.
    assert want["flops"] == got["flops"] < got_whole["flops"]


def test_alternate_matmul_on_gpt2_is_exact_and_recomputes_every_other_product() -> None:
    ids = torch.randint(0, 96, (2, 32), generator=torch.Generator().manual_seed(1))
    eager = _gpt2()
    alternate = memsave.wrap(copy.deepcopy(eager), context_fn=memsave.selective("alternate_matmul", "attention"))
    want, got = _gpt2_step(eager, ids), _gpt2_step(alternate, ids)
    assert torch.equal(got["loss"], want["loss"])
    for name, grad in want["grads"].items():
        assert torch.equal(got["grads"][name], grad), name
    # A block's products are QKV, attention's output projection, the MLP's two: the 1st and 3rd are kept, the 2nd
    # and 4th run again in each of the 2 blocks (the 4th feeds the residual dropout, whose mask the block saves).
    assert got["addmm"] == want["addmm"] + 4


def test_selective_memory_lies_between_whole_regions_and_eager() -> None:
    ids = torch.randint(0, 96, (2, 64), generator=torch.Generator().manual_seed(1))
    eager = _gpt2()
    variants = {
        "eager": eager,
        "whole": memsave.wrap(copy.deepcopy(eager)),
        "selective": memsave.wrap(copy.deepcopy(eager), context_fn=memsave.selective("matmul")),
    }
    act = {
        name: memsave.measure(
            m, ids, loss_fn=lambda out: out.logits.float().square().mean(), steps=1, warmup=0
        ).activation_bytes
        for name, m in variants.items()
    }
    assert act["whole"] < act["selective"] < act["eager"], act
