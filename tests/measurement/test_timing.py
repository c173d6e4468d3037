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
