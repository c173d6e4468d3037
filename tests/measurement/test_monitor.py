"""memsave.MemoryMonitor: per-step allocated and peak memory with the peak reset each step, into a tqdm postfix or a
logger (CPU via the live-tensor tracker, CUDA via the allocator statistics), and the CUDA snapshot helper."""

from __future__ import annotations

import io
import logging

import pytest
import torch
from torch import nn

from memsave.measurement.monitor import MemoryMonitor, StepMemory, cuda_memory_snapshot

KIB4 = 4096  # bytes of torch.ones(1024)


def test_cpu_steps_record_live_bytes_and_reset_the_peak():
    kept = []
    with MemoryMonitor(device="cpu") as monitor:
        a = torch.ones(1024)  # 4 KiB, kept
        b = torch.ones(4096)  # 16 KiB, dropped within the step
        del b
        s1 = monitor.step()
        kept.append(a)
        c = torch.ones(2048)  # 8 KiB, dropped within the step
        del c
        s2 = monitor.step(loss=0.5)
    assert (s1.step, s1.allocated_bytes, s1.peak_bytes) == (1, KIB4, 5 * KIB4)
    # The peak was reset after step 1: step 2 saw a (4 KiB) and c (8 KiB) together.
    assert (s2.step, s2.allocated_bytes, s2.peak_bytes, s2.extra) == (2, KIB4, 3 * KIB4, {"loss": 0.5})
    assert s1.reserved_bytes is None and monitor.history == [s1, s2] and monitor.max_peak_bytes == 5 * KIB4
    # Stopped: tensors made now are not seen, and reading requires a running monitor.
    torch.ones(10_000)
    with pytest.raises(RuntimeError, match="not started"):
        monitor.current()


def test_cpu_model_bytes_are_counted_and_training_loop_iterates():
    torch.manual_seed(0)
    model = nn.Linear(64, 64)
    weights = (64 * 64 + 64) * 4
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    monitor = MemoryMonitor(device="cpu", model=model)
    batches = [torch.randn(8, 64) for _ in range(3)]
    for x in monitor.iterate(batches):
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
    assert [s.step for s in monitor.history] == [1, 2, 3]
    # After each step nothing but the weights is alive (zero_grad sets grads to None).
    assert all(s.allocated_bytes == weights for s in monitor.history)
    # During the step: the output, the gradients (as large as the weights) and small temporaries.
    assert all(s.peak_bytes >= 2 * weights for s in monitor.history)
    assert not monitor._active  # iterate() stopped what it started


def test_tqdm_postfix_and_logger(caplog):
    tqdm = pytest.importorskip("tqdm").tqdm
    sink = io.StringIO()
    bar = tqdm(total=2, file=sink, mininterval=0)
    monitor = MemoryMonitor(device="cpu", pbar=bar, logger="memsave.test", log_every=2)
    with caplog.at_level(logging.INFO, logger="memsave.test"), monitor:
        keep = torch.ones(1024)
        monitor.step(loss=1.25)
        bar.update(1)
        monitor.step()
        bar.update(1)
    bar.close()
    assert "loss=1.25" in sink.getvalue() and "mem=4.00 KiB" in sink.getvalue() and "peak=" in sink.getvalue()
    # log_every=2: one line, for step 2.
    assert [r.getMessage() for r in caplog.records] == ["[cpu] step 2: live tensors 4.00 KiB, peak 4.00 KiB"]
    assert monitor.postfix(x=1) == {"x": 1, "mem": "4.00 KiB", "peak": "4.00 KiB"}
    del keep


def test_monitor_bad_arguments():
    with pytest.raises(ValueError, match="'cpu' or 'cuda'"):
        MemoryMonitor(device="meta")
    with pytest.raises(ValueError, match="log_every"):
        MemoryMonitor(device="cpu", log_every=0)
    with pytest.raises(TypeError, match="tqdm progress bar"):
        MemoryMonitor(device="cpu", pbar=object())
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            MemoryMonitor(device="cuda")
        with pytest.raises(RuntimeError, match="needs a CUDA device"), cuda_memory_snapshot("never.pickle"):
            pass


@pytest.mark.cuda
def test_cuda_steps_use_allocator_statistics(tmp_path):
    dev = torch.device("cuda")
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated(dev)
    with MemoryMonitor(device=dev) as monitor:
        a = torch.ones(1 << 20, device=dev)  # 4 MiB kept
        b = torch.ones(4 << 20, device=dev)  # 16 MiB dropped
        del b
        s1 = monitor.step()
        s2 = monitor.step()
    assert isinstance(s1, StepMemory) and s1.reserved_bytes >= s1.allocated_bytes
    assert s1.allocated_bytes - base == 4 << 20 and s1.peak_bytes - base == 20 << 20
    assert s2.peak_bytes == s2.allocated_bytes  # reset after step 1, nothing allocated since
    path = tmp_path / "snap.pickle"
    with cuda_memory_snapshot(path):
        (torch.ones(1024, device=dev) * 2).sum()
    assert path.stat().st_size > 0
    del a
