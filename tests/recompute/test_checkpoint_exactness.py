"""Exactness suite: every entry point of memsave's recompute gives bitwise what eager gives (CPU, float32).

For each test model (MLP, CNN with BatchNorm and Dropout, UNet with skips, transformer with dropout and token ids)
and each entry point (checkpoint, checkpointed, checkpoint_sequential, wrap), two full training steps (forward,
backward, SGD step) must leave outputs, input gradients, parameter gradients, parameters, every buffer and the
RNG state bitwise equal to the eager model's. Also shows the cases torch.utils.checkpoint gets wrong.
"""

from __future__ import annotations

import copy
import warnings
from typing import Any, Callable, Dict, List

import pytest
import torch
import torch.utils.checkpoint as torch_ckpt
from torch import nn

from helpers import models
from memsave.recompute.region import checkpoint, checkpoint_sequential, checkpointed
from memsave.recompute.wrapping import wrap

Forward = Callable[[nn.Module, torch.Tensor], torch.Tensor]


def _call(block: nn.Module, *args: Any) -> Any:
    return block(*args)


_checkpointed_call = checkpointed(_call)


def _per_child(runner: Callable[..., Any]) -> Forward:
    def forward(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
        for child in model:
            x = runner(child, x)
        return x

    return forward


def _set_region(runner: Callable[..., Any]) -> Forward:
    def forward(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
        model.region = runner
        return model(x)

    return forward


def _plain(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x)


class CheckpointedBlock(models.TransformerBlock):
    forward = checkpointed(models.TransformerBlock.forward)


# How each entry point is applied to each model: (prepare model in place, forward).
def _strategies(name: str) -> Dict[str, Any]:
    if name in ("mlp", "cnn"):
        block = nn.Linear if name == "mlp" else models.ConvBlock
        return {
            "checkpoint": (None, _per_child(checkpoint)),
            "checkpointed": (None, _per_child(_checkpointed_call)),
            "checkpoint_sequential": (None, lambda m, x: checkpoint_sequential(m, 3, x)),
            "wrap": (lambda m: wrap(m, block), _plain),
        }
    if name == "unet":
        return {
            "checkpoint": (None, _set_region(checkpoint)),
            "checkpointed": (None, _set_region(_checkpointed_call)),
            "checkpoint_sequential": (None, _set_region(lambda b, x: checkpoint_sequential(b, 2, x))),
            "wrap": (lambda m: wrap(m, models.DoubleConv), _plain),
        }
    return {
        "checkpoint": (None, _set_region(checkpoint)),
        # checkpointed on the forward method of the block class: every instance is a region.
        "checkpointed": ("class", _plain),
        "checkpoint_sequential": (
            None,
            lambda m, ids: m.readout(checkpoint_sequential(m.blocks, 2, m.embed_tokens(ids))),
        ),
        "wrap": (lambda m: wrap(m, models.TransformerBlock), _plain),
    }


def _train(model: nn.Module, x: torch.Tensor, forward: Forward, steps: int = 2) -> Dict[str, List[torch.Tensor]]:
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    record: Dict[str, List[torch.Tensor]] = {
        "out": [],
        "x_grad": [],
        "grads": [],
        "params": [],
        "buffers": [],
        "rng": [],
    }
    torch.manual_seed(1234)
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        inp = x.clone().requires_grad_(x.is_floating_point())
        out = forward(model, inp)
        # A loss with distinct per-element weights, so every gradient entry matters.
        w = torch.linspace(-1.0, 1.0, out.numel()).reshape(out.shape)
        (out * w).sum().backward()
        record["out"].append(out.detach().clone())
        if inp.is_floating_point():
            record["x_grad"].append(inp.grad.clone())
        record["grads"] += [p.grad.clone() for p in model.parameters()]
        opt.step()
        record["params"] += [p.detach().clone() for p in model.parameters()]
        record["buffers"] += [b.clone() for b in model.buffers()]
        record["rng"].append(torch.get_rng_state())
    return record


def _assert_bitwise(expected: Dict[str, List[torch.Tensor]], got: Dict[str, List[torch.Tensor]], what: str) -> None:
    for key in expected:
        assert len(expected[key]) == len(got[key]), f"{what}: number of {key} differs"
        for i, (e, g) in enumerate(zip(expected[key], got[key])):
            assert e.shape == g.shape and torch.equal(e, g), (
                f"{what}: {key}[{i}] differs from eager (max abs diff "
                f"{(e.double() - g.double()).abs().max().item() if e.shape == g.shape else 'shape'})"
            )


MODELS = ["mlp", "cnn", "unet", "transformer"]
ENTRY_POINTS = ["checkpoint", "checkpointed", "checkpoint_sequential", "wrap"]


@pytest.fixture(scope="module")
def eager_records() -> Dict[str, Dict[str, List[torch.Tensor]]]:
    records = {}
    for name in MODELS:
        model, x = models.build(name)
        records[name] = _train(model, x, _plain)
    return records


@pytest.mark.parametrize("entry", ENTRY_POINTS)
@pytest.mark.parametrize("name", MODELS)
def test_bitwise_equal_to_eager(name: str, entry: str, eager_records: Dict[str, Any]) -> None:
    prepare, forward = _strategies(name)[entry]
    if prepare == "class":
        model = models.transformer(block_cls=CheckpointedBlock)
        x = models.example_input(name)
        calls = _count_recomputes(model)
    else:
        model, x = models.build(name)
        calls = _count_recomputes(model)
        if prepare is not None:
            prepare(model)
    _assert_bitwise(eager_records[name], _train(model, x, forward), f"{name} via {entry}")
    # The regions really were recomputed in backward (and the model really was checkpointed).
    assert calls["backward"] > 0, f"{name} via {entry}: no module ran during backward, nothing was recomputed"


def _count_recomputes(model: nn.Module) -> Dict[str, int]:
    """Count leaf-module forwards that run while autograd executes a backward (i.e. recomputes).

    Installed as instance-level ``forward`` before any wrapping, so it counts whichever way the region calls the
    module (through ``__call__``, or through the original forward that ``wrap`` keeps).
    """
    calls = {"backward": 0}

    def counting(forward: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            if torch._C._current_graph_task_id() != -1:
                calls["backward"] += 1
            return forward(*args, **kwargs)

        return run

    for m in model.modules():
        if not list(m.children()):
            m.forward = counting(m.forward)
    return calls


def test_torch_checkpoint_double_updates_batchnorm_but_memsave_does_not() -> None:
    eager, x = models.build("cnn")
    ref_torch = copy.deepcopy(eager)
    ours = copy.deepcopy(eager)
    torch.manual_seed(7)
    eager(x.clone().requires_grad_()).sum().backward()
    torch.manual_seed(7)
    out = x.clone().requires_grad_()
    for child in ref_torch:
        out = torch_ckpt.checkpoint(child, out, use_reentrant=False)
    out.sum().backward()
    torch.manual_seed(7)
    _per_child(checkpoint)(ours, x.clone().requires_grad_()).sum().backward()
    eager_bufs, torch_bufs, ours_bufs = (list(m.buffers()) for m in (eager, ref_torch, ours))
    # torch.utils.checkpoint runs each BatchNorm twice in training mode: running stats updated twice
    # (pytorch issues 62471, 96136). If this starts failing, torch fixed it: update the README claim.
    assert not all(torch.equal(a, b) for a, b in zip(eager_bufs, torch_bufs))
    assert int(ref_torch[0][1].num_batches_tracked) == 2 * int(eager[0][1].num_batches_tracked)
    assert all(torch.equal(a, b) for a, b in zip(eager_bufs, ours_bufs))


def test_spectral_norm_power_iteration_replayed() -> None:
    # spectral_norm updates its u/v buffers in a forward pre-hook and uses them in forward: the recompute must
    # start from the forward's buffer values, not the updated ones (torch.utils.checkpoint gets this wrong).
    torch.manual_seed(0)
    eager = nn.Sequential(
        nn.utils.spectral_norm(nn.Linear(6, 6)), nn.Tanh(), nn.utils.parametrizations.spectral_norm(nn.Linear(6, 3))
    )
    ours, ref_torch = copy.deepcopy(eager), copy.deepcopy(eager)
    x = torch.randn(4, 6)
    eager(x).sum().backward()
    checkpoint(ours, x).sum().backward()
    torch_ckpt.checkpoint(ref_torch, x, use_reentrant=False).sum().backward()
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(eager.parameters(), ours.parameters()))
    assert all(torch.equal(a, b) for a, b in zip(eager.buffers(), ours.buffers()))
    assert not all(torch.equal(a.grad, b.grad) for a, b in zip(eager.parameters(), ref_torch.parameters()))


def test_reentrant_fails_on_frozen_input_memsave_gives_parameter_grads() -> None:
    eager = models.unet()
    ours, reentrant = copy.deepcopy(eager), copy.deepcopy(eager)
    x = models.example_input("unet")  # an image batch: does not require grad
    torch.manual_seed(3)
    eager(x).sum().backward()
    reentrant.region = lambda block, h: torch_ckpt.checkpoint(block, h, use_reentrant=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "None of the inputs have requires_grad=True"
        # The first block alone, as the classic walk-through's first call: backward dies.
        with pytest.raises(RuntimeError, match="does not require grad"):
            reentrant.region(reentrant.enc1, x).sum().backward()
        # The whole UNet: backward runs, but no checkpointed block gets a gradient (untrained weights).
        reentrant(x).sum().backward()
    assert all(p.grad is None for p in reentrant.enc1.parameters())
    ours.region = checkpoint
    torch.manual_seed(3)
    ours(x).sum().backward()
    for (pname, p), q in zip(eager.named_parameters(), ours.parameters()):
        assert q.grad is not None and torch.equal(p.grad, q.grad), pname


def test_frozen_input_between_regions_gives_parameter_grads() -> None:
    # LoRA-style: a frozen part feeds a trainable block; the block's input does not require grad.
    torch.manual_seed(0)
    frozen = nn.Linear(8, 8).requires_grad_(False)
    block = nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 8))
    ours = copy.deepcopy(block)
    x = torch.randn(3, 8)
    block(frozen(x)).sum().backward()
    checkpoint(ours, frozen(x)).sum().backward()
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(block.parameters(), ours.parameters()))
