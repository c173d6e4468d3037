"""memsave.convert with the fused Sequential patterns: BN -> act, LayerNorm -> Linear, act -> Linear, and the
opt-in Conv -> BN -> act In-Place ABN pattern."""

from __future__ import annotations

import copy

import torch
from torch import nn

from helpers.fused import FLOAT32_RTOL, module_state, rel_err, saved_bytes
from memsave.nn import (
    ActLinear,
    BatchNormAct2d,
    BatchNormActConv2d,
    DeferredBatchNormAct2d,
    DeferredLayerNorm,
    InPlaceABN2d,
    LayerNormLinear,
)
from memsave.operators.convert import convert, plan_convert, sequential_patterns
from memsave.operators.convert import fused_patterns as _convert_fused


def _cnn() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(inplace=True),
        nn.Conv2d(8, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.GELU(),
        nn.Conv2d(8, 8, 3, padding=1),
        nn.BatchNorm2d(8, momentum=None),
        nn.LeakyReLU(0.1),
        nn.Flatten(),
        nn.LayerNorm(8 * 6 * 6),
        nn.Linear(8 * 6 * 6, 32),
        nn.SiLU(),
        nn.Linear(32, 10),
    )


def _assert_grads_close(grads, refs):
    """Relative to the largest gradient entry of the whole model: a conv bias followed by BatchNorm has a zero
    gradient in exact arithmetic, so per-tensor relative errors would compare rounding noise with noise."""
    scale = max(r.abs().max().item() for r in refs)
    for g, r in zip(grads, refs):
        assert (g - r).abs().max().item() <= FLOAT32_RTOL * scale


def _step(model: nn.Module, x: torch.Tensor):
    x = x.detach().clone().requires_grad_()
    y = model(x)
    grads = torch.autograd.grad(y.square().sum(), [x, *model.parameters()])
    return y, grads


def test_patterns_are_registered():
    assert {"batch_norm_act_conv2d", "batch_norm_act", "layer_norm_linear", "act_linear"} <= set(sequential_patterns())


def test_convert_fuses_sequential_patterns_keeping_keys_values_and_gradients():
    model, ref = _cnn(), _cnn()
    keys = list(ref.state_dict())
    convert(model, fuse=True)
    kinds = [type(m) for m in model]
    assert kinds == [
        nn.Conv2d,
        DeferredBatchNormAct2d,
        nn.Identity,
        BatchNormActConv2d,
        DeferredBatchNormAct2d,
        nn.Identity,
        BatchNormActConv2d,
        BatchNormAct2d,
        nn.Identity,
        nn.Flatten,
        DeferredLayerNorm,
        LayerNormLinear,
        nn.Identity,
        ActLinear,
    ]
    assert (model[1].act, model[4].act, model[7].act, model[7].act_param) == ("relu", "gelu", "leaky_relu", 0.1)
    assert model[7].momentum is None and model[13].act == "silu"
    assert list(model.state_dict()) == keys
    assert model[3]._bn() is model[1] and model[11]._norm() is model[10]
    x = torch.randn(4, 3, 6, 6)
    for _ in range(2):  # two training steps: running statistics (and the cumulative average) stay equal
        y, grads = _step(model, x)
        y2, grads2 = _step(ref, x)
        assert rel_err(y, y2) <= FLOAT32_RTOL
        _assert_grads_close(grads, grads2)
    for (k, v), (k2, v2) in zip(model.state_dict().items(), ref.state_dict().items()):
        assert k == k2 and torch.equal(v, v2), k
    model.eval()
    ref.eval()
    assert rel_err(model(x), ref(x)) <= FLOAT32_RTOL
    model.load_state_dict(ref.state_dict())  # checkpoints of the unconverted model load


def test_converted_model_keeps_fewer_bytes():
    model, ref = _cnn(), _cnn()
    convert(model, fuse=True)
    x = torch.randn(4, 3, 6, 6, requires_grad=True)
    fused_bytes, _ = saved_bytes(lambda: model(x), module_state(model))
    eager_bytes, _ = saved_bytes(lambda: ref(x), module_state(ref))
    # Two conv inputs (relu and gelu outputs), the gelu and leaky_relu inputs (4 x 4*8*6*6 floats), the normalized
    # LayerNorm output and the SiLU output.
    assert eager_bytes - fused_bytes >= 4 * (4 * 4 * 8 * 36 + 4 * 288 + 4 * 32)


def test_declined_and_unsupported_cases():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(16, 16),
        nn.ReLU(),
        nn.Linear(16, 16),  # relu -> Linear: nothing to save, and a mask would gain nothing either: left
        nn.LayerNorm(8),
        nn.Linear(16, 4),  # shapes do not chain (would fail in forward anyway): declined
    )
    convert(model, fuse=True)
    assert type(model[1]) is nn.ReLU and type(model[2]) is nn.Linear
    assert type(model[3]) is nn.LayerNorm and type(model[4]) is nn.Linear
    sync = nn.Sequential(nn.Conv2d(3, 4, 1), nn.SyncBatchNorm(4), nn.ReLU())
    convert(sync, fuse=True)
    assert type(sync[1]) is nn.SyncBatchNorm  # SyncBatchNorm semantics are not supported: left alone


def test_include_exclude_and_plan():
    model = _cnn()
    report = plan_convert(model, fuse=True)
    assert any("batch_norm_act" in e.detail for e in report.entries)
    assert type(model[1]) is nn.BatchNorm2d  # planning changes nothing
    convert(model, exclude=[nn.BatchNorm2d, nn.LayerNorm], fuse=True)
    assert type(model[1]) is nn.BatchNorm2d and type(model[10]) is nn.LayerNorm and type(model[3]) is nn.Conv2d
    assert type(model[13]) is ActLinear  # SiLU -> Linear does not touch excluded modules


def test_transformer_mlp_sequential():
    torch.manual_seed(0)
    mlp = nn.Sequential(
        nn.LayerNorm(32), nn.Linear(32, 128), nn.GELU(approximate="tanh"), nn.Linear(128, 32), nn.Dropout(0.0)
    )
    ref = copy.deepcopy(mlp)
    convert(mlp, fuse=True)
    assert [type(m) for m in mlp][:4] == [DeferredLayerNorm, LayerNormLinear, nn.Identity, ActLinear]
    assert mlp[3].act == "gelu_tanh"
    x = torch.randn(2, 8, 32)
    y, grads = _step(mlp, x)
    y2, grads2 = _step(ref, x)
    assert rel_err(y, y2) <= FLOAT32_RTOL
    _assert_grads_close(grads, grads2)


def test_opt_in_inplace_abn_pattern():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.LeakyReLU(0.05),
        nn.Conv2d(8, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
    )
    ref = copy.deepcopy(model)
    _convert_fused.register_inplace_abn_pattern()
    try:
        convert(model, fuse=True)
    finally:
        _convert_fused.unregister_inplace_abn_pattern()
    assert _convert_fused.INPLACE_ABN_PATTERN not in sequential_patterns()
    assert [type(m) for m in model] == [nn.Conv2d, InPlaceABN2d, nn.Identity, nn.Conv2d, BatchNormAct2d, nn.Identity]
    # without the opt-in, the same model gets the exact patterns
    plain = copy.deepcopy(ref)
    convert(plain, fuse=True)
    assert [type(m) for m in plain][:4] == [nn.Conv2d, DeferredBatchNormAct2d, nn.Identity, BatchNormActConv2d]
    assert model[1].act_param == 0.05
    assert list(model.state_dict()) == list(ref.state_dict())
    x = torch.randn(2, 3, 8, 8)
    y, grads = _step(model, x)
    y2, grads2 = _step(ref, x)
    assert rel_err(y, y2) <= FLOAT32_RTOL
    _assert_grads_close(grads, grads2)


def test_benchmark_rewrites_keep_keys_and_gradients():
    """The fusion recipes the benchmark rows apply (benchmarks/fusion_recipes.py) rewrite ResNet-50 and the
    GPT-2-like model in place: same parameter names, gradients equal to eager's within float32 rounding."""
    from benchmarks import fusion_recipes as recipes

    from memsave import models as bench_models

    for name, fuse in (("resnet50", recipes.fuse_resnet50), ("gpt2", recipes.fuse_gpt2)):
        case = bench_models.build(name, "tiny")
        eager = case.model
        eager.eval() if name == "gpt2" else None  # dropout off: both sides then run the same function
        fused = fuse(copy.deepcopy(eager))
        assert [n for n, _ in fused.named_parameters()] == [n for n, _ in eager.named_parameters()]
        assert list(fused.state_dict()) == list(eager.state_dict())
        grads = []
        for model in (eager, fused):
            loss = case.loss_fn(model(*case.inputs))
            grads.append(torch.autograd.grad(loss, list(model.parameters())))
        _assert_grads_close(grads[1], grads[0])


def test_recipes_refuse_other_models_and_fuse_sequentials_counts():
    """A recipe refuses a model it was not written for (before changing it); fuse_sequentials applies only the named
    patterns and counts them."""
    from benchmarks import fusion_recipes as recipes

    model = _cnn()
    before = copy.deepcopy(model)
    for fuse in (recipes.fuse_resnet50, recipes.fuse_gpt2):
        try:
            fuse(model)
        except TypeError as err:
            assert "model" in str(err)
        else:
            raise AssertionError("expected TypeError")
    assert str(model) == str(before)
    assert recipes.fuse_sequentials(model, ["batch_norm_act_conv2d", "batch_norm_act"]) == 3
    assert isinstance(model[1], DeferredBatchNormAct2d) and isinstance(model[3], BatchNormActConv2d)
    assert isinstance(model[4], DeferredBatchNormAct2d) and isinstance(model[7], BatchNormAct2d)
    assert isinstance(model[10], nn.LayerNorm)  # layer_norm_linear was not named
    assert list(model.state_dict()) == list(before.state_dict())
