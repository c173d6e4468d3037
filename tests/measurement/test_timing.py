"""memsave.measurement.timing on an injected clock: steps advance a fake clock by a known cost, so the interleaving,
the best-of-windows rule and the paired ratios are checked exactly, whatever the machine's load."""

from typing import Callable, Dict, List

import pytest

from memsave.measurement.timing import time_interleaved


class FakeClock:
    """A clock that only moves when a step runs: each step adds its cost, plus any disturbance scheduled for it."""

    def __init__(self) -> None:
        self.now = 0.0
        self.calls: List[str] = []

    def __call__(self) -> float:
        return self.now

    def step(self, name: str, cost: float, disturb: Callable[[int], float] = lambda i: 0.0) -> Callable[[], None]:
        count = [0]

        def run() -> None:
            self.calls.append(name)
            self.now += cost + disturb(count[0])
            count[0] += 1

        return run


def _timed(clock: FakeClock, costs: Dict[str, float], **kw) -> Dict:
    steps = {n: clock.step(n, c) for n, c in costs.items()}
    return time_interleaved(steps, clock=clock, **kw)


def test_ratio_and_median_are_exact_for_steady_costs():
    clock = FakeClock()
    t = _timed(clock, {"eager": 0.010, "wrap": 0.015}, rounds=5)
    assert t["eager"].ratio == 1.0 and t["eager"].ratio_iqr == 0.0
    assert t["wrap"].ratio == pytest.approx(1.5, rel=1e-12) and t["wrap"].ratio_iqr == pytest.approx(0.0, abs=1e-12)
    assert t["wrap"].median_seconds == pytest.approx(0.015, rel=1e-12) and t["wrap"].rounds == 5
    assert t["wrap"].spread == pytest.approx(0.0, abs=1e-9)


def test_window_shape_follows_the_reference_warmup():
    # 11 ms steps: one step per 2 ms window, 5 windows fill a 50 ms round.
    t = _timed(FakeClock(), {"a": 0.011, "b": 0.001})
    assert (t["a"].steps_per_round, t["a"].windows) == (1, 5) and (t["b"].steps_per_round, t["b"].windows) == (1, 5)
    # 0.5 ms steps: 4 steps a window, the windows capped at max_windows.
    t = _timed(FakeClock(), {"a": 0.0005}, max_windows=3)
    assert (t["a"].steps_per_round, t["a"].windows) == (4, 3)
    # Slow steps: min_windows a round.
    assert _timed(FakeClock(), {"a": 1.0})["a"].windows == 3
    assert _timed(FakeClock(), {"a": 1.0}, min_windows=1)["a"].windows == 1


def test_the_fastest_window_hides_a_disturbance_other_windows_had():
    clock = FakeClock()
    # Every other call of 'b' is slowed by another program (+40 ms): each round still has undisturbed windows.
    steps = {"a": clock.step("a", 0.010), "b": clock.step("b", 0.010, disturb=lambda i: 0.040 * (i % 2))}
    t = time_interleaved(steps, rounds=7, clock=clock)
    assert t["b"].ratio == pytest.approx(1.0, rel=1e-12) and t["b"].median_seconds == pytest.approx(0.010)


def test_rounds_alternate_their_order_and_windows_interleave():
    clock = FakeClock()
    steps = {"a": clock.step("a", 0.5), "b": clock.step("b", 0.5)}
    time_interleaved(steps, rounds=3, warmup=0, min_round_seconds=0, min_windows=2, clock=clock)
    # After one warm-up call each: two windows of one step per variant and round, the order reversed each round.
    assert "".join(clock.calls[2:]) == "abab" + "baba" + "abab"


def test_bad_limits_are_refused():
    step = {"a": lambda: None}
    with pytest.raises(ValueError, match="max_windows"):
        time_interleaved(step, max_windows=0)
    with pytest.raises(ValueError, match="min_windows"):
        time_interleaved(step, min_windows=4, max_windows=3)
    with pytest.raises(ValueError, match="min_window_seconds"):
        time_interleaved(step, min_window_seconds=-1.0)
    with pytest.raises(ValueError, match="reference"):
        time_interleaved(step, reference="b")
    with pytest.raises(ValueError, match="max_rounds"):
        time_interleaved(step, rounds=5, max_rounds=4)
    with pytest.raises(ValueError, match="precision"):
        time_interleaved(step, precision=-0.1)


# One step per window and one window per round: each round's time is one call, so disturbances reach the ratios.
ONE_CALL_ROUNDS = dict(warmup=0, min_round_seconds=0, min_window_seconds=0, min_windows=1, max_windows=1)


def test_steady_ratios_take_the_rounds_asked_for():
    t = _timed(FakeClock(), {"a": 0.010, "b": 0.013}, rounds=5, **ONE_CALL_ROUNDS)
    assert t["a"].rounds == t["b"].rounds == 5


def test_wide_ratios_take_more_rounds_up_to_the_cap():
    clock = FakeClock()
    # b's calls (the first is the warm-up) cost 10, 14, 18, 10, ... ms: ratios 1.4, 1.8, 1.0, ... never narrow.
    steps = {"a": clock.step("a", 0.010), "b": clock.step("b", 0.010, disturb=lambda i: 0.004 * (i % 3))}
    t = time_interleaved(steps, rounds=5, clock=clock, **ONE_CALL_ROUNDS)
    assert t["b"].rounds == 20 and len(t["b"].times) == 20 and t["a"].rounds == 20
    assert sorted({round(r, 9) for r in (tb / ta for tb, ta in zip(t["b"].times, t["a"].times))}) == [1.0, 1.4, 1.8]
    clock = FakeClock()
    steps = {"a": clock.step("a", 0.010), "b": clock.step("b", 0.010, disturb=lambda i: 0.004 * (i % 3))}
    assert time_interleaved(steps, rounds=5, max_rounds=7, clock=clock, **ONE_CALL_ROUNDS)["b"].rounds == 7
    clock = FakeClock()
    steps = {"a": clock.step("a", 0.010), "b": clock.step("b", 0.010, disturb=lambda i: 0.004 * (i % 3))}
    assert time_interleaved(steps, rounds=5, max_rounds=5, clock=clock, **ONE_CALL_ROUNDS)["b"].rounds == 5


def test_rounds_stop_once_the_median_is_certain():
    clock = FakeClock()
    # Another program slows b in every other one of its first six rounds (calls 1-6; call 0 is the warm-up).
    steps = {"a": clock.step("a", 0.010), "b": clock.step("b", 0.010, disturb=lambda i: 0.008 * (i in (1, 3, 5)))}
    t = time_interleaved(steps, rounds=5, clock=clock, **ONE_CALL_ROUNDS)
    # Rounds are added until the undisturbed ratios (1.0) fill the inter-quartile range, well before the cap.
    ratios = [tb / ta for tb, ta in zip(t["b"].times, t["a"].times)]
    assert 5 < t["b"].rounds < 20 and t["b"].ratio == pytest.approx(1.0) and t["b"].ratio_iqr == pytest.approx(0.0)
    assert ratios[:6] == pytest.approx([1.8, 1.0] * 3) and ratios[6:] == pytest.approx([1.0] * (len(ratios) - 6))


def test_a_lone_variant_adapts_to_the_spread_of_its_time():
    clock = FakeClock()
    t = time_interleaved(
        {"a": clock.step("a", 0.010, disturb=lambda i: 0.005 * (i % 2))}, clock=clock, **ONE_CALL_ROUNDS
    )
    assert t["a"].rounds == 20
    clock = FakeClock()
    assert time_interleaved({"a": clock.step("a", 0.010)}, clock=clock, **ONE_CALL_ROUNDS)["a"].rounds == 5
