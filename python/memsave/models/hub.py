"""Real model definitions from Hugging Face transformers at small configs with random weights: the language models the
tests, the benchmarks and the examples train (nothing is downloaded; transformers is imported when a builder is
called, and a missing install raises an ImportError that says how to get it).

Each builder spells out the few numbers that size the model and leaves the rest of the architecture to transformers'
defaults; ``dropout=0.0`` turns every dropout off (deterministic comparisons), ``dropout=None`` keeps the config's own
rates, and any other config field passes through ``**config``.
"""

from __future__ import annotations

from typing import Any, Optional

from torch import nn


def _transformers() -> Any:
    try:
        import transformers
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "memsave.models.hub builds Hugging Face models: pip install transformers (the tests use 5.24.0)"
        ) from exc
    return transformers


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

    Example:
        >>> model = memsave.models.hub.gpt2(layers=2, hidden=32, vocab=101)
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


def llama(
    layers: int = 2,
    hidden: int = 64,
    intermediate: int = 128,
    heads: int = 4,
    kv_heads: Optional[int] = None,
    vocab: int = 128,
    positions: int = 64,
    **config: Any,
) -> nn.Module:
    """A ``LlamaForCausalLM`` with random weights and no KV cache.

    Args:
        layers: decoder layers.
        hidden: model width.
        intermediate: the gated MLP's width.
        heads: attention heads.
        kv_heads: key/value heads (grouped-query attention); ``None``: as many as ``heads``.
        vocab: vocabulary size.
        positions: ``max_position_embeddings``.
        **config: further ``LlamaConfig`` fields (``hidden_act=...``, ``attention_dropout=...`` ...).

    Returns:
        The model, in training mode.

    Raises:
        ImportError: transformers is not installed.

    Example:
        >>> model = memsave.models.hub.llama(layers=2, hidden=64, vocab=256)
        >>> memsave.convert(model, fuse=True)
    """
    tf = _transformers()
    cfg = tf.LlamaConfig(
        num_hidden_layers=layers,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads if kv_heads is not None else heads,
        vocab_size=vocab,
        max_position_embeddings=positions,
        **{"use_cache": False, **config},
    )
    return _with_causal_lm_loss(tf.LlamaForCausalLM(cfg))
