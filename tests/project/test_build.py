"""The build layer: build_info, the torch-version guard, and `python -m memsave info`."""

import importlib
import os
import subprocess
import sys

import pytest
import torch

import memsave
from memsave import extension as _build


def test_build_info_names_the_torch_it_was_built_against():
    info = memsave.build_info()
    assert info["torch_version"] == torch.__version__
    assert info["version"] == memsave.__version__
    assert isinstance(info["cuda"], bool)
    if info["cuda"]:
        assert info["cuda_archs"], "a CUDA build must record its architectures"
        assert info["cuda_runtime_version"] >= 11000


def test_cpu_kernels_use_torchs_openmp_threads_when_torch_does():
    # at::parallel_for compiled without -fopenmp runs every CPU kernel on one thread, silently.
    torch_uses_openmp = "parallel backend: OpenMP" in torch.__config__.parallel_info()
    assert memsave.build_info()["openmp"] == torch_uses_openmp


def test_cuda_kernels_are_built_when_torch_has_cuda_and_nvcc_is_found():
    import shutil

    if torch.version.cuda is None or shutil.which("nvcc") is None:
        pytest.skip("CPU-only torch or no nvcc: the CPU part alone is built")
    if os.environ.get("MEMSAVE_CUDA", "AUTO").upper() == "OFF":
        pytest.skip("built with MEMSAVE_CUDA=OFF (as tools/compat.sh can): the CPU part alone, on purpose")
    assert memsave.build_info()["cuda"], "MEMSAVE_CUDA=AUTO must build the CUDA kernels here"
    assert "CUDA" in memsave.dispatch_table()["memsave::relu"]


def test_import_under_another_torch_raises_importerror_naming_both_versions(monkeypatch):
    config = importlib.import_module("memsave._build_config")
    monkeypatch.setattr(config, "TORCH_VERSION", "1.0.0+fake")
    with pytest.raises(ImportError) as info:
        _build.load_extension()
    message = str(info.value)
    assert "1.0.0+fake" in message and torch.__version__ in message
    assert "--no-build-isolation" in message


def test_every_operator_has_cpu_fake_and_autograd_kernels():
    table = memsave.dispatch_table()
    assert "memsave::relu" in table
    for name, keys in table.items():
        assert "CPU" in keys and "Meta" in keys, f"{name} lacks a CPU or fake kernel: {keys}"
        if memsave.build_info()["cuda"]:
            assert "CUDA" in keys, f"{name} has no CUDA kernel in a CUDA build"


def test_info_command_prints_build_facts_and_dispatch_keys():
    out = subprocess.run([sys.executable, "-m", "memsave", "info"], capture_output=True, text=True, check=True).stdout
    assert f"built against torch {torch.__version__}" in out
    assert "memsave::relu" in out and "CPU" in out
