"""The benchmark harness (benchmarks/): models, strategy registry, result files, and the per-block memory claims."""

import json
import shutil
import subprocess

import pytest
import torch
from benchmarks import run as bench_run
from benchmarks import strategies as bench_strategies

from memsave import models as bench_models
from memsave.measurement.allocator import cpu_memory_stats
from memsave.measurement.strategies import StrategyContext, parse_strategy, register_strategy, unregister_strategy
from memsave.measurement.tracker import LiveTensorTracker

PER_BLOCK = ("torch.checkpoint/block", "memsave.checkpoint/block")


@pytest.mark.parametrize("name", bench_models.MODELS)
def test_sequential_view_is_the_same_computation(name):
    case = bench_models.build(name, "tiny")
    model = case.model.eval()  # no dropout, fixed BatchNorm statistics: the two views must agree exactly
    seq = model.as_sequential()
    assert {id(p) for p in seq.parameters()} <= {id(p) for p in model.parameters()}
    with torch.no_grad():
        assert torch.equal(model(*case.inputs), seq(*case.inputs))
    for block in model.checkpoint_blocks():
        model.get_submodule(block)  # every named block exists


def test_build_is_seeded_and_checks_names():
    a, b = bench_models.build("resnet50", "tiny", seed=3), bench_models.build("resnet50", "tiny", seed=3)
    assert all(torch.equal(p, q) for p, q in zip(a.model.parameters(), b.model.parameters(), strict=True))
    assert torch.equal(a.inputs[0], b.inputs[0])
    with pytest.raises(ValueError, match="vgg16"):
        bench_models.build("alexnet")
    with pytest.raises(ValueError, match="choose from"):
        bench_models.build("unet", "huge")


def test_gpt_head_is_tied_and_survives_deepcopy():
    import copy

    model = bench_models.build("gpt2", "tiny").model
    twin = copy.deepcopy(model)
    assert twin.head.lm_head.weight is twin.embed.wte.weight


def test_rows_are_names_of_memsave_registry_and_a_registered_kind_becomes_a_row():
    calls = []

    def _identity(model, arg, ctx):
        calls.append((type(model).__name__, arg, ctx.device.type))
        return model

    register_strategy("test-identity", "eager, registered by a test", arg="<tag>", apply=_identity)
    try:
        with pytest.raises(ValueError, match="valid strategies: eager"):
            bench_strategies.get(["no-such-strategy"])
        assert [s.name for s in bench_strategies.get(["test-identity:x"])] == ["eager", "test-identity:x"]
        rows = bench_run.run_model(
            "vgg16", "tiny", ["test-identity:x"], torch.device("cpu"), steps=1, warmup=0, log=lambda *a: None
        )
        assert calls == [("VGG16", "x", "cpu")]
        assert [r["strategy"] for r in rows] == ["eager", "test-identity:x"]
        assert rows[1]["max_grad_diff"] == 0.0 and rows[1]["activation_bytes"] == rows[0]["activation_bytes"]
    finally:
        unregister_strategy("test-identity")


def test_harness_end_to_end(tmp_path):
    result = bench_run.main(
        ["--models", "vgg16", "unet", "--size", "tiny", "--steps", "1", "--warmup", "0", "--out-dir", str(tmp_path)]
    )
    rows = result["rows"]
    assert [r["strategy"] for r in rows[:5]] == list(bench_strategies.DEFAULT_STRATEGIES)
    assert len(rows) == 10 and not any("error" in r or "skipped" in r for r in rows), rows
    for r in rows:
        # Every strategy here is lossless: on CPU float32 the gradients are bitwise equal to eager's.
        assert r["max_grad_diff"] == 0.0, r
        assert r["peak_bytes"] > 0 and r["activation_bytes"] > 0 and r["time_ratio"] > 0
    saved = json.loads((tmp_path / "bench_cpu_tiny.json").read_text())
    assert saved["environment"]["torch"] == torch.__version__ and "device_name" in saved["environment"]
    md = (tmp_path / "bench_cpu_tiny.md").read_text()
    assert "| checkpoint:blocks |" in md and f"torch {torch.__version__}" in md


def test_plan_rows_run_within_the_feasible_range_and_stay_exact():
    from benchmarks import strategies_plan

    assert strategies_plan.range_budget(100, 200, 0.25) == 125
    with pytest.raises(ValueError, match="within"):
        strategies_plan.range_budget(100, 200, 1.5)
    rows = bench_run.run_model(
        "gpt2",
        "tiny",
        list(strategies_plan.PLAN_STRATEGIES),
        torch.device("cpu"),
        steps=1,
        warmup=0,
        log=lambda *a: None,
    )
    assert [r["strategy"] for r in rows] == ["eager", *strategies_plan.PLAN_STRATEGIES]
    assert not any("error" in r or "skipped" in r for r in rows), rows
    # Every plan is lossless: gradients bitwise equal to eager's; each keeps fewer activations than eager.
    assert all(r["max_grad_diff"] == 0.0 for r in rows), rows
    assert all(r["activation_bytes"] < rows[0]["activation_bytes"] for r in rows[1:]), rows


@pytest.mark.parametrize("name", ["vgg16", "unet"])
def test_per_block_checkpoint_halves_activations_at_cpu_size(name):
    """At the committed CPU sizes: per-block checkpointing keeps at most 50% of eager's
    activation bytes, and memsave keeps no more than torch.utils.checkpoint with the same blocks.

    Both measures are taken: the live-tensor tracker, and the allocator level (CPU allocation events: bytes
    allocated minus freed during forward). The allocator level also sees the RNG states both checkpoints keep per
    region (torch.get_rng_state() is not an operator, so the tracker does not).

    memsave gets BatchNorm statistics exact without keeping anything more than torch: a training-mode BatchNorm
    only writes its running statistics, so its recompute runs on scratch copies made at recompute time.
    """
    case = bench_models.build(name, "cpu")
    x = case.inputs

    def forward_bytes(strategy: str):
        import copy

        model = copy.deepcopy(case.model)
        runner = parse_strategy(strategy).prepare(model, StrategyContext(x, case.loss_fn, torch.device("cpu")))
        with LiveTensorTracker() as tracker:
            out = runner(*x)
            tracked = tracker.live_bytes
        del out
        allocated = cpu_memory_stats(lambda: runner(*x)).net_bytes
        return tracked, allocated, model

    eager_t, eager_a, _ = forward_bytes("eager")
    torch_t, torch_a, _ = forward_bytes("torch_checkpoint:blocks")
    ms_t, ms_a, _ms_model = forward_bytes("checkpoint:blocks")
    print(
        f"{name}: eager {eager_t} / {eager_a} B, torch per block {torch_t} / {torch_a} B, "
        f"memsave per block {ms_t} / {ms_a} B (tracker / allocator)"
    )
    for eager, tc, ms in ((eager_t, torch_t, ms_t), (eager_a, torch_a, ms_a)):
        assert tc <= 0.5 * eager
        assert ms <= 0.5 * eager
        assert ms <= tc


def test_linear_cross_entropy_benchmark_reports_every_variant_and_the_verdict(tmp_path, capsys):
    """benchmarks/linear_cross_entropy.py at a tiny case: eager, memsave and (where this torch has
    F.linear_cross_entropy) torch's reference and chunked paths are all measured, each against the float64
    reference, and the verdict fields are written to the JSON and the markdown. No timing is asserted."""
    from benchmarks import linear_cross_entropy as bench_lce

    from memsave.common import compat

    out = tmp_path / "lce.json"
    assert bench_lce.main(["--cases", "64x16x100:float32", "--repeats", "2", "--out", str(out)]) == 0
    has_torch = compat.native_linear_cross_entropy() is not None
    expected = ["eager", "memsave"] + (["torch", "torch_chunked"] if has_torch else [])
    data = json.loads(out.read_text())
    assert {"device", "torch", "threads", "load_average_start", "load_average_end"} <= set(data["meta"])
    (row,) = data["rows"]
    assert row["case"] == "64x16x100:float32" and row["variants"] == expected
    for name in expected:
        assert row[f"{name}_peak_bytes"] > 0 and row[f"{name}_time_ratio"] > 0, name
        assert len(row[f"{name}_times_s"]) == 2, name
        for err in ("loss_err", "grad_hidden_err", "grad_weight_err"):
            assert 0 <= row[f"{name}_{err}"] < 1e-4, (name, err, row[f"{name}_{err}"])
    assert {"verdict", "verdict_peak_ok", "verdict_time_ok", "verdict_time_tolerance"} <= set(row)
    assert isinstance(row["verdict"], bool) if has_torch else row["verdict"] is None
    md = (tmp_path / "lce.md").read_text()
    for label in ("eager", "memsave") + (("torch", "torch chunked") if has_torch else ()):
        assert f"| 64x16x100:float32 | {label} |" in md, label
    assert "Verdict:" in md and "| verdict |" in md
    assert "verdict:" in capsys.readouterr().out


def test_transformer_ops_rms_norm_has_torchs_native_variant(tmp_path):
    """benchmarks/transformer_ops.py's rms_norm case measures torch's F.rms_norm beside memsave's, with the errors
    against float64 and the verdict."""
    from benchmarks import transformer_ops

    from memsave.common import compat

    out = tmp_path / "ops.json"
    argv = ["--rows", "32", "--hidden", "64", "--repeats", "2", "--dtypes", "float32", "--cases", "rms_norm float32"]
    assert transformer_ops.main([*argv, "--out", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    has_torch = compat.native_rms_norm() is not None
    assert row["variants"] == ["eager", "memsave"] + (["torch"] if has_torch else [])
    for name in row["variants"]:
        assert 0 <= row[f"{name}_err"] < 1e-4 and row[f"{name}_peak_bytes"] > 0, name
    if has_torch:
        assert row["torch_time_ratio"] > 0 and isinstance(row["verdict"], bool)


def test_a_results_file_names_the_package_sources_that_differ_from_the_commit(tmp_path, monkeypatch):
    # git ran in benchmarks/, where the pathspecs "python" and "csrc" name nothing, and the first line lost a letter.
    from benchmarks import harness

    if shutil.which("git") is None:
        pytest.skip("needs git")
    repo = tmp_path / "checkout"
    (repo / "benchmarks").mkdir(parents=True)
    (repo / "python").mkdir()
    source = repo / "python" / "ops.py"
    source.write_text("x = 1\n")
    for command in (
        ["init", "-q"],
        ["add", "python"],
        ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c"],
    ):
        subprocess.run(["git", *command], cwd=repo, check=True, capture_output=True)
    source.write_text("x = 2\n")
    monkeypatch.setattr(harness, "HERE", repo / "benchmarks")
    meta = harness.run_record("frontier", "cpu", [], harness.RunClock())
    assert meta["git_dirty"] == ["python/ops.py"]
    # ... and the page's opening line says so beside the commit.
    assert harness.commit_text(meta) == f"commit {meta['git_commit']}, package sources modified: python/ops.py"
    assert harness.commit_text({**meta, "git_dirty": []}) == f"commit {meta['git_commit']}"
