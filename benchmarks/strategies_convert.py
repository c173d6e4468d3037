"""Benchmark rows for memsave.convert's mask operators (ReLU, LeakyReLU, Dropout, MaxPool2d), alone and with
per-block checkpointing. Registers ``convert_dropout`` when imported::

    python3 benchmarks/run.py --models vgg16 unet --plugins benchmarks.strategies_convert \\
        --strategies eager checkpoint:blocks convert convert+checkpoint:blocks convert_dropout --name convert_cpu

Rows (:data:`CONVERT_STRATEGIES`):

* ``convert`` (memsave's own strategy) — ReLU, LeakyReLU and MaxPool2d swapped (Dropout left to torch), so gradients
  stay bitwise equal to eager: the lossless row. Fused Sequential patterns are not applied, so the row shows the
  masks alone.
* ``convert+checkpoint:blocks`` — the same, then every block checkpointed with ``memsave.wrap``: inside a
  checkpointed region the masks keep the recompute's peak down.
* ``convert_dropout`` — Dropout swapped too. memsave's Dropout draws other (equally distributed) bits than torch's,
  so its gradients differ from eager wherever dropout is on: registered as not lossless.
"""

from __future__ import annotations

from typing import Optional, Tuple

from torch import nn

from memsave.measurement.strategies import StrategyContext, register_strategy
from memsave.operators.convert import convert

__all__ = ["CONVERT_STRATEGIES"]

#: The convert rows, in table order.
CONVERT_STRATEGIES: Tuple[str, ...] = ("convert", "convert+checkpoint:blocks", "convert_dropout")


def _convert_dropout(model: nn.Module, arg: Optional[str], ctx: StrategyContext) -> nn.Module:
    return convert(model, dropout=True)


register_strategy(
    "convert_dropout",
    "memsave.convert(dropout=True): the masks and Dropout (other random bits than torch's: not bitwise)",
    apply=_convert_dropout,
    lossless=False,
    replace=True,
)
