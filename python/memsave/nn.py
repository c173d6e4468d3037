"""``memsave.nn``: memory-efficient drop-in modules.

The same classes as :mod:`memsave.operators.nn` (their home), which lists them by family.

Examples:
    >>> import memsave.nn as mnn
    >>> act = mnn.ReLU(inplace=True)                     # keeps one bit per element for backward
    >>> norm = mnn.RMSNorm(4096, eps=1e-6)
"""

from __future__ import annotations

from .operators.nn import (
    ActLinear,
    BatchNormAct2d,
    BatchNormActConv2d,
    DeferredBatchNormAct2d,
    DeferredLayerNorm,
    DeferredRMSNorm,
    Dropout,
    GatedMLP,
    InPlaceABN2d,
    LayerNormLinear,
    LeakyReLU,
    LinearCrossEntropy,
    MaxPool2d,
    ReLU,
    RMSNorm,
    RMSNormLinear,
    activation_spec,
    fuse_batch_norm_act_conv2d,
    fuse_layer_norm_linear,
    fuse_rms_norm_linear,
)

__all__ = [
    "ActLinear",
    "BatchNormAct2d",
    "BatchNormActConv2d",
    "DeferredBatchNormAct2d",
    "DeferredLayerNorm",
    "DeferredRMSNorm",
    "Dropout",
    "GatedMLP",
    "InPlaceABN2d",
    "LayerNormLinear",
    "LeakyReLU",
    "LinearCrossEntropy",
    "MaxPool2d",
    "RMSNorm",
    "RMSNormLinear",
    "ReLU",
    "activation_spec",
    "fuse_batch_norm_act_conv2d",
    "fuse_layer_norm_linear",
    "fuse_rms_norm_linear",
]
