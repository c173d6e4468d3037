r"""Python halves of the ``torch.ops.memsave`` operators: one module per operator family, as in ``csrc/ops``.

Each module registers, for its family's operators, the fake (meta) kernels used by ``torch.compile`` and
FakeTensorMode, and the autograd formulas, which save only what the memory win needs and call the operator's own
``*_backward`` operator. The schemas and the CPU/CUDA kernels live in ``csrc/ops/<family>/``.

========  ==================================================================  ==============================
family    operators                                                            C++/CUDA
========  ==================================================================  ==============================
masks     relu, leaky_relu, dropout (+ ``_`` in-place forms, ``_backward``)   ``csrc/ops/masks/``
pooling   max_pool2d                                                           ``csrc/ops/pooling/``
norm_act  batch_norm_act, batch_norm_act_conv2d, batch_norm_act_apply,         ``csrc/ops/norm_act/``
          inplace_abn
linear    layer_norm_linear, layer_norm_apply, act_linear                     ``csrc/ops/linear/``
rms_norm  rms_norm, rms_norm_linear                                            ``csrc/ops/rms_norm/``
gated_mlp gated_act, gated_act_linear                                          ``csrc/ops/gated_mlp/``
loss      linear_cross_entropy, cross_entropy_tile_lse\_,                     ``csrc/ops/loss/``
          cross_entropy_tile_grad\_
amp       unscale_and_check\_, amp_update_scale\_                              ``csrc/ops/amp/``
========  ==================================================================  ==============================
"""

from . import amp, gated_mlp, linear, loss, masks, norm_act, pooling, rms_norm

__all__ = ["amp", "gated_mlp", "linear", "loss", "masks", "norm_act", "pooling", "rms_norm"]
