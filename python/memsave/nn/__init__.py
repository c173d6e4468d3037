"""Memory-efficient drop-in modules.

* Mask-saving replacements of torch.nn modules (same constructor arguments and state_dict, subclasses of the torch
  module they replace): :class:`ReLU`, :class:`LeakyReLU`, :class:`Dropout`, :class:`MaxPool2d`.
* Fused recompute-in-backward modules: :class:`BatchNormAct2d`, :class:`InPlaceABN2d`, :class:`LayerNormLinear`,
  :class:`ActLinear` (see :mod:`memsave.nn.fused`).

:func:`memsave.convert` swaps them into an existing model.
"""
from .activation import LeakyReLU, ReLU
from .dropout import Dropout
from .fused import (
    ActLinear, BatchNormAct2d, BatchNormActConv2d, DeferredBatchNormAct2d, DeferredLayerNorm, InPlaceABN2d,
    LayerNormLinear, fuse_bn_act_conv, fuse_norm_linear,
)
from .pooling import MaxPool2d

__all__ = [
    "ActLinear",
    "BatchNormAct2d",
    "BatchNormActConv2d",
    "DeferredBatchNormAct2d",
    "DeferredLayerNorm",
    "Dropout",
    "InPlaceABN2d",
    "LayerNormLinear",
    "LeakyReLU",
    "MaxPool2d",
    "ReLU",
    "fuse_bn_act_conv",
    "fuse_norm_linear",
]
