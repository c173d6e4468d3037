"""What marks a module as a memsave region, for the parts that must see regions without importing recompute.

:func:`memsave.wrap` and an applied :class:`memsave.Plan` make a module a region by giving it an instance-level
``forward``: an object of a :class:`RegionForward` subclass defined in the recompute part. :func:`memsave.convert`
(the operators part) must not silently replace such a module (its region would be lost), and one part never imports
another (docs/architecture.md), so the marker class lives here. Nothing here imports any part.
"""

from __future__ import annotations

from typing import Dict, List, Optional

from torch import nn

__all__ = ["RegionForward", "region_forward", "region_forwards", "regions_in"]


class RegionForward:
    """Base class of the instance-level ``forward`` that makes a module a memsave region.

    The recompute part's ``CheckpointedForward`` (wrap's) and its plan's grouped forward derive from it; the class
    adds nothing but the mark.

    Examples:
        >>> isinstance(vars(model.blocks[0]).get("forward"), RegionForward)   # after memsave.wrap(model)
        True
    """


def region_forward(module: nn.Module) -> Optional[RegionForward]:
    """The instance-level forward that makes ``module`` itself a region, or None (its submodules are not looked at).

    Examples:
        >>> region_forward(memsave.wrap(model).blocks[0]) is not None
        True
    """
    forward = vars(module).get("forward")
    return forward if isinstance(forward, RegionForward) else None


def region_forwards(module: nn.Module) -> Dict[str, RegionForward]:
    """The regions in ``module``: qualified name (relative to ``module``, ``""`` for itself) -> its region forward,
    in ``named_modules()`` order.

    Examples:
        >>> list(region_forwards(memsave.wrap(model)))
        ['blocks.0', 'blocks.1']
    """
    found = ((name, region_forward(m)) for name, m in module.named_modules())
    return {name: forward for name, forward in found if forward is not None}


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
    return list(region_forwards(module))
