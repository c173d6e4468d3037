"""The operators part's strategies for :func:`memsave.compare`, :func:`memsave.estimate` and the command line.

* ``convert``: :func:`memsave.convert` (bit-mask ReLU/LeakyReLU, byte-index MaxPool2d; bitwise exact).
* ``convert_all``: ``memsave.convert(fuse=True, dropout=True)``: fused operators too (equal up to float rounding).
"""

from __future__ import annotations

from typing import Optional

from torch import nn

from ..measurement.strategies import StrategyContext, register_strategy
from .convert import convert

__all__ = ["register_strategies"]


def _apply_convert(model: nn.Module, arg: Optional[str], ctx: StrategyContext) -> nn.Module:
    out = convert(model)
    return model if out is None else out


def _apply_convert_all(model: nn.Module, arg: Optional[str], ctx: StrategyContext) -> nn.Module:
    out = convert(model, fuse=True, dropout=True)
    return model if out is None else out


def register_strategies() -> None:
    """Register the ``convert`` and ``convert_all`` strategies (called once by ``memsave/__init__.py``)."""
    register_strategy(
        "convert",
        "memsave.convert: bit-mask ReLU/LeakyReLU and byte-index MaxPool2d (bitwise exact)",
        apply=_apply_convert,
    )
    register_strategy(
        "convert_all",
        "memsave.convert(fuse=True, dropout=True): also fused BN/LayerNorm/MLP operators "
        "(equal up to float rounding) and memsave Dropout (other random bits than torch's)",
        apply=_apply_convert_all,
        lossless=False,
    )
