"""Which dispatch keys the ``torch.ops.memsave`` operators have kernels for (for ``python -m memsave info``).

Uses two private ``torch._C`` queries, kept in this one module: they are stable since torch 2.0 and only feed a
diagnostic printout, never a computation.
"""
from __future__ import annotations

from typing import Dict, List

import torch

_KEYS = ("CPU", "CUDA", "Meta", "Autograd")


def dispatch_table() -> Dict[str, List[str]]:
    """Map each ``memsave::`` operator to the dispatch keys it has a kernel for.

    Returns:
        ``{"memsave::relu": ["CPU", "CUDA", "Meta", "Autograd"], ...}`` sorted by operator name. "Meta" is the
        fake kernel (used by torch.compile and FakeTensorMode); "Autograd" the registered backward.

    Example:
        >>> memsave.dispatch_table()["memsave::relu"]
        ['CPU', 'CUDA', 'Meta', 'Autograd']
    """
    names = sorted(n for n in torch._C._dispatch_get_all_op_names() if n.startswith("memsave::"))
    table: Dict[str, List[str]] = {}
    for name in names:
        table[name] = [k for k in _KEYS if torch._C._dispatch_has_kernel_for_dispatch_key(name, k)]
    return table
