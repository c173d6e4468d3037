"""All or nothing for changes to a model: one snapshot of every module's instance state, put back if a change fails.

:func:`memsave.wrap`, :func:`memsave.unwrap`, applying a :class:`memsave.Plan` and :func:`memsave.convert` change a
model in place, module by module. Each runs inside :func:`all_or_nothing`, so a failure halfway (a predicate that
raises, a plan naming a module the model lacks, a convert rule that fails) leaves the model exactly as it was.
"""

from __future__ import annotations

import contextlib
import copy
from typing import Any, Dict, Iterator, List, Tuple

from torch import nn

__all__ = ["ModelSnapshot", "all_or_nothing"]


class ModelSnapshot:
    """Every module's instance state: submodules, parameters, buffers, hooks, an instance-level ``forward`` or
    ``extra_repr``, the training flag (a shallow copy of each module's ``__dict__`` and of the dicts in it).

    Examples:
        >>> snapshot = ModelSnapshot(model)
        >>> model.fc = nn.Identity()
        >>> snapshot.restore()                                 # model.fc is the old module again
    """

    def __init__(self, model: nn.Module) -> None:
        self.saved: List[Tuple[nn.Module, Dict[str, Any]]] = [
            (m, {k: copy.copy(v) if isinstance(v, dict) else v for k, v in vars(m).items()}) for m in model.modules()
        ]

    def restore(self) -> None:
        """Put every module's instance state back as it was when the snapshot was taken."""
        for module, state in self.saved:
            vars(module).clear()
            vars(module).update(state)


@contextlib.contextmanager
def all_or_nothing(model: nn.Module) -> Iterator[None]:
    """Run a change to ``model``; if it raises, put every module's instance state back first.

    Args:
        model: the model the ``with`` body changes in place.

    Returns:
        A context manager; the body's exception propagates unchanged after the model is restored.

    Examples:
        >>> with all_or_nothing(model):
        ...     for name, module in selected:
        ...         wrap_module(module, name)
    """
    snapshot = ModelSnapshot(model)
    try:
        yield
    except BaseException:
        snapshot.restore()
        raise
