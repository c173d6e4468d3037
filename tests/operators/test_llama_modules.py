"""memsave.nn.fuse_rms_norm_linear, RMSNorm and GatedMLP swapped by hand into a Hugging Face LlamaForCausalLM (the
README's recipe; memsave.convert does it for you): same state_dict keys, same loss, gradients within float32
rounding, fewer activation bytes. Built from a config with random weights; nothing is downloaded."""

from __future__ import annotations

import copy

import pytest
import torch

import memsave
from helpers import hub
from memsave.nn import GatedMLP, RMSNorm, fuse_rms_norm_linear

transformers = pytest.importorskip("transformers")


def _swap(model) -> None:
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        layer.input_layernorm, (attn.q_proj, attn.k_proj, attn.v_proj) = fuse_rms_norm_linear(
            layer.input_layernorm, attn.q_proj, attn.k_proj, attn.v_proj
        )
        layer.post_attention_layernorm, (gate, up) = fuse_rms_norm_linear(
            layer.post_attention_layernorm, mlp.gate_proj, mlp.up_proj
        )
        layer.mlp = GatedMLP.from_modules(gate, up, mlp.down_proj, act="silu")
    model.model.norm = RMSNorm.from_module(model.model.norm)


def test_llama_with_memsave_modules_matches_eager_and_keeps_less():
    torch.manual_seed(0)
    eager = hub.llama(2, 64, 176, heads=4, kv_heads=2, vocab=128, positions=64, use_cache=True)
    ours = copy.deepcopy(eager)
    _swap(ours)
    assert list(ours.state_dict()) == list(eager.state_dict())
    ids = torch.randint(0, 128, (2, 32), generator=torch.Generator().manual_seed(1))
    loss, loss_eager = ours(ids, labels=ids).loss, eager(ids, labels=ids).loss
    assert abs(loss.item() - loss_eager.item()) <= 1e-6 * abs(loss_eager.item())
    loss.backward()
    loss_eager.backward()
    for (name, p), q in zip(ours.named_parameters(), eager.parameters()):
        assert (p.grad - q.grad).abs().max() <= 1e-5 * q.grad.abs().max(), name
    logits_sum = lambda out: out.logits.float().sum()  # noqa: E731
    kept = memsave.measure(ours, ids, loss_fn=logits_sum).activation_bytes
    kept_eager = memsave.measure(eager, ids, loss_fn=logits_sum).activation_bytes
    assert kept <= 0.6 * kept_eager, (kept, kept_eager)
