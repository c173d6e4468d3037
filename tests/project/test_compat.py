"""The supported torch range: one statement of it, the C++ standard read from torch, the compat module's feature
checks, and the compatibility table tools/compat.sh writes."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from memsave.common import compat

ROOT = Path(__file__).resolve().parents[2]


def _load(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_running_torch_is_within_the_supported_range():
    assert compat.torch_version() >= compat.TORCH_FLOOR
    major, minor = compat.TORCH_FLOOR
    assert f"torch>={major}.{minor}" == compat.SUPPORTED_TORCH


def test_pyproject_readme_cmake_and_docs_state_the_same_range():
    major, minor = compat.TORCH_FLOOR
    floor = f"{major}.{minor}"
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert f'"torch>={floor}"' in pyproject
    python_floor = compat.SUPPORTED_PYTHON.split(">=")[1]
    assert f'requires-python = ">={python_floor}"' in pyproject
    assert f'python_version = "{python_floor}"' in pyproject  # mypy checks the oldest supported Python
    assert f"**torch >= {floor}, Python >= {python_floor}**" in (ROOT / "README.md").read_text()
    assert f"**torch >= {floor} on Python >= {python_floor}**" in (ROOT / "docs" / "compatibility.md").read_text()
    assert f'VERSION_LESS "{floor}"' in (ROOT / "CMakeLists.txt").read_text()


def test_no_module_outside_compat_compares_torch_versions():
    package = ROOT / "python" / "memsave"
    pattern = re.compile(r"torch\.__version__\s*[<>]|__version__\.split|version\.parse|TorchVersion")
    offenders = [
        str(p.relative_to(package))
        for p in package.rglob("*.py")
        if p.name != "compat.py" and pattern.search(p.read_text())
    ]
    assert offenders == []


def test_info_prints_the_supported_range():
    out = subprocess.run([sys.executable, "-m", "memsave", "info"], capture_output=True, text=True, check=True).stdout
    assert f"supported: {compat.SUPPORTED_TORCH}, {compat.SUPPORTED_PYTHON}" in out


@pytest.mark.parametrize(
    ("extension_source", "cmake_config", "expected"),
    [
        ('extra = ["-std=c++17"]', "target_compile_features(torch INTERFACE cxx_std_17)", 17),
        ('extra = ["-std=c++20"]\nold = "-std=c++17"', "target_compile_features(torch INTERFACE cxx_std_20)", 20),
        ("", "", 17),  # neither names one: the fallback
    ],
)
def test_cxx_standard_is_the_highest_torch_names(tmp_path, extension_source, cmake_config, expected):
    reader = _load(ROOT / "cmake" / "torch_cxx_standard.py")
    (tmp_path / "utils").mkdir()
    (tmp_path / "share" / "cmake" / "Torch").mkdir(parents=True)
    (tmp_path / "utils" / "cpp_extension.py").write_text(extension_source)
    (tmp_path / "share" / "cmake" / "Torch" / "TorchConfig.cmake").write_text(cmake_config)
    assert max(reader.named_standards(tmp_path), default=reader.FALLBACK) == expected


def test_cxx_standard_of_the_installed_torch_matches_its_extension_builder():
    reader = _load(ROOT / "cmake" / "torch_cxx_standard.py")
    flags = Path(torch.__file__).parent / "utils" / "cpp_extension.py"
    named = {int(n) for n in re.findall(r"-std=c\+\+(\d+)", flags.read_text())}
    assert max(reader.named_standards(reader.torch_dir())) == max(named)


def test_a_missing_internal_raises_naming_it_and_the_range(monkeypatch):
    import torch._functorch.config as functorch_config

    monkeypatch.delattr(functorch_config, "activation_memory_budget", raising=False)
    with pytest.raises(RuntimeError, match=r"activation_memory_budget.*torch>="):
        compat.partitioner_budget(0.5)
    assert compat.partitioner_budget(None).__enter__() is None  # no budget asked: nothing to check


def test_compile_backend_without_torchs_wrapper_raises(monkeypatch):
    monkeypatch.delattr(torch, "_TorchCompileInductorWrapper")
    with pytest.raises(RuntimeError, match="_TorchCompileInductorWrapper"):
        compat.compile_backend("inductor", None, None, None)


def test_native_ops_are_found_by_feature_not_version(monkeypatch):
    monkeypatch.delattr(torch.nn.functional, "linear_cross_entropy", raising=False)
    assert compat.native_linear_cross_entropy() is None
    monkeypatch.setattr(torch.nn.functional, "rms_norm", lambda *a, **k: None)
    assert compat.native_rms_norm() is torch.nn.functional.rms_norm


def test_compat_table_replaces_a_versions_row_and_keeps_the_others(tmp_path):
    table = _load(ROOT / "tools" / "compat_table.py")
    doc = tmp_path / "compatibility.md"
    doc.write_text(f"intro\n{table.BEGIN}\n{table.END}\nafter\n")
    rows = {
        "2.15.0+cu132": "| 2.15.0+cu132 | 3.11.7 | AUTO | ok | 10 passed in 1.0s | 20 | d |",
        "2.11.0+cu130": "| 2.11.0+cu130 | 3.11.7 | AUTO | ok | 9 passed, 1 failed in 1.0s | 19 | d |",
    }
    text = doc.read_text()
    for row in rows.values():
        text = table.merge(text, row)
    again = "| 2.15.0+cu132 | 3.11.7 | AUTO | failed (rc 1) | not run | 3 | d |"
    text = table.merge(text, again)
    body = text.split(table.BEGIN)[1].split(table.END)[0]
    assert body.count("2.15.0+cu132") == 1 and again in body
    assert rows["2.11.0+cu130"] in body
    assert body.index("2.11.0") < body.index("2.15.0")  # sorted by release
    assert text.startswith("intro\n") and text.endswith("after\n")
    with pytest.raises(SystemExit, match="compat-table"):
        table.merge("no table here", again)


def test_flops_over_a_backward_are_counted_through_compat_only():
    # torch 2.15's FlopCounterMode breaks a selective region's recompute when it is active over backward.
    offenders = [
        str(p.relative_to(ROOT))
        for folder in ("python", "benchmarks", "tests", "examples")
        for p in (ROOT / folder).rglob("*.py")
        if p.name not in ("compat.py", "test_compat.py") and "FlopCounterMode(" in p.read_text()
    ]
    assert offenders == []


def test_count_flops_counts_a_selective_recompute_without_breaking_it():
    from torch import nn

    import memsave

    torch.manual_seed(0)
    block = nn.Sequential(nn.LayerNorm(8), nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8))
    x = torch.randn(4, 8, requires_grad=True)
    y = memsave.checkpoint(block, x, context_fn=memsave.selective("matmul"))
    with compat.count_flops() as flops:
        y.sum().backward()
    # Backward's own products only (the two Linears are kept, not recomputed): 2 x (grad input + grad weight).
    assert flops.total == 2 * (2 * 4 * 16 * 8) * 2
