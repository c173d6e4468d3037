"""Recompute in backward: checkpointed regions, wrapping a model's modules, and plans for a memory budget.

=================  ==============================================================================================
``region.py``      the region runtime: :func:`checkpoint`, :func:`checkpointed`, :func:`checkpoint_sequential`
``state.py``       what a region replays in its recompute: module buffers and ``training`` flags, autocast
``wrapping.py``    :func:`wrap` / :func:`unwrap`: chosen submodules become regions, in place, state_dict unchanged
``blocks.py``      :func:`find_blocks`: a model's repeated blocks, what :func:`wrap` with no policy checkpoints
``selective.py``   :func:`selective`: a ``context_fn`` keeping the outputs of chosen operator classes (matmul, ...)
``chunked.py``     :func:`chunked`: a position-wise module (an MLP) run slice by slice along the sequence
``planning/``      :func:`plan`: which regions fit a memory budget with the least recompute (C++ solver in
                   ``csrc/planner``)
``strategies.py``  the ``checkpoint:<policy>`` and ``plan:<budget>`` strategies of :func:`memsave.compare`
``policies.py``    the policy strings :func:`wrap` and ``checkpoint:<policy>`` share (``"blocks"``, ``"all"``, ...)
=================  ==============================================================================================
"""

from .blocks import find_blocks
from .chunked import chunked, is_chunked
from .planning import Plan, plan
from .policies import resolve_checkpoint_policy
from .region import checkpoint, checkpoint_sequential, checkpointed
from .selective import OPERATOR_CLASSES, selective
from .wrapping import RegionPlan, is_wrapped, unwrap, wrap

__all__ = [
    "OPERATOR_CLASSES",
    "Plan",
    "RegionPlan",
    "checkpoint",
    "checkpoint_sequential",
    "checkpointed",
    "chunked",
    "find_blocks",
    "is_chunked",
    "is_wrapped",
    "plan",
    "resolve_checkpoint_policy",
    "selective",
    "unwrap",
    "wrap",
]
