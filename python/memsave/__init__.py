"""memsave: train bigger models and batches on the GPU you have.

Three levers and one instrument, one subpackage each:

==================  ============================================================================================
``recompute/``      recompute in backward: :func:`checkpoint`, :func:`checkpointed`, :func:`checkpoint_sequential`,
                    :func:`wrap`, :func:`unwrap`, :func:`find_blocks`, :func:`selective` (keep chosen operators'
                    outputs), :func:`chunked` (an MLP slice by slice), :func:`plan` (a budget-driven plan solved in C++)
``operators/``      memory-efficient operators (``torch.ops.memsave.*``): :mod:`memsave.functional`,
                    :mod:`memsave.nn`, :func:`convert`
``amp/``            mixed precision: :class:`memsave.amp.GradScaler`, :func:`accumulate`
``measurement/``    :func:`measure`, :func:`compare`, :func:`estimate`, :func:`max_batch_size`, :class:`MemoryMonitor`,
                    :func:`register_strategy` (a strategy that compare, estimate and the command line understand)
==================  ============================================================================================

``integrations/``   Hugging Face Trainer (:mod:`memsave.integrations.transformers`: ``Memsave``, ``enable``,
                    ``MemoryCallback``), Lightning (:mod:`memsave.integrations.lightning`: ``Memsave``,
                    ``MemoryCallback``); imported on demand
``models/``         the built-in benchmark models of the demo, the command line and ``benchmarks/``

plus ``errors.py`` (every exception), ``extension.py`` (loads the compiled ``memsave._C``), ``common/`` (the RNG
state and progress bar several parts share) and ``cli/`` (``python -m memsave``).

``functional.py`` and ``nn.py`` are the public modules :mod:`memsave.functional` and :mod:`memsave.nn`, exporting
what ``operators/functional.py`` and ``operators/nn/`` define.

Importing memsave loads the compiled extension, then registers, by explicit calls made once here and in this order,
the operators' fake kernels and autograd formulas, convert's built-in swaps, patterns and module rules, each part's
:func:`compare` strategies (recompute, operators, amp), and the wrap listener that lets :func:`wrap` keep a Hugging
Face model's own checkpointing switch (:mod:`memsave.integrations.transformers_switch`). No module registers anything
when it is imported, and nothing in transformers is patched: only a model given to :func:`wrap` or
:func:`memsave.integrations.transformers.enable` is changed, on the instance.

Examples:
    >>> import memsave
    >>> memsave.wrap(model)                       # recompute each of its blocks (memsave.find_blocks) in backward
    >>> memsave.wrap(model, (MyBlock,))           # recompute every MyBlock in backward
    >>> print(memsave.measure(model, x))          # peak and activation bytes of one training step
"""

from __future__ import annotations

import logging

from ._version import __version__
from .extension import build_info, dispatch_table, load_extension

# A library configures no logging; it only makes its logger safe to use (docs/output.md).
logging.getLogger(__name__).addHandler(logging.NullHandler())

_C = load_extension()  # before the parts: it registers the torch.ops.memsave schemas and kernels

from . import amp, functional, nn, operators  # noqa: E402
from .amp import accumulate  # noqa: E402
from .amp import strategies as amp_strategies  # noqa: E402
from .common.chunking import provide_chunking  # noqa: E402
from .errors import (  # noqa: E402
    CheckpointError,
    InfeasibleBudgetError,
    InplaceModificationError,
    MemsaveWarning,
    PlanMismatchError,
    RecomputeMismatchError,
    WrapConflictError,
)
from .integrations import transformers_switch  # noqa: E402
from .measurement import (  # noqa: E402
    Comparison,
    Estimate,
    Measurement,
    MemoryMonitor,
    compare,
    estimate,
    max_batch_size,
    measure,
    register_strategy,
)
from .measurement import strategies as measurement_strategies  # noqa: E402
from .operators import convert  # noqa: E402
from .operators import strategies as operator_strategies  # noqa: E402
from .operators.convert import register_rules as register_convert_rules  # noqa: E402
from .recompute import (  # noqa: E402
    Plan,
    checkpoint,
    checkpoint_sequential,
    checkpointed,
    chunked,
    find_blocks,
    plan,
    selective,
    unwrap,
    wrap,
)
from .recompute import strategies as recompute_strategies  # noqa: E402
from .recompute.chunked import chunked_method  # noqa: E402
from .recompute.wrapping import add_wrap_listener  # noqa: E402

operators.ops.register()
# convert's built-in swaps, sequential patterns and module rules.
register_convert_rules()
# The strategies of compare, estimate and the command line (eager first), in the order help texts list them.
for _strategies in (measurement_strategies, recompute_strategies, operator_strategies, amp_strategies):
    _strategies.register_strategies()
# convert(mlp_chunks=...) (operators) slices MLPs with recompute's regions, reached through common/chunking.py.
provide_chunking(chunked, chunked_method)
# wrap / unwrap claim a Hugging Face model's own checkpointing switch, and give it back (on that model only).
add_wrap_listener(transformers_switch.after_wrap, transformers_switch.after_unwrap)


__all__ = [
    # recompute in backward
    "checkpoint",
    "checkpointed",
    "checkpoint_sequential",
    "wrap",
    "unwrap",
    "find_blocks",
    "selective",
    "chunked",
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
    "register_strategy",
    # errors
    "CheckpointError",
    "InfeasibleBudgetError",
    "InplaceModificationError",
    "MemsaveWarning",
    "PlanMismatchError",
    "RecomputeMismatchError",
    "WrapConflictError",
    # build
    "build_info",
    "dispatch_table",
    "__version__",
]
