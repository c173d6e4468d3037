"""``memsave.convert``: swap memory-efficient modules into an existing model, in place, keeping its state_dict keys.

================== ==========================================================================================
``conversion.py``  :func:`convert` and :func:`plan_convert`, the :class:`ConvertReport` they print
``registry.py``    one-for-one module swaps and nn.Sequential patterns, and the verdicts (does a swap pay?)
``mask_swaps.py``  built-in swaps: ReLU, LeakyReLU, MaxPool2d, Dropout (opt-in) -> memsave's mask modules
``fused_patterns`` built-in patterns: BatchNorm -> act (-> Conv2d), LayerNorm -> Linear, act -> Linear
``structure.py``   ``fuse=True``: norms, gated MLPs, activation -> Linear recognised by what they compute, in any model
``causal_lm.py``   ``fuse=True``: a causal LM (by structure) called with labels computes its loss with
                   ``linear_cross_entropy`` and never builds the logits
``probe.py``       every structural candidate checked on a probe: equal within float tolerance, fewer bytes kept
``dataflow.py``    who reads a module's output: one traced probe forward of the model
``model_zoo.py``   module rules by class name for what structure cannot cover (timm's ViT Mlp and Block), and the
                   MLPs ``mlp_chunks`` chunks
================== ==========================================================================================
"""

from . import fused_patterns, mask_swaps, model_zoo
from .causal_lm import CausalLMHead, FusedCausalLMLoss
from .conversion import ConvertEntry, ConvertReport, convert, plan_convert
from .fused_patterns import INPLACE_ABN_PATTERN, register_inplace_abn_pattern, unregister_inplace_abn_pattern
from .registry import (
    register_module_swap,
    register_sequential_pattern,
    sequential_patterns,
    unregister_sequential_pattern,
)

__all__ = [
    "CausalLMHead",
    "ConvertEntry",
    "ConvertReport",
    "FusedCausalLMLoss",
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


def register_rules() -> None:
    """Register convert's built-in swaps, patterns and module rules, in the order convert tries them.

    Called once by ``memsave/__init__.py``; importing this package registers nothing.

    Examples:
        >>> from memsave.operators import convert
        >>> convert.register_rules()   # what importing memsave did already
    """
    fused_patterns.register_rules()
    mask_swaps.register_rules()
    model_zoo.register_rules()
