"""Memory sizes and budgets as people write them, and as memsave prints them: one parser, one unit table.

Every spelling has one meaning, wherever memsave reads a size (``plan(budget=...)``, ``plan:<budget>`` strategies,
``max_batch_size(memory=...)``, the command line):

==========================  ==========================================  =====================  ======================
spelling                    meaning                                     :func:`parse_bytes`    :func:`parse_budget`
==========================  ==========================================  =====================  ======================
``4096`` (int), ``"4096"``  bytes                                       yes                    yes
``"512MiB"``, ``"1.5 GB"``  bytes: KiB/MiB/GiB/TiB (or Ki, Mi, ...) are  yes                    yes
                            powers of 1024, KB/MB/GB/TB (or K, M, ...)
                            powers of 1000, B is 1; case-insensitive
``0.5`` (float), ``"0.5"``  a fraction of the eager step's peak         no (ValueError)        yes
``"50%"``                   the same fraction, as a percentage          no (ValueError)        yes
==========================  ==========================================  =====================  ======================

A bare number with a decimal point is a fraction, never bytes (``"0.5"`` is half of eager's peak, not half a byte):
write bytes as an integer or with a unit.
"""

from __future__ import annotations

import math
import numbers
import re
from typing import Optional, Tuple, Union

__all__ = ["Budget", "format_bytes", "is_fraction", "parse_budget", "parse_bytes"]

#: What a memory budget may be: bytes (int, or a string with a unit) or a fraction of eager's peak (float, "50%").
Budget = Union[int, float, str]

_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "m": 10**6,
    "mb": 10**6,
    "g": 10**9,
    "gb": 10**9,
    "t": 10**12,
    "tb": 10**12,
    "ki": 2**10,
    "kib": 2**10,
    "mi": 2**20,
    "mib": 2**20,
    "gi": 2**30,
    "gib": 2**30,
    "ti": 2**40,
    "tib": 2**40,
}
_NUMBER = r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE]([+-]?[0-9]+))?"
_SIZE_RE = re.compile(r"^\s*" + _NUMBER + r"\s*([A-Za-z]*|%)\s*$")
_HOW = (
    "write bytes as an int, or a string with a unit such as '512MiB', '4GB', '1.5 GiB' (units: B, KB/MB/GB/TB = "
    "1000^n, KiB/MiB/GiB/TiB = 1024^n)"
)


def _parse(value: object, what: str, fractions: bool) -> Tuple[str, float]:
    """``("bytes", n)`` or ``("fraction", f)``; raises TypeError/ValueError naming ``what``."""
    also = ", or a fraction of eager's peak such as 0.5 or '50%'" if fractions else ""
    if isinstance(value, bool) or not isinstance(value, (numbers.Real, str)):
        raise TypeError(f"{what}: expected a memory size, got {type(value).__name__} {value!r}; {_HOW}{also}")
    if isinstance(value, numbers.Integral):
        if value <= 0:
            raise ValueError(f"{what}: must be > 0 bytes, got {value}")
        return "bytes", float(value)
    if isinstance(value, numbers.Real):
        f = float(value)
        if not fractions:
            raise ValueError(
                f"{what}: a float ({value!r}) means a fraction of eager's peak, which is not a size here; {_HOW}"
            )
        if not math.isfinite(f) or f <= 0:
            raise ValueError(f"{what}: a fraction of eager's peak must be a positive number, got {value!r}")
        return "fraction", f
    m = _SIZE_RE.match(value)
    unit = m.group(3).lower() if m else None
    if m is None or (unit not in _UNITS and unit != "%"):
        raise ValueError(f"{what}: cannot parse {value!r} as a memory size; {_HOW}{also}")
    number = float(m.group(1)) * (10 ** int(m.group(2)) if m.group(2) else 1)
    is_fraction = unit == "%" or (unit == "" and ("." in m.group(1) or m.group(2) is not None))
    if is_fraction:
        if not fractions:
            raise ValueError(f"{what}: {value!r} reads as a fraction of eager's peak, which is not a size here; {_HOW}")
        f = number / 100.0 if unit == "%" else number
        if not math.isfinite(f) or f <= 0:
            raise ValueError(f"{what}: a fraction of eager's peak must be positive, got {value!r}")
        return "fraction", f
    n = number * _UNITS[unit]
    if n < 1:
        raise ValueError(f"{what}: {value!r} is less than one byte; give a positive size")
    return "bytes", n


def parse_bytes(value: Union[int, str], what: str = "memory") -> int:
    """Parse a memory size: an int of bytes, or a string such as ``"24GiB"``, ``"512MB"``, ``"1.5 GiB"``, ``"4096"``.

    A 24 GB GPU card usually has 24 GiB: write ``"24GiB"``. See the module docstring for every spelling.

    Args:
        value: the size.
        what: what the size is, for the error message.

    Returns:
        the size in bytes (rounded down to an int, >= 1).

    Raises:
        ValueError: the string does not parse, the size is not positive, or it is a fraction (a float, ``"0.5"``,
            ``"50%"``), which only a budget can be.
        TypeError: ``value`` is neither an int nor a string.

    Examples:
        >>> parse_bytes("1.5KiB")
        1536
    """
    _, n = _parse(value, what, fractions=False)
    return int(n)


def parse_budget(budget: Budget, eager_peak_bytes: Optional[int] = None, what: str = "memsave.plan: budget") -> int:
    """Turn a memory budget into bytes: a size as :func:`parse_bytes` reads it, or a fraction of eager's peak.

    Args:
        budget: an int number of bytes; a string with a unit (``"512MiB"``); or a fraction of ``eager_peak_bytes``:
            a float (``0.5``), a bare decimal string (``"0.5"``) or a percentage (``"50%"``).
        eager_peak_bytes: eager's measured peak, needed for a fraction.
        what: what the budget is, for the error message.

    Returns:
        the budget in bytes (>= 1).

    Raises:
        TypeError: the budget is not an int, float or str (a bool, say).
        ValueError: the budget is not positive, the string cannot be parsed, or a fraction is given without
            ``eager_peak_bytes``.

    Examples:
        >>> parse_budget("1.5 KiB")
        1536
        >>> parse_budget("50%", eager_peak_bytes=1000)
        500
    """
    kind, v = _parse(budget, what, fractions=True)
    if kind == "bytes":
        return int(v)
    if eager_peak_bytes is None:
        raise ValueError(f"{what}: a fractional budget ({budget!r}) needs eager's peak (memsave.plan measures it)")
    return max(1, int(v * eager_peak_bytes))


def is_fraction(budget: Budget) -> bool:
    """Whether ``budget`` is a fraction of eager's peak (so it needs that peak to become bytes).

    Raises:
        TypeError, ValueError: as :func:`parse_budget`.

    Examples:
        >>> is_fraction("50%"), is_fraction("2GiB")
        (True, False)
    """
    return _parse(budget, "budget", fractions=True)[0] == "fraction"


def format_bytes(n: Optional[Union[int, float]]) -> str:
    """Human-readable binary size.

    Args:
        n: a number of bytes (may be negative), or None.

    Returns:
        e.g. ``"12.3 MiB"``; ``"-"`` for None.

    Examples:
        >>> format_bytes(3 * 2**20)
        '3.00 MiB'
    """
    if n is None:
        return "-"
    sign = "-" if n < 0 else ""
    v = float(abs(n))
    for unit in ("B", "KiB", "MiB", "GiB"):
        if v < 1024 or unit == "GiB":
            return f"{sign}{int(v)} B" if unit == "B" else f"{sign}{v:.2f} {unit}"
        v /= 1024
    raise AssertionError("unreachable")
