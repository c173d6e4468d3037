"""Twin stages: the time model pools the timings of stages that compute the same thing.

A shared CPU stalls now and then for tens of milliseconds; a stall inside one block of one timed step used to carry
half of itself into that block's forward time (the median of two steps). Stages with the same module types,
parameter shapes and allocation sizes are twins, and every twin's time is the median of the whole group's samples.
The tests inject the timings, so they hold on any machine.
"""

from __future__ import annotations

import copy
from typing import Any, Dict, List

import pytest
import torch

from helpers import hub
from memsave.recompute.planning.chain import StageModules, build_chain, pooled_medians, split_into_stages
from memsave.recompute.planning.operators import OPERATOR_CLASSES, OperatorClassProfiler
from memsave.recompute.planning.trace import Trace, time_steps, trace_step


def _gpt2_trace(layers: int = 3) -> Any:
    pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = hub.gpt2(layers, 32, heads=4, vocab=128, positions=16)
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(1))
    kwargs = {"input_ids": ids, "labels": ids}
    loss_fn = lambda out: out.loss  # noqa: E731
    return model, kwargs, loss_fn, trace_step(model, (), loss_fn, torch.device("cpu"), kwargs)


def _by_name(stages: List[StageModules]) -> Dict[str, int]:
    return {s.modules[0]: i for i, s in enumerate(stages) if s.modules}


def test_pooled_medians_pool_twins_only() -> None:
    a, b, c = (StageModules("module", [n]) for n in ("h.0", "h.1", "head"))
    b.twin = 0
    glue = StageModules("glue", [])
    got = pooled_medians([[1.0, 1.1], [9.0, 1.2], [3.0, 5.0], []], [a, b, c, glue])
    assert got == pytest.approx([1.15, 1.15, 4.0, 0.0])


def test_the_blocks_of_a_transformer_are_twins_its_embeddings_and_head_are_not() -> None:
    model, _, _, trace = _gpt2_trace()
    stages = split_into_stages(trace, model)
    at = _by_name(stages)
    first = at["transformer.h.0"]
    assert stages[first].twin is None
    assert [stages[at[f"transformer.h.{k}"]].twin for k in (1, 2)] == [first, first]
    assert stages[at["transformer.wte"]].twin is None and stages[at["lm_head"]].twin is None
    assert all(s.twin is None for s in stages if s.kind == "glue")


def test_a_resnet_s_blocks_are_twins_within_a_layer_after_its_downsampling_block() -> None:
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10)
    x = torch.randn(2, 3, 32, 32)
    trace = trace_step(model, (x,), lambda out: out.sum(), torch.device("cpu"), {})
    stages = split_into_stages(trace, model)
    at = _by_name(stages)
    assert stages[at["layer1.1"]].twin == at["layer1.0"]  # no downsampling in resnet18's first layer
    for layer in ("layer2", "layer3", "layer4"):
        assert stages[at[f"{layer}.0"]].twin is None  # strided, with a downsampling branch
        assert stages[at[f"{layer}.1"]].twin is None  # the first plain block of its width


def _stalled(runs: List[Dict[str, Any]], trace: Trace, name: str, seconds: float) -> List[Dict[str, Any]]:
    """The timed steps with the first step's call of module ``name`` ``seconds`` longer (the machine stalled)."""
    runs = copy.deepcopy(runs)
    call = next(c.index for c in trace.calls if c.name == name)
    runs[0]["t_ret"][call] += seconds
    for end in ("t2", "t3"):  # the forward and the step take that much longer too
        runs[0][end] += seconds
    return runs


def test_a_stall_in_one_block_of_one_step_leaves_every_block_s_time_as_it_was() -> None:
    model, kwargs, loss_fn, trace = _gpt2_trace(layers=4)
    runs = time_steps(model, (), loss_fn, len(trace.calls), 2, lambda: None, kwargs)
    calm, stages = build_chain(trace, model, runs)
    stalled, _ = build_chain(trace, model, _stalled(runs, trace, "transformer.h.2", 5.0))
    blocks = [i for i, s in enumerate(stages) if s.modules and s.modules[0].startswith("transformer.h.")]
    assert len(blocks) == 4
    calm_times = [calm.stages[i].fwd_time for i in blocks]
    stalled_times = [stalled.stages[i].fwd_time for i in blocks]
    assert len(set(calm_times)) == 1 and len(set(stalled_times)) == 1  # one number for the four twins
    # Pooled over 8 samples, the stall is one of them: the median moves to a neighbouring sample, never by 2.5 s.
    assert stalled_times[0] < 1.0
    names = {stages[i].modules[0] for i in blocks}
    samples = sorted(r["t_ret"][c.index] - r["t_call"][c.index] for r in runs for c in trace.calls if c.name in names)
    assert samples[0] <= stalled_times[0] <= samples[-1]


def test_the_operator_class_profile_pools_twins_too() -> None:
    model, kwargs, loss_fn, trace = _gpt2_trace()
    stages = split_into_stages(trace, model)
    profiler = OperatorClassProfiler(model, stages, OPERATOR_CLASSES, lambda: None)
    time_steps(model, (), loss_fn, len(trace.calls), 2, lambda: None, kwargs, forward_context=profiler.forward)
    got = profiler.result()
    at = _by_name(stages)
    blocks = [at[f"transformer.h.{k}"] for k in range(3)]
    for c in ("matmul", "attention"):
        assert len({got.classes[i][c] for i in blocks}) == 1 and got.classes[blocks[0]][c][1] > 0
        assert len({got.class_tails[i].get(c, 0.0) for i in blocks}) == 1
    assert len({got.tails[i] for i in blocks}) == 1
