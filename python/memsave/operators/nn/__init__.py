"""Memory-efficient drop-in modules (``memsave.nn``).

* Mask-saving replacements of torch.nn modules (same constructor arguments and state_dict, subclasses of the torch
  module they replace): :class:`ReLU`, :class:`LeakyReLU`, :class:`Dropout`, :class:`MaxPool2d`.
* Fused recompute-in-backward modules: :class:`BatchNormAct2d`, :class:`InPlaceABN2d`, :class:`BatchNormActConv2d`
  (``norm_act.py``), :class:`LayerNormLinear`, :class:`ActLinear` (``linear.py``).
* Transformer modules: :class:`RMSNorm`, :class:`RMSNormLinear` (``rms_norm.py``), :class:`GatedMLP`,
  :class:`PackedGatedMLP` (``gated_mlp.py``).
* A loss that never holds the logits: :class:`LinearCrossEntropy` (``loss.py``).

:func:`memsave.convert` swaps them into an existing model.
"""

from .activation import LeakyReLU, ReLU, activation_spec
from .dropout import Dropout
from .gated_mlp import GatedMLP, PackedGatedMLP
from .linear import ActLinear, DeferredLayerNorm, LayerNormLinear, fuse_layer_norm_linear
from .loss import LinearCrossEntropy
from .norm_act import (
    BatchNormAct2d,
    BatchNormActConv2d,
    DeferredBatchNormAct2d,
    InPlaceABN2d,
    fuse_batch_norm_act_conv2d,
)
from .pooling import MaxPool2d
from .rms_norm import DeferredRMSNorm, RMSNorm, RMSNormLinear, fuse_rms_norm_linear

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
    "PackedGatedMLP",
    "RMSNorm",
    "RMSNormLinear",
    "ReLU",
    "activation_spec",
    "fuse_batch_norm_act_conv2d",
    "fuse_layer_norm_linear",
    "fuse_rms_norm_linear",
]
