"""benchmarks/frontier.py at a tiny size: every variant has a row (measured, or skipped with its reason), memsave's
rows and torchtitan's selective policy give eager's gradients bitwise, plan rows are within their budgets and carry
their planning times (the first plan profiled, the second came from the plan cache), recompute FLOPs are counted,
and the JSON, markdown and plot are written; the frontier marking, the matched compile budget and the comparison
with torch's eager points on hand-made numbers; torchtitan's policy saves what it says."""

import json

import pytest
import torch

import memsave

pytest.importorskip("transformers")

from benchmarks import frontier

from helpers import run_main


def test_frontier_benchmark_runs(tmp_path, capsys):
    out = tmp_path / "frontier.json"
    tiny = ["--quick", "--models", "gpt2", "--threads", "1", "--repeats", "1"]
    run_main(frontier.main, *tiny, "--fractions", "0", "0.5", "--out", str(out))
    data = json.loads(out.read_text())
    assert data["meta"]["memsave_version"] == memsave.__version__
    assert data["meta"]["fractions"] == [0.0, 0.5]
    (res,) = data["results"]
    rows = res["variants"]
    assert list(rows) == [
        "eager",
        "torch blocks",
        "torchtitan sac",
        "wrap",
        "sqrt",
        "module 0%",
        "module 50%",
        "selective 0%",
        "selective 50%",
        "compile 0%",
        "compile 50%",
        "selective @ torchtitan sac",
    ]
    assert rows["eager"]["recompute_flops"] == 0 and rows["eager"]["grad_rel_err"] == 0.0
    for name in ("torch blocks", "torchtitan sac", "wrap"):
        assert rows[name]["grad_rel_err"] == 0.0
        assert rows[name]["recompute_flops"] > 0  # every block's forward runs again (all of it, or every other matmul)
    # torchtitan's policy keeps every other matmul and the attention: less recompute, more memory than whole blocks.
    assert rows["torchtitan sac"]["recompute_flops"] < rows["torch blocks"]["recompute_flops"]
    assert rows["torchtitan sac"]["activation_bytes"] > rows["torch blocks"]["activation_bytes"]
    assert rows["selective @ torchtitan sac"]["budget_bytes"] == rows["torchtitan sac"]["peak_bytes"]
    planned = ("sqrt", "module 0%", "module 50%", "selective 0%", "selective 50%", "selective @ torchtitan sac")
    budgets = [rows[name].get("budget_bytes") for name in planned[:-1]]
    for name in planned:
        row = rows[name]
        assert "skipped" in row or row["grad_rel_err"] == 0.0, name
        if "skipped" not in row and row.get("budget_bytes") is not None:
            assert row["within_budget"], name
        if "skipped" not in row:  # a fresh cache: the first plan profiled (unless an earlier row asked the same)
            repeated = name == "selective @ torchtitan sac" and row["budget_bytes"] in budgets
            assert row["plan_seconds"] > 0 and row["plan_cached"] is repeated, name
            assert row["replan_cached"] is True, name
    for name in ("compile 0%", "compile 50%"):
        assert "not run" in rows[name]["skipped"] and 0.0 <= rows[name]["activation_memory_budget"] <= 1.0
    assert any(r.get("on_frontier") for r in rows.values())
    smallest = min((r for r in rows.values() if "peak_bytes" in r), key=lambda r: (r["peak_bytes"], r["time_ratio"]))
    assert smallest["on_frontier"]  # nothing has a lower peak than the smallest, nor its peak at a lower time
    page = (tmp_path / "frontier.md").read_text()
    assert page.count("| gpt2 |") == len(rows) and "| plan s | again s |" in page
    assert (tmp_path / "frontier.png").read_bytes()[:4] == b"\x89PNG"
    printed = capsys.readouterr().out
    assert "selective 0%" in printed and "torchtitan sac" in printed and "wrote" in printed
    assert "at torchtitan sac's peak" in printed  # the comparison with torch's eager points
    assert [f.name for f in tmp_path.glob("**/*.json")] == ["frontier.json"]  # the plan cache was a temporary one
    # --markdown-from writes the page and the plot again from the JSON alone.
    (tmp_path / "frontier.md").unlink()
    (tmp_path / "frontier.png").unlink()
    assert frontier.main(["--markdown-from", str(out)]) == 0
    assert (tmp_path / "frontier.md").exists() and (tmp_path / "frontier.png").exists()


def test_mark_frontier_keeps_the_rows_nothing_beats():
    rows = {
        "eager": dict(peak_bytes=100, time_ratio=1.0),
        "blocks": dict(peak_bytes=50, time_ratio=1.3),
        "selective": dict(peak_bytes=50, time_ratio=1.1),  # same peak as blocks, faster: blocks drops off
        "module": dict(peak_bytes=70, time_ratio=1.2),  # beaten on both by selective
        "skipped": dict(skipped="no plan fits"),
    }
    frontier.mark_frontier(rows)
    assert {v for v, r in rows.items() if r.get("on_frontier")} == {"eager", "selective"}
    assert "on_frontier" not in rows["skipped"]


def test_matched_activation_budget():
    # eager: 300 peak of which 200 activations; a budget of 150 leaves room for 50 of the 200 activation bytes.
    assert frontier.matched_activation_budget(150, 300, 200) == pytest.approx(0.25)
    assert frontier.matched_activation_budget(50, 300, 200) == 0.0
    assert frontier.matched_activation_budget(400, 300, 200) == 1.0


def test_bad_fractions_are_a_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        frontier.main(["--fractions", "1.5", "--no-save"])
    assert e.value.code == 2
    assert "--fractions" in capsys.readouterr().err


def test_selective_region_benchmark_runs(tmp_path):
    from benchmarks import selective_region

    out = tmp_path / "region.json"
    assert selective_region.main(["--repeats", "1", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert list(rows) == ["eager", "whole", "selective"]
    assert rows["eager"]["recompute_flops"] == 0 and rows["eager"]["step_ratio"] == 1.0
    assert rows["whole"]["recompute_flops"] > 0  # the block's matmuls run again
    assert rows["selective"]["recompute_flops"] == 0  # their outputs were kept
    assert "| selective |" in (tmp_path / "region.md").read_text()


@pytest.fixture
def rows():
    """Hand-made rows of one model, torch's and memsave's, eager and compiled: each comparison must pick its own
    kind of row out of all of them."""
    mib = 2**20
    return {
        "eager": dict(kind="eager", peak_bytes=300 * mib, time_ratio=1.0),
        # torch's eager choices, and memsave's eager rows
        "torch blocks": dict(kind="blocks", peak_bytes=100 * mib, time_ratio=1.30),
        "torchtitan sac": dict(kind="blocks sac", peak_bytes=160 * mib, time_ratio=1.10),
        "wrap": dict(kind="blocks", peak_bytes=100 * mib, time_ratio=1.31),
        "selective 0%": dict(kind="selective", peak_bytes=99 * mib, time_ratio=1.25),
        "selective 50%": dict(kind="selective", peak_bytes=170 * mib, time_ratio=1.05),  # above torchtitan's peak
        "module 75%": dict(kind="module", skipped="no plan fits"),
        "module 25%": dict(kind="module", peak_bytes=150 * mib, time_ratio=1.14),
        # torch.compile at matched budgets, and memsave's compiled rows (faster than every eager row at torch
        # blocks' peak, and below it: not counted among the eager rows)
        "compile 25%": dict(kind="compile", peak_bytes=137 * mib, time_ratio=0.97),
        "compile 0%": dict(kind="compile", peak_bytes=90 * mib, time_ratio=1.10),
        "compile 50%": dict(kind="compile", skipped="torch.compile failed here"),
        "wrap + compile": dict(kind="blocks + compile", peak_bytes=95 * mib, time_ratio=1.20),
        "plan + compile 25%": dict(kind="plan + compile", peak_bytes=170 * mib, time_ratio=0.85),
        "plan + compile @ compile 25%": dict(kind="plan + compile", peak_bytes=135 * mib, time_ratio=1.01),
    }


def test_matched_peak_takes_memsaves_fastest_compiled_row_at_or_below_torchs_peak(rows):
    at_25, at_0 = frontier.matched_peak(rows)
    # At 137 MiB the 170 MiB plan does not count; the 135 MiB plan is faster than wrap + compile: +0.04.
    assert "plan + compile @ compile 25%" in at_25 and "+0.04" in at_25 and at_25.endswith("within +0.05")
    assert "no memsave compiled row fits" in at_0
    rows["plan + compile @ compile 25%"]["time_ratio"] = 1.03
    assert "NOT within" in frontier.matched_peak(rows)[0]


def test_torch_eager_points_take_memsaves_fastest_eager_row_at_or_below_torchs_peak(rows):
    at_blocks, at_sac = frontier.torch_eager_points(rows)
    assert "selective 0%" in at_blocks and "-0.05" in at_blocks and at_blocks.endswith("within +0.02")
    # At torchtitan's 160 MiB the fastest memsave row at or below it is module 25%: +0.04, not within the noise.
    assert "module 25%" in at_sac and "+0.04" in at_sac and "NOT within" in at_sac
    del rows["selective 0%"], rows["wrap"], rows["module 25%"]
    assert "no memsave eager row fits" in frontier.torch_eager_points(rows)[0]


def test_plan_cells_show_planning_times_and_the_cache():
    assert frontier.plan_cells(dict(peak_bytes=1)) == ("-", "-")
    fresh = dict(plan_seconds=2.34, plan_cached=False, replan_seconds=0.0041, replan_cached=True)
    assert frontier.plan_cells(fresh) == ("2.3", "0.004")
    again = dict(plan_seconds=0.012, plan_cached=True, replan_seconds=2.5, replan_cached=False)
    assert frontier.plan_cells(again) == ("0.0 (cache)", "2.500 (not cached)")
    # In eager steps (plan_seconds over eager's median step) once the rows are timed.
    assert frontier.plan_cells({**fresh, "plan_steps": 5.46}) == ("2.3 (5.5 steps)", "0.004")


def test_torchtitan_policy_saves_every_other_matmul_and_the_attention():
    from torch.utils.checkpoint import CheckpointPolicy

    policy = frontier.torchtitan_policy()  # one region call's
    mm, addmm = torch.ops.aten.mm.default, torch.ops.aten.addmm.default
    sdpa = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default

    class Ctx:
        def __init__(self, is_recompute):
            self.is_recompute = is_recompute

    fwd = [policy(Ctx(False), op) for op in (mm, addmm, sdpa, torch.ops.aten.gelu.default, addmm, mm)]
    save, recomp = CheckpointPolicy.MUST_SAVE, CheckpointPolicy.PREFER_RECOMPUTE
    assert fwd == [save, recomp, save, recomp, save, recomp]
    # The recompute counts afresh, so it saves and replays the same matmuls as the forward did.
    assert [policy(Ctx(True), op) for op in (mm, addmm, mm)] == [save, recomp, save]
