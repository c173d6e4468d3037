"""One progress bar for memsave's long-running calls (``plan``, ``compare(progress=True)``, the CLI's ``bench``)."""

from __future__ import annotations

from typing import Any, Optional

__all__ = ["progress_bar"]


def progress_bar(total: int, desc: str, unit: str = "it", delay: float = 1.0) -> Optional[Any]:
    """A tqdm bar over ``total`` steps that shows only if the work lasts longer than ``delay`` seconds.

    Args:
        total: number of steps. desc: label. unit: what a step is. delay: seconds before the bar appears.

    Returns:
        the bar (call ``update(n)``, ``set_postfix_str(s)``, ``close()``), or None when tqdm is not installed.

    Examples:
        >>> bar = progress_bar(3, "work")
        >>> for _ in range(3):
        ...     bar.update(1)
        >>> bar.close()
    """
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover - tqdm is a dependency
        return None
    return tqdm(total=total, desc=desc, unit=unit, delay=delay, leave=False)
