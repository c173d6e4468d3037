"""memsave's compiled extension (``memsave._C``): load it, refusing a torch it was not built against, and report
what was built (:func:`build_info`) and which dispatch keys its operators have kernels for (:func:`dispatch_table`).

A C++ extension is tied to the exact torch it was compiled with (C++ ABI, dispatcher internals). Loading it under
another torch fails with an undefined-symbol error at best and corrupts memory at worst, so the versions are compared
*before* the shared library is loaded, and the error says how to rebuild.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Dict, List

import torch

__all__ = ["REBUILD_COMMAND", "build_info", "dispatch_table", "load_extension"]

REBUILD_COMMAND = (
    "pip install --no-build-isolation --force-reinstall --no-deps memsave  "
    "(or, in a checkout: pip install --no-build-isolation -e .)"
)


def load_extension() -> ModuleType:
    """Import ``memsave._C`` after checking it was built for the running torch.

    Returns:
        The ``memsave._C`` module (importing it also registers ``torch.ops.memsave.*``).

    Raises:
        ImportError: memsave was not built, or was built against another torch; the message names both versions and
            the rebuild command.
    """
    try:
        config = importlib.import_module("memsave._build_config")
    except ImportError as exc:  # pragma: no cover - only without a build
        raise ImportError(
            "memsave's compiled extension is missing (no memsave/_build_config.py): build it with\n    "
            + REBUILD_COMMAND
        ) from exc
    # The full version string, local tag included: 2.11.0+cu130 and 2.11.0+cpu are different binaries.
    if torch.__version__ != config.TORCH_VERSION:
        raise ImportError(
            f"memsave {config.MEMSAVE_VERSION} was built against torch {config.TORCH_VERSION} but torch "
            f"{torch.__version__} is installed. A C++ extension only works with the torch it was compiled for; "
            f"rebuild memsave against this torch:\n    {REBUILD_COMMAND}"
        )
    try:
        return importlib.import_module("memsave._C")
    except ImportError as exc:
        raise ImportError(
            f"memsave's compiled extension failed to load ({exc}). It was built against torch "
            f"{config.TORCH_VERSION}; torch {torch.__version__} is installed. Rebuild it:\n    {REBUILD_COMMAND}"
        ) from exc


def build_info() -> dict:
    """The facts memsave was built with.

    Returns:
        dict with ``version``, ``torch_version`` (the torch it was compiled against), ``cuda`` (CUDA kernels built),
        ``cuda_archs``, ``cuda_runtime_version``, ``openmp`` and ``compiler``.

    Examples:
        >>> memsave.build_info()["cuda"]
        True
    """
    return dict(load_extension().build_info())


# Which dispatch keys the ``torch.ops.memsave`` operators have kernels for (for ``python -m memsave info``). Uses two
# private ``torch._C`` queries, kept in this one place: they are stable since torch 2.0 and only feed a diagnostic
# printout, never a computation.
_KEYS = ("CPU", "CUDA", "Meta", "Autograd")


def dispatch_table() -> Dict[str, List[str]]:
    """Map each ``memsave::`` operator to the dispatch keys it has a kernel for.

    Returns:
        ``{"memsave::relu": ["CPU", "CUDA", "Meta", "Autograd"], ...}`` sorted by operator name. "Meta" is the
        fake kernel (used by torch.compile and FakeTensorMode); "Autograd" the registered backward.

    Examples:
        >>> memsave.dispatch_table()["memsave::relu"]
        ['CPU', 'CUDA', 'Meta', 'Autograd']
    """
    names = sorted(n for n in torch._C._dispatch_get_all_op_names() if n.startswith("memsave::"))
    table: Dict[str, List[str]] = {}
    for name in names:
        table[name] = [k for k in _KEYS if torch._C._dispatch_has_kernel_for_dispatch_key(name, k)]
    return table
