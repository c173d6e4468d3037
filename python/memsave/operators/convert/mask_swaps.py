"""The built-in one-for-one swaps of :func:`memsave.convert`: torch's ReLU, LeakyReLU, MaxPool2d and (opt-in)
Dropout for memsave's mask-saving modules, with the verdict of each (does the mask pay, given its neighbours?).
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

from torch import nn

from .. import nn as mnn
from ..functional import pool_params
from .registry import DEPENDS, NO_GAIN, PAYS, ModuleSwap, add_module_swap, keeps_input, keeps_output, module_kind


def _relu_note(module: nn.Module, producer: Optional[nn.Module], consumer: Optional[nn.Module]) -> Tuple[str, str]:
    """torch's ReLU (and in-place LeakyReLU) keeps its output: the mask pays iff the consumer does not keep it."""
    if consumer is None:
        return DEPENDS, (
            "keeps 1 bit/element instead of its output; pays only if its consumer (decided in forward, not "
            "visible here) does not keep its input: memsave MaxPool2d, an addition, a checkpointed region"
        )
    keeps = keeps_input(consumer)
    kind = module_kind(consumer)
    if keeps is True:
        return NO_GAIN, (
            f"no gain on its own: the next {kind} keeps this output for its backward anyway (the mask pays only "
            f"inside a checkpointed region)"
        )
    if keeps is False:
        return PAYS, f"keeps 1 bit/element instead of its output: the next {kind} does not keep it"
    return DEPENDS, f"keeps 1 bit/element instead of its output; pays only if the next {kind} does not keep its input"


def _leaky_relu_note(
    module: nn.Module, producer: Optional[nn.Module], consumer: Optional[nn.Module]
) -> Tuple[str, str]:
    """torch's LeakyReLU keeps its input (its output when in place): the mask pays iff nothing else keeps that."""
    if getattr(module, "inplace", False):
        return _relu_note(module, producer, consumer)
    if producer is None:
        return DEPENDS, (
            "keeps 1 bit/element instead of its input; pays unless the producer of that input (not visible here) "
            "keeps it anyway"
        )
    keeps = keeps_output(producer)
    if keeps is True:
        return NO_GAIN, f"no gain on its own: the previous {module_kind(producer)} keeps this input (its output) anyway"
    if keeps is False:
        return PAYS, f"keeps 1 bit/element instead of its input: the previous {module_kind(producer)} does not keep it"
    return (
        DEPENDS,
        f"keeps 1 bit/element instead of its input; pays unless the previous {module_kind(producer)} keeps it",
    )


def _maxpool_refuse(module: Any) -> Optional[str]:
    try:
        pool_params(module.kernel_size, module.stride, module.padding, module.dilation)
    except (TypeError, ValueError) as exc:
        return str(exc)
    return None


def register_rules() -> None:
    """Register the built-in mask swaps (ReLU, LeakyReLU, Dropout opt-in, MaxPool2d); called once by
    :func:`memsave.operators.convert.register_rules`."""
    add_module_swap(ModuleSwap(nn.ReLU, lambda m: mnn.ReLU(inplace=m.inplace), lambda m: None, _relu_note))
    add_module_swap(
        ModuleSwap(
            nn.LeakyReLU,
            lambda m: mnn.LeakyReLU(m.negative_slope, inplace=m.inplace),
            lambda m: None,
            _leaky_relu_note,
        )
    )
    add_module_swap(
        ModuleSwap(
            nn.Dropout,
            lambda m: mnn.Dropout(m.p, inplace=m.inplace),
            lambda m: None,
            lambda m, prv, nxt: (
                PAYS,
                "keeps 1 bit/element instead of torch's mask (1 byte/element on CUDA, 1 element on CPU)",
            ),
            opt_in="dropout",
        )
    )
    add_module_swap(
        ModuleSwap(
            nn.MaxPool2d,
            lambda m: mnn.MaxPool2d(m.kernel_size, m.stride, m.padding, m.dilation, m.return_indices, m.ceil_mode),
            _maxpool_refuse,
            lambda m, prv, nxt: (PAYS, "keeps 1 byte/output element instead of int64 indices (8 bytes) and its input"),
        )
    )
