"""Functional forms of memsave's memory-efficient operators (``torch.ops.memsave.*`` with autograd), public as
:mod:`memsave.functional`; each is defined in its family's module in ``ops/``.

Each function computes what its ``torch.nn.functional`` namesake (or the composition its name spells) computes, but
keeps less for backward:

=========================  ==============================================  ==========================================
function                   memsave keeps for backward                      torch keeps
=========================  ==============================================  ==========================================
``relu``                   1 bit per element                               the output
``leaky_relu``             1 bit per element                               the input (the output when in place)
``dropout``                1 bit per element                               a mask of 1 byte (CPU: of the dtype) each
``max_pool2d``             1 byte per output element + the input's sizes   int64 indices (8 bytes) + the input
``linear_cross_entropy``   one float64 per row (its log-sum-exp); the      the [rows, classes] logits' log-softmax
                           logits exist one tile at a time                 (and the logits and their gradient)
``batch_norm_act``         the BN input + 2 per-channel vectors            the BN output and the activation output
``batch_norm_act_conv2d``  the BN input + 2 per-channel vectors            also the conv's input (activation output)
``inplace_abn``            its output only (written over its input)        BN input, output, activation output
``layer_norm_linear``      the norm's input + per-row mean/rstd            also the normalized tensor
``act_linear``             the activation's input                          its input and output
``rms_norm``               the input + one float per row                   also the float32 normalized tensor (and
                                                                           float32 copies of a 16-bit input)
``rms_norm_linear``        the norm's input (once for several weights)     also the norm's intermediates and output
``gated_act``              gate and up                                     also act(gate)
``gated_act_linear``       gate and up                                     also act(gate) and act(gate) * up
=========================  ==============================================  ==========================================

``inplace=True`` overwrites the input through a mutating operator (schema ``Tensor(a!)``) whose autograd re-bases
the input's history exactly as torch's in-place operators do, so it is safe wherever ``torch.relu_`` is; like
torch, it refuses a leaf tensor that requires grad.
"""

from __future__ import annotations

from .ops._common import ACTIVATIONS, INVERTIBLE_ACTIVATIONS, resolve_activation
from .ops.gated_mlp import GATED_ACTIVATIONS, gated_act, gated_act_linear, resolve_gated_activation
from .ops.linear import act_linear, layer_norm_linear
from .ops.loss import linear_cross_entropy
from .ops.masks import dropout, leaky_relu, relu
from .ops.norm_act import batch_norm_act, batch_norm_act_conv2d, inplace_abn
from .ops.pooling import max_pool2d, pool_params
from .ops.rms_norm import rms_norm, rms_norm_linear

__all__ = [
    # bit-mask and byte-index operators
    "relu",
    "leaky_relu",
    "dropout",
    "max_pool2d",
    # a loss that never holds the logits
    "linear_cross_entropy",
    # fused recompute-in-backward operators
    "batch_norm_act",
    "batch_norm_act_conv2d",
    "inplace_abn",
    "layer_norm_linear",
    "act_linear",
    "rms_norm",
    "rms_norm_linear",
    "gated_act",
    "gated_act_linear",
    "GATED_ACTIVATIONS",
    "ACTIVATIONS",
    "INVERTIBLE_ACTIVATIONS",
    "pool_params",
    "resolve_activation",
    "resolve_gated_activation",
]
