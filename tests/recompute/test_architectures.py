"""``find_blocks``, ``wrap`` and ``plan`` on the structures a new user brings, beyond one stack of layers.

Real model definitions at tiny configs with random weights (nothing is downloaded), CPU float32, training mode:

* blocks held as attributes of stage modules (timm RegNet: ``s1.b1 ... s4.b7``) and blocks of several classes, one
  family per stage (timm EfficientNetV2: ConvBnAct, EdgeResidual, InvertedResidual): ``find_blocks`` returns every
  block, and ``wrap`` cuts the activations kept for backward (``memsave.measure``) to at most 0.3 of eager's;
* the units a model's own checkpointing switch checkpoints are its blocks (Hugging Face Wav2Vec2's convolutional
  feature encoder layers beside its encoder layers, SegFormer's and Swin's blocks, DINOv2 with registers; timm
  MobileViT's MobileNetV2 blocks beside its MobileViT blocks, ConvNeXt), and wherever a model has such a switch
  (those, Hugging Face ViT and Llama, timm ViT) ``wrap``'s allocator-level peak of a training step is at or below the
  switch's and its gradients and buffers equal eager's bitwise; GoogLeNet's Inception modules are blocks, not their
  branches' convolutions nor the auxiliary classifiers;
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
from helpers import ROOT, hub
from helpers.steps import Args, Kwargs, LossFn, assert_same_step, generator, one_thread, step_peak, train_step
from memsave.recompute.blocks import _structure, explain_blocks

__all__ = ["one_thread"]  # the module's autouse fixture
VOCAB = 96
#: The tiny transformer of the Hugging Face vision, T5 and CLIP models here (3 layers: a plan has blocks to choose
#: from), in the config names transformers maps to each family's own (T5's ``d_model``, ``num_layers`` ...); and its
#: MLP width, which T5 calls ``d_ff``.
_TINY, _MLP = dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=4), 64


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
    assert choice.source == "timm", choice  # what its set_grad_checkpointing checkpoints
    names, reason = _structure(model)  # and without timm's switch, the structure finds the same blocks
    assert names == expected and "RegStage" in reason, reason


@pytest.mark.parametrize("name", ["tf_efficientnetv2_b0", "efficientnetv2_rw_t"])
def test_efficientnetv2_blocks_of_every_stage_and_class(name: str) -> None:
    model = _timm(name)
    expected = [f"blocks.{i}.{j}" for i, stage in enumerate(model.blocks) for j in range(len(stage))]
    classes = {type(model.get_submodule(n)).__name__ for n in expected}
    assert {"EdgeResidual", "InvertedResidual"} <= classes
    choice = explain_blocks(model)
    assert choice.names == expected and choice.source == "timm", choice
    names, reason = _structure(model)  # without timm's switch: one family per stage gives the same blocks
    assert names == expected
    for cls in classes:  # the reasons name every class chosen
        assert cls in choice.reason and cls in reason, (choice.reason, reason)


def _mixtral() -> nn.Module:
    _transformers()
    torch.manual_seed(0)
    experts = {"num_local_experts": 4, "num_experts_per_tok": 2, "pad_token_id": 0, "use_cache": True}
    return hub.causal_lm("Mixtral", 2, 32, 64, kv_heads=2, vocab=VOCAB, bos_token_id=0, eos_token_id=0, **experts)


def test_mixture_of_experts_blocks_are_the_layers_not_the_experts() -> None:
    model = _mixtral()
    layers = ["model.layers.0", "model.layers.1"]
    choice = explain_blocks(model)
    assert choice.source == "transformers" and choice.names == layers, choice
    names, reason = _structure(model)  # without Hugging Face's checkpoint layers the structure gives the same
    assert names == layers, reason


# ------------------------------------------------------------------- the units of the models' own checkpointing
Switch = Callable[[nn.Module], None]
Case = Tuple[nn.Module, Args, Kwargs, LossFn]


def _hf_switch(model: nn.Module) -> None:
    model.activation_checkpointing_enable()  # transformers 5's name (Trainer's activation_checkpointing=True)


def _timm_switch(model: nn.Module) -> None:
    model.set_grad_checkpointing(True)


def _hidden(out: Any) -> torch.Tensor:
    return out.last_hidden_state.float().square().mean()


def _square(out: torch.Tensor) -> torch.Tensor:
    return out.float().square().mean()


def _image(size: int = 32, seed: int = 1) -> torch.Tensor:
    return torch.randn(2, 3, size, size, generator=generator(seed))


def _wav2vec2() -> Case:
    tf = _transformers()
    torch.manual_seed(0)
    config = tf.Wav2Vec2Config(  # dropout, layerdrop 0.1 and SpecAugment (numpy's RNG) on
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        conv_dim=(32, 32, 32),
        conv_stride=(5, 2, 2),
        conv_kernel=(10, 3, 3),
        num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=2,
    )
    return tf.Wav2Vec2Model(config).train(), (), {"input_values": torch.randn(2, 4000, generator=generator())}, _hidden


def _segformer() -> Case:
    tf = _transformers()
    torch.manual_seed(0)
    config = tf.SegformerConfig(  # drop path 0.1
        depths=[2, 2, 2, 2],
        hidden_sizes=[16, 32, 48, 64],
        num_attention_heads=[1, 2, 2, 4],
        decoder_hidden_size=32,
        num_labels=3,
        hidden_dropout_prob=0.1,
    )
    labels = torch.randint(0, 3, (2, 64, 64), generator=generator(2))
    kwargs = {"pixel_values": _image(64), "labels": labels}
    return tf.SegformerForSemanticSegmentation(config).train(), (), kwargs, lambda out: out.loss


def _swin() -> Case:
    tf = _transformers()
    torch.manual_seed(0)
    config = tf.SwinConfig(
        image_size=32,
        patch_size=2,
        embed_dim=16,
        depths=[2, 2],
        num_heads=[2, 4],
        window_size=4,
        drop_path_rate=0.1,
        hidden_dropout_prob=0.1,
    )
    return tf.SwinModel(config).train(), (), {"pixel_values": _image()}, _hidden


def _vision(family: str, **extra: Any) -> Callable[[], Case]:
    def build() -> Case:
        tf = _transformers()
        torch.manual_seed(0)
        sizes = {**_TINY, "num_attention_heads": 2, "intermediate_size": _MLP}
        config = getattr(tf, f"{family}Config")(image_size=32, patch_size=4, hidden_dropout_prob=0.1, **sizes, **extra)
        return getattr(tf, f"{family}Model")(config).train(), (), {"pixel_values": _image()}, _hidden

    return build


def _llama() -> Case:
    _transformers()
    torch.manual_seed(0)
    model = hub.causal_lm("Llama", 3, 32, 64, kv_heads=1, vocab=VOCAB, attention_dropout=0.1)
    ids = torch.randint(0, VOCAB, (2, 64), generator=generator())
    return model.train(), (), {"input_ids": ids, "labels": ids, "use_cache": False}, lambda out: out.loss


def _timm_case(name: str, size: int, **kwargs: Any) -> Callable[[], Case]:
    def build() -> Case:
        timm = pytest.importorskip("timm")
        torch.manual_seed(0)
        model = timm.create_model(name, pretrained=False, num_classes=10, drop_path_rate=0.1, **kwargs)
        return model.train(), (_image(size),), {}, _square

    return build


SWITCH_CASES: Dict[str, Tuple[Callable[[], Case], Switch]] = {
    "hf-wav2vec2": (_wav2vec2, _hf_switch),
    "hf-segformer": (_segformer, _hf_switch),
    "hf-swin": (_swin, _hf_switch),
    "hf-dinov2-registers": (_vision("Dinov2WithRegisters", num_register_tokens=4), _hf_switch),
    "hf-vit": (_vision("ViT"), _hf_switch),
    "hf-llama": (_llama, _hf_switch),
    "timm-mobilevit": (_timm_case("mobilevit_xxs", 64), _timm_switch),
    "timm-vit": (
        _timm_case("vit_tiny_patch16_224", 32, img_size=32, patch_size=4, embed_dim=32, num_heads=2, depth=3),
        _timm_switch,
    ),
    "timm-convnext": (_timm_case("convnext_atto", 64), _timm_switch),
}


def _blocks_of(model: nn.Module, *paths: str) -> List[str]:
    """The qualified names of the members of the lists at ``paths`` (``*`` for every member of a list on the way)."""
    names = [""]
    for path in paths:
        for part in path.split("."):
            if part == "*":
                names = [f"{n}.{c}" for n in names for c, _ in model.get_submodule(n).named_children()]
            else:
                names = [f"{n}.{part}" if n else part for n in names]
    return names


DECLARED: Dict[str, Tuple[str, Tuple[str, ...]]] = {
    # Wav2Vec2's convolutional feature encoder layers beside its encoder layers.
    "hf-wav2vec2": ("transformers", ("feature_extractor.conv_layers.*", "encoder.layers.*")),
    # SegFormer's blocks, not the stages its _no_split_modules names.
    "hf-segformer": ("transformers", ("segformer.stages.*.blocks.*",)),
    # Swin's stages are checkpoint layers holding checkpoint layers: the blocks.
    "hf-swin": ("transformers", ("encoder.layers.*.blocks.*",)),
    "hf-dinov2-registers": ("transformers", ("encoder.layer.*",)),
    # MobileViT's MobileNetV2 blocks beside its MobileViT blocks: every block of every stage.
    "timm-mobilevit": ("timm", ("stages.*.*",)),
    "timm-convnext": ("timm", ("stages.*.blocks.*",)),
}


@pytest.mark.parametrize("name", list(DECLARED))
def test_blocks_are_the_units_the_model_checkpoints_itself(name: str) -> None:
    model = SWITCH_CASES[name][0]()[0]
    source, paths = DECLARED[name]
    expected = [n for path in paths for n in _blocks_of(model, path)]
    choice = explain_blocks(model)
    assert choice.names == expected and choice.source == source, choice
    if name == "timm-mobilevit":
        classes = {type(model.get_submodule(n)).__name__ for n in expected}
        assert classes == {"BottleneckBlock", "MobileVitBlock"}, classes


def _seeded(fn: Callable[[], Any]) -> Any:
    """``fn()`` from a fixed RNG state: torch's (dropout, drop path, Wav2Vec2's layerdrop) and numpy's (Wav2Vec2's
    SpecAugment masks), so that every model compared drops the same layers and masks the same steps."""
    np = pytest.importorskip("numpy")
    np.random.seed(0)
    torch.manual_seed(1234)
    return fn()


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SWITCH_CASES))
def test_wrap_peak_is_at_or_below_the_models_own_checkpointing_and_exact(name: str) -> None:
    build, switch = SWITCH_CASES[name]
    model, args, kwargs, loss = build()
    wrapped = memsave.wrap(copy.deepcopy(model))
    own = copy.deepcopy(model)
    switch(own)
    peaks = {  # copies: a step updates BatchNorm statistics
        label: _seeded(lambda m=m: step_peak(copy.deepcopy(m), args, kwargs, loss))  # type: ignore[misc]
        for label, m in (("eager", model), ("own", own), ("wrap", wrapped))
    }
    assert peaks["wrap"] <= peaks["own"] < peaks["eager"], peaks
    grads = _seeded(lambda: train_step(model, args, kwargs, loss))
    grads_wrapped = _seeded(lambda: train_step(wrapped, args, kwargs, loss))
    assert_same_step(grads, grads_wrapped, model, wrapped)


def _googlenet(aux_logits: bool) -> nn.Module:
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    return torchvision.models.googlenet(weights=None, aux_logits=aux_logits, init_weights=True, num_classes=10)


@pytest.mark.parametrize("aux_logits", [False, True])
def test_inception_modules_are_blocks(aux_logits: bool) -> None:
    model = _googlenet(aux_logits).train()
    inception = [n for n, m in model.named_children() if type(m).__name__ == "Inception"]
    assert len(inception) == 9
    choice = explain_blocks(model)
    assert choice.names == inception and choice.source == "structure", choice  # not the branches' convolutions
    if aux_logits:  # the auxiliary classifiers hold more parameters, but are not blocks
        assert "InceptionAux are auxiliary heads" in choice.reason, choice.reason
    x = _image(64)
    loss: LossFn = lambda out: sum(_square(o) for o in out if o is not None)  # noqa: E731  (logits, aux2, aux1)
    loss = loss if aux_logits else _square
    wrapped = memsave.wrap(copy.deepcopy(model))
    assert_same_step(train_step(model, (x,), {}, loss), train_step(wrapped, (x,), {}, loss), model, wrapped)
    assert step_peak(wrapped, (x,), {}, loss) < step_peak(model, (x,), {}, loss)


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
    tokens = dict(vocab_size=VOCAB, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    config = tf.T5Config(**_TINY, **tokens, d_ff=_MLP, d_kv=8, num_decoder_layers=3)  # dropout 0.1
    ids = torch.randint(2, VOCAB, (2, 48), generator=generator())
    labels = torch.randint(2, VOCAB, (2, 32), generator=generator(2))
    kwargs = {"input_ids": ids, "labels": labels, "use_cache": False}
    return tf.T5ForConditionalGeneration(config).train(), (), kwargs, lambda out: out.loss


def _clip() -> Tuple[nn.Module, Args, Kwargs, LossFn]:
    tf = _transformers()
    torch.manual_seed(0)
    config = tf.CLIPConfig(
        text_config=dict(vocab_size=VOCAB, max_position_embeddings=64, intermediate_size=_MLP, **_TINY),
        vision_config=dict(image_size=32, patch_size=4, intermediate_size=_MLP, **_TINY),
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
