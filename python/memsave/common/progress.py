"""One progress bar for memsave's long-running calls (``plan``, ``compare``, the CLI's ``demo``, ``bench`` and
``estimate``), and one switch for it.

A bar appears only when the work lasts longer than a second, on stderr, and is erased when the work ends, so it never
stays between result lines. ``progress=False`` on a call, ``MEMSAVE_PROGRESS=0`` in the environment, or the command
line's ``--no-progress`` turn it off; an explicit ``progress=True`` wins over the environment.
"""

from __future__ import annotations

import os
from typing import Any, Optional

__all__ = ["PROGRESS_ENV", "progress_bar", "progress_enabled"]

#: The environment variable that turns every progress bar off (``0``, ``false``, ``off`` or ``no``).
PROGRESS_ENV = "MEMSAVE_PROGRESS"


def progress_enabled(progress: Optional[bool] = None) -> bool:
    """Whether to show a progress bar: ``progress`` when given, else what :data:`PROGRESS_ENV` says (default on).

    Args:
        progress: the caller's ``progress=`` argument; None defers to the environment.

    Returns:
        True to show the bar.

    Raises:
        TypeError: ``progress`` is neither a bool nor None.

    Examples:
        >>> os.environ["MEMSAVE_PROGRESS"] = "0"
        >>> progress_enabled(), progress_enabled(True)
        (False, True)
    """
    if progress is not None:
        if not isinstance(progress, bool):
            raise TypeError(f"progress must be True, False or None (the environment decides), got {progress!r}")
        return progress
    return os.environ.get(PROGRESS_ENV, "1").strip().lower() not in ("0", "false", "off", "no")


def progress_bar(
    total: int, desc: str, unit: str = "it", delay: float = 1.0, progress: Optional[bool] = None
) -> Optional[Any]:
    """A tqdm bar over ``total`` steps that shows only if the work lasts longer than ``delay`` seconds.

    Args:
        total: number of steps. desc: label. unit: what a step is. delay: seconds before the bar appears.
        progress: the caller's switch (:func:`progress_enabled`).

    Returns:
        the bar (call ``update(n)``, ``set_postfix_str(s)``, ``close()``), or None when progress is off or tqdm is
        not installed.

    Raises:
        TypeError: ``progress`` is neither a bool nor None.

    Examples:
        >>> bar = progress_bar(3, "work")
        >>> for _ in range(3):
        ...     bar.update(1)
        >>> bar.close()
    """
    if not progress_enabled(progress):
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover - tqdm is a dependency
        return None
    return tqdm(total=total, desc=desc, unit=unit, delay=delay, leave=False)
