"""Plans for ``torch.compile``: ``memsave.plan(..., compile=True)`` measures its candidates as compile runs them.

On a Hugging Face GPT-2 and a timm ViT (tiny sizes, no dropout: compiled random operations draw from inductor's
generator), at budgets 25%, 50% and 75% of the way from per-block checkpoint's compiled peak to the compiled eager
step's: ``torch.compile(memsave.wrap(model, plan))`` stays within the budget, and its gradients are eager compiled's
within float32 rounding (inductor reorders float operations). Plus: an impossible budget raises
:class:`memsave.InfeasibleBudgetError` carrying the compiled minimum, a selective plan (regions keeping their matrix
products) trains under compile, and the plan records that it was made for compile and how long planning took.
Where regions are needed, torch's partitioner (no region, a lower ``activation_memory_budget``) is a candidate too,
chosen when its compiled step is faster: the choice is checked with injected step times, not live ones.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, List, Sequence, Tuple

import pytest
import torch
from torch import nn

import memsave
from memsave.measurement.allocator import step_peak_bytes
from memsave.recompute.planning.search import PARTITIONER_PROBES

pytestmark = pytest.mark.slow
REL = 1e-4  # normwise, as in test_compile.py


def _gpt2() -> Tuple[nn.Module, Dict[str, Any], Callable[[Any], torch.Tensor]]:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        n_layer=4, n_embd=64, n_head=4, n_positions=64, vocab_size=256, resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0, use_cache=False, bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    ids = torch.randint(0, 256, (4, 64), generator=torch.Generator().manual_seed(1))
    return transformers.GPT2LMHeadModel(cfg).train(), {"input_ids": ids}, lambda out: out.logits.float().sum()


def _vit() -> Tuple[nn.Module, Dict[str, Any], Callable[[Any], torch.Tensor]]:
    vt = pytest.importorskip("timm.models.vision_transformer")
    torch.manual_seed(0)
    model = vt.VisionTransformer(img_size=32, patch_size=4, embed_dim=64, depth=4, num_heads=2, num_classes=10)
    return model.train(), {"x": torch.randn(8, 3, 32, 32)}, lambda out: out.float().sum()


MODELS = {"gpt2": _gpt2, "vit": _vit}


def _compiled_step(model: nn.Module, inputs: Dict[str, Any], loss_fn: Callable[[Any], torch.Tensor]) -> Callable:
    torch._dynamo.reset()
    run = torch.compile(model)

    def step() -> None:
        model.zero_grad(set_to_none=True)
        loss_fn(run(**inputs)).backward()

    step()  # compile outside what is measured
    return step


def _compiled_peak(model: nn.Module, inputs: Dict[str, Any], loss_fn: Callable[[Any], torch.Tensor]) -> int:
    step = _compiled_step(model, inputs, loss_fn)
    model.zero_grad(set_to_none=True)
    return step_peak_bytes(step, torch.device("cpu"))


def _compiled_grads(model: nn.Module, inputs: Dict[str, Any], loss_fn: Callable[[Any], torch.Tensor]) -> Dict:
    step = _compiled_step(model, inputs, loss_fn)
    step()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return grads


@pytest.fixture(scope="module", params=sorted(MODELS))
def case(request: pytest.FixtureRequest) -> Dict[str, Any]:
    model, inputs, loss_fn = MODELS[request.param]()
    eager = _compiled_peak(model, inputs, loss_fn)
    memsave.wrap(model)
    blocks = _compiled_peak(model, inputs, loss_fn)
    memsave.unwrap(model)
    assert blocks < eager
    return {
        "model": model,
        "inputs": inputs,
        "loss_fn": loss_fn,
        "eager": eager,
        "blocks": blocks,
        "grads": _compiled_grads(model, inputs, loss_fn),
    }


@pytest.mark.parametrize("fraction", [0.25, 0.5, 0.75])
def test_compiled_plan_within_budget_and_gradients_match(case: Dict[str, Any], fraction: float) -> None:
    model, inputs, loss_fn = case["model"], case["inputs"], case["loss_fn"]
    budget = int(case["blocks"] + fraction * (case["eager"] - case["blocks"]))
    p = memsave.plan(model, budget=budget, loss_fn=loss_fn, compile=True, selective=False, timing_steps=1, **inputs)
    assert p.compiled and p.planning_seconds > 0
    assert p.measured_peak_bytes is not None and p.measured_peak_bytes <= budget, p.summary()
    memsave.wrap(model, p)
    try:
        with p.compile_context():  # torch's partitioner where the plan chose it
            peak = _compiled_peak(model, inputs, loss_fn)
            grads = _compiled_grads(model, inputs, loss_fn)
    finally:
        memsave.unwrap(model)
        torch._dynamo.reset()
    assert peak <= budget, (peak, budget, p.summary())
    assert grads.keys() == case["grads"].keys()
    for name, want in case["grads"].items():
        error = (grads[name].double() - want.double()).abs().max().item()
        assert error <= REL * want.double().abs().max().item() + 1e-7, name


def test_infeasible_budget_carries_the_compiled_minimum(case: Dict[str, Any]) -> None:
    model, inputs, loss_fn = case["model"], case["inputs"], case["loss_fn"]
    with pytest.raises(memsave.InfeasibleBudgetError, match="under torch.compile") as e:
        memsave.plan(model, budget=1024, loss_fn=loss_fn, compile=True, selective=False, timing_steps=1, **inputs)
    assert 1024 < e.value.min_bytes < case["eager"]


def test_selective_plan_under_compile(case: Dict[str, Any]) -> None:
    """A plan with selective regions (those keeping matrix products) trains under compile like eager compiled."""
    from memsave.recompute.planning import profile, search

    model, inputs, loss_fn = case["model"], case["inputs"], case["loss_fn"]
    prof = profile(model, loss_fn=loss_fn, compile=True, timing_steps=1, **inputs)
    k = prof.chain.operator_classes.index("matmul") if "matmul" in prof.chain.operator_classes else 0
    for st in prof.chain.stages:  # injected costs: selective recompute nearly free, so every region is selective
        st.fwd_time, st.bwd_time, st.tail_time, st.selective_tail_time = 1.0, 2.0, 0.0, []
        st.selective_fwd_time = [0.01 if i == k else 1.0 for i in range(len(st.selective_fwd_time))]
    predicted_eager = prof.chain.simulate([(0, len(prof.stages), False)])["peak_bytes"]
    # Any recompute fits this budget; the search's eager shortcut is keyed to the (lower) compiled eager peak.
    prof = dataclasses.replace(prof, eager_peak_bytes=predicted_eager)
    p = search(prof, predicted_eager - 1, verify=False)
    assert any(p.selective), p.summary()
    memsave.wrap(model, p)
    try:
        grads = _compiled_grads(model, inputs, loss_fn)
    finally:
        memsave.unwrap(model)
        torch._dynamo.reset()
    for name, want in case["grads"].items():
        error = (grads[name].double() - want.double()).abs().max().item()
        assert error <= REL * want.double().abs().max().item() + 1e-7, name


def _ratios(partitioner_seconds: float, regions_seconds: float) -> Callable[..., List[float]]:
    def compiled_ratios(self: Any, plans: Sequence[memsave.Plan], rounds: int = 6) -> List[float]:
        seconds = [partitioner_seconds if p.activation_memory_budget is not None else regions_seconds for p in plans]
        return [s / seconds[0] for s in seconds]

    return compiled_ratios


@pytest.mark.parametrize("faster", ["partitioner", "regions"])
def test_the_faster_of_regions_and_torchs_partitioner_within_the_budget(
    case: Dict[str, Any], faster: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from memsave.recompute.planning import planner

    model, inputs, loss_fn = case["model"], case["inputs"], case["loss_fn"]
    # A budget that needs recompute; on these models torch's partitioner fits it at 0.5 or above.
    budget = int(case["blocks"] + 0.75 * (case["eager"] - case["blocks"]))
    times = (1.0, 2.0) if faster == "partitioner" else (2.0, 1.0)
    monkeypatch.setattr(planner._Stepper, "compiled_ratios", _ratios(*times))
    p = memsave.plan(model, budget=budget, loss_fn=loss_fn, compile=True, selective=False, timing_steps=1, **inputs)
    if faster == "partitioner":
        amb = p.activation_memory_budget
        assert amb is not None and not p.regions(), p.summary()
        # a budget of the bisection: a multiple of 2 ** -PARTITIONER_PROBES in [0, 1)
        assert 0.0 <= amb < 1.0 and amb * 2**PARTITIONER_PROBES == int(amb * 2**PARTITIONER_PROBES)
        assert f"activation_memory_budget {p.activation_memory_budget:g}" in p.summary()
    else:
        assert p.activation_memory_budget is None and p.regions(), p.summary()
    assert memsave.Plan.from_json(p.to_json()) == p
    step_model = p.compile(model)  # the regions, compiled under the plan's partitioner budget
    try:
        torch._dynamo.reset()

        def step() -> None:
            model.zero_grad(set_to_none=True)
            loss_fn(step_model(**inputs)).backward()

        step()
        model.zero_grad(set_to_none=True)
        peak = step_peak_bytes(step, torch.device("cpu"))
        grads = {n: q.grad.detach().clone() for n, q in model.named_parameters() if q.grad is not None}
    finally:
        memsave.unwrap(model)
        torch._dynamo.reset()
    assert peak <= budget, (peak, budget, p.summary())
    for name, want in case["grads"].items():
        error = (grads[name].double() - want.double()).abs().max().item()
        assert error <= REL * want.double().abs().max().item() + 1e-7, name


def test_finalists_are_the_programs_already_measured(case: Dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """Dynamo captures the model once and every plan, partitioner budget and finalist is compiled once from that
    capture: no candidate is traced again (``compile_at``, the fallback), and the finalists' interleaved timing
    runs the compiled programs whose peaks were measured, without compiling again; the chosen plan still fits
    compiled."""
    from memsave.recompute.planning import capture, planner

    model, inputs, loss_fn = case["model"], case["inputs"], case["loss_fn"]
    budget = int(case["blocks"] + 0.75 * (case["eager"] - case["blocks"]))
    compiled: List[int] = []  # per program: how many finalist timings had begun
    traced: List[int] = []
    timings: List[int] = []
    real_compile, real_ratios = capture.CapturedStep._compile, planner._Stepper.compiled_ratios

    def counting_compile(self: Any, index: int, example_inputs: List[Any]) -> Any:
        if index == 0:
            compiled.append(len(timings))
        return real_compile(self, index, example_inputs)

    def counting_ratios(self: Any, plans: Sequence[memsave.Plan], rounds: int = 6) -> List[float]:
        timings.append(len(plans))
        return real_ratios(self, plans, rounds=1)

    monkeypatch.setattr(capture.CapturedStep, "_compile", counting_compile)
    monkeypatch.setattr(planner, "compile_at", lambda *a, **k: traced.append(1))
    monkeypatch.setattr(planner._Stepper, "compiled_ratios", counting_ratios)
    p = memsave.plan(model, budget=budget, loss_fn=loss_fn, compile=True, selective=False, timing_steps=1, **inputs)
    assert timings == [2], p.summary()  # regions against torch's partitioner
    assert not traced  # every candidate's regions ran inside the one capture
    assert compiled and not any(compiled), compiled
    assert p.measured_peak_bytes is not None and p.measured_peak_bytes <= budget, p.summary()
    # eager, at least one candidate and the partitioner's budgets: each compiled once
    assert len(compiled) >= 3
