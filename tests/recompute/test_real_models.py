"""memsave on the models people train: Hugging Face transformers, timm and torchvision definitions at small configs
with random weights (nothing is downloaded; ``HF_HUB_OFFLINE=1`` is set in conftest.py), CPU float32.

For each architecture: :func:`memsave.find_blocks` names the per-layer blocks, and ``memsave.wrap(model)`` (no
policy) gives bitwise eager's output, parameter gradients and buffers (BatchNorm statistics) from the same seed,
with dropout / stochastic depth on. Hugging Face models are called with keyword inputs (``input_ids``,
``attention_mask``, ``labels``) and give a ``ModelOutput``. Plus PEFT LoRA on a frozen base: the adapters' gradients
equal eager's.
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Dict, List, Tuple

import pytest
import torch
from torch import nn

import memsave
from helpers import hub, in_backward
from helpers.steps import assert_same_step
from memsave.recompute import is_wrapped

Inputs = Dict[str, Any]
Case = Tuple[Callable[[], nn.Module], Callable[[], Inputs], List[str]]


def _g(seed: int = 1) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ------------------------------------------------------------------------------------------------ Hugging Face
VOCAB, SEQ = 96, 16


def _lm_inputs() -> Inputs:
    ids = torch.randint(0, VOCAB, (2, SEQ), generator=_g())
    mask = torch.ones(2, SEQ, dtype=torch.long)
    mask[1, :3] = 0  # left padding in the second sequence
    labels = ids.clone()
    labels[mask == 0] = -100
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def _mlm_inputs() -> Inputs:
    inputs = _lm_inputs()
    keep = torch.rand(2, SEQ, generator=_g(2)) < 0.3  # the masked-LM loss on ~30% of the tokens
    inputs["labels"] = torch.where(keep, inputs["labels"], torch.full_like(inputs["labels"], -100))
    return inputs


def _lazy(library: str, build: Callable[..., nn.Module], *args: Any, **kwargs: Any) -> Callable[[], nn.Module]:
    """``build(*args, **kwargs)`` when called, the test skipped where ``library`` is not installed."""

    def make() -> nn.Module:
        pytest.importorskip(library)
        return build(*args, **kwargs)

    return make


def _gpt2() -> nn.Module:
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=64, vocab_size=VOCAB)  # dropout 0.1
    return transformers.GPT2LMHeadModel(config)


def _decoder(family: str, **extra: Any) -> Callable[[], nn.Module]:
    extra = {"attention_dropout": 0.1, "use_cache": True, **extra}  # the configs' default cache, attention dropout on
    return _lazy("transformers", hub.causal_lm, family, 2, 64, 128, kv_heads=2, vocab=VOCAB, **extra)


HF_CASES: Dict[str, Case] = {
    "gpt2": (_gpt2, _lm_inputs, ["transformer.h.0", "transformer.h.1"]),
    "llama": (_decoder("Llama"), _lm_inputs, ["model.layers.0", "model.layers.1"]),
    "mistral": (_decoder("Mistral", sliding_window=8), _lm_inputs, ["model.layers.0", "model.layers.1"]),
    "qwen2": (_decoder("Qwen2"), _lm_inputs, ["model.layers.0", "model.layers.1"]),
    "bert": (
        _lazy("transformers", hub.bert, 2, 64, 128, vocab=VOCAB, positions=64),  # dropout 0.1
        _mlm_inputs,
        ["bert.encoder.layer.0", "bert.encoder.layer.1"],
    ),
}


# ------------------------------------------------------------------------------------------------------ timm
def _image() -> Inputs:
    return {"x": torch.randn(2, 3, 32, 32, generator=_g())}


def _timm(name: str, **kwargs: Any) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        timm = pytest.importorskip("timm")
        return timm.create_model(name, pretrained=False, num_classes=10, **kwargs)

    return build


TIMM_CASES: Dict[str, Case] = {
    "timm-vit": (
        _lazy("timm", hub.timm_vit, size=32, patch=8, dim=32, depth=3, heads=2, dropout=0.1),
        _image,
        ["blocks.0", "blocks.1", "blocks.2"],
    ),
    "timm-convnext": (
        _timm("convnext_atto", depths=(2, 1, 1, 1), dims=(16, 32, 48, 64), drop_path_rate=0.1),
        _image,
        ["stages.0.blocks.0", "stages.0.blocks.1", "stages.1.blocks.0", "stages.2.blocks.0", "stages.3.blocks.0"],
    ),
    "timm-swin": (
        _timm(
            "swin_tiny_patch4_window7_224",
            img_size=32,
            patch_size=4,
            window_size=4,
            embed_dim=16,
            depths=(2, 1),
            num_heads=(2, 4),
            drop_path_rate=0.1,
        ),
        _image,
        ["layers.0.blocks.0", "layers.0.blocks.1", "layers.1.blocks.0"],
    ),
    "timm-efficientnet": (
        _timm("efficientnet_b0", drop_path_rate=0.1),
        _image,
        # Every block of every stage: the first (DepthwiseSeparableConv) and the rest (InvertedResidual) alike.
        [f"blocks.{s}.{i}" for s, n in enumerate((1, 2, 2, 3, 3, 4, 1)) for i in range(n)],
    ),
    "timm-resnet": (
        _timm("resnet18", drop_path_rate=0.1),
        _image,
        [f"layer{s}.{i}" for s in range(1, 5) for i in range(2)],
    ),
}


# ----------------------------------------------------------------------------------------------- torchvision
def _tv(build: Callable[[Any], nn.Module]) -> Callable[[], nn.Module]:
    def make() -> nn.Module:
        return build(pytest.importorskip("torchvision").models)

    return make


TV_CASES: Dict[str, Case] = {
    "tv-resnet18": (
        _tv(lambda m: m.resnet18(weights=None, num_classes=10)),
        _image,
        [f"layer{s}.{i}" for s in range(1, 5) for i in range(2)],
    ),
    "tv-resnet50": (
        _tv(lambda m: m.resnet50(weights=None, num_classes=10)),
        _image,
        [f"layer{s}.{i}" for s, n in enumerate((3, 4, 6, 3), 1) for i in range(n)],
    ),
    "tv-vit": (
        _lazy("torchvision", hub.torchvision_vit, size=32, patch=8, layers=2, heads=2, hidden=32, mlp=64, dropout=0.1),
        _image,
        ["encoder.layers.encoder_layer_0", "encoder.layers.encoder_layer_1"],
    ),
    "tv-densenet": (
        _tv(
            lambda m: m.DenseNet(
                growth_rate=8, block_config=(2, 3, 2, 2), num_init_features=16, bn_size=2, drop_rate=0.1, num_classes=10
            )
        ),
        _image,
        [f"features.denseblock{b}.denselayer{i}" for b, n in enumerate((2, 3, 2, 2), 1) for i in range(1, n + 1)],
    ),
    "tv-mobilenet-v3": (
        _tv(lambda m: m.mobilenet_v3_small(weights=None, num_classes=10)),
        _image,
        [f"features.{i}" for i in range(1, 12)],
    ),
    "tv-efficientnet": (
        _tv(lambda m: m.efficientnet_b0(weights=None, num_classes=10, stochastic_depth_prob=0.1)),
        _image,
        [f"features.{s}.{i}" for s, n in enumerate((1, 1, 2, 2, 3, 3, 4, 1)) for i in range(n) if s > 0],
    ),
}

CASES: Dict[str, Case] = {**HF_CASES, **TIMM_CASES, **TV_CASES}


# --------------------------------------------------------------------------------------------------- the step
def _loss(out: Any) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out.float().pow(2).mean()
    return out.loss  # a Hugging Face ModelOutput


def _step(model: nn.Module, inputs: Inputs) -> Tuple[torch.Tensor, Dict[str, torch.Tensor]]:
    """One training step from a fixed RNG state: (the detached output, the parameter gradients)."""
    torch.manual_seed(1234)
    args = [inputs["x"]] if "x" in inputs else []
    kwargs = {k: v for k, v in inputs.items() if k != "x"}
    out = model(*args, **kwargs)
    _loss(out).backward()
    result = out if isinstance(out, torch.Tensor) else out.logits
    return result.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


def _count_runs(model: nn.Module, blocks: List[str]) -> Dict[str, List[int]]:
    """[forward runs, backward runs (recomputes)] of each block, counted on its first submodule with parameters
    (a hook on the block itself would see only the call, not the recompute)."""
    runs: Dict[str, List[int]] = {name: [0, 0] for name in blocks}

    def counter(name: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: Any) -> None:
            runs[name][int(in_backward())] += 1

        return hook

    for name in blocks:
        first = next(
            m
            for sub, m in model.get_submodule(name).named_modules()
            if sub and next(m.parameters(False), None) is not None
        )
        first.register_forward_pre_hook(counter(name))
    return runs


def _assert_same_step(model: nn.Module, inputs: Inputs) -> nn.Module:
    """Eager and ``memsave.wrap`` (a deep copy) give bitwise the same output, gradients and buffers, and every
    block found is recomputed once in backward."""
    ours = memsave.wrap(copy.deepcopy(model))
    blocks = [n for n, m in ours.named_modules() if is_wrapped(m)]
    runs = _count_runs(ours, blocks)
    out, grads = _step(model, inputs)
    out_w, grads_w = _step(ours, inputs)
    assert runs == {name: [1, 1] for name in blocks}
    assert torch.equal(out, out_w)
    assert_same_step(grads, grads_w, model, ours)
    return ours


def test_nothing_is_downloaded() -> None:
    constants = pytest.importorskip("huggingface_hub.constants")
    assert constants.HF_HUB_OFFLINE  # conftest.py: a from_pretrained / pretrained=True here fails loudly
    hub = pytest.importorskip("huggingface_hub")
    errors = pytest.importorskip("huggingface_hub.errors")
    with pytest.raises(errors.LocalEntryNotFoundError):  # the local cache only, never the network
        hub.hf_hub_download("memsave-tests/not-a-repo", "model.safetensors")


@pytest.mark.parametrize("name", list(CASES))
def test_find_blocks_and_wrap_are_exact(name: str) -> None:
    build, inputs, expected = CASES[name]
    torch.manual_seed(0)
    model = build().train()
    assert memsave.find_blocks(model) == expected
    ours = _assert_same_step(model, inputs())
    assert [n for n, m in ours.named_modules() if is_wrapped(m)] == expected


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_decoder_cache_off_in_regions_on_without_grad(name: str) -> None:
    """A training step with the config's ``use_cache=True`` runs the regions without the KV cache (a recompute
    would write it twice; Hugging Face's gradient checkpointing does the same); without grad the wrapped model
    fills the cache as usual, for generation."""
    build, inputs, _ = HF_CASES[name]
    torch.manual_seed(0)
    model = memsave.wrap(build().train())
    assert model.config.use_cache
    kwargs = inputs()
    out = model(**kwargs)
    out.loss.backward()
    assert out.past_key_values is None or out.past_key_values.get_seq_length() == 0
    with torch.no_grad():
        out = model.eval()(input_ids=kwargs["input_ids"], use_cache=True)
    assert out.past_key_values.get_seq_length() == SEQ


@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")  # peft calls it
def test_peft_lora_adapters_get_eager_gradients() -> None:
    peft = pytest.importorskip("peft")
    torch.manual_seed(0)
    base = _gpt2()
    # init_lora_weights=False: both adapter matrices random (the default B = 0 gives A a zero gradient).
    config = peft.LoraConfig(
        r=4,
        lora_alpha=8,
        lora_dropout=0.1,
        target_modules=["c_attn", "c_fc"],
        fan_in_fan_out=True,
        init_lora_weights=False,
    )  # GPT-2's Conv1D: weights transposed
    model = peft.get_peft_model(base, config).train()
    assert memsave.find_blocks(model) == ["base_model.model.transformer.h.0", "base_model.model.transformer.h.1"]
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    inputs = _lm_inputs()
    ours = _assert_same_step(model, inputs)
    grads = {n for n, p in ours.named_parameters() if p.grad is not None}
    assert grads == trainable  # the frozen base gets no gradient; every adapter does
