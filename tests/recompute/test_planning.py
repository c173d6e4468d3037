"""memsave.plan: the budget guarantee on four model families, gradients bitwise equal to eager, Plan API, bad input.

The guarantee is checked the way memsave measures memory on CPU: the allocator-level peak of one training step
(gradients None, forward, loss, backward) from the profiler's allocation events, relative to the step's start.
Run with ``-s`` to see the measured margins (budget - measured peak) of every model and budget.
"""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch
from torch import nn

import memsave
from helpers import models
from memsave.errors import MemsaveWarning
from memsave.measurement.allocator import cpu_peak_bytes
from memsave.measurement.measuring import default_loss
from memsave.measurement.units import format_bytes, parse_budget
from memsave.recompute.planning.plan import _GroupedForward


# ------------------------------------------------------------------------------------------------------- models
def mlp50(seed: int = 0):
    """An MLP chain of 50 Linear layers of varied widths with mixed activations (plain nn.Sequential)."""
    torch.manual_seed(seed)
    widths = [32, 48, 80, 96, 64, 40, 88, 56, 72, 24]
    acts = [nn.GELU, nn.Tanh, nn.ReLU, nn.SiLU]
    layers = []
    for i in range(50):
        layers += [nn.Linear(widths[i % 10], widths[(i + 1) % 10]), acts[i % 4]()]
    return nn.Sequential(*layers, nn.Linear(widths[0], 10)), torch.randn(64, 32)


class ResNetLike(nn.Module):
    """Stem, three stages of two residual blocks (nn.Sequential), pooling and a classifier."""

    def __init__(self, widths=(8, 16, 32)) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, widths[0], 3, 1, 1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU(inplace=True)
        )
        stages, c_in = [], widths[0]
        for i, w in enumerate(widths):
            stages.append(nn.Sequential(models.BasicBlock(c_in, w, 1 if i == 0 else 2), models.BasicBlock(w, w)))
            c_in = w
        self.layer1, self.layer2, self.layer3 = stages
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(c_in, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layer3(self.layer2(self.layer1(self.stem(x))))
        return self.fc(torch.flatten(self.pool(x), 1))


def resnet(seed: int = 0):
    torch.manual_seed(seed)
    return ResNetLike(), torch.randn(4, 3, 24, 24)


def unet(seed: int = 0):
    torch.manual_seed(seed)
    return models.SmallUNet(base=4), torch.randn(2, 3, 32, 32)


def gpt(seed: int = 0):
    torch.manual_seed(seed)
    model = models.TinyTransformer(vocab=40, d=32, n_blocks=4, seq=32)
    return model, torch.randint(0, 40, (4, 32), generator=torch.Generator().manual_seed(1))


FAMILIES = {"mlp50": mlp50, "unet": unet, "resnet": resnet, "gpt": gpt}


# ------------------------------------------------------------------------------------------------------ helpers
def _step(model: nn.Module, x: torch.Tensor) -> None:
    for p in model.parameters():
        p.grad = None
    torch.manual_seed(1234)  # the same dropout masks in every run
    default_loss(model(x)).backward()


def _peak(model: nn.Module, x: torch.Tensor) -> int:
    """Allocator-level CPU peak of one step with gradients None at its start (docs/design.md)."""
    for p in model.parameters():
        p.grad = None
    return cpu_peak_bytes(lambda: _step(model, x))


def _grads(model: nn.Module, x: torch.Tensor):
    _step(model, x)
    return [p.grad.clone() for p in model.parameters()]


def _plan(model, x, **kw):
    kw.setdefault("timing_steps", 1)
    return memsave.plan(model, x, **kw)


@pytest.fixture(scope="module")
def unet_sqrt():
    """A UNet and its sqrt(N) plan, shared by the tests that only read the plan."""
    model, x = unet()
    return model, x, _plan(model, x, solver="sqrt")


# ------------------------------------------------------------------------------------------------- the guarantee
@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_measured_peak_within_budget_and_gradients_bitwise(name: str) -> None:
    model, x = FAMILIES[name]()
    eager_model = copy.deepcopy(model)
    reference = _grads(eager_model, x)
    eager_peak = _peak(eager_model, x)
    # The smallest feasible budget is the measured peak of the minimum-memory plan: that plan is the first of four
    # (its budget is its own measured peak), then three budgets spread up to eager's peak.
    least = _plan(model, x, solver="min_memory")
    smallest = least.measured_peak_bytes
    assert 0 < smallest < eager_peak, (smallest, eager_peak)
    budgets = [smallest] + [smallest + (eager_peak - smallest) * k // 4 for k in (1, 2, 3)]
    lines = []
    for budget in budgets:
        p = least if budget == smallest else _plan(model, x, budget=budget)
        wrapped = memsave.wrap(copy.deepcopy(model), p)
        grads = _grads(wrapped, x)
        assert all(torch.equal(a, b) for a, b in zip(grads, reference)), f"{name}: gradients differ from eager"
        measured = _peak(wrapped, x)
        lines.append(
            f"{name}: budget {budget} measured {measured} margin {budget - measured} predicted "
            f"{p.predicted_peak_bytes} regions {len(p.regions())} overhead {p.predicted_overhead:.3f}"
        )
        assert measured <= budget, lines[-1]
    print("\n" + "\n".join(lines))


def test_budget_at_or_above_eager_peak_recomputes_nothing_and_says_so() -> None:
    model, x = models.build("cnn")
    with pytest.warns(MemsaveWarning, match=r"at or above what the model needs without recompute .* changes nothing"):
        p = _plan(model, x, budget=1.0)
    assert p.regions() == [] and p.predicted_overhead == 0.0
    assert p.measured_peak_bytes == p.eager_peak_bytes
    with pytest.warns(MemsaveWarning, match="the plan recomputes nothing"):
        p = _plan(model, x, budget=10 * p.eager_peak_bytes)
    assert p.regions() == []


def test_an_infeasible_budget_shows_the_floor() -> None:
    model, x = models.build("cnn")
    grads = sum(p.numel() * p.element_size() for p in model.parameters())
    with pytest.raises(memsave.InfeasibleBudgetError) as info:
        memsave.plan(model, x, budget=1, selective=False, timing_steps=1, verify=False, progress=False)
    message = str(info.value)
    assert f"the parameter gradients, {format_bytes(grads)}" in message
    assert "optimizer's state" in message and "memsave.estimate(model, x, optimizer='adamw')" in message


def test_profiled_chain_is_monotonic_and_beats_sqrt(unet_sqrt) -> None:
    chain = unet_sqrt[2].chain.to_dict()
    lo = memsave._C.planner_min_peak(chain)["peak_bytes"]
    hi = memsave._C.planner_simulate(chain, [(0, len(chain["stages"]), False)])["peak_bytes"]
    previous = math.inf
    for k in range(21):
        res = memsave._C.planner_solve(chain, lo + (hi - lo) * k // 20, "optimal", 2000)
        assert res["feasible"]
        assert res["predicted_extra_time"] <= previous
        previous = res["predicted_extra_time"]
    assert previous == 0.0
    for strategy in ("sqrt", "uniform:3", "uniform:7"):
        base = memsave._C.planner_solve(chain, None, strategy, 2000)
        opt = memsave._C.planner_solve(chain, base["predicted_peak_bytes"], "optimal", 2000)
        assert opt["predicted_extra_time"] <= base["predicted_extra_time"]


# ----------------------------------------------------------------------------- the measured search of plan()
class _FakePlan:
    def __init__(self, res):
        self.segments = res["segments"]
        self.predicted_peak_bytes = res["predicted_peak_bytes"]
        self.predicted_extra_seconds = res["predicted_extra_time"]
        self.measured_peak_bytes = None


def _fake_search(options, measured, budget, verify=True):
    """_search_optimal over a made-up solver: ``options`` = [(name, predicted peak, extra time)], the solver picks
    the cheapest whose predicted peak fits; ``measured`` = name -> measured peak."""
    from memsave.recompute.planning.search import search_optimal as _search_optimal

    def res(name, peak, extra):
        return {"feasible": True, "segments": [name], "predicted_peak_bytes": peak, "predicted_extra_time": extra}

    def solve(b):
        fits = [o for o in options if o[1] <= b]
        return res(*min(fits, key=lambda o: o[2])) if fits else {"feasible": False}

    calls = []

    def measure(p):
        calls.append(p.segments[0])
        return measured[p.segments[0]]

    least = min(options, key=lambda o: o[1])
    best = _search_optimal(solve, lambda: res(*least), _FakePlan, measure if verify else None, budget)
    return best, calls


def test_search_finds_a_plan_predicted_just_above_the_budget_that_measures_within_it() -> None:
    # GPT-like at sqrt's measured peak: the model's smallest prediction (101) is above the budget (100), but two
    # plans measure 99.5; the cheaper one (S) must win over the minimum-memory one (M).
    best, calls = _fake_search(
        [("S", 101, 1.0), ("M", 100.5, 3.0), ("eager", 200, 0.0)], {"S": 99.5, "M": 99.0, "eager": 200}, budget=100
    )
    assert best.segments == ["S"] and best.measured_peak_bytes == 99.5
    assert calls == ["M", "S"]


def test_search_lowers_the_solver_budget_when_the_model_was_optimistic() -> None:
    best, calls = _fake_search(
        [("A", 100, 1.0), ("B", 95, 2.0), ("C", 80, 5.0)], {"A": 104, "B": 97, "C": 82}, budget=100
    )
    assert best.segments == ["B"] and calls == ["A", "B"]


def test_search_returns_none_when_nothing_measures_within_the_budget() -> None:
    best, _ = _fake_search([("A", 100, 1.0)], {"A": 120}, budget=100)
    assert best is None


def test_search_without_verification_takes_the_solver_answer() -> None:
    best, calls = _fake_search([("A", 100, 1.0), ("B", 90, 2.0)], {"A": 500, "B": 500}, budget=100, verify=False)
    assert best.segments == ["A"] and best.measured_peak_bytes is None and calls == []


def test_unet_skip_connections_are_in_the_chain(unet_sqrt) -> None:
    skips = unet_sqrt[2].chain.skips
    assert len(skips) >= 2  # s1 and s2 are read by the decoder's concatenations
    assert all(s.consumer > s.producer + 1 for s in skips)


# ------------------------------------------------------------------------------------------------- strategies
@pytest.mark.parametrize("strategy", ["uniform:2", "all", "none"])
def test_baseline_strategies_apply_and_stay_exact(strategy: str) -> None:
    model, x = models.build("cnn")
    reference = _grads(copy.deepcopy(model), x)
    p = _plan(model, x, solver=strategy)
    assert p.solver == strategy and p.budget_bytes is None
    wrapped = memsave.wrap(copy.deepcopy(model), p)
    assert all(torch.equal(a, b) for a, b in zip(_grads(wrapped, x), reference))
    if strategy == "none":
        assert p.regions() == []
    else:
        assert p.regions()


def test_fixed_strategy_over_budget_is_infeasible() -> None:
    model, x = models.build("cnn")
    with pytest.raises(memsave.InfeasibleBudgetError) as info:
        _plan(model, x, budget=1000, solver="sqrt")
    assert info.value.min_bytes > 1000


def test_grouped_regions_in_a_sequential_round_trip_through_unwrap() -> None:
    model, x = models.build("mlp")
    reference = _grads(copy.deepcopy(model), x)
    p = _plan(model, x, solver="sqrt")
    assert any(len(r) > 1 for r in p.regions())
    keys = list(model.state_dict())
    memsave.wrap(model, p)
    assert isinstance(model.__dict__.get("forward"), _GroupedForward)
    assert "[memsave.checkpoint " in repr(model)
    assert list(model.state_dict()) == keys
    assert all(torch.equal(a, b) for a, b in zip(_grads(model, x), reference))
    memsave.unwrap(model)
    assert "forward" not in model.__dict__ and "memsave" not in repr(model)
    assert all(torch.equal(a, b) for a, b in zip(_grads(model, x), reference))


class _KwargsBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.gate = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor, *, scale: torch.Tensor, extra=None):
        h = torch.tanh(self.lin(x)) * scale
        return h + torch.sigmoid(self.gate(x)), extra


class _KwargsNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(_KwargsBlock() for _ in range(6))
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x, _ = block(x, scale=scale, extra="tag")
        return self.head(x)


def test_modules_called_with_kwargs_and_several_tensors() -> None:
    torch.manual_seed(0)
    model, x, scale = _KwargsNet(), torch.randn(64, 16), torch.rand(16)
    step = lambda m: default_loss(m(x, scale)).backward()  # noqa: E731
    eager = copy.deepcopy(model)
    step(eager)
    p = memsave.plan(model, x, scale, solver="all", timing_steps=1)
    assert [r for r in p.regions()] == [[f"blocks.{i}"] for i in range(6)] + [["head"]]
    wrapped = memsave.wrap(copy.deepcopy(model), p)
    step(wrapped)
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(wrapped.parameters(), eager.parameters()))


# ---------------------------------------------------------------------------------------------------- Plan API
def test_plan_summary_json_round_trip_and_verbose(unet_sqrt, capsys) -> None:
    model, _x, p = unet_sqrt
    memsave.plan(*models.build("cnn"), solver="none", timing_steps=1, verbose=True)
    assert "memsave plan for Sequential (none)" in capsys.readouterr().out
    text = p.summary()
    assert "memsave plan for SmallUNet" in text and "recompute #0" in text and "glue" in text and "kept" in text
    assert "enc1" in text and str(p) == text
    q = memsave.Plan.from_json(p.to_json())
    assert q == p
    d = json.loads(p.to_json())
    assert d["fingerprint"] == p.fingerprint
    d["strategy"] = d.pop("solver")  # plans written when the field was called strategy still load
    assert memsave.Plan.from_json(json.dumps(d)) == p
    assert p.predicted_overhead > 0 and p.predicted_peak_bytes > 0 and p.min_feasible_bytes > 0
    memsave.wrap(copy.deepcopy(model), q)  # a plan read back applies as the original would


def test_plan_from_another_model_raises(unet_sqrt) -> None:
    p = unet_sqrt[2]
    other, _ = models.build("cnn")
    with pytest.raises(memsave.PlanMismatchError, match="made for a SmallUNet"):
        memsave.wrap(other, p)
    with pytest.raises(ValueError, match="lacks"):
        memsave.wrap(other, memsave.Plan.from_json(p.to_json()))
    wider = models.SmallUNet(base=8)  # same module names, other parameter shapes
    with pytest.raises(memsave.PlanMismatchError, match="shapes or dtypes differ"):
        memsave.wrap(wider, p)
    for text in ("not json", json.dumps({"format": 99}), json.dumps([1, 2])):
        with pytest.raises(ValueError):
            memsave.Plan.from_json(text)


def test_plan_leaves_the_model_as_it_found_it() -> None:
    model, x = models.build("cnn")
    model(x).sum().backward()  # some existing gradients
    grads = [p.grad.clone() for p in model.parameters()]
    state = copy.deepcopy(model.state_dict())
    torch.manual_seed(7)
    rng = torch.get_rng_state()
    _plan(model, x, solver="sqrt")  # verification applies and removes its regions
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), grads))
    after = model.state_dict()
    assert all(torch.equal(after[k], v) for k, v in state.items())  # BatchNorm statistics included
    assert not any(memsave.recompute.is_wrapped(m) for m in model.modules())


# ------------------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "budget, error",
    [
        (0, ValueError),
        (-5, ValueError),
        (-0.5, ValueError),
        (float("nan"), ValueError),
        ("lots", ValueError),
        ("12 parsecs", ValueError),
        ("-3MiB", ValueError),
        ("", ValueError),
        (True, TypeError),
        ([1], TypeError),
    ],
)
def test_bad_budgets_are_rejected_before_profiling(budget, error) -> None:
    model, x = models.build("mlp")
    with pytest.raises(error):
        memsave.plan(model, x, budget=budget)


def test_parse_budget_units() -> None:
    assert parse_budget("512MiB") == 512 * 2**20
    assert parse_budget("4GB") == 4 * 10**9
    assert parse_budget("1.5 gib") == int(1.5 * 2**30)
    assert parse_budget(" 100 ") == 100
    assert parse_budget(2048) == 2048
    assert parse_budget(0.25, eager_peak_bytes=4000) == 1000
    with pytest.raises(ValueError, match="eager"):
        parse_budget(0.5)


def test_other_bad_arguments() -> None:
    model, x = models.build("mlp")
    with pytest.raises(ValueError, match="unknown solver"):
        memsave.plan(model, x, budget=10**6, solver="fastest")
    with pytest.raises(ValueError, match="uniform"):
        memsave.plan(model, x, budget=10**6, solver="uniform:0")
    with pytest.raises(ValueError, match="needs a budget"):
        memsave.plan(model, x)
    with pytest.raises(TypeError):
        memsave.plan(lambda t: t, x, budget=10**6)
    with pytest.raises(ValueError, match="failed"):
        memsave.plan(model, torch.randn(6, 5), budget=10**6)  # wrong input width
    with pytest.raises(ValueError, match="no parameter"):
        memsave.plan(nn.Sequential(nn.ReLU(), nn.Tanh()), torch.randn(4, 4), budget=10**6)
    with pytest.raises(ValueError, match="not both"):
        memsave.plan(model, x, solver="sqrt", strategy="sqrt")
    with pytest.raises(TypeError, match="compile"):
        memsave.plan(model, x, solver="sqrt", compile="yes")
    memsave.wrap(model, nn.Linear)
    with pytest.raises(ValueError, match="unwrap"):
        memsave.plan(model, x, budget=10**6)


def test_strategy_is_a_deprecated_name_of_solver() -> None:
    model, x = models.build("mlp")
    with pytest.warns(DeprecationWarning, match="solver="):
        p = memsave.plan(model, x, strategy="sqrt", verify=False, timing_steps=1, selective=False)
    q = memsave.plan(model, x, solver="sqrt", verify=False, timing_steps=1, selective=False)
    assert p.solver == q.solver == "sqrt" and p.segments == q.segments
    with pytest.warns(DeprecationWarning, match="Plan.solver"):
        assert q.strategy == "sqrt"  # the field's old name still reads


def test_search_takes_injected_costs() -> None:
    """The search reads only the profile: with injected costs, the block made cheap to recompute is the one
    recomputed, whatever this machine's timings were."""
    from memsave.recompute.planning import profile, search

    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(64, 512), nn.Tanh(), nn.Linear(512, 64)) for _ in range(4)])
    x = torch.randn(512, 64, requires_grad=True)
    prof = profile(model, x, timing_steps=1, selective=False)
    n = len(prof.stages)
    full = prof.chain.simulate([(0, n, False)])["peak_bytes"]
    prof.eager_peak_bytes = full
    for cheap in (1, 2):
        inside = [i for i, st in enumerate(prof.stages) if st.modules and st.modules[0].startswith(f"{cheap}.")]
        for i, st in enumerate(prof.chain.stages):
            st.fwd_time, st.bwd_time, st.tail_time = (0.001 if i in inside else 1.0), 2.0, 0.0
        p = search(prof, budget_bytes=full - 1, verify=False)
        assert [(b, e) for b, e, r in p.segments if r] == [(inside[0], inside[-1] + 1)], p.summary()
        assert p.predicted_extra_seconds == pytest.approx(0.001 * len(inside))


def test_infeasible_error_carries_the_smallest_budget() -> None:
    model, x = models.build("cnn")
    with pytest.raises(memsave.InfeasibleBudgetError) as info:
        _plan(model, x, budget="1KiB")
    err = info.value
    assert isinstance(err, ValueError)
    assert str(err.min_bytes) in str(err)
    p = _plan(model, x, budget=err.min_bytes)  # the reported minimum does fit
    assert p.measured_peak_bytes <= err.min_bytes
