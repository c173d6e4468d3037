"""Selective plans: the planner chooses per segment among keep, recompute whole and selective recompute (keep the
outputs of matmul / conv / attention operators, recompute the rest).

On a Hugging Face GPT-2 (4 layers, d 256, 4 x 256 tokens, dropout 0.1) and a timm ViT (6 blocks, d 192, batch 32 of
64 x 64 images): the model is profiled once (bytes from the allocation log, deterministic) and the search is given
*injected* costs instead of this machine's timings (each stage's forward time proportional to its bytes, backward
twice that, a selective variant recomputing what its kept classes leave: 5% when it keeps the matrix products and
attention), so the choice it makes does not depend on how fast or loaded the machine is. At a budget halfway
between per-block checkpoint's measured peak and eager's, the selective plan's measured peak meets the budget with at
most half the recompute FLOPs (``compat.count_flops`` over backward, minus eager's backward) of the module-level plan at
the same budget, and its gradients are bitwise eager's. What the live planner chooses from measured timings is a
benchmark claim (benchmarks/frontier.py, its recompute-FLOP columns). Plus: ``selective=False`` gives module-level
plans, the summary and JSON show what each region keeps, older JSON loads, bad arguments are rejected, the binding
takes operator-class sets, selective plans fit every budget module-level ones fit, and selective variants price their
dispatch overhead.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Callable, Dict, List, Tuple

import pytest
import torch
from torch import nn

import memsave
from helpers import hub
from memsave._C import planner_simulate, planner_solve
from memsave.common import compat
from memsave.recompute.planning.chain import Chain, Stage
from memsave.recompute.selective import OPERATOR_CLASSES


def _gpt2() -> Tuple[nn.Module, torch.Tensor, Callable[[Any], torch.Tensor]]:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        n_layer=4, n_embd=256, n_head=4, n_positions=256, vocab_size=512, bos_token_id=0, eos_token_id=0
    )
    model = transformers.GPT2LMHeadModel(cfg)
    return model, torch.randint(0, 512, (4, 256)), lambda out: out.logits.float().sum()


def _vit() -> Tuple[nn.Module, torch.Tensor, Callable[[Any], torch.Tensor]]:
    vt = pytest.importorskip("timm.models.vision_transformer")
    torch.manual_seed(0)
    # No dropout here (GPT-2 keeps its own, for the RNG): each dropout adds cheap operators a selective region
    # recomputes, which with their dispatch overhead made whole regions as cheap at this width.
    model = vt.VisionTransformer(img_size=64, patch_size=8, embed_dim=192, depth=6, num_heads=3, num_classes=10)
    return model, torch.randn(32, 3, 64, 64), lambda out: out.float().sum()


MODELS = {"gpt2": _gpt2, "vit": _vit}


def _step(model: nn.Module, x: torch.Tensor, loss_fn: Callable[[Any], torch.Tensor]) -> List[torch.Tensor]:
    """One seeded training step: the parameters' gradients."""
    for p in model.parameters():
        p.grad = None
    torch.manual_seed(123)
    loss_fn(model(x)).backward()
    grads = [p.grad.clone() for p in model.parameters()]
    for p in model.parameters():
        p.grad = None
    return grads


def _backward_flops(model: nn.Module, x: torch.Tensor, loss_fn: Callable[[Any], torch.Tensor]) -> int:
    """FLOPs of one backward (recompute included), counted by torch's formulas (compat.count_flops)."""
    torch.manual_seed(123)
    loss = loss_fn(model(x))
    with compat.count_flops() as counter:
        loss.backward()
    for p in model.parameters():
        p.grad = None
    return counter.total


# Injected costs: the share of a stage's forward work in each operator class (matrix products and attention are
# nearly all of a transformer block's FLOPs); what a selective variant keeps is not recomputed.
# Every other product keeps the larger half of a block's matmul work (GPT-2: 7 of 12 units, QKV and the MLP's first).
_SHARE = {"matmul": 0.8, "alternate_matmul": 0.45, "attention": 0.15, "conv": 0.8}


def _inject_costs(prof: Any) -> None:
    """Replace the profile's measured times by costs that depend on its (deterministic) bytes only."""
    from memsave.recompute.planning.operators import split_operator_classes

    chain = prof.chain
    for st, met in zip(chain.stages, prof.classes_met):
        st.fwd_time = 1e-9 * (st.saved_bytes + st.output_bytes) + 1e-6
        st.bwd_time = 2 * st.fwd_time
        st.tail_time, st.selective_tail_time = 0.0, []  # no early stop in the injected costs
        for k, variant in enumerate(chain.operator_classes[: len(st.selective_fwd_time)]):
            kept = sum(_SHARE[c] for c in split_operator_classes(variant) if c in met)
            st.selective_fwd_time[k] = st.fwd_time * max(0.05, 1.0 - kept)


@pytest.fixture(scope="module", params=sorted(MODELS))
def planned(request: pytest.FixtureRequest) -> Dict[str, Any]:
    """Both plans of one model at the halfway budget (searched on injected costs), and the eager references."""
    from memsave.recompute.planning import profile, search

    model, x, loss_fn = MODELS[request.param]()
    eager_peak = memsave.measure(model, x, loss_fn=loss_fn, steps=1, warmup=0).peak_bytes
    memsave.wrap(model)
    block_peak = memsave.measure(model, x, loss_fn=loss_fn, steps=1, warmup=0).peak_bytes
    memsave.unwrap(model)
    assert block_peak < 0.7 * eager_peak  # activations dominate at these sizes
    budget = (eager_peak + block_peak) // 2

    def measure(p: memsave.Plan) -> int:
        memsave.wrap(model, p)
        try:
            return memsave.measure(model, x, loss_fn=loss_fn, steps=1, warmup=0).peak_bytes
        finally:
            memsave.unwrap(model)

    prof = profile(model, x, loss_fn=loss_fn, timing_steps=1)
    _inject_costs(prof)
    selective = search(prof, budget, measure=measure)
    module_level = search(dataclasses.replace(prof, chain=prof.chain.module_level()), budget, measure=measure)
    return {
        "name": request.param,
        "model": model,
        "x": x,
        "loss_fn": loss_fn,
        "budget": budget,
        "eager_peak": eager_peak,
        "module_level": module_level,
        "selective": selective,
        "eager_grads": _step(model, x, loss_fn),
        "eager_flops": _backward_flops(model, x, loss_fn),
    }


@pytest.mark.slow
def test_selective_plan_meets_the_budget_with_at_most_half_the_recompute_flops(planned: Dict[str, Any]) -> None:
    model, x, loss_fn, budget = planned["model"], planned["x"], planned["loss_fn"], planned["budget"]
    recompute_flops = {}
    for kind in ("module_level", "selective"):
        p = planned[kind]
        assert p.measured_peak_bytes is not None and p.measured_peak_bytes <= budget, (kind, p.summary())
        memsave.wrap(model, p)
        try:
            measured = memsave.measure(model, x, loss_fn=loss_fn, steps=1, warmup=0).peak_bytes
            recompute_flops[kind] = _backward_flops(model, x, loss_fn) - planned["eager_flops"]
            grads = _step(model, x, loss_fn)
        finally:
            memsave.unwrap(model)
        assert measured <= budget, (kind, measured, budget)
        assert all(torch.equal(a, b) for a, b in zip(grads, planned["eager_grads"])), kind
    sel = planned["selective"]
    assert any(sel.selective), sel.summary()  # at least one region is selective
    assert recompute_flops["module_level"] > 0
    assert recompute_flops["selective"] <= recompute_flops["module_level"] / 2, (recompute_flops, sel.summary())
    assert sel.predicted_extra_seconds < planned["module_level"].predicted_extra_seconds


@pytest.mark.slow
def test_selective_false_gives_module_level_plans(planned: Dict[str, Any]) -> None:
    p = planned["module_level"]
    assert p.chain.operator_classes == [] and not any(p.selective)
    assert all(not st.selective_fwd_time for st in p.chain.stages)
    assert "selective #" not in p.summary()


@pytest.mark.slow
def test_summary_and_json_show_what_each_region_keeps(planned: Dict[str, Any]) -> None:
    p = planned["selective"]
    assert len(p.selective) == len(p.segments)
    text = p.summary()
    for k, (_b, _e, rec) in enumerate(p.segments):
        assert not p.keeps(k) or rec  # only checkpointed segments keep operator outputs
        if p.keeps(k):
            assert f"(keeps {'+'.join(p.keeps(k))})" in text
            assert set(p.keeps(k)) <= set(OPERATOR_CLASSES)
    q = memsave.Plan.from_json(p.to_json())
    assert q == p and q.selective == p.selective and q.chain.operator_classes == p.chain.operator_classes
    # A plan written by memsave 0.3 or earlier names the operator classes "policies": it loads the same.
    d = json.loads(p.to_json())
    d["chain"]["policies"] = d["chain"].pop("operator_classes")
    assert memsave.Plan.from_json(json.dumps(d)) == p
    # A plan written before selective plans existed (no selective fields anywhere) still loads: regions whole.
    del d["selective"]
    del d["chain"]["policies"]
    for st in d["chain"]["stages"]:
        for key in ("selective_fwd_time", "selective_kept_bytes", "checkpoint_kept_bytes", "tail_time"):
            del st[key]
        for key in ("selective_tail_time",):
            del st[key]
    old = memsave.Plan.from_json(json.dumps(d))
    assert old.selective == [] and old.keeps(0) == () and old.segments == p.segments
    assert "selective #" not in old.summary()


@pytest.mark.slow
def test_a_selective_plan_applies_and_unwraps(planned: Dict[str, Any]) -> None:
    model, p = planned["model"], planned["selective"]
    memsave.wrap(model, p)
    assert "memsave.checkpoint" in repr(model)
    memsave.unwrap(model)
    assert "memsave.checkpoint" not in repr(model)


def test_selective_classes_can_be_restricted_and_bad_values_are_rejected() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(
        *[nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64), nn.Tanh()) for _ in range(4)]
    )
    x = torch.randn(256, 64, requires_grad=True)
    p = memsave.plan(model, x, budget=0.6, selective=["matmul"])
    assert p.chain.operator_classes == ["matmul"]
    assert all(k in ((), ("matmul",)) for k in p.selective)
    q = memsave.plan(model, x, budget=0.6, selective=False, timing_steps=1)
    assert q.chain.operator_classes == [] and not any(q.selective)
    with pytest.raises(TypeError, match="selective"):
        memsave.plan(model, x, budget=0.6, selective="matmul")
    with pytest.raises(ValueError, match="bogus"):
        memsave.plan(model, x, budget=0.6, selective=["bogus"])
    with pytest.raises(ValueError, match="no operator class"):
        memsave.plan(model, x, budget=0.6, selective=[])


def test_binding_takes_operator_classes_and_selective_segments() -> None:
    stage = {
        "fwd_time": 1.0,
        "bwd_time": 2.0,
        "input_bytes": 10,
        "output_bytes": 10,
        "saved_bytes": 20,
        "selective_fwd_time": [0.25],
        "selective_kept_bytes": [4],
    }
    chain = {"stages": [stage] * 4, "operator_classes": ["matmul"]}
    whole = planner_simulate(chain, [(0, 2, True), (2, 4, False)])
    sel = planner_simulate(chain, [(0, 2, True, 0), (2, 4, False)])
    assert sel["extra_time"] == 0.5 and whole["extra_time"] == 2.0
    assert sel["peak_bytes"] >= whole["peak_bytes"]  # the kept outputs are held until the recompute
    assert planner_simulate(chain, [(0, 2, True, None), (2, 4, False)]) == whole
    res = planner_solve(chain, sel["peak_bytes"], "optimal")
    assert len(res["segment_kept_classes"]) == len(res["segments"]) and 0 in res["segment_kept_classes"]
    with pytest.raises(ValueError, match="selective"):
        planner_simulate(
            {"stages": [dict(stage, selective_fwd_time=[])] * 4, "operator_classes": ["matmul"]}, [(0, 4, False)]
        )
    with pytest.raises(ValueError, match="kept_classes 1; .* 1 operator_classes entries"):
        planner_simulate(chain, [(0, 2, True, 1), (2, 4, False)])
    # The binding knows one name only: the old key is an unknown one, and the message lists the right one.
    with pytest.raises(ValueError, match="unknown key 'policies'.*operator_classes"):
        planner_simulate({"stages": [stage] * 4, "policies": ["matmul"]}, [(0, 4, False)])
    with pytest.raises(TypeError, match=r"operator_classes'\] must be a list of str"):
        planner_simulate({"stages": [stage] * 4, "operator_classes": "matmul"}, [(0, 4, False)])


def test_chain_reads_the_old_policies_key_and_writes_operator_classes() -> None:
    stage = Stage("s", 1.0, 2.0, 10, 10, saved_bytes=20, selective_fwd_time=[0.25, 0.5], selective_kept_bytes=[4, 2])
    chain = Chain(stages=[stage, dataclasses.replace(stage, name="t")], operator_classes=["matmul+attention", "matmul"])
    d = chain.to_dict()
    assert d["operator_classes"] == ["matmul+attention", "matmul"] and "policies" not in d
    old = dict(d)
    old["policies"] = old.pop("operator_classes")  # as memsave 0.3 and earlier wrote it
    assert Chain.from_dict(old) == chain == Chain.from_dict(d)
    assert Chain.from_dict(dict(d, policies=d["operator_classes"])) == chain  # both keys, agreeing
    with pytest.raises(ValueError, match="both operator_classes .* and its old name policies"):
        Chain.from_dict(dict(d, policies=["conv"]))
    # The chain the binding reads is the one it writes: a selective segment of entry 1 costs that entry's variants.
    assert chain.simulate([(0, 2, True, 1)])["extra_time"] == 1.0


@pytest.mark.slow
def test_selective_plans_fit_every_budget_module_level_plans_fit() -> None:
    """Module-level plans are a subset of selective ones: at the tightest budget a module-level plan meets (its
    minimum-memory plan's measured peak), a selective plan is found too, and selective minimum-memory plans are no
    larger. (The cost model can tie a selective region with a whole one that measures a few allocations more, as on
    this GPT-2, where the selective chain alone misses the whole-region plan.)"""
    pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = hub.gpt2(2, 32, heads=4, vocab=128, positions=16)  # no dropout, no cache
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(1))
    smallest = memsave.plan(model, input_ids=ids, labels=ids, solver="min_memory", selective=False)
    budget = smallest.measured_peak_bytes
    for selective in (False, True):
        p = memsave.plan(model, input_ids=ids, labels=ids, budget=budget, selective=selective)
        assert p.measured_peak_bytes is not None and p.measured_peak_bytes <= budget, (selective, p.summary())
    q = memsave.plan(model, input_ids=ids, labels=ids, solver="min_memory")
    assert q.measured_peak_bytes <= budget
    with pytest.raises(memsave.InfeasibleBudgetError) as e:
        memsave.plan(model, input_ids=ids, labels=ids, budget=q.measured_peak_bytes - 1)
    assert e.value.min_bytes == q.measured_peak_bytes  # the smaller of both chains' minimum-memory plans, measured


def test_selective_variants_price_the_dispatch_overhead_of_every_operator() -> None:
    """A selective variant costs its stage's forward time less the kept classes' time, plus the selective contexts'
    per-operator overhead for every operator the stage dispatches; stages that cannot be recomputed get none."""
    from memsave.recompute.planning.chain import Chain, Stage, StageModules
    from memsave.recompute.planning.operators import OperatorProfile, selective_variants

    stages = [Stage(name=f"s{i}", fwd_time=1.0, bwd_time=2.0, input_bytes=8, output_bytes=8) for i in range(2)]
    modules = [StageModules(kind="module", modules=["a"], recomputable=True), StageModules(kind="glue", modules=[])]
    chain = Chain(stages=stages)
    profile = OperatorProfile(classes=[{"matmul": (100, 0.4)}, {}], operators=[10, 3])
    selective_variants(chain, modules, profile, overhead_per_operator=0.01)
    assert chain.operator_classes == ["matmul"]
    assert stages[0].selective_kept_bytes == [100]
    assert stages[0].selective_fwd_time == [pytest.approx(0.6 + 10 * 0.01)]
    assert stages[1].selective_fwd_time == [] and stages[1].selective_kept_bytes == []


def test_selective_overhead_per_operator_is_measured_and_small() -> None:
    from memsave.recompute.planning.operators import selective_overhead_per_operator

    seconds = selective_overhead_per_operator(torch.device("cpu"), lambda: None)
    assert 0.0 < seconds < 1e-2  # dispatch modes and hooks per operator: tens of microseconds on a server CPU


def test_operator_classes_recorded_in_the_timing_steps_match_forwards_of_their_own() -> None:
    """The planner records the classes inside its timing steps' forwards (CPU): the same bytes per stage and class,
    and the same operator counts, as forwards run under the profiler alone; every class time is positive."""
    pytest.importorskip("transformers")
    from memsave.recompute.planning.chain import split_into_stages
    from memsave.recompute.planning.operators import OperatorClassProfiler
    from memsave.recompute.planning.trace import time_steps, trace_step

    torch.manual_seed(0)
    model = hub.gpt2(2, 32, heads=4, vocab=128, positions=16)
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(1))
    kwargs = {"input_ids": ids, "labels": ids}
    loss_fn = lambda out: out.loss  # noqa: E731
    trace = trace_step(model, (), loss_fn, torch.device("cpu"), kwargs)
    stages = split_into_stages(trace, model)
    in_timing = OperatorClassProfiler(model, stages, OPERATOR_CLASSES, lambda: None)
    runs = time_steps(model, (), loss_fn, len(trace.calls), 2, lambda: None, kwargs, forward_context=in_timing.forward)
    alone = OperatorClassProfiler(model, stages, OPERATOR_CLASSES, lambda: None)
    for _ in range(2):
        with alone.forward():
            model(**kwargs)
    got, want = in_timing.result(), alone.result()
    assert len(runs) == 2 and len(in_timing.runs) == 2
    assert got.operators == want.operators and sum(got.operators) > 0
    bytes_of = lambda prof: [{c: b for c, (b, _) in per.items()} for per in prof.classes]  # noqa: E731
    assert bytes_of(got) == bytes_of(want)
    assert {"matmul", "attention"} <= set().union(*bytes_of(got))
    assert all(t > 0 for per in got.classes for _, t in per.values())


def test_operator_class_profiler_refuses_unknown_classes_and_an_empty_result() -> None:
    from memsave.recompute.planning.operators import OperatorClassProfiler

    with pytest.raises(ValueError, match="unknown operator classes"):
        OperatorClassProfiler(nn.Linear(2, 2), [], ["softmax"], lambda: None)
    with pytest.raises(RuntimeError, match="no forward was recorded"):
        OperatorClassProfiler(nn.Linear(2, 2), [], ["matmul"], lambda: None).result()


def _module_stages(n: int) -> List[Any]:
    return _module_stages_named([f"m{i}" for i in range(n)])


def test_alternation_is_offered_only_where_every_region_counts_from_an_even_start() -> None:
    """The profile counts each stage's products from 1; a region counts from its start. They agree unless a stage
    with an odd count is followed, in a run of recomputable stages, by one with products."""
    from memsave.recompute.planning.chain import StageModules
    from memsave.recompute.planning.operators import alternation_aligned

    assert alternation_aligned(_module_stages(5), [0, 4, 4, 4, 1])  # GPT-2 / ViT blocks, then a head
    assert not alternation_aligned(_module_stages(4), [0, 7, 7, 1])  # Llama's decoder layers: 7 products
    assert alternation_aligned(_module_stages(3), [3, 0, 0])
    glue = StageModules(kind="glue", modules=[])
    assert alternation_aligned([*_module_stages(1), glue, *_module_stages(1)], [3, 0, 2])  # no region spans glue
    assert not alternation_aligned(_module_stages(3), [3, 0, 2])


def test_selective_variants_never_keep_both_matmul_classes_and_drop_a_misaligned_alternation() -> None:
    from memsave.recompute.planning.chain import Chain, Stage
    from memsave.recompute.planning.operators import OperatorProfile, selective_variants

    def variants(alternating: List[int]) -> List[str]:
        stages = [Stage(name=f"s{i}", fwd_time=1.0, bwd_time=2.0, input_bytes=8, output_bytes=8) for i in range(2)]
        chain = Chain(stages=stages)
        per_stage = {"matmul": (100, 0.4), "alternate_matmul": (70, 0.2), "attention": (10, 0.1)}
        selective_variants(chain, _module_stages(2), OperatorProfile([per_stage, per_stage], [5, 5], alternating))
        return chain.operator_classes

    assert variants([4, 4]) == [
        "matmul+attention",
        "alternate_matmul+attention",
        "matmul",
        "alternate_matmul",
        "attention",
    ]
    assert variants([3, 4]) == ["matmul+attention", "matmul", "attention"]


def test_variant_tails_leave_out_the_kept_operators() -> None:
    """A stage's tail (its forward after its last saved tensor) is what a recompute ending there skips; a selective
    variant's tail is that less the kept operators' time in it, at most the variant's own forward."""
    from memsave.recompute.planning.chain import Chain, Stage
    from memsave.recompute.planning.operators import OperatorProfile, selective_variants, stage_tails

    stages = [Stage(name="s", fwd_time=1.0, bwd_time=2.0, input_bytes=8, output_bytes=8)]
    chain = Chain(stages=stages)
    profile = OperatorProfile(
        classes=[{"matmul": (100, 0.5), "attention": (10, 0.45)}],
        operators=[0],
        tails=[0.3],
        class_tails=[{"matmul": 0.2}],
    )
    stage_tails(chain, _module_stages(1), profile)
    selective_variants(chain, _module_stages(1), profile)
    assert chain.operator_classes == ["matmul+attention", "matmul", "attention"]
    assert stages[0].tail_time == 0.3
    assert stages[0].selective_fwd_time == pytest.approx([0.05, 0.5, 0.55])
    assert stages[0].selective_tail_time == pytest.approx([0.05, 0.1, 0.3])  # the first capped at its forward
    # The binding subtracts a segment's last stage's tail from its recompute.
    assert chain.simulate([(0, 1, True)])["extra_time"] == pytest.approx(1.0 - 0.3)
    assert chain.simulate([(0, 1, True, 1)])["extra_time"] == pytest.approx(0.5 - 0.1)


def test_profiler_finds_each_stage_s_tail_and_every_other_product() -> None:
    """Which operators run after a stage's last saved tensor depends on their order, not on this machine's speed:
    a stage ending in a Linear (its input saved before the product runs) has that product in its tail; one ending in
    Tanh (its output saved after it runs) has none. The alternate class records the 1st, 3rd, ... product only."""
    from memsave.recompute.planning.operators import OperatorClassProfiler

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 16)),
        nn.Sequential(nn.Linear(16, 24), nn.Tanh()),
    )
    x = torch.randn(4, 8, requires_grad=True)
    profiler = OperatorClassProfiler(model, _module_stages_named(["0", "1"]), OPERATOR_CLASSES, lambda: None)
    for _ in range(3):
        with profiler.forward():
            model(x).sum().backward()
    got = profiler.result()
    assert got.alternating == [2, 1]
    assert got.classes[0]["matmul"][0] == 4 * (32 + 16) * 4 and got.classes[0]["alternate_matmul"][0] == 4 * 32 * 4
    assert got.class_tails[0]["matmul"] > 0 and got.tails[0] >= got.class_tails[0]["matmul"]
    assert got.class_tails[0]["alternate_matmul"] == 0  # the kept (1st) product runs before the last save
    assert got.class_tails[1].get("matmul", 0.0) == 0  # Tanh saves its output after the product


def _module_stages_named(names: List[str]) -> List[Any]:
    from memsave.recompute.planning.chain import StageModules

    return [StageModules(kind="module", modules=[n], recomputable=True) for n in names]


def test_plans_offer_the_alternate_class_on_gpt2_but_not_on_llama() -> None:
    pytest.importorskip("transformers")
    from memsave.recompute.planning import profile

    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(1))
    gpt2 = profile(
        hub.gpt2(2, 32, heads=4, vocab=128, positions=16),
        input_ids=ids,
        labels=ids,
        timing_steps=1,
        loss_fn=lambda out: out.loss,
    )
    assert "alternate_matmul+attention" in gpt2.chain.operator_classes
    llama = profile(
        hub.llama(2, 32, 64, heads=4, kv_heads=4, vocab=128, positions=16),
        input_ids=ids,
        labels=ids,
        timing_steps=1,
        loss_fn=lambda out: out.loss,
    )
    assert "matmul+attention" in llama.chain.operator_classes
    assert not any("alternate_matmul" in s for s in llama.chain.operator_classes)  # 7 products a decoder layer
