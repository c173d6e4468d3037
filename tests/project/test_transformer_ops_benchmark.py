"""benchmarks/transformer_ops.py at a tiny size: every case runs, the memsave variant keeps less than eager, and the
JSON has the machine facts."""

import json

from benchmarks import transformer_ops


def test_transformer_ops_benchmark_runs_and_memsave_keeps_less(tmp_path, capsys):
    out = tmp_path / "ops.json"
    assert transformer_ops.main(["--rows", "32", "--hidden", "64", "--repeats", "2", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert {"device", "torch", "memsave", "threads", "load_average_end"} <= set(data["meta"])
    cases = {r["case"] for r in data["rows"]}
    assert {"rms_norm float32", "rms_norm bfloat16", "rms_norm_qkv float32", "gated_mlp silu 2816 float32"} <= cases
    for r in data["rows"]:
        assert r["memsave_kept_bytes"] < r["eager_kept_bytes"], r["case"]
        assert r["time_ratio"] > 0
    assert "rms_norm_qkv" in capsys.readouterr().out
