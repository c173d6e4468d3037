"""benchmarks/real_models.py at a tiny size: every variant has a row (measured, or skipped with its reason), memsave's
rows give eager's gradients bitwise, plan rows are within their budgets, and the JSON has the machine facts."""

import json

import pytest

import memsave

pytest.importorskip("transformers")

from benchmarks import real_models

from helpers import run_main


def test_real_models_benchmark_runs(tmp_path, capsys):
    out = tmp_path / "real.json"
    tiny = ["--quick", "--models", "gpt2", "--no-compile", "--threads", "1", "--repeats", "1"]
    run_main(real_models.main, *tiny, "--out", str(out))
    data = json.loads(out.read_text())
    meta = data["meta"]
    assert {
        "device",
        "torch",
        "transformers",
        "timm",
        "torchvision",
        "threads",
        "cpu",
        "git_commit",
        "load_average_start",
        "load_average_end",
    } <= set(meta)
    assert meta["memsave_version"] == memsave.__version__ != "0.0.0"
    (res,) = data["results"]
    rows = res["variants"]
    assert list(rows) == list(real_models.VARIANTS)
    assert res["blocks"] == ["transformer.h.0", "transformer.h.1"]
    for name in ("torch blocks", "wrap"):
        assert rows[name]["grad_rel_err"] == 0.0
        assert rows[name]["activation_bytes"] < rows["eager"]["activation_bytes"]
    for name in ("plan 25%", "plan 50%", "plan 75%"):
        row = rows[name]
        assert "skipped" in row or (row["within_budget"] and row["grad_rel_err"] == 0.0)
    assert "not run" in rows["compile amb 0.5"]["skipped"]
    assert (tmp_path / "real.md").read_text().count("| GPT2LMHeadModel") == len(real_models.VARIANTS)
    assert "torch blocks" in capsys.readouterr().out


def test_torch_checkpoint_blocks_recomputes_the_found_blocks():
    case = real_models.build("llama", quick=True)
    blocks = real_models.torch_checkpoint_blocks(case.model)
    assert blocks == ["model.layers.0", "model.layers.1"]
    calls = []
    case.model.get_submodule(blocks[0]).self_attn.register_forward_pre_hook(lambda m, a: calls.append(1))
    case.loss_fn(case.model(*case.args, **case.kwargs)).backward()
    assert len(calls) == 2  # forward and the recompute in backward
