"""Benchmark rows for memsave.convert's mask operators (ReLU, LeakyReLU, Dropout, MaxPool2d), alone and with
per-block checkpointing. Registered when imported:

    python3 benchmarks/run.py --models vgg16 unet --plugins benchmarks.strategies_convert \\
        --strategies eager memsave.checkpoint/block convert convert+memsave.checkpoint/block convert(all) \\
        --name convert_cpu

Rows:

* ``convert`` — ReLU, LeakyReLU and MaxPool2d swapped (Dropout left to torch), so gradients stay bitwise equal to
  eager: the lossless row. Fused Sequential patterns (BatchNorm+activation, ...) are not applied here (they need
  their BatchNorm/Linear included), so the row shows the masks alone.
* ``convert+memsave.checkpoint/block`` — the same, then every block checkpointed with ``memsave.wrap``: inside a
  checkpointed region the masks keep the recompute's peak down.
* ``convert(all)`` — Dropout swapped too. memsave's Dropout draws other (equally distributed) bits than torch's,
  so its gradients differ from eager wherever dropout is on: registered as not lossless.
"""
from __future__ import annotations

from typing import Any, Tuple

from torch import nn

from benchmarks.strategies import register

_MASKS = (nn.ReLU, nn.LeakyReLU, nn.MaxPool2d)


def _convert(model: nn.Module, with_dropout: bool) -> nn.Module:
    from memsave.operators.convert import convert

    return convert(model, include=[*_MASKS, nn.Dropout] if with_dropout else list(_MASKS), dropout=with_dropout)


@register("convert", "memsave.convert: ReLU/LeakyReLU/MaxPool2d keep 1 bit / 1 byte (Dropout left to torch)",
          requires=("memsave:convert",))
def _convert_masks(model: nn.Module, inputs: Tuple[Any, ...]) -> nn.Module:
    return _convert(model, with_dropout=False)


@register("convert+memsave.checkpoint/block", "convert, then memsave.wrap(model, <every block>)",
          requires=("memsave:convert", "memsave.recompute:wrap"))
def _convert_checkpointed(model: nn.Module, inputs: Tuple[Any, ...]) -> nn.Module:
    from memsave.recompute.wrapping import wrap

    names = set(model.checkpoint_blocks())  # type: ignore[operator]
    return wrap(_convert(model, with_dropout=False), lambda name, module: name in names)


@register("convert(all)", "memsave.convert including Dropout (other random bits than torch: not bitwise)",
          lossless=False, requires=("memsave:convert",))
def _convert_all(model: nn.Module, inputs: Tuple[Any, ...]) -> nn.Module:
    return _convert(model, with_dropout=True)
