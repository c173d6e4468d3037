"""The command line, ``python -m memsave``: the user's own model (``--model MODULE:CALLABLE`` with ``--input`` shapes,
token inputs, the loss taken from non-tensor outputs), one-line errors with their exit codes, and, slow, the whole
CLI from a wheel installed into a fresh virtualenv and run outside the checkout."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import List

import pytest
import torch

import memsave
from memsave.cli import main, options
from memsave.cli.usage import ArgumentParser, CommandError, UsageError, run_command
from memsave.cli.user_model import InputSpec, parse_input
from memsave.errors import MemsaveWarning
from memsave.measurement import default_loss

REPO = Path(__file__).resolve().parents[2]
MOD = "memsave_cli_test_models"

# The user's models, as a module of their own (written to a temporary folder put on sys.path).
USER_MODELS = '''
from collections import OrderedDict

import torch
from torch import nn


def make_cnn(channels=3, classes=5):
    return nn.Sequential(
        nn.Sequential(nn.Conv2d(channels, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU()),
        nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU()),
        nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(1), nn.Linear(8, classes)),
    )


class LMOutput(OrderedDict):
    """Like a Hugging Face ModelOutput: a dict whose items are also attributes; logits is not the first item."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


class TinyLM(nn.Module):
    def __init__(self, vocab=64, d=16, layers=2):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.h = nn.ModuleList(nn.Sequential(nn.LayerNorm(d), nn.Linear(d, d), nn.GELU()) for _ in range(layers))
        self.head = nn.Linear(d, vocab)

    def forward(self, ids):
        x = self.wte(ids)
        for block in self.h:
            x = x + block(x)
        return LMOutput(hidden_states=x, logits=self.head(x))


class TwoInputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 3), nn.Linear(5, 3)

    def forward(self, x, y):
        return torch.zeros(x.shape[0], dtype=torch.long), self.a(x) + self.b(y)


def broken():
    raise RuntimeError("cannot build this model\\nsecond line of the message")


def not_a_module():
    return 42


NOT_CALLABLE = 3
'''


@pytest.fixture(scope="module")
def user_models(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("user_models")
    (folder / f"{MOD}.py").write_text(USER_MODELS)
    (folder / "fails_on_import.py").write_text("raise ImportError('a dependency of this module is missing')\n")
    sys.path.insert(0, str(folder))
    try:
        yield folder
    finally:
        sys.path.remove(str(folder))
        for name in (MOD, "fails_on_import"):
            sys.modules.pop(name, None)


def _stdout(capsys: pytest.CaptureFixture, command: str, *extra: str) -> str:
    """``memsave`` with the words of ``command`` and then ``extra`` exits 0: its standard output."""
    assert main([*command.split(), *extra]) == 0
    return capsys.readouterr().out


# ------------------------------------------------------------------------------------------------ --model / --input
@pytest.mark.slow
def test_bench_user_model_with_a_float_input(user_models, tmp_path, capsys):
    out = tmp_path / "cnn.json"
    text = _stdout(
        capsys, f"bench --model {MOD}:make_cnn --input 2,3,16,16 --device cpu --steps 1 --no-progress --json", str(out)
    )
    assert f"{MOD}:make_cnn (input 2x3x16x16 float32)" in text and "checkpoint:blocks" in text
    data = json.loads(out.read_text())
    assert data["model"] == f"{MOD}:make_cnn" and data["size"] is None and data["batch"] == 2
    assert data["config"] == {"inputs": ["2,3,16,16"], "model_kwargs": {}}
    assert [r["strategy"] for r in data["rows"]] == ["eager", "checkpoint:blocks"]
    assert data["rows"][1]["max_grad_diff"] == 0.0 and data["rows"][0]["peak_bytes"] > 0


@pytest.mark.slow
def test_estimate_user_language_model_with_token_input_and_dict_output(user_models, tmp_path, capsys):
    out = tmp_path / "lm.json"
    text = _stdout(
        capsys,
        f"estimate --model {MOD}:TinyLM --input tokens:2,16:40 --device cpu --memory 4MiB --json",
        str(out),
        "--model-kwargs",
        '{"vocab": 40, "layers": 3}',
    )
    assert f"{MOD}:TinyLM (input 2x16 token ids < 40) on cpu" in text and "max batch (4MiB)" in text
    data = json.loads(out.read_text())
    assert data["config"] == {"inputs": ["tokens:2,16:40"], "model_kwargs": {"vocab": 40, "layers": 3}}
    eager, ckpt = data["rows"]
    assert ckpt["activation_bytes"] < eager["activation_bytes"]
    assert ckpt["max_batch"] >= eager["max_batch"] >= 1


@pytest.mark.slow
def test_bench_token_ids_stay_below_the_vocabulary(user_models, capsys):
    # An id >= vocab would make the embedding raise: the real (not fake) inputs of bench are drawn below it.
    text = _stdout(
        capsys,
        f"bench --model {MOD}:TinyLM --input tokens:4,32:7 --device cpu --steps 1 --no-progress --model-kwargs",
        '{"vocab": 7}',
    )
    assert "(input 4x32 token ids < 7)" in text


def test_several_inputs_a_batch_override_and_a_file_path(user_models, capsys):
    path = user_models / f"{MOD}.py"
    text = _stdout(
        capsys,
        "bench --input 2,4 --input 2,5 --batch 3 --device cpu --steps 1 --no-progress --strategies",
        "eager,checkpoint:all",
        "--model",
        f"{path}:TwoInputs",
    )
    assert f"{path}:TwoInputs (inputs 3x4 float32, 3x5 float32)" in text and "checkpoint:all" in text


@pytest.mark.slow
def test_builtin_models_keep_size_and_batch(capsys):
    text = _stdout(capsys, "estimate --model unet --size tiny --batch 3 --device cpu")
    assert "unet (tiny, batch 3) on cpu" in text
    assert "built-in" not in text  # no library has a "unet" to confuse it with


@pytest.mark.slow
def test_a_builtin_name_a_library_also_uses_says_which_model_runs(capsys):
    # "--model gpt2" is memsave's own GPT, not transformers' GPT-2: the output says so and how to get that one.
    text = _stdout(capsys, "estimate --model gpt2 --size tiny --device cpu --no-progress")
    assert "gpt2 (tiny, batch" in text
    assert "(memsave's built-in gpt2, not transformers' one: that is --model hf:gpt2)" in text
    assert options.builtin_note("resnet50").endswith("--model torchvision.models:resnet50 --input 2,3,224,224)")
    assert options.builtin_note("unet") == ""


@pytest.mark.parametrize(
    "text, shape, vocab",
    [
        ("8,3,64,64", (8, 3, 64, 64), None),
        (" 4, 16 ", (4, 16), None),
        ("tokens:2,128:50257", (2, 128), 50257),
    ],
)
def test_parse_input(text, shape, vocab):
    spec = parse_input(text)
    assert spec == InputSpec(shape, vocab)
    assert parse_input(spec.spelling()) == spec
    t = spec.make(torch.device("cpu"), torch.Generator().manual_seed(0), batch=2)
    assert t.shape == (2,) + shape[1:] and t.dtype == (torch.float32 if vocab is None else torch.int64)
    if vocab is not None:
        assert int(t.min()) >= 0 and int(t.max()) < vocab


@pytest.mark.parametrize(
    "text", ["", "8x3x64", "2,-1", "2,0", "2,3.5", "tokens:2,8", "tokens:2,8:0", "tokens::5", "float:2,3"]
)
def test_parse_input_rejects(text):
    with pytest.raises(UsageError, match="--input"):
        parse_input(text)


# ------------------------------------------------------------------------------------------------ the loss
def test_user_models_are_stepped_with_measurements_default_loss(user_models):
    args = argparse.Namespace(
        model=f"{MOD}:TinyLM", input=["tokens:2,8:64"], model_kwargs=None, batch=None, seed=0, size=None
    )
    case = options.build_case(args, torch.device("cpu"))
    assert case.loss_fn is default_loss
    out = case.model(*case.inputs)
    assert torch.equal(case.loss_fn(out), out.logits.float().sum())  # .logits before the first float tensor


# ------------------------------------------------------------------------------------------------ a plain MLP
MLP = """
from torch import nn


def mlp():
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
"""


def test_bench_on_a_model_without_blocks_prints_eager_and_an_error_row(tmp_path, capsys, monkeypatch):
    (tmp_path / "m.py").write_text(MLP)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "mlp.json"
    # exit 0: eager ran
    text = _stdout(capsys, "bench --model ./m.py:mlp --input 8,16 --steps 1 --no-progress --json", str(out))
    rows = {r["strategy"]: r for r in json.loads(out.read_text())["rows"]}
    assert list(rows) == ["eager", "checkpoint:blocks"]
    assert rows["eager"]["peak_bytes"] > 0 and rows["eager"].get("error") is None
    assert "repeated" in rows["checkpoint:blocks"]["error"] or "block" in rows["checkpoint:blocks"]["error"]
    assert "checkpoint:blocks" in text and "error" in text


def test_estimate_on_a_model_without_blocks_prints_eager_and_an_error_row(tmp_path, capsys, monkeypatch):
    (tmp_path / "m.py").write_text(MLP)
    monkeypatch.chdir(tmp_path)
    text = _stdout(capsys, "estimate --model ./m.py:mlp --input 8,16 --no-progress")
    eager_line = next(line for line in text.splitlines() if line.startswith("eager "))
    assert "error" not in eager_line
    assert any(line.startswith("checkpoint:blocks") and "error" in line for line in text.splitlines())


@pytest.mark.parametrize("command", ["bench", "estimate"])
def test_a_memory_size_without_a_unit_is_refused_naming_the_units(user_models, capsys, command):
    argv = [command, *_CNN, "--memory", "64"] if command == "estimate" else None
    if argv is None:  # bench has no --memory: the parser for sizes is shared
        with pytest.raises(UsageError, match="no unit.*KiB, MiB, GiB"):
            options.parse_memory("64")
        assert options.parse_memory("64KiB") == 65536 and options.parse_memory("1GB") == 10**9
        return
    with pytest.raises(SystemExit) as info:
        main(argv)
    err = capsys.readouterr().err
    assert info.value.code == 2 and "--memory '64' has no unit" in err and "MiB" in err and "GB" in err


@pytest.mark.parametrize("command", ["bench", "estimate", "demo"])
def test_every_subcommand_has_the_same_progress_size_and_device_flags_and_defines_units(capsys, command):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    flat = " ".join(capsys.readouterr().out.split())
    for needle in ("--no-progress", "--size {tiny,cpu,full}", "--device", "cuda when a GPU is visible, else cpu"):
        assert needle in flat, (command, needle)
    assert "KiB/MiB/GiB (powers of 1024)" in flat and "inter-quartile range" in flat


def test_strategies_are_checked_before_the_model_is_built(user_models, capsys, monkeypatch):
    from memsave.cli import bench, estimate

    built = []
    for module in (bench, estimate):
        monkeypatch.setattr(module, "build_case", lambda *a, **k: built.append(1))
    for command in ("bench", "estimate"):
        with pytest.raises(SystemExit) as info:
            main([command, *_CNN, "--strategies", "eager,nonsense"])
        assert info.value.code == 2
    assert built == [] and "unknown strategy 'nonsense'" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------ one-line errors
_CNN = ["--model", f"{MOD}:make_cnn", "--input", "2,3,8,8", "--device", "cpu"]

ERRORS = [
    # wrong command lines: exit code 2
    ([], 2, "a subcommand is required"),
    (["frobnicate"], 2, "invalid choice: 'frobnicate'"),
    (["bench", "--frobnicate"], 2, "unrecognized arguments: --frobnicate"),
    (["bench"], 2, "--model is required"),
    (["bench", "--model", "alexnet"], 2, "unknown model 'alexnet'"),
    (["estimate", "--model", "resnet50", "--size", "huge"], 2, "invalid choice: 'huge'"),
    (["bench", "--model", "resnet50", "--input", "2,3"], 2, "--input and --model-kwargs are for MODULE:CALLABLE"),
    (["bench", "--model", "no_such_module_xyz:make"], 2, "--input"),
    (["bench", "--model", "no_such_module_xyz:make", "--input", "2,3"], 2, "no module named 'no_such_module_xyz'"),
    (
        ["bench", "--model", f"{MOD}:make_cnm", "--input", "2,3"],
        2,
        "has no attribute 'make_cnm'; did you mean make_cnn",
    ),
    (["bench", "--model", f"{MOD}:NOT_CALLABLE", "--input", "2,3"], 2, "is not callable"),
    (["bench", "--model", f"{MOD}:not_a_module", "--input", "2,3"], 2, "not a torch.nn.Module"),
    (["bench", "--model", "no/such/file.py:make", "--input", "2,3"], 2, "no such file"),
    (["bench", "--model", ":make", "--input", "2,3"], 2, "write MODULE:CALLABLE"),
    (["bench", "--model", f"{MOD}:make_cnn", "--input", "2,x"], 2, "--input '2,x': not a shape"),
    (["estimate", "--model", f"{MOD}:TinyLM", "--input", "tokens:2,8"], 2, "token inputs need a vocabulary size"),
    (["bench", *_CNN, "--size", "tiny"], 2, "--size is for the built-in models"),
    (["bench", *_CNN, "--model-kwargs", "{oops"], 2, "--model-kwargs is not valid JSON"),
    (["bench", *_CNN, "--batch", "0"], 2, "--batch must be >= 1"),
    (["bench", *_CNN, "--strategies", "eager,nonsense"], 2, "unknown strategy 'nonsense'"),
    (["bench", *_CNN, "--device", "tpu"], 2, "--device must be cpu or cuda"),
    (["estimate", *_CNN, "--memory", "lots"], 2, "cannot parse 'lots' as a memory size"),
    (["estimate", *_CNN, "--headroom", "1.5"], 2, "--headroom must be a fraction"),
    (["demo", "--size", "huge"], 2, "invalid choice: 'huge'"),
    (["info", "--verbose"], 2, "unrecognized arguments: --verbose"),
    # understood, but the run failed: exit code 1
    (["bench", "--model", f"{MOD}:broken", "--input", "2,3"], 1, "calling it failed: RuntimeError: cannot build"),
    (["bench", "--model", "fails_on_import:make", "--input", "2,3"], 1, "importing fails_on_import failed"),
    (["bench", *_CNN, "--model-kwargs", '{"depth": 3}'], 1, "unexpected keyword argument 'depth'"),
    (
        ["bench", "--model", f"{MOD}:make_cnn", "--input", "2,4,8,8", "--device", "cpu", "--no-progress"],
        1,
        "bench: memsave_cli_test_models:make_cnn (input 2x4x8x8 float32) failed: RuntimeError: Given groups=1",
    ),
    (
        ["estimate", "--model", f"{MOD}:make_cnn", "--input", "2,4,8,8", "--device", "cpu"],
        1,
        "estimate: memsave_cli_test_models:make_cnn (input 2x4x8x8 float32) failed:",
    ),
    (["bench", *_CNN, "--input", "2,3", "--no-progress"], 1, "failed: TypeError"),  # forward takes one input
]


@pytest.mark.parametrize("argv, code, message", ERRORS, ids=[" ".join(a[0])[:60] or "no-args" for a in ERRORS])
def test_every_failure_is_one_line_with_its_exit_code(user_models, capsys, monkeypatch, argv, code, message):
    monkeypatch.delenv("MEMSAVE_TRACEBACK", raising=False)
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == code
    err = capsys.readouterr().err
    lines = [line for line in err.replace("\r", "\n").splitlines() if line.strip() and "memsave.estimate:" not in line]
    assert len(lines) == 1, err
    assert lines[0].startswith("memsave: error: ") and message in lines[0], lines[0]
    assert "Traceback" not in err


def test_traceback_escape_hatch(user_models, monkeypatch):
    argv = ["bench", "--model", f"{MOD}:broken", "--input", "2,3"]
    with pytest.raises(CommandError, match="calling it failed") as info:
        main(argv + ["--traceback"])
    assert isinstance(info.value.__cause__, RuntimeError)
    with pytest.raises(UsageError, match="unknown model"):
        main(["--traceback", "bench", "--model", "alexnet"])
    monkeypatch.setenv("MEMSAVE_TRACEBACK", "1")
    with pytest.raises(CommandError):
        main(argv)


# ------------------------------------------------------------------------------------------------ warnings
def _warn_and_parse(argv: List[str]) -> int:
    # A subcommand as the CLI's are: its parser (with --steps and a switch), then memsave's and another library's
    # warnings, written for the Python API.
    p = ArgumentParser(prog="python -m memsave bench")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--no-progress", action="store_true")
    p.parse_args(argv)
    warnings.warn("compare: step times spread widely;\n  time more rounds (steps=...)", MemsaveWarning, stacklevel=1)
    warnings.warn("measure: no bar (no_progress=...), a loss (loss_fn=...)", MemsaveWarning, stacklevel=1)
    warnings.warn("a deprecation of another library", UserWarning, stacklevel=1)
    return 0


def test_warnings_of_a_command_are_one_line_naming_its_flags(capsys, monkeypatch):
    monkeypatch.delenv("MEMSAVE_TRACEBACK", raising=False)
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        assert run_command(_warn_and_parse, ["--steps", "1"]) == 0
    assert capsys.readouterr().err.splitlines() == [
        "memsave: warning: compare: step times spread widely; time more rounds (--steps N)",
        # a switch is its flag; a keyword the command has no flag for stays as it is
        "memsave: warning: measure: no bar (--no-progress), a loss (loss_fn=...)",
        "memsave: warning: UserWarning: a deprecation of another library",
    ]
    # --traceback: Python's own display (file and line), for debugging
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert run_command(_warn_and_parse, ["--traceback"]) == 0
    assert str(caught[0].message).endswith("(steps=...)") and capsys.readouterr().err == ""


def test_warnings_filtered_out_stay_hidden(capsys, monkeypatch):
    monkeypatch.delenv("MEMSAVE_TRACEBACK", raising=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PYTHONWARNINGS=ignore
        assert run_command(_warn_and_parse, []) == 0
    assert capsys.readouterr().err == ""


@pytest.mark.slow  # a real bench run (timing rounds): seconds on 2 loaded cores
def test_bench_timing_warning_is_one_line_with_the_steps_flag(user_models, capsys, monkeypatch):
    from memsave.measurement import comparison, timing

    monkeypatch.delenv("MEMSAVE_TRACEBACK", raising=False)
    # Every timing "spreads widely": the warning a loaded machine gets.
    monkeypatch.setattr(comparison, "spread_warning", lambda t, where: timing.spread_warning(t, where, threshold=-1))
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        assert main(["bench", "--steps", "1", "--no-progress", "--strategies", "eager", *_CNN]) == 0
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert err, "no warning printed"
    assert all(line.startswith("memsave: warning: compare: step times spread widely") for line in err), err
    assert all(line.endswith("or time more rounds (--steps N)") for line in err), err
    assert not [line for line in err if "steps=" in line or ".py" in line], err


@pytest.mark.slow
def test_module_entry_point_prints_warnings_in_one_line(user_models, tmp_path):
    # The process as a user runs it, on a machine where timings spread: stderr holds only memsave's one-line
    # warnings, no file paths, no Python source lines, no torch log lines.
    script = (
        "import sys\n"
        "from memsave.measurement import comparison, timing\n"
        "from memsave.cli.main import main\n"
        "comparison.spread_warning = lambda t, where: timing.spread_warning(t, where, threshold=-1)\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    env = dict(os.environ, MEMSAVE_TRACEBACK="", PYTHONPATH=str(user_models))
    env.pop("PYTHONWARNINGS", None)
    r = subprocess.run(
        [sys.executable, "-c", script, "bench", "--steps", "1", "--no-progress", *_CNN],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    lines = [line for line in r.stderr.splitlines() if line.strip() and not line.startswith("USDT:")]
    assert lines and all(line.startswith("memsave: warning: ") for line in lines), r.stderr
    assert not [line for line in lines if ".py" in line or "steps=" in line], r.stderr
    assert "(--steps N)" in lines[0]


def test_help_documents_the_model_and_input_forms(capsys):
    for command in ("bench", "estimate"):
        with pytest.raises(SystemExit) as info:
            main([command, "--help"])
        assert info.value.code == 0
        text = capsys.readouterr().out
        for needle in (
            "MODULE:CALLABLE",
            "tokens:SHAPE:VOCAB",
            "tokens:2,128:50257",
            "--model-kwargs",
            "torchvision.models:resnet18",
            "default_loss",
            "--traceback",
        ):
            assert needle in text, (command, needle)


def test_module_entry_point_fails_in_one_line(tmp_path):
    # The process as a user runs it (same memsave as this test imports), from outside the checkout.
    env = dict(os.environ, MEMSAVE_TRACEBACK="")
    where = subprocess.run(
        [sys.executable, "-c", "import memsave; print(memsave.__file__)"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert Path(where).resolve() == Path(memsave.__file__).resolve()
    r = subprocess.run(
        [sys.executable, "-m", "memsave", "bench", "--model", "no_such_module_xyz:f", "--input", "2,3"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip().splitlines() == [
        "memsave: error: --model 'no_such_module_xyz:f': no module named "
        "'no_such_module_xyz' (is it installed, or in the current directory or "
        "on PYTHONPATH?)"
    ]


@pytest.mark.slow  # a python -m memsave process importing torchvision
def test_estimate_with_a_wrong_input_shape_prints_only_memsaves_error(tmp_path):
    # A shape the model pools down to nothing: fake tensors would log the failing meta kernel's traceback and the CPU
    # profiler its start/stop lines; the user sees memsave's one-line error and nothing else.
    env = dict(os.environ, MEMSAVE_TRACEBACK="")
    env.pop("KINETO_LOG_LEVEL", None)
    argv = ["estimate", "--model", "torchvision.models:squeezenet1_1", "--input", "2,3,8,8", "--device", "cpu"]
    r = subprocess.run(
        [sys.executable, "-m", "memsave", *argv], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 1 and r.stdout == "", r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("memsave: error: estimate: torchvision.models:squeezenet1_1 (input 2x3x8x8 float32)")
    assert "Output size is too small" in lines[0]


# ------------------------------------------------------------------------------------------------ from a wheel
def _check(cmd: List[str], cwd: Path, env: dict, timeout: int = 900) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"{' '.join(cmd)} -> {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


@pytest.mark.slow
def test_cli_from_a_wheel_in_a_fresh_virtualenv(tmp_path):
    """Build a CPU-only wheel, install it into a new virtualenv, run every subcommand from outside the checkout.

    The wheel is built in ``build/wheel-test`` (gitignored; a rerun is an incremental ninja build, ccache helps a
    fresh clone), never in the editable install's ``build/{wheel_tag}``. The virtualenv does not use
    ``--system-site-packages``: the system's site-packages may hold an editable install of memsave whose ``.pth``
    import hook would win over the wheel. Instead a ``.pth`` file in the virtualenv lists the folders holding torch
    and memsave's other dependencies; folders named in a ``.pth`` file are added to ``sys.path`` without running
    their own ``.pth`` files, so the wheel's memsave is the one imported (asserted below).
    """
    import importlib.util

    missing = [
        m for m in ("torchvision", "scikit_build_core", "pybind11", "ninja") if importlib.util.find_spec(m) is None
    ]
    if missing:
        pytest.fail(f"missing {', '.join(missing)}: `bash tools/setup.sh --test` installs them")
    t0 = time.perf_counter()
    dist, outside = tmp_path / "dist", tmp_path / "outside"
    dist.mkdir()
    outside.mkdir()
    assert REPO not in outside.resolve().parents

    # 1. The wheel, CPU kernels only (one build at a time on this machine: the lock tools/setup.sh takes).
    build_dir = REPO / "build" / "wheel-test"
    env = dict(
        os.environ,
        MEMSAVE_CUDA="OFF",
        CCACHE_BASEDIR=str(REPO),
        CCACHE_NOHASHDIR="true",
        CMAKE_BUILD_PARALLEL_LEVEL=os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", "2"),
    )
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "-q",
        "--disable-pip-version-check",
        "--no-build-isolation",
        "--no-deps",
        "-w",
        str(dist),
        f"-Cbuild-dir={build_dir}",
        "-Ccmake.define.MEMSAVE_CUDA=OFF",
        str(REPO),
    ]
    if shutil.which("flock"):
        cmd = ["flock", "/tmp/memsave-build.lock"] + cmd
    _check(cmd, REPO, env, timeout=3600)
    wheels = list(dist.glob("memsave-*.whl"))
    assert len(wheels) == 1, wheels
    t_build = time.perf_counter() - t0

    # 2. A fresh virtualenv with the wheel (no dependencies from an index), then torch & co made visible (after the
    #    install, so that pip does not see the system's memsave).
    venv = tmp_path / "venv"
    clean = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "MEMSAVE_TRACEBACK", "VIRTUAL_ENV")
    }
    clean.update(PYTHONNOUSERSITE="1", PATH=f"{venv / 'bin'}{os.pathsep}{clean.get('PATH', '')}")
    _check([sys.executable, "-m", "venv", str(venv)], outside, clean)
    py = str(venv / "bin" / "python")
    _check(
        [py, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps", str(wheels[0])], outside, clean
    )
    purelib = _check([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], outside, clean).stdout
    import numpy
    import torchvision
    import tqdm

    folders = dict.fromkeys(str(Path(m.__file__).resolve().parents[1]) for m in (torch, numpy, tqdm, torchvision))
    Path(purelib.strip(), "memsave_test_dependencies.pth").write_text("\n".join(folders) + "\n")

    # 3. The wheel's memsave and its compiled extension are the ones imported, not a checkout's.
    where = _check(
        [py, "-c", "import memsave, memsave._C; print(memsave.__file__); print(memsave._C.__file__)"], outside, clean
    ).stdout.split()
    for path in where:
        assert Path(path).resolve().is_relative_to(venv.resolve()), where

    # 4. Every subcommand, from outside the checkout.
    r = _check([py, "-m", "memsave", "info"], outside, clean)
    assert f"memsave {memsave.__version__}" in r.stdout and "CUDA kernels: no" in r.stdout
    assert "memsave::relu" in r.stdout and "CPU" in r.stdout
    r = _check([py, "-m", "memsave", "demo", "--size", "tiny", "--steps", "1", "--device", "cpu"], outside, clean)
    assert "checkpoint:Block" in r.stdout and "eager" in r.stdout
    memsave_cli = [py, "-m", "memsave"]
    bench = "bench --model resnet50 --size tiny --device cpu --steps 1 --no-progress"
    r = _check([*memsave_cli, *bench.split()], outside, clean)
    assert "resnet50 (tiny, batch 2)" in r.stdout and "checkpoint:blocks" in r.stdout
    estimate = "estimate --model torchvision.models:resnet18 --input 8,3,64,64 --device cpu"
    r = _check([*memsave_cli, *estimate.split()], outside, clean)
    assert "torchvision.models:resnet18 (input 8x3x64x64 float32) on cpu" in r.stdout
    rows = {line.split()[0] for line in r.stdout.splitlines()[3:]}
    assert rows == {"eager", "checkpoint:blocks"}, r.stdout

    # 5. The console script, and a failure from the installed package: one line, exit code 2.
    r = subprocess.run(
        [str(venv / "bin" / "memsave"), "bench", "--model", "alexnet"],
        cwd=outside,
        env=clean,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert r.stderr.startswith("memsave: error: unknown model 'alexnet'")
    print(f"wheel built in {t_build:.0f} s; installed and run in {time.perf_counter() - t0 - t_build:.0f} s")
