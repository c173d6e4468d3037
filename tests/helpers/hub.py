"""Real model definitions from Hugging Face transformers, timm and torchvision at small configs with random weights: the
models the tests and the benchmarks train (nothing is downloaded; the library is imported when a builder is called, and
a missing install raises an ImportError that says how to get it). Test scaffolding, not part of the memsave package:
tests import it as ``from helpers import hub`` (tests/conftest.py puts tests/ on sys.path), the benchmarks as
``from tests.helpers import hub``.

Each builder spells out the few numbers that size the model and leaves the rest of the architecture to transformers'
defaults; ``dropout=0.0`` turns every dropout off (deterministic comparisons), ``dropout=None`` keeps the config's own
rates, and any other config field passes through ``**config``.
"""

from __future__ import annotations

import importlib
from typing import Any, Optional

import torch
from torch import nn


def _library(name: str, tested: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            f"tests/helpers/hub.py builds {name} models: pip install {name} (the tests use {tested})"
        ) from exc


def _transformers() -> Any:
    return _library("transformers", "5.24.0")


def _with_causal_lm_loss(model: nn.Module) -> nn.Module:
    # Unset, transformers logs a warning on every loss (and dynamo cannot graph the log call).
    setattr(model, "loss_type", "ForCausalLM")  # noqa: B010  (a transformers attribute nn.Module does not declare)
    return model.train()


def gpt2(
    layers: int = 2,
    hidden: int = 64,
    heads: int = 4,
    vocab: int = 128,
    positions: int = 64,
    dropout: Optional[float] = 0.0,
    **config: Any,
) -> nn.Module:
    """A ``GPT2LMHeadModel`` with random weights and no KV cache.

    Args:
        layers: transformer blocks (``n_layer``).
        hidden: model width (``n_embd``).
        heads: attention heads.
        vocab: vocabulary size.
        positions: the longest sequence (``n_positions``).
        dropout: residual, embedding and attention dropout; ``None`` keeps GPT-2's defaults (0.1).
        **config: further ``GPT2Config`` fields (``activation_function=...``, ``use_cache=True`` ...).

    Returns:
        The model, in training mode.

    Raises:
        ImportError: transformers is not installed.

    Examples:
        >>> model = hub.gpt2(layers=2, hidden=32, vocab=101)
        >>> model(torch.randint(0, 101, (2, 16)), labels=...).loss
    """
    tf = _transformers()
    rates = {} if dropout is None else {"resid_pdrop": dropout, "embd_pdrop": dropout, "attn_pdrop": dropout}
    cfg = tf.GPT2Config(
        vocab_size=vocab,
        n_embd=hidden,
        n_layer=layers,
        n_head=heads,
        n_positions=positions,
        **{"use_cache": False, "bos_token_id": 0, "eos_token_id": 0, **rates, **config},
    )
    return _with_causal_lm_loss(tf.GPT2LMHeadModel(cfg))


def llama(*args: Any, **config: Any) -> nn.Module:
    """A ``LlamaForCausalLM`` with random weights and no KV cache: :func:`causal_lm` for the family ``"Llama"``, with
    its arguments after ``family`` (``layers, hidden, intermediate, heads, kv_heads, vocab, positions``, then
    ``LlamaConfig`` fields such as ``hidden_act=...``, ``attention_dropout=...``).

    Returns:
        The model, in training mode.

    Raises:
        ImportError: transformers is not installed.

    Examples:
        >>> model = hub.llama(layers=2, hidden=64, vocab=256)
        >>> memsave.convert(model, fuse=True)
    """
    return causal_lm("Llama", *args, **config)


def causal_lm(
    family: str = "Llama",
    layers: int = 2,
    hidden: int = 64,
    intermediate: int = 128,
    heads: int = 4,
    kv_heads: Optional[int] = None,
    vocab: int = 128,
    positions: int = 64,
    **config: Any,
) -> nn.Module:
    """A ``<family>ForCausalLM`` of the Llama-shaped decoders (Llama, Mistral, Qwen2, Mixtral ...) with random weights
    and no KV cache.

    Args:
        family: the transformers name prefix: ``<family>Config`` and ``<family>ForCausalLM``.
        layers: decoder layers.
        hidden: model width.
        intermediate: the gated MLP's (each expert's) width.
        heads: attention heads.
        kv_heads: key/value heads (grouped-query attention); ``None``: as many as ``heads``.
        vocab: vocabulary size.
        positions: ``max_position_embeddings``.
        **config: further config fields (``sliding_window=...``, ``num_local_experts=...``, ``use_cache=True`` ...).

    Returns:
        The model, in training mode.

    Raises:
        ImportError: transformers is not installed.
        AttributeError: transformers has no such family.

    Examples:
        >>> model = hub.causal_lm("Mistral", layers=2, hidden=64, kv_heads=2, sliding_window=8)
    """
    tf = _transformers()
    cfg = getattr(tf, f"{family}Config")(
        num_hidden_layers=layers,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads if kv_heads is not None else heads,
        vocab_size=vocab,
        max_position_embeddings=positions,
        **{"use_cache": False, **config},
    )
    return _with_causal_lm_loss(getattr(tf, f"{family}ForCausalLM")(cfg))


class LossOf(nn.Module):
    """A causal LM's ``lm(ids, labels=ids).loss`` as a module: what ``memsave.measure`` and ``memsave.wrap`` step.

    Args:
        lm: a transformers ``...ForCausalLM`` (any model whose call with ``labels=`` returns an output with ``.loss``).

    Returns:
        The module; ``forward(ids)`` returns the scalar loss.

    Raises:
        AttributeError: in ``forward``, when ``lm``'s output has no ``loss``.

    Examples:
        >>> memsave.measure(hub.LossOf(hub.llama()), torch.randint(0, 128, (2, 16)), loss_fn=lambda loss: loss)
    """

    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.lm(ids, labels=ids).loss


#: Per family (transformers ``model_type``), the config fields a tiny model needs besides the sizes
#: :func:`decoder` sets: other names for the MLP width, mixture-of-experts and latent-attention sizes (expert
#: widths a multiple of 8: transformers' grouped expert kernel needs 16-byte strides).
DECODER_FIELDS = {
    "opt": lambda hidden, width: {"ffn_dim": width, "word_embed_proj_dim": hidden},
    "falcon": lambda hidden, width: {"ffn_hidden_size": width, "num_kv_heads": 2, "new_decoder_architecture": True},
    "qwen3_moe": lambda hidden, width: {
        "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 8 * max(1, width // 32),
        "mlp_only_layers": [0],
    },
    "mixtral": lambda hidden, width: {"num_local_experts": 4, "num_experts_per_tok": 2},
    "deepseek_v3": lambda hidden, width: {
        "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 8 * max(1, width // 32),
        "first_k_dense_replace": 1, "q_lora_rank": hidden // 2, "kv_lora_rank": hidden // 4, "qk_rope_head_dim": 8,
        "qk_nope_head_dim": 8, "v_head_dim": 16, "n_group": 2, "topk_group": 1, "n_shared_experts": 1,
    },
    "gemma3_text": lambda hidden, width: {"head_dim": 16, "sliding_window": 16},
}  # fmt: skip

# Every dropout rate field of the decoder configs (a config ignores the ones it does not have).
_DROPOUTS = (
    "dropout", "attention_dropout", "hidden_dropout", "activation_dropout", "resid_pdrop", "embd_pdrop",
    "attn_pdrop", "residual_dropout", "embedding_dropout", "layerdrop",
)  # fmt: skip


def decoder(
    model_type: str,
    layers: int = 2,
    hidden: int = 64,
    intermediate: int = 128,
    heads: int = 4,
    kv_heads: Optional[int] = 2,
    vocab: int = 128,
    positions: int = 128,
    dropout: Optional[float] = 0.0,
    **config: Any,
) -> nn.Module:
    """Any transformers decoder-only language model (``AutoModelForCausalLM``) by its ``model_type``, tiny, with
    random weights and no KV cache: the sizes below, the family's own fields from :data:`DECODER_FIELDS`, and
    transformers' defaults for the rest (``qwen3_moe``, ``gemma3_text``, ``olmo2``, ``deepseek_v3``, ``phi3``,
    ``gpt_neox``, ``opt``, ``falcon``, ``granite``, ``stablelm``, ``cohere``, ...).

    Args:
        model_type: the transformers model type (``AutoConfig.for_model``).
        layers: decoder layers.
        hidden: model width.
        intermediate: the MLP width.
        heads: attention heads.
        kv_heads: key/value heads, where the family has them.
        vocab: vocabulary size (the special token ids are set to 0, inside it).
        positions: ``max_position_embeddings``.
        dropout: every dropout rate of the config (``None`` keeps the family's own).
        **config: further config fields, over the above.

    Returns:
        The model, in training mode.

    Raises:
        ImportError: transformers is not installed.
        ValueError: transformers knows no such model type.

    Examples:
        >>> model = hub.decoder("qwen3", vocab=32000)
        >>> model(ids, labels=ids).loss
    """
    tf = _transformers()
    fields: dict = dict(
        num_hidden_layers=layers, hidden_size=hidden, intermediate_size=intermediate, num_attention_heads=heads,
        vocab_size=vocab, max_position_embeddings=positions, use_cache=False, pad_token_id=0, bos_token_id=0,
        eos_token_id=0,
    )  # fmt: skip
    if kv_heads is not None:
        fields["num_key_value_heads"] = kv_heads
    fields.update(DECODER_FIELDS.get(model_type, lambda h, w: {})(hidden, intermediate))
    if dropout is not None:
        fields.update({name: dropout for name in _DROPOUTS})
    fields.update(config)
    cfg = tf.AutoConfig.for_model(model_type, **fields)
    return _with_causal_lm_loss(tf.AutoModelForCausalLM.from_config(cfg))


def bert(
    layers: int, hidden: int, intermediate: int, heads: int = 4, vocab: int = 128, positions: int = 512, **config: Any
) -> nn.Module:
    """A ``BertForMaskedLM`` with random weights, sized as :func:`causal_lm` is (``layers``: encoder layers,
    ``intermediate``: the feed-forward width, ``positions``: BERT's 512 unless given), further ``BertConfig`` fields as
    ``**config`` (``hidden_dropout_prob=0.0`` ...; BERT's dropout rates are 0.1).

    Returns:
        The model, in training mode.

    Raises:
        ImportError: transformers is not installed.

    Examples:
        >>> model = hub.bert(layers=2, hidden=32, intermediate=64, vocab=96)
    """
    tf = _transformers()
    sizes = dict(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads, vocab_size=vocab)
    cfg = tf.BertConfig(intermediate_size=intermediate, max_position_embeddings=positions, **sizes, **config)
    return tf.BertForMaskedLM(cfg).train()


def timm_vit(
    size: int, patch: int, dim: int, depth: int, heads: int, classes: int = 10, dropout: Optional[float] = None
) -> nn.Module:
    """timm's ``vit_tiny_patch16_224`` architecture at another size, with random weights.

    Args:
        size: the image side (``img_size``).
        patch: the patch side.
        dim: the embedding width.
        depth: transformer blocks.
        heads: attention heads.
        classes: classifier outputs.
        dropout: head, projection, attention and drop-path rate alike; ``None`` keeps timm's (0).

    Returns:
        The model, in training mode.

    Raises:
        ImportError: timm is not installed.

    Examples:
        >>> model = hub.timm_vit(size=32, patch=8, dim=32, depth=2, heads=2)
    """
    timm = _library("timm", "1.0.31")
    rates = {} if dropout is None else {f"{k}_rate": dropout for k in ("drop", "proj_drop", "attn_drop", "drop_path")}
    sizes = dict(img_size=size, patch_size=patch, embed_dim=dim, depth=depth, num_heads=heads)
    return timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=classes, **sizes, **rates).train()


def torchvision_vit(
    size: int, patch: int, layers: int, heads: int, hidden: int, mlp: int, classes: int = 10, dropout: float = 0.0
) -> nn.Module:
    """A torchvision ``VisionTransformer`` with random weights.

    Args:
        size: the image side.
        patch: the patch side.
        layers: encoder layers.
        heads: attention heads.
        hidden: the embedding width.
        mlp: the MLP width.
        classes: classifier outputs.
        dropout: dropout and attention dropout alike.

    Returns:
        The model, in training mode.

    Raises:
        ImportError: torchvision is not installed.

    Examples:
        >>> model = hub.torchvision_vit(size=32, patch=8, layers=2, heads=2, hidden=32, mlp=64)
    """
    models = _library("torchvision", "0.26.0").models
    sizes = dict(image_size=size, patch_size=patch, num_layers=layers, num_heads=heads, hidden_dim=hidden, mlp_dim=mlp)
    model = models.VisionTransformer(**sizes, dropout=dropout, attention_dropout=dropout, num_classes=classes)
    return model.train()
