"""memsave: train bigger models and batches on the GPU you have.

Three levers and one instrument:

* recompute in backward: :func:`checkpoint`, :func:`checkpointed`, :func:`checkpoint_sequential`, :func:`wrap`;
* memory-efficient operators: :mod:`memsave.functional`, :mod:`memsave.nn`;
* measurement: :func:`measure`.

Example:
    >>> import memsave
    >>> memsave.wrap(model, (MyBlock,))           # recompute every MyBlock in backward
    >>> print(memsave.measure(model, x))          # peak and activation bytes of one training step
"""
from __future__ import annotations

from ._build import load_extension

_C = load_extension()

from . import _ops  # noqa: E402,F401  (registers fake kernels and autograd for torch.ops.memsave.*)
from . import amp, functional, nn  # noqa: E402
from ._dispatch import dispatch_table  # noqa: E402
from .accumulate import accumulate  # noqa: E402
from .checkpoint import checkpoint, checkpoint_sequential, checkpointed  # noqa: E402
from .compare import Comparison, compare  # noqa: E402
from .convert import convert  # noqa: E402
from .errors import (  # noqa: E402
    CheckpointError,
    InfeasibleBudgetError,
    InplaceModificationError,
    MemsaveWarning,
    RecomputeMismatchError,
)
from .estimate import Estimate, estimate, max_batch_size  # noqa: E402
from .measure import Measurement, measure  # noqa: E402
from .monitor import MemoryMonitor  # noqa: E402
from .planning import Plan, PlanMismatchError, plan  # noqa: E402
from .wrap import unwrap, wrap  # noqa: E402

__version__: str = _C.build_info()["version"]


def build_info() -> dict:
    """The facts memsave was built with.

    Returns:
        dict with ``version``, ``torch_version`` (the torch it was compiled against), ``cuda`` (CUDA kernels built),
        ``cuda_archs``, ``cuda_runtime_version`` and ``compiler``.

    Example:
        >>> memsave.build_info()["cuda"]
        True
    """
    return dict(_C.build_info())


__all__ = [
    # recompute in backward
    "checkpoint",
    "checkpointed",
    "checkpoint_sequential",
    "wrap",
    "unwrap",
    "plan",
    "Plan",
    # memory-efficient operators
    "convert",
    "functional",
    "nn",
    # mixed precision
    "amp",
    "accumulate",
    # measurement
    "measure",
    "Measurement",
    "compare",
    "Comparison",
    "estimate",
    "Estimate",
    "max_batch_size",
    "MemoryMonitor",
    # errors
    "CheckpointError",
    "InfeasibleBudgetError",
    "InplaceModificationError",
    "MemsaveWarning",
    "PlanMismatchError",
    "RecomputeMismatchError",
    # build
    "build_info",
    "dispatch_table",
    "__version__",
]
