"""Every file in examples/ runs in the suite at a tiny size, and ``python -m memsave demo``.

Each ``examples/*.py`` runs as a user runs it: ``python examples/<name>.py`` with its tiny-size flags (:data:`TINY`),
from a directory outside the repository, so an example that needs the repository (``benchmarks/``, ``tests/``) fails
here. ``examples/*.ipynb`` run in tests/project/test_notebook.py. No example imports ``benchmarks`` or ``tests``.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable, Dict, List

import pytest

from helpers import ROOT

EXAMPLES = ROOT / "examples"

#: The command-line arguments that run each example at its tiny size (documented in each example's docstring).
TINY: Dict[str, List[str]] = {
    "amp_accumulate.py": ["--size", "tiny", "--device", "cpu", "--steps", "1"],
    "hf_trainer.py": ["--size", "tiny", "--steps", "2"],
    "timm_train.py": ["--size", "tiny", "--steps", "1"],
    "unet.py": ["--size", "tiny", "--device", "cpu", "--steps", "1"],
    "vgg16_sequential.py": ["--size", "tiny", "--device", "cpu", "--steps", "1"],
}

#: The packages an example needs besides memsave and torch (the test skips without them).
NEEDS: Dict[str, str] = {"hf_trainer.py": "transformers", "timm_train.py": "timm"}

#: The notebooks, run headless by tests/project/test_notebook.py.
NOTEBOOKS = {"compare_memory.ipynb"}

#: Top-level modules that exist only in the repository checkout (tests/conftest.py puts tests/ on sys.path, hence
#: ``helpers``): an installed memsave has none of them.
REPO_ONLY = {"benchmarks", "tests", "helpers", "conftest"}


def _example_files() -> List[Path]:
    return sorted(p for p in EXAMPLES.iterdir() if p.is_file() and not p.name.startswith("."))


def _run(*args: str, cwd: Path = ROOT) -> str:
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    proc = subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-3000:]}"
    return proc.stdout


def _check_amp_accumulate(out: str) -> None:
    for name in ("float32, one batch of K*b", "autocast, K x b", "+ memsave checkpoint, K x b"):
        assert name in out, out
    assert "last vs first: peak" in out, out
    windows = [line for line in out.splitlines() if line.startswith("window ")]
    assert len(windows) == 2 and all(", stepped," in line for line in windows), out


def _check_hf_trainer(out: str) -> None:
    assert "peak" in out and "activations" in out and "generate after training" in out, out


def _check_timm_train(out: str) -> None:
    assert "largest step peak:" in out, out


def _check_unet(out: str) -> None:
    # The tutorial's reentrant checkpointing dies on the input image that does not require grad ...
    assert "reentrant: RuntimeError: element 0 of tensors does not require grad" in out
    # ... memsave's gives eager's gradients and BatchNorm statistics, with fewer activations.
    assert "bitwise equal to eager: True" in out
    assert "activations kept:" in out


def _check_vgg16_sequential(out: str) -> None:
    lines = {line.split("  ")[0]: line for line in out.splitlines()}
    for name in ("eager", "torch checkpoint_sequential(2)", "memsave checkpoint_sequential(2)"):
        assert name in lines, out
        assert lines[name].rstrip().endswith(" 0"), f"gradient differs from eager: {lines[name]}"
    assert "14,222 MB -> 10,550 MB" in out


#: What each example's output must show.
CHECKS: Dict[str, Callable[[str], None]] = {
    "amp_accumulate.py": _check_amp_accumulate,
    "hf_trainer.py": _check_hf_trainer,
    "timm_train.py": _check_timm_train,
    "unet.py": _check_unet,
    "vgg16_sequential.py": _check_vgg16_sequential,
}


def test_every_example_file_runs_in_the_suite():
    """A new example needs its tiny command line here (or, for a notebook, in test_notebook.py)."""
    names = {p.name for p in _example_files()}
    scripts = {n for n in names if n.endswith(".py")}
    assert scripts == set(TINY) == set(CHECKS), f"examples/*.py without a tiny run here: {sorted(scripts - set(TINY))}"
    assert names - scripts == NOTEBOOKS, f"examples/ files no test runs: {sorted(names - scripts - NOTEBOOKS)}"


# Each example is a subprocess that builds and trains a model: slow by nature (25 s for amp_accumulate on 2 loaded
# CPU cores), so they run in the full suite, not the fast loop.
@pytest.mark.slow
@pytest.mark.parametrize("name", [p.name for p in _example_files() if p.suffix == ".py"])
def test_example_runs_at_tiny_size(name: str, tmp_path: Path):
    if name in NEEDS:
        pytest.importorskip(NEEDS[name])
    out = _run(str(EXAMPLES / name), *TINY[name], cwd=tmp_path)  # outside the repository, as a user runs it
    CHECKS[name](out)


def _imported_modules(path: Path) -> List[str]:
    """The modules ``path`` imports (``import a.b``, ``from a.b import c``, ``importlib.import_module("a.b")``);
    for a notebook, those of its code cells (IPython's ``%``/``!`` lines dropped)."""
    if path.suffix == ".ipynb":
        cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
        sources = ["".join(c["source"]) for c in cells]
        source = "\n".join(
            "\n".join(line for line in s.splitlines() if not line.lstrip().startswith(("%", "!"))) for s in sources
        )
    else:
        source = path.read_text()
    modules = []
    for node in ast.walk(ast.parse(source, filename=str(path))):
        if isinstance(node, ast.Import):
            modules += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            modules.append(node.module)
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", None)) in ("import_module", "__import__")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            modules.append(node.args[0].value)
    return modules


@pytest.mark.parametrize("name", [p.name for p in _example_files() if p.suffix in (".py", ".ipynb")])
def test_example_imports_nothing_from_the_repository(name: str):
    """Examples are for users of an installed memsave: no ``benchmarks``/``tests`` imports, no sys.path edits."""
    path = EXAMPLES / name
    repo_only = [m for m in _imported_modules(path) if m.split(".")[0] in REPO_ONLY]
    assert not repo_only, f"examples/{name} imports {repo_only}: use memsave's public API instead"
    assert "sys.path" not in path.read_text(), f"examples/{name} edits sys.path to reach the repository"


def test_import_check_sees_a_repository_import(tmp_path: Path):
    script = tmp_path / "example.py"
    script.write_text(
        "import torch\nfrom benchmarks.strategies_amp import X\nimport tests.helpers\n"
        "import importlib\nimportlib.import_module('helpers.models')\n"
    )
    assert [m for m in _imported_modules(script) if m.split(".")[0] in REPO_ONLY] == [
        "benchmarks.strategies_amp",
        "tests.helpers",
        "helpers.models",
    ]


def test_demo(capsys):
    from memsave.cli import demo

    assert demo.main(["--size", "tiny", "--steps", "1", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line[:1].isalpha() and "  " in line}
    assert {"eager", "torch_checkpoint:Block", "checkpoint:Block", "checkpoint_sequential:2"} <= set(rows), out
    # columns: strategy, peak (2 tokens), activations (2), ratio, grad diff, BN stats
    for name in ("checkpoint:Block", "checkpoint_sequential:2"):
        assert rows[name][-2] == "0" and rows[name][-1] == "yes", rows[name]
    # torch.utils.checkpoint updates BatchNorm statistics twice: the demo shows it.
    assert rows["torch_checkpoint:Block"][-1] == "NO"


@pytest.mark.skipif(sys.platform != "linux", reason="timing-free smoke test of the module entry point")
def test_demo_via_module_entry_point():
    out = _run("-m", "memsave", "demo", "--size", "tiny", "--steps", "1", "--device", "cpu")
    assert "checkpoint:Block" in out
