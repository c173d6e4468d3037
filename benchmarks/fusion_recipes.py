"""Benchmark-only fusion recipes for whole models whose forward is not an ``nn.Sequential`` that
:func:`memsave.convert`'s patterns could match: each rewrites a model in place with the fused modules, keeping
every parameter name and state_dict key (the benchmark rows ``fused:<choice>`` in benchmarks/strategies_fused.py
apply them).

* :func:`fuse_resnet50` -- the benchmark zoo's ResNet-50 (``memsave.models``): in every bottleneck
  bn1 -> relu -> conv2 and bn2 -> relu -> conv3 become ``fuse_batch_norm_act_conv2d`` pairs (the conv's input is
  recomputed in backward), the stem's bn1 -> relu a BatchNormAct2d; or, with ``inplace_abn=True``, every BN + ReLU
  an InPlaceABN2d with leaky_relu(0.01) (a different model: ReLU is not invertible).
* :func:`fuse_gpt2` -- the zoo's GPT-2-like model: ln_1 -> qkv, ln_2 -> fc1 and ln_f -> lm_head become
  LayerNormLinear pairs (a tied lm_head weight stays tied), GELU -> fc2 an ActLinear.
* :func:`fuse_sequentials` -- any model: the named fused Sequential patterns (only those) in every nn.Sequential.

None is bitwise lossless (the fused backward kernels round differently from torch's); the default ResNet-50 and the
GPT-2 rewrites give eager's gradients within float32 rounding.
"""

from __future__ import annotations

import types
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
from torch import nn

from memsave.nn import (
    ActLinear,
    BatchNormAct2d,
    InPlaceABN2d,
    activation_spec,
    fuse_batch_norm_act_conv2d,
    fuse_layer_norm_linear,
)

# convert's own pattern builders, so a recipe fuses exactly as memsave.convert(fuse=True) would.
from memsave.operators.convert.fused_patterns import (
    _build_batch_norm_act,
    _build_batch_norm_act_conv2d,
    _is_activation,
)

__all__ = ["fuse_gpt2", "fuse_resnet50", "fuse_sequentials", "is_resnet50"]

_Builder = Callable[[List[Any]], Optional[Sequence[nn.Module]]]
# The patterns fuse_sequentials knows: element types (None: an activation) and the builder convert's pattern uses.
_SEQUENTIAL_RECIPES: Dict[str, Tuple[Tuple[Optional[type], ...], _Builder]] = {
    "batch_norm_act_conv2d": ((nn.BatchNorm2d, None, nn.Conv2d), _build_batch_norm_act_conv2d),
    "batch_norm_act": ((nn.BatchNorm2d, None), _build_batch_norm_act),
}


def is_resnet50(model: nn.Module) -> bool:
    """Whether ``model`` is the benchmark zoo's ResNet-50 (what :func:`fuse_resnet50` rewrites)."""
    return type(model).__name__ == "ResNet50" and hasattr(model, "layer4")


def _bottlenecks(model: nn.Module) -> Iterator[Any]:
    for name in ("layer1", "layer2", "layer3", "layer4"):
        yield from getattr(model, name)


def _bottleneck_forward(self: Any, x: torch.Tensor) -> torch.Tensor:
    # bn1/bn2 carry the relu now: a DeferredBatchNormAct2d (applied by the next conv) or an InPlaceABN2d.
    out = self.bn1(self.conv1(x))
    out = self.bn2(self.conv2(out))
    out = self.bn3(self.conv3(out))
    identity = x if self.downsample is None else self.downsample(x)
    return self.relu(out + identity)


def _resnet_forward(self: Any, x: torch.Tensor) -> torch.Tensor:
    x = self.maxpool(self.bn1(self.conv1(x)))
    x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
    return self.fc(torch.flatten(self.avgpool(x), 1))


def fuse_resnet50(model: nn.Module, inplace_abn: bool = False) -> nn.Module:
    """Rewrite the benchmark zoo's ResNet-50 in place: BN + ReLU fused into the next conv, or In-Place ABN.

    Args:
        model: a ``memsave.models`` ResNet50 (stem ``conv1``/``bn1``/``relu``, ``layer1`` .. ``layer4`` of
            bottlenecks with ``bn1``/``bn2``/``conv2``/``conv3``).
        inplace_abn: use InPlaceABN2d (leaky_relu 0.01) for every BN followed by a ReLU; this changes the model.

    Returns:
        ``model``, with the same parameter names and state_dict keys.

    Raises:
        TypeError: ``model`` is not the zoo's ResNet-50.

    Examples:
        >>> model = fuse_resnet50(memsave.models.build("resnet50", "tiny").model)  # doctest: +SKIP
    """
    if not is_resnet50(model):
        raise TypeError(f"fuse_resnet50: model must be memsave.models' ResNet50, got {type(model).__name__}")
    return _fuse_resnet50(model, inplace_abn)


def _fuse_resnet50(model: Any, inplace_abn: bool) -> nn.Module:
    if inplace_abn:
        model.bn1 = InPlaceABN2d.from_batchnorm(model.bn1, act="leaky_relu", act_param=0.01)
    else:
        model.bn1 = BatchNormAct2d.from_batchnorm(model.bn1, act="relu")
    model.forward = types.MethodType(_resnet_forward, model)
    for block in _bottlenecks(model):
        if inplace_abn:
            block.bn1 = InPlaceABN2d.from_batchnorm(block.bn1, act="leaky_relu", act_param=0.01)
            block.bn2 = InPlaceABN2d.from_batchnorm(block.bn2, act="leaky_relu", act_param=0.01)
        else:
            block.bn1, block.conv2 = fuse_batch_norm_act_conv2d(block.bn1, "relu", block.conv2)
            block.bn2, block.conv3 = fuse_batch_norm_act_conv2d(block.bn2, "relu", block.conv3)
        block.forward = types.MethodType(_bottleneck_forward, block)
    return model


def _matches(run: Sequence[nn.Module], kinds: Tuple[Optional[type], ...]) -> bool:
    return len(run) == len(kinds) and all(
        type(m) is k if k is not None else _is_activation(m) for m, k in zip(run, kinds)
    )


def _fuse_at(seq: nn.Sequential, i: int, names: Sequence[str]) -> int:
    """Apply the first of ``names`` that matches ``seq`` at position ``i``; returns how many children it took (0:
    none)."""
    for name in names:
        kinds, build = _SEQUENTIAL_RECIPES[name]
        run = [seq[j] for j in range(i, min(i + len(kinds), len(seq)))]
        new = build(run) if _matches(run, kinds) else None
        if new is not None:
            for k, m in enumerate(new):
                seq[i + k] = m
            return len(kinds)
    return 0


def fuse_sequentials(model: nn.Module, names: Sequence[str]) -> int:
    """Apply the named fused Sequential patterns, and only those, to every ``nn.Sequential`` in ``model``.

    Args:
        model: any module; it is changed in place.
        names: patterns to try at each position, first match wins: ``"batch_norm_act_conv2d"``,
            ``"batch_norm_act"``.

    Returns:
        The number of fusions made.

    Raises:
        ValueError: an unknown pattern name.

    Examples:
        >>> fuse_sequentials(nn.Sequential(nn.BatchNorm2d(3), nn.ReLU()), ["batch_norm_act"])
        1
    """
    unknown = [n for n in names if n not in _SEQUENTIAL_RECIPES]
    if unknown:
        raise ValueError(f"fuse_sequentials: names must be among {sorted(_SEQUENTIAL_RECIPES)}, got {unknown}")
    count = 0
    for module in list(model.modules()):
        if not isinstance(module, nn.Sequential):
            continue
        i = 0
        while i < len(module):
            taken = _fuse_at(module, i, names)
            count += taken > 0
            i += max(taken, 1)
    return count


def fuse_gpt2(model: nn.Module) -> nn.Module:
    """Rewrite the benchmark zoo's GPT-2-like model in place: LayerNormLinear for ln_1 -> qkv, ln_2 -> fc1 and
    ln_f -> lm_head, ActLinear for GELU -> fc2.

    Args:
        model: a ``memsave.models`` GPT (blocks ``h[i]`` with ``ln_1``, ``attn.qkv``, ``ln_2``, ``mlp`` =
            Sequential(fc1, act, fc2); ``head.ln_f``, ``head.lm_head``).

    Returns:
        ``model``, with the same parameter names and state_dict keys.

    Raises:
        TypeError: ``model`` is not the zoo's GPT.

    Examples:
        >>> model = fuse_gpt2(memsave.models.build("gpt2", "tiny").model)  # doctest: +SKIP
    """
    if type(model).__name__ != "GPT" or not hasattr(model, "h"):
        raise TypeError(f"fuse_gpt2: model must be memsave.models' GPT, got {type(model).__name__}")
    blocks: Any = model.h
    for block in blocks:
        block.ln_1, block.attn.qkv = fuse_layer_norm_linear(block.ln_1, block.attn.qkv)
        block.ln_2, block.mlp[0] = fuse_layer_norm_linear(block.ln_2, block.mlp[0])
        act, param = activation_spec(block.mlp[1])  # type: ignore[misc]
        block.mlp[1], block.mlp[2] = nn.Identity(), ActLinear.from_linear(block.mlp[2], act=act, act_param=param)
    head: Any = model.head
    head.ln_f, head.lm_head = fuse_layer_norm_linear(head.ln_f, head.lm_head)
    return model
