"""The one CPU allocation-event reading rule (memsave.measurement.allocator.read_cpu_events), used by measure,
compare, estimate's checks and the planner's trace: only frees of blocks allocated within the run count; and no
cyclic garbage collection runs inside a measured call."""

from __future__ import annotations

import gc

import pytest
import torch

from memsave.measurement.allocator import cpu_allocation_profiler, cpu_memory_stats, read_cpu_events
from memsave.recompute.planning.trace import Trace


def test_frees_of_blocks_older_than_the_run_are_not_counted() -> None:
    old = [torch.ones(1 << 18)]  # 1 MiB allocated before the run

    def run() -> torch.Tensor:
        old.pop()  # frees the old block during the run
        return torch.ones(1 << 16)  # 256 KiB made and kept

    with cpu_allocation_profiler() as prof:
        kept = run()
    deltas = read_cpu_events(prof).deltas
    # Summing every free event (the rule the planner used to have) would subtract the old megabyte too.
    assert sum(d for _, d in deltas) == kept.untyped_storage().nbytes()
    assert all(d > 0 for _, d in deltas)  # the only free in the run is of a block from before it


def test_frees_of_blocks_made_in_the_run_are_counted_and_the_peak_is_relative_to_the_start() -> None:
    def run() -> None:
        a = torch.ones(1 << 18)  # 1 MiB
        b = a + a  # 1 MiB more: the peak
        del a, b

    stats = cpu_memory_stats(run)
    assert stats.net_bytes == 0
    assert stats.peak_bytes == 2 * (1 << 20)


def test_marker_times_come_from_the_same_events() -> None:
    with cpu_allocation_profiler() as prof:
        with torch.autograd.profiler.record_function("memsave_marker_0"):
            pass
        x = torch.ones(1024)
        with torch.autograd.profiler.record_function("memsave_marker_1"):
            pass
    events = read_cpu_events(prof, marker_prefix="memsave_marker_")
    assert set(events.markers) == {"memsave_marker_0", "memsave_marker_1"}
    t_alloc = [t for t, d in events.deltas if d == x.untyped_storage().nbytes()]
    assert events.markers["memsave_marker_0"] < t_alloc[0] < events.markers["memsave_marker_1"]


def test_the_planner_trace_reads_cpu_memory_by_the_same_rule() -> None:
    old = [torch.ones(1 << 18)]
    tr = Trace(torch.device("cpu"))
    with cpu_allocation_profiler() as prof:
        tr.marker(("start",))
        old.pop()
        kept = torch.ones(1 << 16)
        tr.marker(("end",))
    tr.finish_cpu(prof)
    assert tr.allocator_peak(0, len(tr.events)) == kept.untyped_storage().nbytes()


def test_no_cyclic_collection_runs_inside_a_measurement_and_the_collector_is_left_as_it_was() -> None:
    collections: list = []

    def note(phase: str, info: dict) -> None:
        if phase == "start":
            collections.append(info["generation"])

    during: list = []  # collections seen by the end of each churn call

    def churn() -> torch.Tensor:
        collections.clear()
        for _ in range(5000):  # cyclic garbage enough to trigger generation-0 collections when enabled
            a: list = []
            a.append(a)
        during.append(len(collections))
        return torch.ones(1024)

    gc.callbacks.append(note)
    was_on = gc.isenabled()
    try:
        gc.enable()
        stats = cpu_memory_stats(churn)
        assert during[-1] == 0 and gc.isenabled()
        assert stats.net_bytes == 4096
        churn()
        assert during[-1] > 0, "the collector runs in the same call outside a measurement (else this checks nothing)"
        gc.disable()
        cpu_memory_stats(churn)
        assert not gc.isenabled()  # a collector the caller turned off stays off
        gc.enable()
        with pytest.raises(RuntimeError, match="boom"):
            cpu_memory_stats(lambda: (_ for _ in ()).throw(RuntimeError("boom")))
        assert gc.isenabled()  # and back on after a failing call
    finally:
        gc.callbacks.remove(note)
        if was_on:
            gc.enable()
        else:
            gc.disable()
