"""The model families transformers' own gradient-checkpointing tests run on (test_hf_checkpointing_suite.py).

Not a test module of this repository (pytest does not collect it here): the harness runs it in a subprocess with the
transformers sdist's ``tests/`` importable as ``hf_tests``. Each class below is transformers' ``ModelTesterMixin``
(its tests, unchanged) with a small model tester of ours: a tiny config with random weights and random token ids,
the part that lives in transformers' per-model test files, which the sdist does not ship.
"""

from __future__ import annotations

import unittest
from dataclasses import dataclass, field
from typing import Any, Dict, Tuple

import torch
import transformers
from hf_tests.test_modeling_common import ModelTesterMixin

BATCH, SEQ, VOCAB = 2, 7, 99

#: The tiny size every family is built at, in the config field names transformers maps to each family's own (a
#: config's ``attribute_map``: GPT-2's ``n_embd``, T5's ``d_model`` ...); :func:`_sizes` renames the unmapped ones.
_SIZE = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=37,
    num_hidden_layers=2,
    num_attention_heads=4,
    max_position_embeddings=64,
)


def _sizes(**names: str) -> Dict[str, Any]:
    """:data:`_SIZE` with fields the family's config does not map: ``intermediate_size="ffn_dim"`` renames one,
    ``=""`` leaves it out."""
    return {names.get(k, k): v for k, v in _SIZE.items() if names.get(k, k)}


_DECODER = {**_SIZE, "num_key_value_heads": 2, "pad_token_id": 0}


@dataclass
class Family:
    """One model family: its config class and settings, and the heads its tests build."""

    name: str
    config_class: str
    config: Dict[str, Any]
    classes: Tuple[str, ...]
    encoder_decoder: bool = False
    extra: Dict[str, Any] = field(default_factory=dict)


def _heads(prefix: str, *heads: str) -> Tuple[str, ...]:
    return tuple(f"{prefix}{h}" for h in heads)


_CAUSAL = ("Model", "ForCausalLM", "ForSequenceClassification", "ForTokenClassification", "ForQuestionAnswering")

FAMILIES = (
    Family("llama", "LlamaConfig", _DECODER, _heads("Llama", *_CAUSAL)),
    Family("mistral", "MistralConfig", _DECODER, _heads("Mistral", *_CAUSAL)),
    Family("qwen2", "Qwen2Config", _DECODER, _heads("Qwen2", *_CAUSAL)),
    Family("gemma", "GemmaConfig", {**_DECODER, "head_dim": 8}, _heads("Gemma", *_CAUSAL[:4])),
    Family("phi3", "Phi3Config", _DECODER, _heads("Phi3", *_CAUSAL[:4])),
    Family(
        "gpt_neox",
        "GPTNeoXConfig",
        {k: v for k, v in _DECODER.items() if k != "num_key_value_heads"},
        _heads("GPTNeoX", *_CAUSAL),
    ),
    Family(
        "gpt2",
        "GPT2Config",
        {**_sizes(intermediate_size=""), "pad_token_id": 0},  # GPT-2's MLP is 4 x hidden
        _heads(
            "GPT2",
            "Model",
            "LMHeadModel",
            "ForSequenceClassification",
            "ForTokenClassification",
            "ForQuestionAnswering",
        ),
    ),
    Family(
        "opt",
        "OPTConfig",
        {**_sizes(intermediate_size="ffn_dim"), "word_embed_proj_dim": 32, "pad_token_id": 1},
        _heads("OPT", "Model", "ForCausalLM", "ForSequenceClassification", "ForQuestionAnswering"),
    ),
    Family(
        "bert",
        "BertConfig",
        {**_SIZE, "type_vocab_size": 2},
        _heads(
            "Bert",
            "Model",
            "ForMaskedLM",
            "ForSequenceClassification",
            "ForTokenClassification",
            "ForQuestionAnswering",
            "ForMultipleChoice",
        ),
        extra={"token_type_ids": True},
    ),
    Family(
        "t5",
        "T5Config",
        {
            **_sizes(intermediate_size="d_ff", max_position_embeddings=""),
            "d_kv": 8,
            "num_decoder_layers": 2,
            "pad_token_id": 0,
            "decoder_start_token_id": 0,
        },
        _heads("T5", "Model", "ForConditionalGeneration"),
        encoder_decoder=True,
    ),
)


class _Tester:
    """What ``ModelTesterMixin``'s gradient-checkpointing tests read from a model tester."""

    is_training = True
    batch_size, seq_length, num_choices = BATCH, SEQ, 2

    def __init__(self, family: Family) -> None:
        self.family = family

    def get_config(self) -> Any:
        return getattr(transformers, self.family.config_class)(**self.family.config)

    def prepare_config_and_inputs_for_common(self) -> Tuple[Any, Dict[str, torch.Tensor]]:
        g = torch.Generator().manual_seed(0)
        inputs = {
            "input_ids": torch.randint(2, VOCAB, (BATCH, SEQ), generator=g),
            "attention_mask": torch.ones(BATCH, SEQ, dtype=torch.long),
        }
        if self.family.extra.get("token_type_ids"):
            inputs["token_type_ids"] = torch.randint(0, 2, (BATCH, SEQ), generator=g)
        if self.family.encoder_decoder:
            inputs["decoder_input_ids"] = torch.randint(2, VOCAB, (BATCH, SEQ), generator=g)
            inputs["decoder_attention_mask"] = torch.ones(BATCH, SEQ, dtype=torch.long)
        return self.get_config(), inputs


def _test_class(family: Family) -> type:
    class FamilyTest(ModelTesterMixin, unittest.TestCase):
        all_model_classes = tuple(getattr(transformers, n) for n in family.classes if hasattr(transformers, n))
        is_encoder_decoder = family.encoder_decoder

        def setUp(self) -> None:
            self.model_tester = _Tester(family)

    name = "".join(part.title() for part in family.name.split("_")) + "GradientCheckpointingTest"
    FamilyTest.__name__ = FamilyTest.__qualname__ = name
    return FamilyTest


globals().update({cls.__name__: cls for cls in map(_test_class, FAMILIES)})
