"""``memsave.functional``: the functional forms of memsave's memory-efficient operators.

The same objects as :mod:`memsave.operators.functional` (their home); see that module for what each keeps for
backward against what torch keeps.

Examples:
    >>> import memsave.functional as MF
    >>> y = MF.relu(x)                                   # keeps one bit per element for backward
    >>> loss = MF.linear_cross_entropy(hidden, head.weight, labels)
"""

from __future__ import annotations

from .operators.functional import (
    ACTIVATIONS,
    GATED_ACTIVATIONS,
    INVERTIBLE_ACTIVATIONS,
    act_linear,
    batch_norm_act,
    batch_norm_act_conv2d,
    dropout,
    gated_act,
    gated_act_linear,
    inplace_abn,
    layer_norm_linear,
    leaky_relu,
    linear_cross_entropy,
    max_pool2d,
    pool_params,
    relu,
    resolve_activation,
    resolve_gated_activation,
    rms_norm,
    rms_norm_linear,
)

__all__ = [
    "ACTIVATIONS",
    "GATED_ACTIVATIONS",
    "INVERTIBLE_ACTIVATIONS",
    "act_linear",
    "batch_norm_act",
    "batch_norm_act_conv2d",
    "dropout",
    "gated_act",
    "gated_act_linear",
    "inplace_abn",
    "layer_norm_linear",
    "leaky_relu",
    "linear_cross_entropy",
    "max_pool2d",
    "pool_params",
    "relu",
    "resolve_activation",
    "resolve_gated_activation",
    "rms_norm",
    "rms_norm_linear",
]
