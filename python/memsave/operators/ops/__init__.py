r"""The Python face of the ``torch.ops.memsave`` operators: one module per operator family, as in ``csrc/ops``.

Each module records (:class:`~memsave.operators.ops._registration.Registrations`), for its family's operators, the
fake (meta) kernels used by ``torch.compile`` and FakeTensorMode and the autograd formulas, which save only what the
memory win needs and call the operator's own ``*_backward`` operator; and it defines the family's functional forms
(exported by :mod:`memsave.functional`). :func:`register` registers every family's records once:
``memsave/__init__.py`` calls it after loading the compiled extension, which defines the schemas. The schemas and the
CPU/CUDA kernels live in ``csrc/ops/<family>/``.

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

from __future__ import annotations

import torch

from ...common import compat
from . import amp, gated_mlp, linear, loss, masks, norm_act, pooling, rms_norm

#: Every operator family's module, in csrc/ops order.
FAMILIES = (masks, pooling, norm_act, linear, rms_norm, gated_mlp, loss, amp)

_LIBRARY: list = []  # the memsave FRAGMENT library, kept alive once made (torch drops a library's kernels with it)


def register() -> None:
    """Register the fake kernels and autograd formulas of every ``torch.ops.memsave`` operator (once).

    Raises:
        RuntimeError: the compiled extension was not loaded (the schemas are missing), or this torch lacks an
            internal the mutating operators' Autograd kernels need
            (:func:`memsave.common.compat.require_autograd_redispatch`).

    Examples:
        >>> import memsave  # calls register(); a second call does nothing
        >>> memsave.operators.ops.register()
    """
    if _LIBRARY:
        return
    if not hasattr(torch.ops.memsave, "relu"):
        raise RuntimeError("memsave.operators.ops.register: load the compiled extension first (memsave.extension)")
    compat.require_autograd_redispatch()
    lib = torch.library.Library("memsave", "FRAGMENT")
    for family in FAMILIES:
        family.REGISTRATIONS.apply(lib)
    _LIBRARY.append(lib)


__all__ = ["FAMILIES", "register"]
