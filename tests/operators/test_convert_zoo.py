"""memsave.convert(model, fuse=True) on the model zoos: Hugging Face Llama, Mistral, Qwen2, Qwen3,
GPT-2 and BERT, timm's ViT -- real model definitions at tiny configs with random weights (nothing is downloaded),
CPU float32.

For each: the state_dict keys do not change and checkpoints load both ways (strict), the loss is within 1e-5
relative of eager's and every gradient within float32 rounding (1e-5 of the gradient's largest value), the logits
without labels are eager's, and fewer activation bytes are kept (memsave.measure's live-tensor tracker). A causal
LM called with labels computes Hugging Face's loss (shift, ignore_index, num_items_in_batch, shift_labels) with
linear_cross_entropy and returns an empty ``[batch, seq, 0]`` tensor as ``.logits``. Unsupported parts are
skipped with a reason in the report, never converted wrongly.
"""

from __future__ import annotations

import copy
from typing import Callable, Dict, Tuple

import pytest
import torch
from torch import nn

import memsave
from helpers import hub
from memsave.operators.convert import CausalLMHead, plan_convert

transformers = pytest.importorskip("transformers")

VOCAB, SEQ = 96, 16
LOSS_RTOL, GRAD_RTOL = 1e-5, 1e-5


def _ids(seed: int = 1, batch: int = 2) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, SEQ), generator=torch.Generator().manual_seed(seed))


def _llama_family(name: str) -> Callable[[], nn.Module]:
    return lambda: hub.causal_lm(name, 2, 32, 72, heads=4, kv_heads=2, vocab=VOCAB, positions=64)


def _gpt2() -> nn.Module:
    return hub.gpt2(layers=2, hidden=32, heads=4, vocab=VOCAB, positions=64, dropout=0.0)


CAUSAL_LMS: Dict[str, Tuple[Callable[[], nn.Module], Dict[str, str]]] = {
    # model -> (builder, {module name: new class} the report must show)
    "llama": (
        _llama_family("Llama"),
        {
            "model.layers.0.self_attn.q_proj": "memsave.RMSNormLinear",
            "model.layers.1.mlp": "memsave.GatedMLP",
            "model.layers.0.input_layernorm": "memsave.DeferredRMSNorm",
            "model.norm": "memsave.RMSNorm",
            "lm_head": "memsave.CausalLMHead",
        },
    ),
    "mistral": (
        _llama_family("Mistral"),
        {"model.layers.1.mlp": "memsave.GatedMLP", "lm_head": "memsave.CausalLMHead"},
    ),
    "qwen2": (
        _llama_family("Qwen2"),
        {"model.layers.0.self_attn.v_proj": "memsave.RMSNormLinear", "lm_head": "memsave.CausalLMHead"},
    ),
    "qwen3": (_llama_family("Qwen3"), {"model.layers.0.mlp": "memsave.GatedMLP", "lm_head": "memsave.CausalLMHead"}),
    "gpt2": (
        _gpt2,
        {
            "transformer.h.0.mlp.c_proj": "memsave.ActLinear",
            "transformer.h.1.mlp.act": "Identity",
            "lm_head": "memsave.CausalLMHead",
        },
    ),
}


def _converted(model: nn.Module) -> Tuple[nn.Module, memsave.ConvertReport]:
    report = plan_convert(model, fuse=True)
    before = copy.deepcopy(model.state_dict())
    ours = memsave.convert(copy.deepcopy(model), fuse=True)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # the original is untouched
    return ours, report


def _check_grads(ours: nn.Module, eager: nn.Module) -> None:
    pairs = list(zip(ours.named_parameters(), eager.named_parameters()))
    assert len(pairs) == len(list(eager.parameters()))
    for (name, p), (name_e, q) in pairs:
        assert name == name_e and p.requires_grad == q.requires_grad
        if not q.requires_grad:  # frozen (a LoRA base)
            assert p.grad is None and q.grad is None, name
            continue
        assert p.grad is not None and q.grad is not None, name
        err = (p.grad - q.grad).abs().max().item()
        assert err <= GRAD_RTOL * q.grad.abs().max().item() + 1e-12, (name, err)


def _check_state_dict_both_ways(ours: nn.Module, build: Callable[[], nn.Module]) -> None:
    eager = build()
    assert list(ours.state_dict()) == list(eager.state_dict())
    fresh = memsave.convert(build(), fuse=True)
    fresh.load_state_dict(eager.state_dict(), strict=True)  # an eager checkpoint into a converted model
    assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), eager.state_dict().values()))
    plain = build()
    plain.load_state_dict(ours.state_dict(), strict=True)  # and back
    assert all(torch.equal(a, b) for a, b in zip(plain.state_dict().values(), ours.state_dict().values()))


def _activation_bytes(model: nn.Module, *inputs: torch.Tensor, loss_fn=None) -> int:
    return memsave.measure(model, *inputs, loss_fn=loss_fn, steps=1, warmup=0).activation_bytes


@pytest.mark.parametrize("name", list(CAUSAL_LMS))
def test_causal_lm_matches_eager_without_logits_and_keeps_less(name):
    build, expected = CAUSAL_LMS[name]
    torch.manual_seed(0)
    eager = build()
    ours, report = _converted(eager)
    shown = {e.name: e.new for e in report.entries}
    for module, new in expected.items():
        assert shown.get(module, "").endswith(new.split(".")[-1]), (module, shown.get(module))
    assert isinstance(ours.lm_head, CausalLMHead)
    tied = ours.lm_head.weight is ours.get_input_embeddings().weight
    assert tied == (eager.lm_head.weight is eager.get_input_embeddings().weight)  # a tied head stays tied
    _check_state_dict_both_ways(ours, build)

    ids = _ids()
    labels = ids.clone()
    labels[0, :4] = -100  # ignored tokens
    out, out_eager = ours(ids, labels=labels), eager(ids, labels=labels)
    assert out.logits.shape == (2, SEQ, 0) and out_eager.logits.shape == (2, SEQ, VOCAB)
    assert abs(out.loss.item() - out_eager.loss.item()) <= LOSS_RTOL * abs(out_eager.loss.item())
    assert out.loss.dtype == out_eager.loss.dtype == torch.float32
    out.loss.backward()
    out_eager.loss.backward()
    _check_grads(ours, eager)

    with torch.no_grad():  # without labels: the logits, as before
        logits, logits_eager = ours(ids).logits, eager(ids).logits
    assert logits.shape == logits_eager.shape
    torch.testing.assert_close(logits, logits_eager, rtol=1e-5, atol=1e-5)

    kept = _activation_bytes(hub.LossOf(ours), ids, loss_fn=lambda loss: loss)
    kept_eager = _activation_bytes(hub.LossOf(eager), ids, loss_fn=lambda loss: loss)
    assert kept < 0.8 * kept_eager, (kept, kept_eager)


def _hf_loss_kwargs_cases():
    ids = _ids(3)
    shifted = torch.cat([ids[:, 1:], torch.full((2, 1), -100)], dim=1)
    shifted[1, 5:9] = -100
    return {
        "num_items_in_batch": dict(labels=ids, num_items_in_batch=torch.tensor(40)),
        "num_items_in_batch_int": dict(labels=ids, num_items_in_batch=17),
        "shift_labels": dict(labels=ids, shift_labels=shifted),
    }


@pytest.mark.parametrize("case", ["num_items_in_batch", "num_items_in_batch_int", "shift_labels"])
def test_causal_lm_loss_follows_hugging_face_keywords(case):
    torch.manual_seed(0)
    eager = _llama_family("Llama")()
    ours = memsave.convert(copy.deepcopy(eager), fuse=True)
    kwargs = _hf_loss_kwargs_cases()[case]
    ids = _ids(3)
    loss, loss_eager = ours(ids, **kwargs).loss, eager(ids, **kwargs).loss
    assert abs(loss.item() - loss_eager.item()) <= LOSS_RTOL * abs(loss_eager.item())
    plain = eager(ids, labels=ids).loss  # the keyword changes the loss, so the check above can fail
    assert abs(plain.item() - loss_eager.item()) > 1e-3 * abs(loss_eager.item())


def test_labels_passed_positionally_and_a_deepcopy_keeps_its_own_hooks():
    torch.manual_seed(0)
    eager = _llama_family("Llama")()
    ours = memsave.convert(copy.deepcopy(eager), fuse=True)
    twin = copy.deepcopy(ours)
    ids = _ids()
    # LlamaForCausalLM.forward(input_ids, attention_mask, position_ids, past_key_values, inputs_embeds, labels)
    out = twin(ids, None, None, None, None, ids)
    assert out.logits.shape[-1] == 0
    assert abs(out.loss.item() - eager(ids, labels=ids).loss.item()) <= LOSS_RTOL * out.loss.item()
    assert twin.loss_function.model is twin and twin.lm_head.pending is None and not twin.lm_head.armed
    assert ours.lm_head.pending is None and not ours.lm_head.armed


def test_exclude_lm_head_keeps_the_logits_and_direct_forward_falls_back():
    torch.manual_seed(0)
    eager = _llama_family("Llama")()
    ids = _ids()
    kept_head = memsave.convert(copy.deepcopy(eager), fuse=True, exclude=["lm_head"])
    assert type(kept_head.lm_head) is nn.Linear and isinstance(kept_head.model.layers[0].mlp, memsave.nn.GatedMLP)
    out = kept_head(ids, labels=ids)
    assert out.logits.shape == (2, SEQ, VOCAB)
    ours = memsave.convert(copy.deepcopy(eager), fuse=True)
    direct = ours.forward(ids, labels=ids)  # no hooks: real logits, Hugging Face's loss
    assert direct.logits.shape == (2, SEQ, VOCAB)
    assert abs(direct.loss.item() - eager(ids, labels=ids).loss.item()) <= LOSS_RTOL * direct.loss.item()


def test_convert_twice_and_wrap_after_convert():
    torch.manual_seed(0)
    eager = _llama_family("Llama")()
    ours = memsave.convert(copy.deepcopy(eager), fuse=True)
    again = plan_convert(ours, fuse=True)
    assert all(e.verdict == "skipped" for e in again.entries), again
    memsave.convert(ours, fuse=True)
    memsave.wrap(ours)
    ids = _ids()
    loss, loss_eager = ours(ids, labels=ids).loss, eager(ids, labels=ids).loss
    assert abs(loss.item() - loss_eager.item()) <= LOSS_RTOL * abs(loss_eager.item())
    loss.backward()
    loss_eager.backward()
    _check_grads(ours, eager)


def test_default_convert_leaves_a_transformer_alone():
    torch.manual_seed(0)
    model = _llama_family("Llama")()
    memsave.convert(model)  # fuse=False: only the bitwise mask swaps, and Llama has no ReLU
    assert type(model.lm_head) is nn.Linear and type(model.model.layers[0].mlp).__name__ == "LlamaMLP"


# ---- unsupported configurations: skipped with a reason ----------------------------------------------------------


def test_unsupported_activation_is_skipped_with_a_reason():
    model = hub.llama(1, 32, 72, heads=4, vocab=VOCAB, positions=2048, hidden_act="quick_gelu")
    report = plan_convert(model, fuse=True)
    skipped = {e.name: e.detail for e in report.entries if e.verdict == "skipped"}
    assert "QuickGELUActivation computes none of the fused kernels'" in skipped["model.layers.0.mlp"]
    memsave.convert(model, fuse=True)
    assert type(model.model.layers[0].mlp).__name__ == "LlamaMLP"
    assert isinstance(model.model.layers[0].self_attn.q_proj, memsave.nn.RMSNormLinear)  # the rest still fused
    assert isinstance(model.model.layers[0].post_attention_layernorm, memsave.nn.DeferredRMSNorm)
    assert isinstance(model.model.layers[0].mlp.gate_proj, memsave.nn.RMSNormLinear)  # the norm, into the MLP's Linears

    gpt = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=4, activation_function="quick_gelu")
    )
    report = plan_convert(gpt, fuse=True)
    assert any(e.verdict == "skipped" and "QuickGELU" in e.detail for e in report.entries), report


def test_custom_loss_function_and_softcapping_are_not_fused():
    torch.manual_seed(0)
    model = _llama_family("Llama")()
    model.loss_function = lambda logits, labels, vocab_size, **kw: logits.float().mean()
    memsave.convert(model, fuse=True)
    assert type(model.lm_head) is nn.Linear
    report = plan_convert(_llama_family("Llama")(), fuse=True, include=["model.layers.*"])
    assert "lm_head" not in {e.name for e in report.entries}


def test_lora_adapters_added_before_convert_stay_exact_and_after_convert_are_refused():
    peft = pytest.importorskip("peft")
    torch.manual_seed(0)
    eager = peft.get_peft_model(
        _llama_family("Llama")(),
        peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj", "gate_proj"], init_lora_weights=False),
    )
    ours = copy.deepcopy(eager)
    report = plan_convert(ours, fuse=True)
    shown = {e.name: e.new for e in report.entries}
    layer = "base_model.model.model.layers.0"
    # the adapters read the norm's output too: every Linear that reads it (base layers, lora_A) applies the norm
    assert shown[f"{layer}.input_layernorm"] == "memsave.DeferredRMSNorm"
    assert shown[f"{layer}.self_attn.q_proj.base_layer"] == "memsave.RMSNormLinear"
    assert shown[f"{layer}.self_attn.q_proj.lora_A.default"] == "memsave.RMSNormLinear"
    assert shown[f"{layer}.self_attn.k_proj"] == "memsave.RMSNormLinear"
    memsave.convert(ours, fuse=True)
    assert list(ours.state_dict()) == list(eager.state_dict())
    ids = _ids()
    loss, loss_eager = ours(input_ids=ids, labels=ids).loss, eager(input_ids=ids, labels=ids).loss
    assert abs(loss.item() - loss_eager.item()) <= LOSS_RTOL * abs(loss_eager.item())
    loss.backward()
    loss_eager.backward()
    _check_grads(ours, eager)
    dropped = peft.get_peft_model(
        _llama_family("Llama")(), peft.LoraConfig(r=4, target_modules=["q_proj"], lora_dropout=0.1)
    )
    details = {e.name: e.detail for e in plan_convert(dropped, fuse=True).entries}
    # with a dropout before lora_A, something else than Linears reads the norm's output: not fused
    assert "lora_dropout.default" in details[f"{layer}.input_layernorm"], details[f"{layer}.input_layernorm"]
    converted = memsave.convert(_llama_family("Llama")(), fuse=True)
    with pytest.raises(ValueError, match="RMSNormLinear"):  # PEFT refuses memsave's fused modules
        peft.get_peft_model(converted, peft.LoraConfig(r=4, target_modules=["q_proj"]))


def test_timm_mlp_with_dropout_is_skipped():
    timm = pytest.importorskip("timm")
    mlp = timm.layers.Mlp(16, 32, drop=0.1)
    holder = nn.Sequential(mlp)
    report = plan_convert(holder, fuse=True)
    assert [e.verdict for e in report.entries] == ["skipped"] and "dropout" in report.entries[0].detail
    memsave.convert(holder, fuse=True)
    assert type(holder[0].fc2) is nn.Linear


# ---- encoders -----------------------------------------------------------------------------------------------------


def _bert() -> nn.Module:
    return hub.bert(2, 32, 64, heads=4, vocab=VOCAB, positions=64)


def test_bert_feed_forward_fused():
    torch.manual_seed(0)
    eager = _bert()
    ours, report = _converted(eager)
    assert {e.name: e.new for e in report.entries}["bert.encoder.layer.0.output.dense"] == "memsave.ActLinear"
    _check_state_dict_both_ways(ours, _bert)
    ids = _ids()
    labels = torch.full_like(ids, -100)
    labels[:, ::3] = ids[:, ::3]
    torch.manual_seed(5)  # same dropout masks in both
    loss = ours(ids, labels=labels).loss
    torch.manual_seed(5)
    loss_eager = eager(ids, labels=labels).loss
    assert abs(loss.item() - loss_eager.item()) <= LOSS_RTOL * abs(loss_eager.item())
    loss.backward()
    loss_eager.backward()
    _check_grads(ours, eager)
    ours.eval(), eager.eval()
    kept = _activation_bytes(ours.bert, ids, loss_fn=lambda out: out.last_hidden_state.sum())
    kept_eager = _activation_bytes(eager.bert, ids, loss_fn=lambda out: out.last_hidden_state.sum())
    assert kept < 0.95 * kept_eager, (kept, kept_eager)


def _vit() -> nn.Module:
    timm = pytest.importorskip("timm")
    return timm.create_model(
        "vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, depth=2, num_classes=10
    )


def test_timm_vit_mlp_and_norms_fused():
    torch.manual_seed(0)
    eager = _vit()
    ours, report = _converted(eager)
    shown = {e.name: e.new for e in report.entries}
    assert shown["blocks.0.mlp.fc2"] == "memsave.ActLinear" and shown["blocks.1.attn.qkv"] == "memsave.LayerNormLinear"
    assert shown["blocks.1.mlp.fc1"] == "memsave.LayerNormLinear"
    assert shown["blocks.0.norm2"] == "memsave.DeferredLayerNorm"
    _check_state_dict_both_ways(ours, _vit)
    x = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    y, y_eager = ours(x), eager(x)
    torch.testing.assert_close(y, y_eager, rtol=1e-5, atol=1e-5)
    y.square().sum().backward()
    y_eager.square().sum().backward()
    _check_grads(ours, eager)
    kept = _activation_bytes(ours, x)
    kept_eager = _activation_bytes(eager, x)
    assert kept < 0.9 * kept_eager, (kept, kept_eager)


def test_llama_anchor_peak_is_at_most_half_of_eager():
    """The acceptance model: 2 layers, hidden 256, vocabulary 32,000, 2 x 256 tokens, float32 (allocator-level
    peak of one training step; benchmarks/convert_zoo.py measures 0.33)."""
    from memsave.measurement.allocator import step_peak_bytes

    torch.manual_seed(0)
    eager = hub.llama(layers=2, hidden=256, intermediate=688, heads=4, kv_heads=4, vocab=32000, positions=2048)
    ours = memsave.convert(copy.deepcopy(eager), fuse=True)
    ids = torch.randint(0, 32000, (2, 256), generator=torch.Generator().manual_seed(1))
    peaks, losses = {}, {}
    for name, model in (("eager", eager), ("convert", ours)):

        def step() -> None:
            model.zero_grad(set_to_none=True)
            loss = model(ids, labels=ids).loss
            losses[name] = loss.item()
            loss.backward()

        step()
        model.zero_grad(set_to_none=True)
        peaks[name] = step_peak_bytes(step, torch.device("cpu"))
    assert abs(losses["convert"] - losses["eager"]) <= LOSS_RTOL * abs(losses["eager"])
    assert peaks["convert"] <= 0.5 * peaks["eager"], peaks
