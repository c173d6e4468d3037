"""Load memsave's compiled extension, refusing a torch it was not built against.

A C++ extension is tied to the exact torch it was compiled with (C++ ABI, dispatcher internals). Loading it under
another torch fails with an undefined-symbol error at best and corrupts memory at worst, so the versions are compared
*before* the shared library is loaded, and the error says how to rebuild.
"""
from __future__ import annotations

import importlib
from types import ModuleType

import torch

REBUILD_COMMAND = "pip install --no-build-isolation --force-reinstall --no-deps memsave  (or, in a checkout: pip install --no-build-isolation -e .)"


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
    if config.TORCH_VERSION != torch.__version__:
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
