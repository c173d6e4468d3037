"""memsave.convert: converted VGG-like and ResNet-like models equal the originals, state_dict keys are kept, the
summary says where a mask pays, include/exclude, and the Sequential-pattern extension point."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn

import memsave
import memsave.nn as mnn
from helpers import hub
from helpers.models import BasicBlock
from memsave.errors import MemsaveWarning
from memsave.operators.convert import (
    ConvertReport,
    convert,
    plan_convert,
    register_sequential_pattern,
    sequential_patterns,
    unregister_sequential_pattern,
)

# The four module swaps of this file; with include= these, fused Sequential patterns registered elsewhere (which
# need a BatchNorm or Linear included too) stay out of the bitwise comparisons.
MASK_MODULES = [nn.ReLU, nn.LeakyReLU, nn.Dropout, nn.MaxPool2d]


def vgg_like(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)

    class VGG(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.features = nn.Sequential(
                nn.Conv2d(3, 8, 3, padding=1),
                nn.ReLU(inplace=True),
                nn.Conv2d(8, 8, 3, padding=1),
                nn.ReLU(inplace=True),
                nn.MaxPool2d(2, 2),
                nn.Conv2d(8, 16, 3, padding=1),
                nn.LeakyReLU(0.1),
                nn.Conv2d(16, 16, 3, padding=1),
                nn.ReLU(),
                nn.MaxPool2d(2, 2),
            )
            self.classifier = nn.Sequential(
                nn.Flatten(),
                nn.Linear(16 * 4 * 4, 32),
                nn.ReLU(True),
                nn.Dropout(0.5),
                nn.Linear(32, 32),
                nn.ReLU(True),
                nn.Dropout(0.5),
                nn.Linear(32, 10),
            )

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.classifier(self.features(x))

    return VGG()


def resnet_like(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, 1, 1, bias=False),
        nn.BatchNorm2d(8),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(3, 2, 1),
        BasicBlock(8, 8),
        BasicBlock(8, 16, stride=2),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(16, 10),
    )


def step(model: nn.Module, x: torch.Tensor, seed: int = 123):
    """One forward+backward from a fixed seed: output, input grad, parameter grads, buffers."""
    model.zero_grad(set_to_none=True)
    x = x.detach().clone().requires_grad_()
    torch.manual_seed(seed)
    y = model(x)
    y.pow(2).mean().backward()
    return (y.detach(), x.grad, [p.grad for p in model.parameters()], [b.clone() for b in model.buffers()])


def assert_steps_equal(a, b) -> None:
    assert torch.equal(a[0], b[0])
    assert torch.equal(a[1], b[1])
    for ga, gb in zip(a[2], b[2]):
        assert torch.equal(ga, gb)
    for ba, bb in zip(a[3], b[3]):
        assert torch.equal(ba, bb)


# ---- equality with the unconverted model -----------------------------------------------------------------------


def test_vgg_like_equal_to_unconverted():
    ref = vgg_like()
    ours = convert(copy.deepcopy(ref), include=MASK_MODULES, exclude=[nn.Dropout], unprofitable=True)
    assert sum(isinstance(m, (mnn.ReLU, mnn.LeakyReLU, mnn.MaxPool2d)) for m in ours.modules()) == 8
    x = torch.randn(2, 3, 16, 16)
    assert_steps_equal(step(ours, x), step(ref, x))
    # with Dropout converted too: equal in eval mode (dropout draws other bits in training, by design)
    full = convert(copy.deepcopy(ref), include=MASK_MODULES, dropout=True)
    assert sum(isinstance(m, mnn.Dropout) for m in full.modules()) == 2
    full.eval()
    ref.eval()
    assert_steps_equal(step(full, x), step(ref, x))


def test_resnet_like_equal_to_unconverted():
    ref = resnet_like()
    ours = convert(copy.deepcopy(ref), include=MASK_MODULES)
    assert isinstance(ours[4].relu, mnn.ReLU) and isinstance(ours[3], mnn.MaxPool2d)
    x = torch.randn(2, 3, 16, 16)
    for _ in range(2):  # BatchNorm running statistics stay equal too
        assert_steps_equal(step(ours, x), step(ref, x))


def test_converted_model_inside_memsave_checkpoint_replays_dropout():
    model = convert(vgg_like(), include=MASK_MODULES, dropout=True)
    x = torch.randn(2, 3, 16, 16)
    eager = step(model, x)

    class Ckpt(nn.Module):
        def __init__(self, inner: nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, t: torch.Tensor) -> torch.Tensor:
            return memsave.checkpoint(self.inner.classifier, memsave.checkpoint(self.inner.features, t))

    assert_steps_equal(step(Ckpt(model), x), eager)


def test_saved_bytes_smaller_where_the_mask_pays():
    def saved(model: nn.Module) -> int:
        storages = {}

        def pack(t: torch.Tensor) -> torch.Tensor:
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        x = torch.randn(4, 3, 16, 16, requires_grad=True)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(x)
        return sum(storages.values())

    ref = vgg_like()
    ours = convert(copy.deepcopy(ref), include=MASK_MODULES)
    before, after = saved(ref), saved(ours)
    # conv2 -> ReLU -> MaxPool: torch keeps the ReLU output (4 x 8 x 16 x 16 float32) and int64 pool indices;
    # memsave keeps bits and bytes: at least that output's 32 KiB less.
    assert after < before - 4 * 8 * 16 * 16 * 4


# ---- state_dict, report, selection --------------------------------------------------------------------------


def test_state_dict_keys_kept_and_loadable():
    ref = resnet_like()
    keys = list(ref.state_dict().keys())
    ours = convert(copy.deepcopy(ref))
    assert set(ours.state_dict().keys()) == set(keys)
    ours.load_state_dict(ref.state_dict())
    ref.load_state_dict(ours.state_dict())


def test_report_says_where_the_mask_pays(capsys):
    model = vgg_like()
    returned = convert(model, include=MASK_MODULES, verbose=True, dropout=True)
    assert returned is model
    text = capsys.readouterr().out
    lines = {line.split()[0]: line for line in text.splitlines() if line.startswith(("features.", "classifier."))}
    assert "no gain alone" in lines["features.1"] and "Conv2d keeps this output" in lines["features.1"]
    assert "pays" in lines["features.3"] and "MaxPool2d does not keep it" in lines["features.3"]
    assert "pays" in lines["features.4"] and "int64 indices" in lines["features.4"]
    assert "pays" in lines["features.6"]  # LeakyReLU after a Conv: its input is kept by nobody else
    assert "pays" in lines["classifier.2"]  # ReLU -> Dropout
    assert "not where the next Linear/Conv keeps the output anyway" in text
    rn = resnet_like()
    report = plan_convert(rn, include=MASK_MODULES)
    by_name = {e.name: e for e in report.entries}
    assert by_name["4.relu"].verdict == "depends"  # used in forward(): the consumer is not visible
    assert by_name["2"].verdict == "pays"  # stem ReLU -> memsave MaxPool2d
    assert isinstance(rn[2], nn.ReLU) and not isinstance(rn[2], mnn.ReLU)  # plan_convert changes nothing
    assert isinstance(report, ConvertReport) and "converted" in str(report)


def test_include_exclude_and_skips():
    model = vgg_like()
    convert(model, include=["features.*"], exclude=["features.4", nn.LeakyReLU])
    f, c = model.features, model.classifier
    assert isinstance(f[8], mnn.ReLU) and isinstance(f[9], mnn.MaxPool2d)
    # their masks would gain nothing before a Conv2d and torch's MaxPool2d (features.4 excluded): not made
    assert type(f[1]) is nn.ReLU and type(f[3]) is nn.ReLU
    assert type(f[4]) is nn.MaxPool2d and type(f[6]) is nn.LeakyReLU
    assert type(c[2]) is nn.ReLU and type(c[3]) is nn.Dropout
    big = nn.Sequential(nn.MaxPool2d(17), nn.ReLU())
    report = plan_convert(big)
    assert report.entries[0].verdict == "skipped" and "256" in report.entries[0].detail
    convert(big)
    assert type(big[0]) is nn.MaxPool2d and isinstance(big[1], mnn.ReLU)
    with pytest.raises(TypeError, match="module classes"):
        convert(vgg_like(), include=[3])
    with pytest.raises(TypeError, match="nn.Module"):
        convert(lambda x: x)


def test_idempotent_shared_modules_and_flags():
    shared = nn.ReLU()
    model = nn.Sequential(nn.Linear(4, 4), shared, nn.Linear(4, 4), shared, nn.Dropout(0.3, inplace=True))
    model.eval()
    convert(model, dropout=True, unprofitable=True)  # ReLU -> Linear: a mask of no gain alone, made on request
    assert model[1] is model[3] and isinstance(model[1], mnn.ReLU)
    assert isinstance(model[4], mnn.Dropout) and model[4].inplace and not model[4].training
    first = [type(m) for m in model]
    with pytest.warns(MemsaveWarning, match="changed nothing"):
        convert(model, dropout=True, unprofitable=True)
    assert [type(m) for m in model] == first
    assert repr(model[1]) == "memsave.ReLU()"


def test_a_convert_that_changes_nothing_warns():
    model = nn.Sequential(nn.Linear(4, 4), nn.GELU(), nn.Linear(4, 2))  # no module convert swaps
    before = [type(m) for m in model.modules()]
    with pytest.warns(MemsaveWarning, match=r"changed nothing in Sequential: no module left that convert swaps") as got:
        assert convert(model) is model
    assert "fuse=True also fuses" in str(got[0].message) and got[0].filename == __file__  # the caller's line
    assert [type(m) for m in model.modules()] == before
    with pytest.warns(MemsaveWarning, match=r"every candidate was skipped \(1; verbose=True prints why\)"):
        convert(nn.Sequential(nn.MaxPool2d(17)))  # a window over 256 elements: skipped
    model = vgg_like()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        convert(model)  # swaps: no warning
    with pytest.warns(MemsaveWarning, match="changed nothing in VGG"):
        convert(model)  # the second time there is nothing left to swap


def test_chunking_alone_is_a_change():
    pytest.importorskip("transformers")
    llama = hub.causal_lm("Llama", 1, 32, 64, kv_heads=1, vocab=64)  # SiLU MLPs: nothing to swap without fuse
    with pytest.warns(MemsaveWarning, match="changed nothing in LlamaForCausalLM"):
        convert(copy.deepcopy(llama))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        convert(llama, mlp_chunks=2)  # the MLPs chunked
    assert memsave.recompute.is_chunked(llama.model.layers[0].mlp)


# ---- Sequential patterns ------------------------------------------------------------------------------------


class LinearReLU(nn.Linear):
    """Test fusion: a Linear that applies memsave's ReLU (same parameter names as nn.Linear)."""

    memsave_keeps_input = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return memsave.functional.relu(super().forward(x))


def _fuse(mods):
    lin, _ = mods
    new = LinearReLU(lin.in_features, lin.out_features, bias=lin.bias is not None)
    new.load_state_dict(lin.state_dict())
    return [new, nn.Identity()]


def test_sequential_pattern_registry():
    try:
        register_sequential_pattern("test_linear_relu", (nn.Linear, nn.ReLU), _fuse, note="test", priority=5)
        assert "test_linear_relu" in sequential_patterns()
        torch.manual_seed(0)
        ref = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3), nn.ReLU(), nn.Dropout(0.1))
        model = convert(copy.deepcopy(ref), fuse=True, dropout=True)
        assert isinstance(model[0], LinearReLU) and isinstance(model[1], nn.Identity)
        assert isinstance(model[2], LinearReLU) and isinstance(model[4], mnn.Dropout)
        x = torch.randn(5, 6)
        model.eval()
        ref.eval()
        assert torch.equal(model(x), ref(x))
        report = plan_convert(copy.deepcopy(ref), fuse=True, dropout=True)
        assert report.entries[0].detail.startswith("pattern test_linear_relu")
        # excluded members keep a pattern from matching; the ReLU is then swapped alone
        m2 = convert(copy.deepcopy(ref), exclude=["0"], fuse=True, unprofitable=True)
        assert type(m2[0]) is nn.Linear and isinstance(m2[1], mnn.ReLU) and isinstance(m2[2], LinearReLU)
        # a build may decline
        register_sequential_pattern("test_linear_relu", (nn.Linear, nn.ReLU), lambda ms: None, priority=5)
        m3 = convert(copy.deepcopy(ref), fuse=True, dropout=True, unprofitable=True)
        assert type(m3[0]) is nn.Linear and isinstance(m3[1], mnn.ReLU)
        # a pattern that moves parameters is refused and undone
        register_sequential_pattern(
            "test_linear_relu", (nn.Linear, nn.ReLU), lambda ms: [nn.Identity(), nn.Sequential(ms[0], nn.ReLU())]
        )
        m4 = copy.deepcopy(ref)
        with pytest.raises(ValueError, match="state_dict keys"):
            convert(m4, fuse=True)
        assert type(m4[0]) is nn.Linear and type(m4[1]) is nn.ReLU
        register_sequential_pattern("test_linear_relu", (nn.Linear, nn.ReLU), lambda ms: [ms[0]])
        with pytest.raises(ValueError, match="must return 2 modules"):
            convert(copy.deepcopy(ref), fuse=True, dropout=True)
        with pytest.raises(TypeError, match="element"):
            register_sequential_pattern("bad", (3,), _fuse)
    finally:
        if "test_linear_relu" in sequential_patterns():
            unregister_sequential_pattern("test_linear_relu")
    assert "test_linear_relu" not in sequential_patterns()
    with pytest.raises(KeyError):
        unregister_sequential_pattern("test_linear_relu")


def test_default_convert_is_lossless_and_opt_ins_are_explicit():
    """convert(model) alone is bitwise equal to eager in training mode, dropout included: it leaves Dropout and the
    fused patterns (not bitwise) to the dropout=True / fuse=True opt-ins."""
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Dropout(0.3), nn.Linear(8, 3), nn.ReLU())
    ours = convert(copy.deepcopy(ref))
    assert type(ours[1]) is nn.BatchNorm1d and type(ours[3]) is nn.Dropout  # untouched by default
    assert isinstance(ours[2], mnn.ReLU) and isinstance(ours[5], mnn.ReLU)
    x = torch.randn(5, 6)
    for _ in range(2):  # step() seeds the RNG the same way for both: dropout masks match
        assert_steps_equal(step(ours, x), step(ref, x))
    opted = convert(copy.deepcopy(ref), dropout=True)
    assert isinstance(opted[3], mnn.Dropout)
    report = plan_convert(copy.deepcopy(ref))
    assert all(e.new != "memsave.Dropout" for e in report.entries)
