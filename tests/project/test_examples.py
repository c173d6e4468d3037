"""The runnable examples and ``python -m memsave demo``, at tiny sizes."""

import os
import subprocess
import sys

import pytest

from helpers import ROOT


def _run(*args: str) -> str:
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    proc = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-3000:]}"
    return proc.stdout


def test_unet_example():
    out = _run("examples/unet.py", "--size", "tiny", "--device", "cpu", "--steps", "1")
    # The tutorial's reentrant checkpointing dies on the input image that does not require grad ...
    assert "reentrant: RuntimeError: element 0 of tensors does not require grad" in out
    # ... memsave's gives eager's gradients and BatchNorm statistics, with fewer activations.
    assert "bitwise equal to eager: True" in out
    assert "activations kept:" in out


def test_vgg16_example():
    out = _run("examples/vgg16_sequential.py", "--size", "tiny", "--device", "cpu", "--steps", "1")
    lines = {line.split("  ")[0]: line for line in out.splitlines()}
    for name in ("eager", "torch checkpoint_sequential(2)", "memsave checkpoint_sequential(2)"):
        assert name in lines, out
        assert lines[name].rstrip().endswith(" 0"), f"gradient differs from eager: {lines[name]}"
    assert "14,222 MB -> 10,550 MB" in out


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


@pytest.mark.slow
def test_hf_trainer_example():
    pytest.importorskip("transformers")
    out = _run("examples/hf_trainer.py", "--size", "tiny", "--steps", "2")
    assert "peak" in out and "activations" in out and "generate after training" in out, out


@pytest.mark.slow
def test_timm_train_example():
    pytest.importorskip("timm")
    out = _run("examples/timm_train.py", "--size", "tiny", "--steps", "1")
    assert "largest step peak:" in out, out
