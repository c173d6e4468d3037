"""Interleaved timing: how :func:`memsave.measure`, :func:`memsave.compare`, the demo and the command line time
their variants against each other (one implementation; ``benchmarks/`` may reuse it).

Timing each variant in its own block lets a change of load, clock or cache between blocks pass for a difference
between variants. Here every variant is timed once per *round*, the order reversed every other round (A B C, C B
A, A B C, ...), so that a change during the run hits all variants alike. Within a round each variant is timed in a
few short *windows*, again in turn (A B C A B C ...), and the round keeps each variant's fastest window: other
programs can only add time to a window, so the fastest one is the least disturbed (the "best of" that ``timeit``
recommends). A window is ``timeit.Timer(step, timer=clock).timeit(number)`` with torch.utils.benchmark's clock,
which synchronizes the accelerator around the call: ``number`` steps, chosen in the warm-up so that a window lasts
at least ``min_window_seconds``; a round has ``min_windows`` windows of each variant, or as many as make a
variant's share of a round last ``min_round_seconds`` (at most ``max_windows``). The step time is the median over
rounds, with the inter-quartile range (IQR).

The number of rounds adapts to the load: after ``rounds`` rounds, more are timed (up to ``max_rounds``) while a
median is still uncertain, that is while IQR / median / sqrt(rounds) -- about the median's relative standard error
-- exceeds ``precision`` for some variant's ratio (for a lone variant, its time). A busy machine widens the spread,
and more rounds then narrow the median; :attr:`Timing.rounds` says how many were timed.

A variant's *ratio* to the reference is the median over rounds of (its time / the reference's time in the same
round), with its IQR: the pairing cancels load that changes from round to round.
"""

from __future__ import annotations

import math
import timeit
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from ..common import compat

__all__ = [
    "PRECISION",
    "SPREAD_WARNING",
    "Timing",
    "TimingSettings",
    "median_iqr",
    "spread_warning",
    "time_interleaved",
]

#: The IQR / median above which a timing is reported as unreliable.
SPREAD_WARNING = 0.10

#: The relative uncertainty of a median (IQR / median / sqrt(rounds)) that the adaptive rounds aim for.
PRECISION = 0.02


@dataclass(frozen=True)
class Timing:
    """One variant's step time from :func:`time_interleaved`.

    Attributes:
        name: the variant.
        median_seconds: median over rounds of the seconds per step (each round's fastest window).
        iqr_seconds: inter-quartile range of the same.
        rounds: how many rounds were timed (more than asked when the spread was wide).
        steps_per_round: steps timed together in one window (their mean is the window's time).
        times: seconds per step in each round (its fastest window), in round order.
        ratio: median over rounds of this variant's time / the reference's time in the same round (1.0 for the
            reference itself).
        ratio_iqr: inter-quartile range of those per-round ratios.
        windows: timed windows per round, the fastest of which is the round's time.
    """

    name: str
    median_seconds: float
    iqr_seconds: float
    rounds: int
    steps_per_round: int
    times: Tuple[float, ...]
    ratio: float = 1.0
    ratio_iqr: float = 0.0
    windows: int = 1

    @property
    def spread(self) -> float:
        """IQR / median of the step time (0.0 when the median is 0)."""
        return self.iqr_seconds / self.median_seconds if self.median_seconds > 0 else 0.0


def median_iqr(values: Sequence[float]) -> Tuple[float, float]:
    """The median and inter-quartile range of ``values`` (numpy's linear percentiles, as torch.utils.benchmark).

    Raises:
        ValueError: ``values`` is empty.

    Examples:
        >>> median_iqr([1.0, 2.0, 3.0, 4.0, 100.0])
        (3.0, 2.0)
    """
    if not len(values):
        raise ValueError("median_iqr: no values")
    arr = np.asarray(values, dtype=float)
    q25, q50, q75 = np.percentile(arr, [25, 50, 75])
    return float(q50), float(q75 - q25)


def _timer(fn: Callable[[], Any], clock: Optional[Callable[[], float]]) -> timeit.Timer:
    if clock is not None:
        return timeit.Timer(fn, timer=clock)
    with compat.quiet_torch_import_logs():  # its import logs "No CUDA runtime is found" on a CPU machine
        from torch.utils.benchmark.utils.timer import timer  # synchronizes the accelerator around the call

    return timeit.Timer(fn, timer=timer)


def _seconds(timer: timeit.Timer, number: int) -> float:
    """Seconds per step over ``number`` steps (at least 1 ns, as torch.utils.benchmark)."""
    return max(timer.timeit(number), 1e-9) / number


@dataclass(frozen=True)
class TimingSettings:
    """How :func:`time_interleaved` times: its keyword arguments, checked together (see there for each).

    Examples:
        >>> TimingSettings(rounds=7).max_rounds                  # 4 * rounds unless given
        28
        >>> TimingSettings(rounds=0)
        Traceback (most recent call last):
        ValueError: time_interleaved: rounds must be an int >= 1, got 0
    """

    rounds: int = 5
    max_rounds: Optional[int] = None
    precision: float = PRECISION
    warmup: int = 1
    min_round_seconds: float = 0.05
    min_window_seconds: float = 0.002
    min_windows: int = 3
    max_windows: int = 8

    def __post_init__(self) -> None:
        if not isinstance(self.rounds, int) or self.rounds < 1:
            raise ValueError(f"time_interleaved: rounds must be an int >= 1, got {self.rounds!r}")
        if self.max_rounds is None:
            object.__setattr__(self, "max_rounds", 4 * self.rounds)
        if not isinstance(self.max_rounds, int) or self.max_rounds < self.rounds:
            raise ValueError(
                f"time_interleaved: max_rounds must be an int >= rounds ({self.rounds}), got {self.max_rounds!r}"
            )
        if not isinstance(self.warmup, int) or self.warmup < 0:
            raise ValueError(f"time_interleaved: warmup must be an int >= 0, got {self.warmup!r}")
        for label in ("min_round_seconds", "min_window_seconds", "precision"):
            if not getattr(self, label) >= 0:
                raise ValueError(f"time_interleaved: {label} must be >= 0, got {getattr(self, label)!r}")
        fewest, most = self.min_windows, self.max_windows
        if not (isinstance(fewest, int) and isinstance(most, int) and 1 <= fewest <= most):
            raise ValueError(
                f"time_interleaved: need ints 1 <= min_windows <= max_windows, got min_windows={fewest!r}, "
                f"max_windows={most!r}"
            )


def _check_steps(steps: Mapping[str, Callable[[], Any]]) -> None:
    if not steps:
        raise ValueError("time_interleaved: no variants to time")
    for name, fn in steps.items():
        if not callable(fn):
            raise TypeError(f"time_interleaved: variant {name!r} is a {type(fn).__name__}, not a callable step")


def _window_shape(first: float, settings: TimingSettings) -> Tuple[int, int]:
    """(steps per window, windows per round) for a step that took ``first`` seconds in the warm-up."""
    number = max(1, math.ceil(settings.min_window_seconds / first))
    windows = math.ceil(settings.min_round_seconds / (number * first))
    return number, min(settings.max_windows, max(settings.min_windows, windows))


def _more_rounds(done: Sequence[float], settings: TimingSettings, uncertain: Callable[[], bool]) -> bool:
    """Whether to time another round: fewer than ``rounds`` so far, or medians still uncertain below ``max_rounds``."""
    assert settings.max_rounds is not None  # set by TimingSettings
    return len(done) < settings.rounds or (len(done) < settings.max_rounds and uncertain())


def time_interleaved(
    steps: Mapping[str, Callable[[], Any]],
    *,
    rounds: int = 5,
    max_rounds: Optional[int] = None,
    precision: float = PRECISION,
    warmup: int = 1,
    min_round_seconds: float = 0.05,
    min_window_seconds: float = 0.002,
    min_windows: int = 3,
    max_windows: int = 8,
    reference: Optional[str] = None,
    clock: Optional[Callable[[], float]] = None,
) -> Dict[str, Timing]:
    """Time each step function over interleaved rounds (see the module docstring).

    Args:
        steps: variant name -> a function running one step (it is called many times).
        rounds: the fewest timed rounds (>= 1); each gives one time per variant.
        max_rounds: the most rounds (>= ``rounds``) when the medians stay uncertain; default ``4 * rounds``;
            ``rounds`` turns the adaptation off.
        precision: rounds are added while IQR / median / sqrt(rounds) exceeds this for some variant's ratio to the
            reference (for a lone variant, its time); 0 always times ``max_rounds``.
        warmup: untimed calls of each variant first (>= 0); the reference's fastest of them (or one call when
            ``warmup`` is 0) sets the windows' length and number, the same for every variant.
        min_round_seconds: the least time one variant's share of a round should take; cheap steps get more
            windows (up to ``max_windows``), whose fastest is the round's time.
        min_window_seconds: the least time one window should take; cheap steps are repeated within a window, so
            that the timer's own resolution does not dominate.
        min_windows: the fewest windows per round (>= 1), however long a step.
        max_windows: the most windows per round (>= ``min_windows``).
        reference: the variant ratios are taken to; default the first.
        clock: the timer (seconds, a float); default torch.utils.benchmark's, which synchronizes the accelerator.

    Returns:
        variant name -> :class:`Timing`, in the order of ``steps``; ``Timing.rounds`` is the rounds timed.

    Raises:
        ValueError: no variants, ``rounds`` < 1, ``max_rounds`` < ``rounds``, ``warmup`` < 0, a negative time limit
            or precision, window counts out of order, or ``reference`` is not a variant.
        TypeError: a step is not callable.

    Examples:
        >>> t = time_interleaved({"a": lambda: sum(range(1000)), "b": lambda: sum(range(1000))}, rounds=7)
        >>> t["b"].ratio, t["b"].ratio_iqr, t["b"].rounds       # about 1.0, small, 7 or more
    """
    _check_steps(steps)
    settings = TimingSettings(
        rounds, max_rounds, precision, warmup, min_round_seconds, min_window_seconds, min_windows, max_windows
    )
    names = list(steps)
    ref = names[0] if reference is None else reference
    if ref not in steps:
        raise ValueError(f"time_interleaved: reference {ref!r} is not one of the variants {names}")
    timers = {n: _timer(steps[n], clock) for n in names}
    first = {n: min(_seconds(timers[n], 1) for _ in range(max(settings.warmup, 1))) for n in names}
    # One window shape for every variant, from the reference: like is timed against like.
    number, windows = _window_shape(first[ref], settings)
    taken: Dict[str, List[float]] = {n: [] for n in names}
    while _more_rounds(taken[ref], settings, lambda: _uncertain(taken, ref, settings.precision)):
        order = names if len(taken[ref]) % 2 == 0 else names[::-1]
        best = {n: math.inf for n in names}
        for _ in range(windows):
            for n in order:
                best[n] = min(best[n], _seconds(timers[n], number))
        for n in names:
            taken[n].append(best[n])
    return {n: _timing(n, taken[n], taken[ref], n == ref, number, windows) for n in names}


def _uncertain(taken: Mapping[str, Sequence[float]], ref: str, precision: float) -> bool:
    """Whether some median is still uncertain: IQR / median / sqrt(rounds) over ``precision`` for a variant's
    per-round ratio to ``ref`` (for ``ref`` alone, its time)."""
    series = [_ratios(taken[n], taken[ref]) for n in taken if n != ref]
    for values in series or [list(taken[ref])]:
        median, iqr = median_iqr(values)
        if not math.isfinite(median) or median <= 0 or iqr / median / math.sqrt(len(values)) > precision:
            return True
    return False


def _ratios(times: Sequence[float], ref_times: Sequence[float]) -> List[float]:
    """Each round's time over the reference's in the same round (NaN where the reference took no time)."""
    return [t / rt if rt > 0 else float("nan") for t, rt in zip(times, ref_times)]


def _timing(name: str, times: List[float], ref_times: List[float], is_ref: bool, number: int, windows: int) -> Timing:
    median, iqr = median_iqr(times)
    ratio, ratio_iqr = median_iqr(_ratios(times, ref_times))
    return Timing(
        name=name,
        median_seconds=median,
        iqr_seconds=iqr,
        rounds=len(times),
        steps_per_round=number,
        times=tuple(times),
        ratio=1.0 if is_ref else ratio,
        ratio_iqr=0.0 if is_ref else ratio_iqr,
        windows=windows,
    )


def spread_warning(timings: Sequence[Timing], where: str, threshold: float = SPREAD_WARNING) -> Optional[str]:
    """A warning text when a timing's IQR exceeds ``threshold`` of its median, else None.

    Args:
        timings: the timings to check.
        where: the caller, for the message (``"compare"``).
        threshold: the largest IQR / median taken as reliable.

    Returns:
        the message naming every variant over the threshold, or None.

    Examples:
        >>> t = Timing("eager", 1.0, 0.3, 5, 1, (1.0,) * 5)
        >>> spread_warning([t], "compare")[:40]
        "compare: step times spread widely (IQR o"
    """
    noisy = [t for t in timings if t.spread > threshold]
    if not noisy:
        return None
    shown = ", ".join(f"{t.name} {100 * t.spread:.0f}%" for t in noisy)
    rounds = max(t.rounds for t in timings)
    return (
        f"{where}: step times spread widely (IQR over {100 * threshold:.0f}% of the median over {rounds} rounds: "
        f"{shown}), so the step times and their ratios are uncertain; close other programs, or time more rounds "
        "(steps=...)"
    )
