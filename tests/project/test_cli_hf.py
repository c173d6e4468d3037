"""``--model hf:<type>`` and ``hf:<directory>``: transformers models built locally at a --size, random weights,
nothing downloaded (memsave/cli/hf_model.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from memsave.cli import main
from memsave.cli.hf_model import build_hf_model, default_hf_inputs, hf_config
from memsave.cli.usage import UsageError


def _run(capsys: pytest.CaptureFixture, *argv: str) -> str:
    assert main(list(argv)) == 0
    return capsys.readouterr().out


def test_estimate_of_a_model_type_at_tiny_size(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "llama.json"
    text = _run(capsys, "estimate", "--model", "hf:llama", "--size", "tiny", "--no-progress", "--json", str(out))
    assert "hf:llama: LlamaForCausalLM (hidden 64, 2 layers), tiny, input tokens:2,32:1024" in text
    data = json.loads(out.read_text())
    assert data["config"]["model_type"] == "llama" and data["config"]["hidden_size"] == 64
    eager, blocks = data["rows"]
    assert blocks["activation_bytes"] < eager["activation_bytes"]


@pytest.mark.parametrize("model_type", ["llama", "qwen2", "gpt2", "mistral", "gemma", "opt", "bert"])
def test_model_types_scale_to_tiny_and_read_token_ids(model_type: str) -> None:
    model = build_hf_model(f"hf:{model_type}", "tiny")
    config = model.config
    assert config.vocab_size == 1024 and config.use_cache is False and model.training
    (spec,) = default_hf_inputs(model, "tiny")
    assert spec.vocab == 1024 and spec.shape[0] == 2
    assert sum(p.numel() for p in model.parameters()) < 2_000_000  # scaled down from the 7B-class defaults


def test_a_vision_model_reads_images() -> None:
    model = build_hf_model("hf:vit", "tiny")
    (spec,) = default_hf_inputs(model, "tiny")
    assert spec.vocab is None and spec.shape == (2, 3, model.config.image_size, model.config.image_size)


def test_grouped_query_heads_keep_their_ratio() -> None:
    full = hf_config("hf:qwen2", "full")
    tiny = hf_config("hf:qwen2", "tiny")
    ratio = full.num_attention_heads // full.num_key_value_heads
    assert tiny.num_attention_heads == 4 and tiny.num_key_value_heads == 4 // ratio


def test_a_local_directory_with_a_config(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    config = hf_config("hf:mistral", "tiny")
    config.save_pretrained(tmp_path / "my_model")
    model = build_hf_model(f"hf:{tmp_path / 'my_model'}", "full")  # full: the directory's config as it is
    assert type(model).__name__ == "MistralForCausalLM" and model.config.hidden_size == 64


@pytest.mark.parametrize(
    "spec, message",
    [
        ("hf:", "needs a model type"),
        ("hf:lama", "has no model type 'lama'"),
        ("hf:meta-llama/Llama-3.1-8B", "is not a local directory, and memsave downloads nothing"),
    ],
)
def test_bad_specs_are_one_clear_usage_error(spec: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        hf_config(spec, "tiny")


def test_a_directory_without_config_json(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="has no config.json"):
        hf_config(f"hf:{tmp_path}", "tiny")


def test_the_cli_says_nothing_is_downloaded(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as info:
        main(["estimate", "--model", "hf:Qwen/Qwen2-0.5B", "--no-progress"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "memsave downloads nothing" in err and "--model hf:./Qwen2-0.5B" in err
