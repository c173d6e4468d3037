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
from . import functional  # noqa: E402
from . import nn  # noqa: E402
from .convert import convert  # noqa: E402
from ._dispatch import dispatch_table  # noqa: E402
from .checkpoint import checkpoint, checkpoint_sequential, checkpointed  # noqa: E402
from .errors import (  # noqa: E402
    CheckpointError,
    InplaceModificationError,
    MemsaveWarning,
    RecomputeMismatchError,
)
from .measure import Measurement, measure  # noqa: E402
from .compare import Comparison, compare  # noqa: E402
from .estimate import Estimate, estimate, max_batch_size  # noqa: E402
from .monitor import MemoryMonitor  # noqa: E402
from .wrap import unwrap, wrap  # noqa: E402
from .planning import InfeasibleBudgetError, Plan, PlanMismatchError, plan  # noqa: E402
from . import amp  # noqa: E402
from .accumulate import accumulate  # noqa: E402

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


__all__ = ["accumulate", "amp", "build_info", "convert", "dispatch_table", "functional", "nn", "__version__"]
