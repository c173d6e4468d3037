"""``memsave.convert``: swap memory-efficient modules into an existing model, in place, keeping its state_dict keys.

================== ==========================================================================================
``conversion.py``  :func:`convert` and :func:`plan_convert`, the :class:`ConvertReport` they print
``registry.py``    one-for-one module swaps and nn.Sequential patterns, and the verdicts (does a swap pay?)
``mask_swaps.py``  built-in swaps: ReLU, LeakyReLU, MaxPool2d, Dropout (opt-in) -> memsave's mask modules
``fused_patterns`` built-in patterns: BatchNorm -> act (-> Conv2d), LayerNorm -> Linear, act -> Linear
================== ==========================================================================================
"""
from . import fused_patterns, mask_swaps  # noqa: F401  (register the built-in swaps and patterns)
from .conversion import ConvertEntry, ConvertReport, convert, plan_convert
from .fused_patterns import INPLACE_ABN_PATTERN, register_inplace_abn_pattern, unregister_inplace_abn_pattern
from .registry import (
    register_module_swap,
    register_sequential_pattern,
    sequential_patterns,
    unregister_sequential_pattern,
)

__all__ = [
    "ConvertEntry",
    "ConvertReport",
    "INPLACE_ABN_PATTERN",
    "convert",
    "plan_convert",
    "register_inplace_abn_pattern",
    "register_module_swap",
    "register_sequential_pattern",
    "sequential_patterns",
    "unregister_inplace_abn_pattern",
    "unregister_sequential_pattern",
]
