"""memsave regions under ``torch.compile`` (CPU, float32, inductor).

While dynamo traces, a region lowers to torch's non-reentrant checkpoint (a tagged subgraph whose activations the
compiled backward recomputes), so ``torch.compile(memsave.wrap(model))`` and ``memsave.checkpoint`` inside a compiled
function train like eager: gradients and BatchNorm statistics within float tolerance (inductor fuses and reorders
floating-point operations, so not bitwise), buffers updated once, and the compiled step's peak is still that of a
checkpointed step. Models are built without dropout: random operations under compile draw from inductor's generator,
not eager's, with or without memsave.
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Dict, Tuple

import pytest
import torch
from torch import nn

import memsave
from helpers import hub

REL = 1e-4  # normwise: inductor reorders float32 reductions; per-element errors are relative to the tensor's scale


def _assert_close(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    error = (got.double() - want.double()).abs().max().item()
    scale = want.double().abs().max().item()
    assert error <= REL * scale + 1e-7, f"{what}: max error {error:.3g} against scale {scale:.3g}"


def _step(model: nn.Module, call: Callable[[nn.Module], torch.Tensor]) -> Dict[str, Any]:
    torch.manual_seed(0)
    loss = call(model)
    loss.backward()
    return {
        "loss": loss.detach(),
        "grads": {n: p.grad for n, p in model.named_parameters() if p.grad is not None},
        "buffers": {n: b.detach().clone() for n, b in model.named_buffers()},
    }


def _assert_same_step(got: Dict[str, Any], want: Dict[str, Any]) -> None:
    _assert_close(got["loss"], want["loss"], "loss")
    assert got["grads"].keys() == want["grads"].keys()
    for name, grad in want["grads"].items():
        _assert_close(got["grads"][name], grad, f"gradient of {name}")
    assert got["buffers"].keys() == want["buffers"].keys()
    for name, buf in want["buffers"].items():
        if buf.is_floating_point():
            _assert_close(got["buffers"][name], buf, f"buffer {name}")
        else:  # num_batches_tracked: one update per step, not two
            assert torch.equal(got["buffers"][name], buf), name


def _gpt2(layers: int, width: int) -> nn.Module:
    pytest.importorskip("transformers")
    torch.manual_seed(0)
    return hub.gpt2(layers, width, heads=4, vocab=128, positions=128, dropout=0.0, use_cache=True)


class _LMLoss(nn.Module):
    """A Hugging Face causal LM called with keyword inputs, returning its ``ModelOutput``'s loss."""

    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.lm(input_ids=ids, labels=ids).loss


def test_compiled_wrap_transformer_trains_like_eager() -> None:
    eager = _gpt2(layers=2, width=64)
    wrapped = memsave.wrap(copy.deepcopy(eager))
    assert memsave.find_blocks(eager) == ["transformer.h.0", "transformer.h.1"]
    ids = torch.randint(0, 128, (2, 32), generator=torch.Generator().manual_seed(1))
    want = _step(eager, lambda m: m(input_ids=ids, labels=ids).loss)
    compiled = torch.compile(_LMLoss(wrapped), fullgraph=True)  # fullgraph: the regions cause no graph break
    got = _step(wrapped, lambda m: compiled(ids))
    _assert_same_step(got, want)
    # The wrap survives compilation: eager calls still run memsave's regions, bitwise as before.
    assert all(memsave.recompute.is_wrapped(wrapped.get_submodule(n)) for n in memsave.find_blocks(wrapped))
    for p in wrapped.parameters():
        p.grad = None
    _assert_same_step(_step(wrapped, lambda m: m(input_ids=ids, labels=ids).loss), want)


def test_compiled_wrap_batchnorm_cnn_updates_statistics_once() -> None:
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    eager = torchvision.models.resnet18(num_classes=10).train()
    wrapped = memsave.wrap(copy.deepcopy(eager))
    assert memsave.find_blocks(eager)[:2] == ["layer1.0", "layer1.1"]
    # Batch 4 at 64 x 64: the last stage's BatchNorm normalises over 16 values. At 2 x 32 x 32 (2 values) the
    # gradients are so ill-conditioned that compiling alone, with or without memsave, moves them by 30%.
    x = torch.randn(4, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    want = _step(eager, lambda m: m(x).square().mean())
    compiled = torch.compile(wrapped, fullgraph=True)
    got = _step(wrapped, lambda m: compiled(x).square().mean())
    _assert_same_step(got, want)
    assert int(wrapped.layer1[0].bn1.num_batches_tracked) == 1


@pytest.mark.parametrize("selective", [(), ("matmul",), ("alternate_matmul",)], ids=["whole", "selective", "alternate"])
def test_checkpoint_inside_compiled_function_passes_keywords_through(selective: Tuple[str, ...]) -> None:
    torch.manual_seed(0)
    block = nn.Sequential(nn.Linear(16, 32, bias=False), nn.BatchNorm1d(32), nn.GELU(), nn.Linear(32, 16))
    copied = copy.deepcopy(block)

    def region(x: torch.Tensor, *, name: str, scale: float) -> torch.Tensor:  # `name` belongs to the region
        assert name == "caller's"
        return block(x) * scale

    def step(x: torch.Tensor) -> torch.Tensor:
        context_fn = memsave.selective(*selective) if selective else None  # torch's SAC under compile
        return memsave.checkpoint(
            region, x, use_reentrant=False, context_fn=context_fn, name="caller's", scale=0.5
        ).sum()

    x = torch.randn(8, 16)
    want = _step(copied, lambda m: (m(x) * 0.5).sum())
    got = _step(block, lambda m: torch.compile(step, fullgraph=True)(x))
    _assert_same_step(got, want)


def test_compiled_wrap_keeps_checkpoint_memory() -> None:
    """The compiled backward recomputes the regions: the compiled step's peak stays well below compiled eager's."""
    ids = torch.randint(0, 128, (4, 128), generator=torch.Generator().manual_seed(1))
    peaks = {}
    for variant in ("compiled", "compiled_wrap"):
        lm = _gpt2(layers=4, width=64)
        if variant == "compiled_wrap":
            memsave.wrap(lm)
        step = torch.compile(_LMLoss(lm))
        result = memsave.measure(step, ids, loss_fn=lambda loss: loss, steps=1, warmup=1)
        peaks[variant] = result.peak_bytes
    assert peaks["compiled_wrap"] < 0.7 * peaks["compiled"], peaks
