"""``find_blocks``, ``wrap`` and ``plan`` on the structures a new user brings, beyond one stack of layers.

Real model definitions at tiny configs with random weights (nothing is downloaded), CPU float32, training mode:

* blocks held as attributes of stage modules (timm RegNet: ``s1.b1 ... s4.b7``) and blocks of several classes, one
  family per stage (timm EfficientNetV2: ConvBnAct, EdgeResidual, InvertedResidual): ``find_blocks`` returns every
  block, and ``wrap`` cuts the activations kept for backward (``memsave.measure``) to at most 0.3 of eager's;
* an encoder-decoder (Hugging Face T5, 3 + 3 layers), two towers (Hugging Face CLIP), a mixture of experts
  (Hugging Face Mixtral) and a UNet (``examples/unet.py``): the planner's chain has every block as a stage, so a plan
  at 1.05x the measured peak of ``wrap(model)`` succeeds, its measured peak is within that budget and its gradients
  and buffers equal eager's bitwise; the minimum-memory plan's peak (what ``InfeasibleBudgetError`` reports for a
  budget nothing fits) is not above ``wrap``'s.

The module runs with one intra-op thread (restored afterwards), as the other real-model tests do.
"""

from __future__ import annotations

import copy
import importlib.util
from typing import Any, Callable, Dict, List, Tuple

import pytest
import torch
from torch import nn

import memsave
from helpers import ROOT
from helpers.steps import Args, Kwargs, LossFn, assert_same_step, generator, one_thread, step_peak, train_step
from memsave.models import hub
from memsave.recompute.blocks import explain_blocks

__all__ = ["one_thread"]  # the module's autouse fixture
VOCAB = 96


def _timm(name: str) -> nn.Module:
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    return timm.create_model(name, pretrained=False, num_classes=10).train()


def _transformers() -> Any:
    tf = pytest.importorskip("transformers")
    tf.logging.set_verbosity_error()
    return tf


# ----------------------------------------------------------------------------------------- find_blocks, no forward
def test_regnet_blocks_held_as_attributes_of_stages() -> None:
    model = _timm("regnety_002")
    expected = [f"s{i}.{b}" for i in range(1, 5) for b, _ in getattr(model, f"s{i}").named_children()]
    assert len(expected) == 13
    choice = explain_blocks(model)
    assert choice.names == expected
    assert memsave.find_blocks(model) == expected
    assert choice.source == "structure" and "RegStage" in choice.reason, choice.reason


@pytest.mark.parametrize("name", ["tf_efficientnetv2_b0", "efficientnetv2_rw_t"])
def test_efficientnetv2_blocks_of_every_stage_and_class(name: str) -> None:
    model = _timm(name)
    expected = [f"blocks.{i}.{j}" for i, stage in enumerate(model.blocks) for j in range(len(stage))]
    choice = explain_blocks(model)
    assert choice.names == expected
    classes = {type(model.get_submodule(n)).__name__ for n in expected}
    assert {"EdgeResidual", "InvertedResidual"} <= classes
    for cls in classes:  # the reason names every class chosen
        assert cls in choice.reason, choice.reason


def _mixtral() -> nn.Module:
    _transformers()
    torch.manual_seed(0)
    experts = {"num_local_experts": 4, "num_experts_per_tok": 2, "pad_token_id": 0, "use_cache": True}
    return hub.causal_lm("Mixtral", 2, 32, 64, kv_heads=2, vocab=VOCAB, bos_token_id=0, eos_token_id=0, **experts)


def test_mixture_of_experts_blocks_are_the_layers_not_the_experts() -> None:
    model = _mixtral()
    layers = ["model.layers.0", "model.layers.1"]
    assert memsave.find_blocks(model) == layers
    for m in model.modules():  # without Hugging Face's hint the structure gives the same layers
        if "_no_split_modules" in vars(m) or hasattr(type(m), "_no_split_modules"):
            m._no_split_modules = None
    choice = explain_blocks(model)
    assert choice.source == "structure" and choice.names == layers, choice


# ------------------------------------------------------------------------------------------- wrap on CNN families
@pytest.mark.slow
@pytest.mark.parametrize("name", ["regnety_002", "tf_efficientnetv2_b0"])
def test_wrap_cuts_activations_of_attribute_and_mixed_blocks(name: str) -> None:
    model = _timm(name)
    x = torch.randn(2, 3, 64, 64, generator=generator())
    eager = memsave.measure(copy.deepcopy(model), x, steps=1, warmup=0)
    wrapped = memsave.measure(memsave.wrap(copy.deepcopy(model)), x, steps=1, warmup=0)
    ratio = wrapped.activation_bytes / eager.activation_bytes
    assert ratio <= 0.3, f"{name}: wrap keeps {ratio:.2f} of eager's activations"


# ------------------------------------------------------------------------------------ plans on two-stack models
def _t5() -> Tuple[nn.Module, Args, Kwargs, LossFn]:
    tf = _transformers()
    torch.manual_seed(0)
    config = tf.T5Config(
        vocab_size=VOCAB,
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_layers=3,
        num_decoder_layers=3,
        num_heads=4,
        decoder_start_token_id=0,
        pad_token_id=0,
        eos_token_id=1,
    )  # dropout 0.1
    ids = torch.randint(2, VOCAB, (2, 48), generator=generator())
    labels = torch.randint(2, VOCAB, (2, 32), generator=generator(2))
    kwargs = {"input_ids": ids, "labels": labels, "use_cache": False}
    return tf.T5ForConditionalGeneration(config).train(), (), kwargs, lambda out: out.loss


def _clip() -> Tuple[nn.Module, Args, Kwargs, LossFn]:
    tf = _transformers()
    torch.manual_seed(0)
    tower = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4)
    config = tf.CLIPConfig(
        text_config=dict(vocab_size=VOCAB, max_position_embeddings=64, **tower),
        vision_config=dict(image_size=32, patch_size=4, **tower),
        projection_dim=16,
    )
    kwargs = {
        "input_ids": torch.randint(2, VOCAB, (4, 64), generator=generator()),  # towers of about equal memory
        "pixel_values": torch.randn(4, 3, 32, 32, generator=generator(2)),
        "return_loss": True,
    }
    return tf.CLIPModel(config).train(), (), kwargs, lambda out: out.loss


def _mixtral_lm() -> Tuple[nn.Module, Args, Kwargs, LossFn]:
    ids = torch.randint(0, VOCAB, (2, 32), generator=generator())
    return _mixtral(), (), {"input_ids": ids, "labels": ids, "use_cache": False}, lambda out: out.loss


def _unet() -> Tuple[nn.Module, Args, Kwargs, LossFn]:
    path = ROOT / "examples" / "unet.py"
    spec = importlib.util.spec_from_file_location("memsave_example_unet", path)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    torch.manual_seed(0)
    x = torch.randn(2, 3, 32, 32, generator=generator())
    return example.UNet(w=8).train(), (x,), {}, lambda out: out.float().square().mean()


CASES: Dict[str, Callable[[], Tuple[nn.Module, Args, Kwargs, LossFn]]] = {
    "hf-t5": _t5,  # encoder-decoder: two stacks
    "hf-clip": _clip,  # two towers
    "hf-mixtral": _mixtral_lm,  # mixture of experts
    "unet": _unet,  # skips from the down path to the up path
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_plan_at_wrap_peak_fits_and_is_exact(name: str) -> None:
    model, args, kwargs, loss = CASES[name]()
    blocks: List[str] = memsave.find_blocks(model)
    assert blocks
    reference = copy.deepcopy(model)
    wrap_peak = step_peak(memsave.wrap(copy.deepcopy(model)), args, kwargs, loss)  # copies: BatchNorm statistics
    budget = int(1.05 * wrap_peak)

    plan = memsave.plan(model, *args, **kwargs, budget=budget, loss_fn=loss, timing_steps=1)

    # Every block is a stage of the chain, or a plain Sequential opened into stages that one region may group.
    stages = {m for stage in plan.stage_modules for m in stage.modules}
    for b in blocks:
        children = [f"{b}.{c}" for c, _ in model.get_submodule(b).named_children()]
        assert b in stages or set(children) <= stages, (b, sorted(stages))
    assert plan.measured_peak_bytes is not None and plan.measured_peak_bytes <= budget, plan.summary()
    memsave.wrap(model, plan)
    grads_eager = train_step(reference, args, kwargs, loss)
    grads_plan = train_step(model, args, kwargs, loss)
    assert_same_step(grads_eager, grads_plan, reference, model)
    peak = step_peak(model, args, kwargs, loss)
    assert peak <= budget, f"measured {peak} > budget {budget} (wrap {wrap_peak})\n{plan.summary()}"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["hf-t5", "hf-clip"])
def test_infeasible_budget_states_the_smallest_reached_and_wrap_is_within_it(name: str) -> None:
    model, args, kwargs, loss = CASES[name]()
    wrap_peak = step_peak(memsave.wrap(copy.deepcopy(model)), args, kwargs, loss)
    budget = wrap_peak // 3
    with pytest.raises(memsave.InfeasibleBudgetError) as info:
        memsave.plan(model, *args, **kwargs, budget=budget, loss_fn=loss, timing_steps=1)
    err = info.value
    assert budget < err.min_bytes <= wrap_peak  # the minimum-memory plan is never above wrap's peak
    message = str(err)
    assert str(err.min_bytes) in message and "smallest peak it reached" in message, message
    assert not any(memsave.recompute.is_wrapped(m) for m in model.modules())
