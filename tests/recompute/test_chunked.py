"""memsave.chunked and convert(mlp_chunks=...): position-wise modules run slice by slice along the sequence.

Gradients are float rounding away from the unchunked module's (sums over slices), so they are held to twice eager
float32's own error against the same step in float64. Memory claims are allocator-level peaks of one step.
"""

from __future__ import annotations

import copy
import pickle
from typing import Callable, Dict, Tuple

import pytest
import torch
from torch import nn

import memsave
from helpers import hub
from memsave.recompute.chunked import ChunkedForward, auto_chunks

transformers = pytest.importorskip("transformers")


def _llama(layers: int = 2, hidden: int = 64, intermediate: int = 172) -> nn.Module:
    torch.manual_seed(0)
    return hub.llama(layers, hidden, intermediate, heads=4, kv_heads=2, vocab=128, positions=512, use_cache=True)


def _gpt2(layers: int = 2, width: int = 64) -> nn.Module:
    torch.manual_seed(0)
    return hub.gpt2(layers, width, heads=4, vocab=128, positions=512, dropout=0.0, use_cache=True)


def _grads(module: nn.Module, x: torch.Tensor) -> Dict[str, torch.Tensor]:
    """Gradients of a fixed random projection of ``module(x)``, the input's included (as ``"input"``)."""
    module.zero_grad(set_to_none=True)
    x = x.detach().requires_grad_(True)
    out = module(x)
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(3), dtype=out.dtype)
    (out * weight).sum().backward()
    got = {n: p.grad.detach().clone() for n, p in module.named_parameters()}
    got["input"] = x.grad.detach().clone()
    return got


def _assert_within_twice_eager(module: nn.Module, x: torch.Tensor, chunks: object) -> None:
    want64 = _grads(copy.deepcopy(module).double(), x.double())
    eager = _grads(module, x)
    chunked = _grads(memsave.chunked(copy.deepcopy(module), chunks), x)
    for name, ref in want64.items():
        eager_error = (eager[name].double() - ref).abs().max().item()
        error = (chunked[name].double() - ref).abs().max().item()
        assert error <= 2 * eager_error + 1e-12, f"{name}: chunked error {error:.3g}, eager's {eager_error:.3g}"


@pytest.mark.parametrize("chunks", [4, 7, "auto"])
@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_chunked_mlp_gradients_within_twice_eager_error(family: str, chunks: object) -> None:
    model = _llama() if family == "llama" else _gpt2()
    mlp = model.model.layers[0].mlp if family == "llama" else model.transformer.h[0].mlp
    # batch 2: the slices along dim 1 are not contiguous (GPT-2's Conv1D views its input)
    x = torch.randn(2, 300, 64, generator=torch.Generator().manual_seed(1))
    _assert_within_twice_eager(mlp, x, chunks)


def test_chunked_mlp_peak_is_a_fraction_of_eager() -> None:
    mlp = _llama(layers=1).model.layers[0].mlp
    x = torch.randn(1, 1024, 64, requires_grad=True)
    eager = memsave.measure(mlp, x, steps=1, warmup=1).peak_bytes
    chunked = memsave.measure(memsave.chunked(copy.deepcopy(mlp), 8), x, steps=1, warmup=1).peak_bytes
    # eager keeps gate, act(gate), up and their product (4 x 172 floats per position); 8 slices keep none of them
    assert chunked < 0.4 * eager, (chunked, eager)


def test_chunked_is_in_place_and_undone_by_one_chunk() -> None:
    mlp = _gpt2().transformer.h[0].mlp
    keys = list(mlp.state_dict())
    assert memsave.chunked(mlp, 3) is mlp
    assert memsave.recompute.is_chunked(mlp) and list(mlp.state_dict()) == keys
    pickle.loads(pickle.dumps(copy.deepcopy(mlp)))  # picklable and deep-copyable, like a wrapped module
    memsave.chunked(mlp, 5)
    assert mlp.forward.chunks == 5 and mlp.forward.previous is None  # replaced, not stacked
    memsave.chunked(mlp, 1)
    assert not memsave.recompute.is_chunked(mlp) and "forward" not in mlp.__dict__


def test_chunked_errors_name_the_argument() -> None:
    mlp = nn.Sequential(nn.Linear(8, 8))
    with pytest.raises(ValueError, match="chunks must be >= 1"):
        memsave.chunked(mlp, 0)
    with pytest.raises(ValueError, match="'auto'"):
        memsave.chunked(mlp, "many")
    with pytest.raises(TypeError, match="chunks must be an int"):
        memsave.chunked(mlp, 2.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="nn.Module"):
        memsave.chunked(lambda x: x, 2)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="dim 3 is out of range"):
        memsave.chunked(mlp, 2, dim=3)(torch.randn(2, 4, 8, requires_grad=True))
    with pytest.raises(ValueError, match="mlp_chunks"):
        memsave.convert(_gpt2(), mlp_chunks=-1)


def test_auto_chunks_rule() -> None:
    assert auto_chunks(100, 64) == 1  # up to 256 positions: unchunked
    assert auto_chunks(257, 64) == 2
    assert auto_chunks(8192, 256) == 32
    assert auto_chunks(8192, 1024) == 8  # one slice per hidden positions


def _zoo(name: str) -> Tuple[nn.Module, Callable[[nn.Module], torch.Tensor], str]:
    ids = torch.randint(0, 128, (2, 40), generator=torch.Generator().manual_seed(1))
    if name == "llama":
        return _llama(), lambda m: m(input_ids=ids, labels=ids).loss, "model.layers.1.mlp"
    if name == "gpt2":
        return _gpt2(), lambda m: m(input_ids=ids, labels=ids).loss, "transformer.h.1.mlp"
    if name == "bert":
        torch.manual_seed(0)
        model = hub.bert(2, 64, 128, vocab=128, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        return model, lambda m: m(input_ids=ids, labels=ids).loss, "bert.encoder.layer.1.feed_forward_chunk"
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    vit = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=64, num_classes=10).train()
    images = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    return vit, lambda m: m(images).square().mean(), "blocks.1.mlp"


def _step(model: nn.Module, loss: Callable[[nn.Module], torch.Tensor]) -> Dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    loss(model).backward()
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _assert_close(got: Dict[str, torch.Tensor], want: Dict[str, torch.Tensor], rel: float = 1e-4) -> None:
    assert got.keys() == want.keys()
    for name, ref in want.items():
        error = (got[name] - ref).abs().max().item()
        assert error <= rel * ref.abs().max().item() + 1e-7, f"{name}: {error:.3g}"


@pytest.mark.parametrize("zoo", ["llama", "gpt2", "bert", pytest.param("vit", marks=pytest.mark.slow)])
def test_convert_mlp_chunks_on_model_zoos(zoo: str) -> None:
    model, loss, last_mlp = _zoo(zoo)
    keys = list(model.state_dict())
    want = _step(model, loss)
    converted = memsave.convert(copy.deepcopy(model), fuse=True, mlp_chunks=4)
    assert list(converted.state_dict()) == keys
    layer, _, attr = last_mlp.rpartition(".")
    owner = converted.get_submodule(layer)
    installed = owner.__dict__.get(attr) if attr == "feed_forward_chunk" else getattr(owner, attr).__dict__["forward"]
    assert isinstance(installed, ChunkedForward)
    _assert_close(_step(converted, loss), want)  # fused operators and slices: float rounding
    memsave.wrap(converted)  # the slices are regions nested in each block's region
    _assert_close(_step(converted, loss), want)


@pytest.mark.slow
def test_chunked_mlps_inside_a_plan() -> None:
    model = _llama(layers=2)
    ids = torch.randint(0, 128, (1, 200), generator=torch.Generator().manual_seed(1))
    want = _step(model, lambda m: m(input_ids=ids, labels=ids).loss)
    memsave.convert(model, mlp_chunks=4)
    p = memsave.plan(model, input_ids=ids, labels=ids, budget=0.9, selective=False)
    assert p.measured_peak_bytes is not None and p.measured_peak_bytes <= p.budget_bytes
    memsave.wrap(model, p)
    _assert_close(_step(model, lambda m: m(input_ids=ids, labels=ids).loss), want)


@pytest.mark.slow
def test_chunked_mlps_under_compile() -> None:
    model = _gpt2(layers=2)
    ids = torch.randint(0, 128, (2, 64), generator=torch.Generator().manual_seed(1))
    want = _step(model, lambda m: m(input_ids=ids, labels=ids).loss)
    chunked = memsave.convert(copy.deepcopy(model), mlp_chunks=2)
    memsave.wrap(chunked)
    compiled = torch.compile(lambda i: chunked(input_ids=i, labels=i).loss)
    _assert_close(_step(chunked, lambda m: compiled(ids)), want)
