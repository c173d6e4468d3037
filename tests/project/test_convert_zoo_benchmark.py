"""benchmarks/convert_zoo.py at a tiny size: every variant runs, convert(fuse=True) matches eager's loss and keeps
fewer activation bytes, and the JSON has the machine facts and memsave's real version."""

import json

import pytest

import memsave

pytest.importorskip("transformers")

from benchmarks import convert_zoo


def test_convert_zoo_benchmark_runs_and_convert_keeps_less(tmp_path, capsys):
    out = tmp_path / "zoo.json"
    assert convert_zoo.main(["--tiny", "--models", "llama", "--repeats", "1", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    meta = data["meta"]
    assert {"device", "torch", "transformers", "threads", "load_average_start", "load_average_end"} <= set(meta)
    assert meta["memsave_version"] == memsave.__version__ != "0.0.0"
    (res,) = data["results"]
    rows = res["variants"]
    assert set(rows) == set(convert_zoo.VARIANTS)
    assert rows["convert"]["loss_rel_err"] <= 1e-5 and rows["convert"]["grad_rel_err"] <= 1e-4
    assert rows["wrap"]["grad_rel_err"] == 0.0
    assert rows["convert"]["activation_bytes"] < rows["eager"]["activation_bytes"]
    assert any(e["new"] == "memsave.CausalLMHead" for e in res["converted"])
    assert (tmp_path / "zoo.md").read_text().count("| llama") == 4
    assert "convert+wrap" in capsys.readouterr().out
