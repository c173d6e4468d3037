"""Interleaved timing: how :func:`memsave.measure`, :func:`memsave.compare`, the demo and the command line time
their variants against each other (one implementation; ``benchmarks/`` may reuse it).

Timing each variant in its own block lets a change of load, clock or cache between blocks pass for a difference
between variants. Here every variant is timed once per *round*, the order reversed every other round (A B C, C B
A, A B C, ...), so that a change during the run hits all variants alike. Each timed call is
``torch.utils.benchmark.Timer(...).timeit(number)`` (it keeps the caller's thread count and, on CUDA, synchronizes
around the call); a round times ``number`` steps of each variant, ``number`` chosen in the warm-up so that a round
of one variant lasts at least ``min_round_seconds``. The per-round times of a variant are merged into one
``torch.utils.benchmark.Measurement`` for their median and inter-quartile range (IQR).

A variant's *ratio* to the reference is the median over rounds of (its time / the reference's time in the same
round), with its IQR: the pairing cancels load that changes from round to round.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch

if TYPE_CHECKING:  # imported when timing: it loads torch.utils.cpp_extension (a second, and a warning without CUDA)
    from torch.utils import benchmark

__all__ = ["SPREAD_WARNING", "Timing", "median_iqr", "spread_warning", "time_interleaved"]

#: The IQR / median above which a timing is reported as unreliable.
SPREAD_WARNING = 0.10


@dataclass(frozen=True)
class Timing:
    """One variant's step time from :func:`time_interleaved`.

    Attributes:
        name: the variant.
        median_seconds: median over rounds of the seconds per step.
        iqr_seconds: inter-quartile range of the same.
        rounds: how many rounds were timed.
        steps_per_round: steps timed together in one round (their mean is the round's time).
        times: seconds per step in each round, in round order.
        ratio: median over rounds of this variant's time / the reference's time in the same round (1.0 for the
            reference itself).
        ratio_iqr: inter-quartile range of those per-round ratios.
    """

    name: str
    median_seconds: float
    iqr_seconds: float
    rounds: int
    steps_per_round: int
    times: Tuple[float, ...]
    ratio: float = 1.0
    ratio_iqr: float = 0.0

    @property
    def spread(self) -> float:
        """IQR / median of the step time (0.0 when the median is 0)."""
        return self.iqr_seconds / self.median_seconds if self.median_seconds > 0 else 0.0


def median_iqr(values: Sequence[float]) -> Tuple[float, float]:
    """The median and inter-quartile range of ``values`` (numpy's linear percentiles, as torch.utils.benchmark).

    Raises:
        ValueError: ``values`` is empty.

    Example:
        >>> median_iqr([1.0, 2.0, 3.0, 4.0, 100.0])
        (3.0, 2.0)
    """
    if not len(values):
        raise ValueError("median_iqr: no values")
    arr = np.asarray(values, dtype=float)
    q25, q50, q75 = np.percentile(arr, [25, 50, 75])
    return float(q50), float(q75 - q25)


def _timer(fn: Callable[[], Any], name: str) -> "benchmark.Timer":
    from torch.utils import benchmark

    return benchmark.Timer(
        stmt="step()", globals={"step": fn}, num_threads=torch.get_num_threads(), label="memsave", sub_label=name
    )


def _check(steps: Mapping[str, Callable[[], Any]], rounds: int, warmup: int, min_round_seconds: float) -> None:
    if not steps:
        raise ValueError("time_interleaved: no variants to time")
    for name, fn in steps.items():
        if not callable(fn):
            raise TypeError(f"time_interleaved: variant {name!r} is a {type(fn).__name__}, not a callable step")
    if not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"time_interleaved: rounds must be an int >= 1, got {rounds!r}")
    if not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"time_interleaved: warmup must be an int >= 0, got {warmup!r}")
    if not min_round_seconds >= 0:
        raise ValueError(f"time_interleaved: min_round_seconds must be >= 0, got {min_round_seconds!r}")


def time_interleaved(
    steps: Mapping[str, Callable[[], Any]],
    *,
    rounds: int = 5,
    warmup: int = 1,
    min_round_seconds: float = 0.02,
    reference: Optional[str] = None,
) -> Dict[str, Timing]:
    """Time each step function over ``rounds`` interleaved rounds (see the module docstring).

    Args:
        steps: variant name -> a function running one step (it is called many times).
        rounds: timed rounds (>= 1); each gives one time per variant.
        warmup: untimed calls of each variant first (>= 0); the reference's fastest of them (or one call when
            ``warmup`` is 0) sets how many steps of each variant a round times.
        min_round_seconds: the least time one variant's share of a round should take; cheap steps are repeated
            within a round until it does, so that the timer's own resolution does not dominate.
        reference: the variant ratios are taken to; default the first.

    Returns:
        variant name -> :class:`Timing`, in the order of ``steps``.

    Raises:
        ValueError: no variants, ``rounds`` < 1, ``warmup`` < 0, or ``reference`` is not a variant.
        TypeError: a step is not callable.

    Example:
        >>> t = time_interleaved({"a": lambda: sum(range(1000)), "b": lambda: sum(range(1000))}, rounds=7)
        >>> t["b"].ratio, t["b"].ratio_iqr, t["b"].rounds       # about 1.0, small, 7
    """
    from torch.utils import benchmark

    _check(steps, rounds, warmup, min_round_seconds)
    names = list(steps)
    ref = names[0] if reference is None else reference
    if ref not in steps:
        raise ValueError(f"time_interleaved: reference {ref!r} is not one of the variants {names}")
    timers = {n: _timer(steps[n], n) for n in names}
    first: Dict[str, float] = {}
    for n in names:
        first[n] = min(timers[n].timeit(1).times[0] for _ in range(max(warmup, 1)))
    # One number of steps per round for every variant, from the reference: like is timed against like.
    number = max(1, math.ceil(min_round_seconds / first[ref])) if first[ref] > 0 else 1
    taken: Dict[str, List["benchmark.Measurement"]] = {n: [] for n in names}
    for r in range(rounds):
        for n in names if r % 2 == 0 else names[::-1]:
            taken[n].append(timers[n].timeit(number))
    out: Dict[str, Timing] = {}
    ref_times = [m.times[0] for m in taken[ref]]
    for n in names:
        merged = benchmark.Measurement.merge(taken[n])[0]
        times = tuple(m.times[0] for m in taken[n])
        ratio, ratio_iqr = median_iqr([t / rt if rt > 0 else float("nan") for t, rt in zip(times, ref_times)])
        out[n] = Timing(
            name=n,
            median_seconds=float(merged.median),
            iqr_seconds=float(merged.iqr),
            rounds=rounds,
            steps_per_round=number,
            times=times,
            ratio=1.0 if n == ref else ratio,
            ratio_iqr=0.0 if n == ref else ratio_iqr,
        )
    return out


def spread_warning(timings: Sequence[Timing], where: str, threshold: float = SPREAD_WARNING) -> Optional[str]:
    """A warning text when a timing's IQR exceeds ``threshold`` of its median, else None.

    Args:
        timings: the timings to check.
        where: the caller, for the message (``"compare"``).
        threshold: the largest IQR / median taken as reliable.

    Returns:
        the message naming every variant over the threshold, or None.

    Example:
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
