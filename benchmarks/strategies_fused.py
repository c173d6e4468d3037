"""Fused-operator rows for the benchmark harness (registers ``fused:<choice>``): BatchNorm+activation recomputed inside
the next conv,
In-Place ABN, and LayerNorm/MLP fusion in the GPT-2-like model.

Import it as a plugin of ``benchmarks/run.py``::

    python3 benchmarks/run.py --models resnet50 --size cpu --plugins benchmarks.strategies_fused \\
        --strategies eager fused:batch_norm_act_conv2d fused:inplace_abn --name fused_resnet50_cpu
    python3 benchmarks/run.py --models gpt2 --size cpu --plugins benchmarks.strategies_fused \\
        --strategies eager fused:layer_norm_mlp --name fused_gpt2_cpu

Rows (each rewrites a fresh copy of the model in place; parameter names and the state_dict do not change):

* ``fused:batch_norm_act_conv2d`` -- ResNet-50: in every bottleneck, bn1 -> relu -> conv2 and bn2 -> relu -> conv3
  become
  ``fuse_batch_norm_act_conv2d`` pairs (the conv's input is recomputed in backward), the stem's bn1 -> relu a
  BatchNormAct2d. UNet (and any nn.Sequential): the ``batch_norm_act_conv2d`` / ``batch_norm_act`` convert patterns.
* ``fused:inplace_abn`` -- ResNet-50: bn1/bn2 (+ relu) of every bottleneck and the stem become InPlaceABN2d with
  leaky_relu(0.01). That changes the model (relu is not invertible), so its gradients are not eager's.
* ``fused:layer_norm_mlp`` -- GPT-2-like: ln_1 -> qkv, ln_2 -> fc1 and ln_f -> lm_head become LayerNormLinear pairs
  (``fuse_layer_norm_linear``; the tied lm_head weight stays tied), GELU -> fc2 an ActLinear.

None is bitwise lossless (the fused backward kernels round differently from torch's), hence ``lossless=False``;
``batch_norm_act_conv2d`` and ``layer_norm_mlp`` gradients equal eager's within float32 rounding.
"""

from __future__ import annotations

import types
from typing import Iterator, Optional, Tuple

import torch
from torch import nn

from memsave.measurement.strategies import StrategyContext, register_strategy

__all__ = ["FUSED_STRATEGIES", "fuse_gpt2", "fuse_resnet50"]


# --------------------------------------------------------------------------------------------------------- ResNet-50
def _bottlenecks(model: nn.Module) -> Iterator[nn.Module]:
    for name in ("layer1", "layer2", "layer3", "layer4"):
        yield from getattr(model, name)


def _bottleneck_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    # bn1/bn2 carry the relu now: a DeferredBatchNormAct2d (applied by the next conv) or an InPlaceABN2d.
    out = self.bn1(self.conv1(x))
    out = self.bn2(self.conv2(out))
    out = self.bn3(self.conv3(out))
    identity = x if self.downsample is None else self.downsample(x)
    return self.relu(out + identity)


def _resnet_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    x = self.maxpool(self.bn1(self.conv1(x)))
    x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
    return self.fc(torch.flatten(self.avgpool(x), 1))


def _is_resnet50(model: nn.Module) -> bool:
    return type(model).__name__ == "ResNet50" and hasattr(model, "layer4")


def fuse_resnet50(model: nn.Module, inplace_abn: bool = False) -> nn.Module:
    """Rewrite benchmarks.models.ResNet50 in place: BN+ReLU fused into the next conv (default) or In-Place ABN.

    Args:
        model: a ResNet50 from benchmarks/models.py.
        inplace_abn: use InPlaceABN2d(leaky_relu 0.01) for every BN followed by a ReLU (changes the model).

    Returns:
        ``model``.
    """
    from memsave.nn import BatchNormAct2d, InPlaceABN2d, fuse_batch_norm_act_conv2d

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


def _fuse_sequentials(model: nn.Module, names: Tuple[str, ...]) -> int:
    """Apply the named fused convert patterns (only those) to every nn.Sequential; returns the number of fusions."""
    from memsave.nn import activation_spec
    from memsave.operators.convert import fused_patterns as cf

    builders = {
        "batch_norm_act_conv2d": ((nn.BatchNorm2d, None, nn.Conv2d), cf._build_batch_norm_act_conv2d),
        "batch_norm_act": ((nn.BatchNorm2d, None), cf._build_batch_norm_act),
    }
    count = 0
    for module in list(model.modules()):
        if not isinstance(module, nn.Sequential):
            continue
        i = 0
        while i < len(module):
            for name in names:
                kinds, build = builders[name]
                run = [module[j] for j in range(i, min(i + len(kinds), len(module)))]
                if len(run) < len(kinds):
                    continue
                ok = all(
                    (type(m) is k)
                    if k is not None
                    else (activation_spec(m) is not None and activation_spec(m)[0] != "identity")
                    for m, k in zip(run, kinds)
                )
                new = build(run) if ok else None
                if new is not None:
                    for k, m in enumerate(new):
                        module[i + k] = m
                    i += len(kinds) - 1
                    count += 1
                    break
            i += 1
    return count


# ------------------------------------------------------------------------------------------------------------- GPT-2
def fuse_gpt2(model: nn.Module) -> nn.Module:
    """Rewrite benchmarks.models.GPT in place: LayerNormLinear for ln_1 -> qkv, ln_2 -> fc1, ln_f -> lm_head and
    ActLinear for GELU -> fc2.

    Args:
        model: a GPT from benchmarks/models.py.

    Returns:
        ``model``.
    """
    from memsave.nn import ActLinear, activation_spec, fuse_layer_norm_linear

    for block in model.h:
        block.ln_1, block.attn.qkv = fuse_layer_norm_linear(block.ln_1, block.attn.qkv)
        block.ln_2, block.mlp[0] = fuse_layer_norm_linear(block.ln_2, block.mlp[0])
        act, param = activation_spec(block.mlp[1])
        block.mlp[1], block.mlp[2] = nn.Identity(), ActLinear.from_linear(block.mlp[2], act=act, act_param=param)
    model.head.ln_f, model.head.lm_head = fuse_layer_norm_linear(model.head.ln_f, model.head.lm_head)
    return model


#: The fused rows, in table order (``fused:<choice>``).
FUSED_STRATEGIES: Tuple[str, ...] = ("fused:batch_norm_act_conv2d", "fused:inplace_abn", "fused:layer_norm_mlp")


def _fuse(model: nn.Module, arg: Optional[str], ctx: StrategyContext) -> nn.Module:
    if arg == "batch_norm_act_conv2d":
        if _is_resnet50(model):
            return fuse_resnet50(model)
        if _fuse_sequentials(model, ("batch_norm_act_conv2d", "batch_norm_act")) == 0:
            raise ValueError(f"fused:{arg} found no BatchNorm2d -> activation in {type(model).__name__}")
        return model
    if arg == "inplace_abn":
        if not _is_resnet50(model):
            raise ValueError(f"fused:{arg} is defined for resnet50, not {type(model).__name__}")
        return fuse_resnet50(model, inplace_abn=True)
    if type(model).__name__ != "GPT":
        raise ValueError(f"fused:{arg} is defined for gpt2, not {type(model).__name__}")
    return fuse_gpt2(model)


register_strategy(
    "fused",
    "the fused operators by hand: batch_norm_act_conv2d (BN+ReLU recomputed inside the next conv, "
    "BatchNormAct2d elsewhere), inplace_abn (InPlaceABN2d with leaky_relu 0.01 for every BN+ReLU: a different "
    "activation, not eager's gradients), layer_norm_mlp (LayerNormLinear for ln_1->qkv, ln_2->fc1, ln_f->head, "
    "ActLinear for GELU->fc2); grads = eager's within float32 rounding",
    choices=("batch_norm_act_conv2d", "inplace_abn", "layer_norm_mlp"),
    apply=_fuse,
    lossless=False,
    replace=True,
)
