"""The fused operators' Sequential patterns for :func:`memsave.convert` (registered when memsave.operators.convert
loads).

Patterns (consecutive children of an ``nn.Sequential``; each position keeps its child name and state_dict keys):

* ``batch_norm_act_conv2d``: ``BatchNorm2d -> activation -> Conv2d`` becomes
  ``[DeferredBatchNormAct2d, Identity, BatchNormActConv2d]``: the convolution's input is recomputed in backward
  (the pattern that saves memory around a ReLU).
* ``batch_norm_act``: ``BatchNorm2d -> activation`` (relu, leaky_relu, elu, gelu, silu) becomes
  ``[BatchNormAct2d, Identity]`` where no Conv2d follows.
* ``layer_norm_linear``: ``LayerNorm -> Linear`` becomes ``[DeferredLayerNorm, LayerNormLinear]`` (the LayerNorm's
  parameters stay at its position; the Linear's position applies the norm inside its fused operator).
* ``act_linear``: ``activation -> Linear`` (gelu, silu, leaky_relu, elu) becomes ``[Identity, ActLinear]``; this is
  the tail of ``Linear -> activation -> Linear``, and also follows a fused ``LayerNormLinear``. ReLU is declined:
  torch's ReLU and Linear already share one tensor, so there is nothing to save.

Opt-in, because it changes what the input tensor holds: :func:`register_inplace_abn_pattern` adds
``inplace_abn``: ``Conv2d -> BatchNorm2d -> leaky_relu/elu`` becomes ``[Conv2d, InPlaceABN2d, Identity]``
(the convolution's fresh output is overwritten, which nothing else can see inside a Sequential).
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence

from torch import nn

from ..nn import (
    ActLinear,
    BatchNormAct2d,
    InPlaceABN2d,
    activation_spec,
    fuse_batch_norm_act_conv2d,
    fuse_layer_norm_linear,
)
from .registry import register_sequential_pattern, unregister_sequential_pattern

__all__ = ["INPLACE_ABN_PATTERN", "register_inplace_abn_pattern", "unregister_inplace_abn_pattern"]

INPLACE_ABN_PATTERN = "inplace_abn"


def _is_activation(module: nn.Module) -> bool:
    spec = activation_spec(module)
    return spec is not None and spec[0] != "identity"


def _build_batch_norm_act(modules: List[Any]) -> Optional[Sequence[nn.Module]]:
    bn, act = modules
    name, param = activation_spec(act)  # type: ignore[misc]
    return [BatchNormAct2d.from_batchnorm(bn, act=name, act_param=param), nn.Identity()]


def _build_batch_norm_act_conv2d(modules: List[Any]) -> Optional[Sequence[nn.Module]]:
    bn, act, conv = modules
    if conv.padding_mode != "zeros" or isinstance(conv.padding, str) or conv.in_channels != bn.num_features:
        return None
    deferred, fused = fuse_batch_norm_act_conv2d(bn, act, conv)
    return [deferred, nn.Identity(), fused]


def _build_layer_norm_linear(modules: List[Any]) -> Optional[Sequence[nn.Module]]:
    norm, linear = modules
    if tuple(norm.normalized_shape)[-1] != linear.in_features:
        return None
    deferred, fused = fuse_layer_norm_linear(norm, linear)
    fused.train(linear.training)
    return [deferred.train(norm.training), fused]


def _build_act_linear(modules: List[Any]) -> Optional[Sequence[nn.Module]]:
    act, linear = modules
    name, param = activation_spec(act)  # type: ignore[misc]
    if name == "relu":
        return None  # nothing to save (see the module docstring); leave the ReLU to the mask swap
    fused = ActLinear.from_linear(linear, act=name, act_param=param)
    fused.train(linear.training)
    return [nn.Identity(), fused]


def _build_inplace_abn(modules: List[Any]) -> Optional[Sequence[nn.Module]]:
    conv, bn, act = modules
    name, param = activation_spec(act)  # type: ignore[misc]
    if name not in ("leaky_relu", "elu") or not param or param <= 0:
        return None  # not invertible: batch_norm_act takes it
    return [conv, InPlaceABN2d.from_batchnorm(bn, act=name, act_param=param), nn.Identity()]


def register_rules() -> None:
    """Register the built-in sequential patterns (BatchNorm -> act (-> Conv2d), LayerNorm -> Linear, act -> Linear);
    called once by :func:`memsave.operators.convert.register_rules`."""
    register_sequential_pattern(
        "batch_norm_act_conv2d",
        (nn.BatchNorm2d, _is_activation, nn.Conv2d),
        _build_batch_norm_act_conv2d,
        note="BatchNormActConv2d keeps the BN input and 2 per-channel vectors; the conv's input (the activation "
        "output) is recomputed in backward",
        priority=15,
    )
    register_sequential_pattern(
        "batch_norm_act",
        (nn.BatchNorm2d, _is_activation),
        _build_batch_norm_act,
        note="BatchNormAct2d keeps the BN input and 2 per-channel vectors; the BN output (and the input of "
        "gelu/silu/leaky_relu/elu) is recomputed in backward",
        priority=10,
    )
    register_sequential_pattern(
        "layer_norm_linear",
        (nn.LayerNorm, nn.Linear),
        _build_layer_norm_linear,
        note="LayerNormLinear keeps the LayerNorm input and per-row mean/rstd; the normalized tensor is recomputed",
        priority=10,
    )
    register_sequential_pattern(
        "act_linear",
        (_is_activation, nn.Linear),
        _build_act_linear,
        note="ActLinear keeps the activation's input only; its output is recomputed in backward",
        priority=5,
    )


def register_inplace_abn_pattern(priority: int = 20) -> None:
    """Make :func:`memsave.convert` turn ``Conv2d -> BatchNorm2d -> LeakyReLU/ELU`` into In-Place ABN.

    In-Place ABN keeps only its output (written over the convolution's output); see
    :class:`memsave.nn.InPlaceABN2d` for its limits (zero or tiny gamma, low precision). Other activations keep
    using ``batch_norm_act``.

    Args:
        priority: tried before ``batch_norm_act`` (priority 10) by default.

    Examples:
        >>> from memsave.operators.convert import register_inplace_abn_pattern
        >>> register_inplace_abn_pattern()
        >>> memsave.convert(model)
    """
    register_sequential_pattern(
        INPLACE_ABN_PATTERN,
        (nn.Conv2d, nn.BatchNorm2d, _is_activation),
        _build_inplace_abn,
        note="InPlaceABN2d overwrites the conv output with its own output and keeps only that",
        priority=priority,
    )


def unregister_inplace_abn_pattern() -> None:
    """Undo :func:`register_inplace_abn_pattern`."""
    unregister_sequential_pattern(INPLACE_ABN_PATTERN)
