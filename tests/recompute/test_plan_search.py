"""How memsave.plan chooses between the candidates it evaluated, and what it reports while it works.

- The dominance rule (:func:`memsave.recompute.planning.search.fastest`): the plan picked is never slower than
  another evaluated candidate with a lower or equal peak, and never above another of the same time; checked with
  injected costs and peaks (no live timing) in the optimal search, the minimum-memory choice and the compiled choice,
  whose finalists are timed one step a round (counted calls, not times).
- torch's partitioner budget under compile (:func:`memsave.recompute.planning.search.search_partitioner`): a
  bisection that stops at a fit near the budget and keeps the highest fitting budget it measured, b = 0 last; checked
  with injected peaks.
- The progress bar's postfix names the stage (warming up, profiling, timing stages, ..., verifying candidate k/N), and
  the seconds each stage took are logged at DEBUG.
- On CPU eager's peak is the traced step's own: the same number as a step measured without the log, on real models
  (Hugging Face GPT-2 and torchvision's ResNet-18 at small sizes).
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import torch

import memsave
from helpers import hub
from memsave.measurement.allocator import cpu_peak_bytes
from memsave.measurement.measuring import default_loss
from memsave.recompute.planning import planner
from memsave.recompute.planning.search import (
    COMPILED_ROOM,
    PARTITIONER_PROBES,
    fastest,
    search_optimal,
    search_partitioner,
    smallest_plan,
)


def candidate(segments, predicted_peak, seconds, measured=None):
    """A candidate plan as the search reads it (segments, selective, peaks, predicted recompute)."""
    return SimpleNamespace(
        segments=list(segments),
        selective=[],
        predicted_peak_bytes=predicted_peak,
        measured_peak_bytes=measured,
        predicted_extra_seconds=seconds,
    )


# ------------------------------------------------------------------------------------------------ the dominance rule
def test_fastest_takes_the_least_time_then_the_least_peak():
    slow_small = candidate([(0, 2, True)], 80, 2.0, measured=80)
    fast_big = candidate([(0, 1, True)], 95, 1.0, measured=95)
    fast_small = candidate([(1, 2, True)], 99, 1.0, measured=90)  # predicted above fast_big, measured below it
    assert fastest([slow_small, fast_big]) is fast_big  # faster wins, whatever its peak
    assert fastest([fast_big, fast_small]) is fast_small  # equal time: the lower (measured) peak
    assert fastest([fast_small, fast_big]) is fast_small
    assert fastest([fast_big, candidate([(0, 2, False)], 95, 1.0, measured=95)]) is fast_big  # a full tie: the first
    ratios = {id(slow_small): 0.9, id(fast_big): 1.1}
    assert fastest([fast_big, slow_small], seconds=lambda p: ratios[id(p)]) is slow_small  # measured times
    with pytest.raises(ValueError, match="at least one candidate"):
        fastest([])


def test_the_optimal_search_never_keeps_a_plan_a_cheaper_one_of_equal_time_beats():
    # Budget 100. Round 1 (solver budget 100) measures 95: fits, the model was pessimistic by 5, so round 2 solves
    # at 105 and gets a plan of the same predicted recompute that measures 92: both fit, the second is cheaper.
    answers = {
        100: candidate([(0, 2, True)], 100, 1.0),
        105: candidate([(0, 1, True), (1, 2, True)], 101, 1.0),
    }
    measured = {(0, 2, True): 95, (0, 1, True): 92}
    asked = []

    def solve(budget):
        asked.append(budget)
        res = answers.get(budget, answers[105])
        return {"feasible": True, "plan": res}

    best = search_optimal(
        solve=solve,
        solve_min_memory=lambda: pytest.fail("the search needed no minimum-memory plan"),
        make=lambda res: candidate(res["plan"].segments, res["plan"].predicted_peak_bytes, 1.0),
        measure=lambda p: measured[tuple(p.segments[0])],
        budget_bytes=100,
    )
    assert asked[:2] == [100, 105]
    assert best.measured_peak_bytes == 92  # before: the first found (95) was kept on the tie


def test_the_optimal_search_takes_a_faster_plan_over_a_cheaper_slower_one():
    answers = {100: candidate([(0, 2, True)], 100, 2.0), 110: candidate([(0, 1, True)], 102, 1.0)}
    measured = {(0, 2, True): 90, (0, 1, True): 97}
    best = search_optimal(
        solve=lambda b: {"feasible": True, "plan": answers[100 if b == 100 else 110]},
        solve_min_memory=lambda: pytest.fail("not needed"),
        make=lambda res: candidate(
            res["plan"].segments, res["plan"].predicted_peak_bytes, res["plan"].predicted_extra_seconds
        ),
        measure=lambda p: measured[tuple(p.segments[0])],
        budget_bytes=100,
    )
    assert best.segments == [(0, 1, True)] and best.measured_peak_bytes == 97  # 1.0 s beats 2.0 s, both fit


def _compile_like_search(anchor):
    """search_optimal over plans predicted at 100, 102, ..., 300 bytes (the more kept, the less recompute) whose
    peak measures as compile's does, a fraction of the prediction above a fixed part (40 + 0.46 x predicted), at a
    budget of 135: the best plan that fits is the one predicted at 206 (measured 134)."""
    options = list(range(100, 301, 2))
    measured = []

    def solve(budget):
        fit = [o for o in options if o <= budget]
        return {
            "feasible": bool(fit),
            "plan": candidate([(0, fit[-1], True)], fit[-1], 1000 / fit[-1]) if fit else None,
        }

    def measure(p):
        measured.append(int(40 + 0.46 * p.predicted_peak_bytes))
        return measured[-1]

    best = search_optimal(
        solve=solve,
        solve_min_memory=lambda: solve(100),
        make=lambda res: candidate(
            res["plan"].segments, res["plan"].predicted_peak_bytes, 1000 / res["plan"].predicted_peak_bytes
        ),
        measure=measure,
        budget_bytes=135,
        anchor=anchor,
    )
    return best, measured


def test_under_compile_the_search_interpolates_and_stops_near_the_budget():
    additive, additive_measured = _compile_like_search(None)
    interpolated, interpolated_measured = _compile_like_search((290, 173))  # eager: predicted 290, compiled 173
    assert max(additive.measured_peak_bytes, interpolated.measured_peak_bytes) <= 135
    # The additive correction climbs by a fraction of the distance: four rounds, and still 5 bytes below the budget.
    assert additive_measured == [101, 117, 125, 130] and additive.predicted_peak_bytes == 196
    # Interpolated between the first candidate and compiled eager: the best plan that fits (206) in the second round,
    # within COMPILED_ROOM of the budget, so no third.
    assert interpolated_measured == [101, 134] and interpolated.predicted_peak_bytes == 206
    assert interpolated.measured_peak_bytes >= (1 - COMPILED_ROOM) * 135
    assert interpolated.predicted_extra_seconds < additive.predicted_extra_seconds


def test_the_compiled_search_falls_back_to_ratios_without_a_point_above_the_budget():
    # Nothing measured above the budget, the anchor included: the next solver budget is budget x predicted / measured.
    best, measured = _compile_like_search((290, 120))
    assert measured[:2] == [101, 121] and best.measured_peak_bytes <= 135  # 135 x 134 / 101 = 179: the plan at 178


def test_the_smallest_plan_of_equal_peaks_is_the_faster_one():
    slow = SimpleNamespace(solve=lambda *a: {"plan": candidate([(0, 3, True)], 70, 3.0)})
    quick = SimpleNamespace(solve=lambda *a: {"plan": candidate([(0, 2, True), (2, 3, True)], 72, 1.5)})

    def make(res, chain):
        return candidate(res["plan"].segments, res["plan"].predicted_peak_bytes, res["plan"].predicted_extra_seconds)

    chosen = smallest_plan([slow, quick], 100, make, measure=lambda p: 70)  # both measure 70
    assert chosen.predicted_extra_seconds == 1.5
    chosen = smallest_plan([slow, quick], 100, make, measure=lambda p: 75 if len(p.segments) == 2 else 70)
    assert chosen.predicted_extra_seconds == 3.0  # a lower peak wins before time


def test_the_compiled_choice_takes_the_lower_peak_on_a_tie():
    regions = candidate([(0, 2, True)], 100, 0.5, measured=100)
    partitioner = candidate([(0, 2, False)], 120, 0.0, measured=90)
    stepper = SimpleNamespace(compiled_ratios=lambda plans: [1.0, 1.0])
    assert planner._fastest_compiled(stepper, [regions, partitioner]) is partitioner
    stepper = SimpleNamespace(compiled_ratios=lambda plans: [0.95, 1.0])
    assert planner._fastest_compiled(stepper, [regions, partitioner]) is regions  # faster, above a slower one


def test_the_finalists_are_timed_one_step_a_round():
    # Compiled programs warm from their measurement and slower than a round's minimum (0.05 s; a sleep is never
    # shorter, however loaded the machine): one sizing call each, then six rounds of one step, not three windows.
    calls = {"regions": 0, "partitioner": 0}

    def program(p, partitioner):
        def run():
            calls[p.name] += 1
            time.sleep(0.06)

        return run

    stepper = SimpleNamespace(
        has_program=lambda p, partitioner: True,
        program=program,
        step=lambda run: run(),
        progress=SimpleNamespace(stage=lambda text: None),
        state=SimpleNamespace(clear_grads=lambda: None),
    )
    plans = [SimpleNamespace(name=n, activation_memory_budget=None) for n in calls]
    ratios = planner._Stepper.compiled_ratios(stepper, plans)
    assert calls == {"regions": 7, "partitioner": 7}
    assert ratios[0] == 1.0 and ratios[1] > 0


# ------------------------------------------------------------------------------------- torch's partitioner budget
def _probing(peaks):
    """(the budgets probed, in order; a peak_at that records them)."""
    probed = []

    def peak_at(b):
        probed.append(b)
        return peaks(b)

    return probed, peak_at


def test_the_partitioner_search_bisects_for_the_highest_fitting_budget():
    probed, peak_at = _probing(lambda b: int(100 + 50 * b))
    assert search_partitioner(peak_at, 130) == (0.5, 125)
    assert probed == [0.5, 0.75, 0.625]  # 125 fits, 137.5 and 131.25 do not: three compiles, the last step 1/8


def test_the_partitioner_search_stops_at_a_fit_near_the_budget():
    probed, peak_at = _probing(lambda b: int(100 + 50 * b))
    assert search_partitioner(peak_at, 126) == (0.5, 125)
    assert probed == [0.5]  # within COMPILED_ROOM of 126: no room left worth a compile


def test_the_partitioner_search_tries_zero_last_and_keeps_what_it_measured():
    # torch's peak is not monotonic in its budget: here 0.25 fits and 0.125 does not; the higher fitting one is kept.
    peaks = {0.5: 150, 0.25: 118, 0.375: 130, 0.3125: 121, 0.125: 125}
    probed, peak_at = _probing(peaks.__getitem__)
    assert search_partitioner(peak_at, 120, probes=2) == (0.25, 118)
    assert probed == [0.5, 0.25]
    # Nothing in the bisection fits: b = 0 is the last probe, and None when it does not fit either.
    probed, peak_at = _probing(lambda b: 119 if b == 0.0 else 150)
    assert search_partitioner(peak_at, 120) == (0.0, 119)
    assert probed == [0.5, 0.25, 0.125, 0.0]
    probed, peak_at = _probing(lambda b: 150)
    assert search_partitioner(peak_at, 120) is None and len(probed) == PARTITIONER_PROBES + 1


# ------------------------------------------------------------------------------------------------------- progress
class _Bar:
    """Records what plan shows on its progress bar."""

    def __init__(self, total, desc, progress=None):
        self.total, self.n, self.stages, self.closed = total, 0, [], False

    def set_postfix_str(self, text):
        self.stages.append(text)

    def update(self, n):
        self.n += n

    def close(self):
        self.closed = True


@pytest.mark.slow  # several plans of a real model (5-20 s on two loaded cores)
def test_the_progress_bar_names_each_stage(monkeypatch, caplog):
    pytest.importorskip("transformers")
    bars = []
    monkeypatch.setattr(planner, "progress_bar", lambda *a, **k: bars.append(_Bar(*a, **k)) or bars[-1])
    torch.manual_seed(0)
    model = hub.gpt2(2, 32, heads=4, vocab=128, positions=16)
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(1))
    with caplog.at_level("DEBUG", logger="memsave"):
        p = memsave.plan(model, input_ids=ids, labels=ids, budget=0.9, timing_steps=2, progress=True, cache=False)
    (bar,) = bars
    stages = [s for i, s in enumerate(bar.stages) if i == 0 or s != bar.stages[i - 1]]
    # On CPU the traced step is the first one: no warm-up step before it.
    # The operator classes are recorded in the timing steps: no stage of their own.
    assert stages[:3] == ["profiling", "timing stages", "solving"]
    assert stages[3] == "verifying candidate 1/4"
    assert "measuring eager's peak" not in stages  # on CPU the traced step gave it
    assert bar.closed and bar.n <= bar.total
    # The seconds of each stage, logged at DEBUG (and as a dict on the record).
    (record,) = [r for r in caplog.records if hasattr(r, "memsave_plan_stages")]
    spent = record.memsave_plan_stages
    assert list(spent) == list(dict.fromkeys(stages)) and all(t >= 0 for t in spent.values())
    assert sum(spent.values()) <= p.planning_seconds
    assert "memsave.plan(GPT2LMHeadModel): profiling " in record.getMessage()


# ------------------------------------------------------------------------------------ eager's peak from the trace
def _models():
    yield "gpt2", *_gpt2()
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    resnet = torchvision.models.resnet18(weights=None, num_classes=10)
    yield "resnet18", resnet, (torch.randn(4, 3, 48, 48),), {}


def _gpt2():
    pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = hub.gpt2(2, 32, heads=4, vocab=128, positions=32)
    ids = torch.randint(0, 128, (2, 32), generator=torch.Generator().manual_seed(1))
    return model, (), {"input_ids": ids, "labels": ids}


@pytest.mark.slow  # several plans of a real model (5-20 s on two loaded cores)
def test_on_cpu_eager_peak_from_the_trace_is_a_plain_steps_peak():
    for name, model, args, kwargs in _models():
        prof = planner.profile(model, *args, selective=False, timing_steps=1, **kwargs)

        def step():
            out = model(*args, **kwargs)
            default_loss(out).backward()  # plan's loss when it is given none

        model.zero_grad(set_to_none=True)
        step()  # as plan's warm-up
        model.zero_grad(set_to_none=True)
        assert prof.eager_peak_bytes == cpu_peak_bytes(step), name
