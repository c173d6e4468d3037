"""memsave.compare: strategy names and registry, rows against memsave.measure, the gradient column, state left
untouched, the table / HTML / plot / JSON / DataFrame views, bad input, and `python -m memsave bench`."""

from __future__ import annotations

import copy
import html
import io
import json

import pytest
import torch

from helpers import models
from memsave.errors import MemsaveWarning
from memsave.measurement.comparison import Comparison, compare, parse_strategies
from memsave.measurement.measuring import measure
from memsave.measurement.strategies import (
    StrategyContext,
    available_strategies,
    parse_strategy,
    register_strategy,
    unregister_strategy,
)
from memsave.measurement.units import parse_bytes
from memsave.recompute import resolve_checkpoint_policy


def _loss(out: torch.Tensor) -> torch.Tensor:
    return out.float().pow(2).mean()


@pytest.fixture(scope="module")
def cnn_result():
    """One comparison shared by several tests: the CNN (BatchNorm, in-place ReLU, Dropout) under three strategies."""
    model, x = models.build("cnn")
    return model, x, compare(model, x, strategies=["checkpoint:blocks", "amp:bf16"], loss_fn=_loss, steps=2)


# ------------------------------------------------------------------------------------------------------------ names
def test_parse_strategy_names_and_combinations():
    assert parse_strategy("eager").name == "eager"
    s = parse_strategy(" convert + checkpoint:blocks ")
    assert s.name == "convert+checkpoint:blocks"
    assert [(d.name, a) for d, a in s.parts] == [("convert", None), ("checkpoint", "blocks")]
    assert parse_strategy("eager+amp:bf16").name == "amp:bf16"  # eager adds nothing to a combination
    assert parse_strategy("checkpoint:h.0,h.1").parts[0][1] == "h.0,h.1"
    assert parse_strategy("checkpoint:blocks").lossless and not parse_strategy("amp:fp16+checkpoint:all").lossless
    assert available_strategies()[:1] == ["eager"]
    assert {"checkpoint:<policy>", "plan:<budget>", "convert", "amp:fp16", "amp:bf16"} <= set(available_strategies())


@pytest.mark.parametrize(
    "bad,match",
    [
        (
            "fsdp",
            r"unknown strategy 'fsdp'.*valid strategies: eager, checkpoint:<policy>, plan:<budget>, "
            r"checkpoint_sequential:<segments>, torch_checkpoint:<policy>",
        ),
        ("eager+zero", r"unknown strategy 'zero' in 'eager\+zero'"),
        ("", r"unknown strategy"),
        ("convert+", r"unknown strategy"),
        ("checkpoint", r"'checkpoint' needs an argument, e.g. checkpoint:<policy>"),
        ("checkpoint:", r"needs an argument"),
        ("eager:now", r"takes no argument"),
        ("amp:fp8", r"accepts amp:fp16, amp:bf16"),
    ],
)
def test_parse_strategy_rejects_bad_names(bad, match):
    with pytest.raises(ValueError, match=match):
        parse_strategy(bad)


def test_compare_rejects_unknown_strategy_before_running():
    model, x = models.build("mlp")
    with pytest.raises(ValueError, match="valid strategies: eager"):
        compare(model, x, strategies=["eager", "checkpoint:blocks", "recompute-everything"])


def test_registry_plugs_in_and_refuses_bad_names():
    spec = register_strategy("test-half-width", "test only", apply=lambda m, arg, ctx: m)
    try:
        assert "test-half-width" in available_strategies()
        with pytest.raises(ValueError, match="already registered"):
            register_strategy("test-half-width", "again", apply=lambda m, arg, ctx: m)
        assert parse_strategy("test-half-width+checkpoint:blocks").parts[0][0] is spec
    finally:
        unregister_strategy("test-half-width")
    with pytest.raises(ValueError, match="bad name"):
        register_strategy("has space", "x", apply=lambda m, a, c: m)


def test_checkpoint_policies_resolve_to_module_names():
    tr, _ = models.build("transformer")
    blocks = resolve_checkpoint_policy(tr, "blocks")
    assert blocks and all(type(tr.get_submodule(n)).__name__ == "TransformerBlock" for n in blocks)
    assert resolve_checkpoint_policy(tr, "TransformerBlock") == blocks
    assert resolve_checkpoint_policy(tr, blocks[0] + "," + blocks[-1]) == [blocks[0], blocks[-1]]
    # Nested selections keep the outermost only.
    inner = next(n for n, m in tr.named_modules() if n.startswith(blocks[0] + "."))
    assert resolve_checkpoint_policy(tr, f"{blocks[0]},{inner}") == [blocks[0]]
    # blocks is memsave.find_blocks: the CNN's three ConvBlocks, not its pooling/flatten/linear layers.
    cnn, _ = models.build("cnn")
    assert resolve_checkpoint_policy(cnn, "blocks") == ["0", "1", "3"]
    seq = models.mlp()
    assert resolve_checkpoint_policy(seq, "all") == [str(i) for i in range(len(seq))]
    # A stack of single layers has no blocks: blocks says so (never one region per leaf layer).
    with pytest.raises(
        ValueError,
        match=r"checkpoint:blocks: found no repeated blocks in Sequential .* \(this "
        r"model has Dropout, GELU, Linear, Sequential, Tanh\)",
    ):
        resolve_checkpoint_policy(seq, "blocks")
    with pytest.raises(
        ValueError,
        match=r"'Conv2d' is neither a submodule name nor a module class of Sequential; "
        r"use 'blocks', 'all', a module class name \(this model has .*Linear",
    ):
        resolve_checkpoint_policy(seq, "Conv2d")
    with pytest.raises(ValueError, match="'nope.1' is neither"):
        resolve_checkpoint_policy(seq, "0,nope.1")


def test_parse_bytes_units_and_errors():
    assert parse_bytes("24GiB") == 24 * 2**30
    assert parse_bytes("1.5 kib") == 1536
    assert parse_bytes("512MB") == 512 * 10**6
    assert parse_bytes(4096) == 4096 and parse_bytes("4096") == 4096
    for bad in ("24 gigs", "GiB", "-1GiB", "1..2MB", ""):
        with pytest.raises(ValueError, match="cannot parse"):
            parse_bytes(bad)
    with pytest.raises(TypeError):
        parse_bytes(True)
    with pytest.raises(ValueError, match="must be > 0 bytes"):
        parse_bytes(-5)


# ------------------------------------------------------------------------------------------------------------- rows
def test_rows_agree_with_measure_and_lossless_gradients_are_exact(cnn_result):
    model, x, result = cnn_result
    assert [r.strategy for r in result.rows] == ["eager", "checkpoint:blocks", "amp:bf16"]
    ckpt = result["checkpoint:blocks"]
    # The same numbers measure() gives on a copy prepared the same way.
    for row in (result.eager, ckpt):
        work = copy.deepcopy(model)
        runner = parse_strategy(row.strategy).prepare(work, StrategyContext((x,), _loss, torch.device("cpu")))
        m = measure(runner, x, loss_fn=_loss, steps=1)
        assert row.activation_bytes == m.activation_bytes
        assert row.peak_bytes == pytest.approx(m.peak_bytes, rel=0.02)
        assert row.by_module == m.by_module
    assert result.eager.time_ratio == 1.0 and ckpt.time_ratio > 0
    assert ckpt.activation_bytes < result.eager.activation_bytes
    # Lossless rows: bitwise equal gradients (dropout masks replayed); autocast is not.
    assert result.eager.max_grad_diff == 0.0 and ckpt.max_grad_diff == 0.0
    assert result["amp:bf16"].max_grad_diff > 0.0 and not result["amp:bf16"].lossless
    # Under autocast the by-module names are the model's own (the runner's prefix is removed).
    assert set(result["amp:bf16"].by_module) <= {n for n, _ in model.named_modules()} | {"<no module>"}


def test_compare_leaves_model_grads_buffers_and_rng_unchanged():
    model, x = models.build("cnn")
    model(x).sum().backward()  # the user's gradients and BatchNorm statistics, to be left alone
    grads = {n: (p.grad, p.grad.clone()) for n, p in model.named_parameters()}
    state = copy.deepcopy(model.state_dict())
    torch.manual_seed(1234)
    rng = torch.get_rng_state()
    compare(model, x, strategies=["checkpoint:blocks"], steps=1, warmup=0)
    assert torch.equal(torch.get_rng_state(), rng)
    for name, p in model.named_parameters():
        assert p.grad is grads[name][0] and torch.equal(p.grad, grads[name][1])
    after = model.state_dict()
    assert all(torch.equal(after[k], v) for k, v in state.items())
    assert model.training


def test_compare_checks_devices_and_arguments():
    model, x = models.build("mlp")
    with pytest.raises(ValueError, match=r"compare: the model and the inputs are on several devices \(cpu, meta\)"):
        compare(model.to("meta"), x, strategies=["eager"])
    model, x = models.build("mlp")
    with pytest.raises(ValueError, match="several devices"):
        compare(model, x.to("meta"), strategies=["eager"])
    with pytest.raises(ValueError, match="memsave.estimate"):
        compare(model.to("meta"), x.to("meta"))
    model, x = models.build("mlp")
    with pytest.raises(ValueError, match="steps must be an int >= 1"):
        compare(model, x, steps=0)
    with pytest.raises(ValueError, match="snapshot_dir needs CUDA"):
        compare(model, x, strategies=["eager"], steps=1, snapshot_dir="snaps")
    with pytest.raises(TypeError, match="nn.Module"):
        compare(lambda t: t, x)


# ------------------------------------------------------------------------------------------------------------ views
def test_text_table_is_aligned(cnn_result):
    _, _, result = cnn_result
    lines = str(result).splitlines()
    assert lines[0].startswith("memsave.compare on cpu")
    header, rule, *rows = lines[1:]
    assert header.split()[:2] == ["strategy", "peak"]
    assert len({len(line) for line in [header, rule] + rows}) == 1  # every line as wide as the header
    assert [r.split()[0] for r in rows] == ["eager", "checkpoint:blocks", "amp:bf16"]
    assert "reserved" not in header  # CPU: no reserved column
    assert "activations by module, eager" in result.breakdown("eager", top=3)


def test_html_json_and_dataframe(cnn_result):
    _, _, result = cnn_result
    page = result._repr_html_()
    assert page.startswith("<table>") and page.count("<tr>") == 1 + len(result)
    assert "<code>checkpoint:blocks</code>" in page
    again = Comparison.from_json(result.to_json())
    assert again.rows == result.rows and again.device == "cpu"
    data = json.loads(result.to_json())
    assert data["rows"][0]["strategy"] == "eager" and data["info"]["torch"] == torch.__version__
    pd = pytest.importorskip("pandas")
    df = result.to_dataframe()
    assert isinstance(df, pd.DataFrame) and list(df.index) == ["eager", "checkpoint:blocks", "amp:bf16"]
    assert df.loc["eager", "peak_ratio"] == 1.0 and df.loc["checkpoint:blocks", "max_grad_diff"] == 0.0


def test_plot_renders_a_png(cnn_result):
    pytest.importorskip("matplotlib")
    _, _, result = cnn_result
    fig = result.plot()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    png = buf.getvalue()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    assert len(fig.axes) == 2
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert sorted(labels) == sorted(["eager", "checkpoint:blocks", "amp:bf16"])
    # Peak and activation bytes, each bar labelled with its size and unit (not a rounded "1" or "2"), and a legend.
    bar_labels = [t.get_text().strip() for t in fig.axes[0].texts]
    assert len(bar_labels) == 2 * len(labels) and all(t.endswith(("B", "KiB", "MiB", "GiB")) for t in bar_labels)
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert legend == ["peak bytes", "activation bytes"] and fig.axes[1].get_legend() is not None


def test_plot_then_pyplot_savefig_writes_the_plot(cnn_result, tmp_path):
    # table.plot(); plt.savefig(path): pyplot saves its current figure, which must be the plot, not a blank one.
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.image
    import matplotlib.pyplot as plt

    _, _, result = cnn_result
    plt.close("all")
    fig = result.plot()
    try:
        assert plt.gcf() is fig
        plt.savefig(tmp_path / "compare.png")
    finally:
        plt.close("all")
    pixels = matplotlib.image.imread(tmp_path / "compare.png")
    colours = {tuple(p) for p in pixels.reshape(-1, pixels.shape[-1]).tolist()}
    assert len(colours) > 1  # a blank figure is one colour


# -------------------------------------------------------------------------------------------------------- CLI
def test_bench_command_line(tmp_path, capsys):
    from memsave.cli import main

    out = tmp_path / "gpt2.json"
    assert (
        main(
            [
                "bench",
                "--model",
                "gpt2",
                "--size",
                "tiny",
                "--device",
                "cpu",
                "--strategies",
                "eager,checkpoint:blocks",
                "--steps",
                "1",
                "--no-progress",
                "--breakdown",
                "2",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "gpt2 (tiny, batch 1)" in text and "checkpoint:blocks" in text and "activations by module" in text
    data = json.loads(out.read_text())
    assert [r["strategy"] for r in data["rows"]] == ["eager", "checkpoint:blocks"]
    assert data["rows"][1]["max_grad_diff"] == 0.0 and data["environment"]["torch"] == torch.__version__
    with pytest.raises(SystemExit):
        main(["bench", "--model", "alexnet", "--size", "tiny", "--device", "cpu"])


def test_mapping_row_names_are_the_names_given():
    # {"per block": "checkpoint:blocks"} used to print the row as "checkpoint:blocks".
    model, x = models.build("cnn")
    result = compare(model, x, strategies={"per conv": "checkpoint:Conv2d", "eager again": "eager"}, steps=1)
    assert [r.strategy for r in result.rows] == ["eager", "per conv"]
    assert result["per conv"].max_grad_diff == 0.0
    assert "per conv" in str(result) and "checkpoint:Conv2d" not in str(result)
    with pytest.raises(ValueError, match="row name 'checkpoint:all' is the registered strategy"):
        parse_strategies({"checkpoint:all": "checkpoint:blocks"})


def test_a_strategy_that_raises_the_peak_is_flagged():
    # Checkpointing every module of a small CNN keeps each region's input and costs more than it drops.
    model, x = models.build("cnn")
    with pytest.warns(MemsaveWarning, match=r"compare: checkpoint:all raises the peak above eager's"):
        result = compare(model, x, strategies=["checkpoint:all"], steps=1)
    assert result["checkpoint:all"].peak_bytes > result["eager"].peak_bytes
    (note,) = result.notes()
    assert note.startswith("checkpoint:all raises the peak above eager's (+") and note in str(result)
    assert html.escape(note) in result._repr_html_()
