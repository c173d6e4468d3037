"""What marks a module as a memsave region, for the parts that must see regions without importing recompute.

:func:`memsave.wrap` and an applied :class:`memsave.Plan` make a module a region by giving it an instance-level
``forward``: an object of a :class:`RegionForward` subclass defined in the recompute part. :func:`memsave.convert`
(the operators part) must not silently replace such a module (its region would be lost), and one part never imports
another (docs/architecture.md), so the marker class lives here. Nothing here imports any part.
"""

from __future__ import annotations

from typing import List

from torch import nn

__all__ = ["RegionForward", "regions_in"]


class RegionForward:
    """Base class of the instance-level ``forward`` that makes a module a memsave region.

    The recompute part's ``CheckpointedForward`` (wrap's) and its plan's grouped forward derive from it; the class
    adds nothing but the mark.

    Examples:
        >>> isinstance(vars(model.blocks[0]).get("forward"), RegionForward)   # after memsave.wrap(model)
        True
    """


def regions_in(module: nn.Module) -> List[str]:
    """The qualified names, relative to ``module``, of the regions in ``module`` (``""`` for ``module`` itself).

    Args:
        module: any module.

    Returns:
        The names in ``named_modules()`` order; empty when nothing in ``module`` is a region.

    Examples:
        >>> regions_in(memsave.wrap(model))
        ['blocks.0', 'blocks.1']
    """
    return [name for name, m in module.named_modules() if isinstance(vars(m).get("forward"), RegionForward)]
