"""``memsave.nn``: memory-efficient drop-in modules.

The same classes as :mod:`memsave.operators.nn` (their home), which lists them by family.

Examples:
    >>> import memsave.nn as mnn
    >>> act = mnn.ReLU(inplace=True)                     # keeps one bit per element for backward
    >>> norm = mnn.RMSNorm(4096, eps=1e-6)
"""

from __future__ import annotations

from .operators.nn import *  # noqa: F403  (every name operators/nn/__init__.py lists in __all__)
from .operators.nn import __all__ as __all__
