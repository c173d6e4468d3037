"""``memsave.functional``: the functional forms of memsave's memory-efficient operators.

The same objects as :mod:`memsave.operators.functional` (their home); see that module for what each keeps for
backward against what torch keeps.

Examples:
    >>> import memsave.functional as MF
    >>> y = MF.relu(x)                                   # keeps one bit per element for backward
    >>> loss = MF.linear_cross_entropy(hidden, head.weight, labels)
"""

from __future__ import annotations

from .operators.functional import *  # noqa: F403  (every name operators/functional.py lists in __all__)
from .operators.functional import __all__ as __all__
