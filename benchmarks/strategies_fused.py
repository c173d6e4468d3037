"""Fused-operator rows for the benchmark harness (registers ``fused:<choice>``): BatchNorm+activation recomputed inside
the next conv, In-Place ABN, and LayerNorm/MLP fusion in the GPT-2-like model.

Import it as a plugin of ``benchmarks/run.py``::

    python3 benchmarks/run.py --models resnet50 --size cpu --plugins benchmarks.strategies_fused \\
        --strategies eager fused:batch_norm_act_conv2d fused:inplace_abn --name fused_resnet50_cpu
    python3 benchmarks/run.py --models gpt2 --size cpu --plugins benchmarks.strategies_fused \\
        --strategies eager fused:layer_norm_mlp --name fused_gpt2_cpu

Rows (each rewrites a fresh copy of the model in place with benchmarks/fusion_recipes.py; parameter names and
the state_dict do not change):

* ``fused:batch_norm_act_conv2d`` -- ResNet-50: in every bottleneck, bn1 -> relu -> conv2 and bn2 -> relu -> conv3
  become ``fuse_batch_norm_act_conv2d`` pairs (the conv's input is recomputed in backward), the stem's bn1 -> relu a
  BatchNormAct2d. UNet (and any nn.Sequential): the ``batch_norm_act_conv2d`` / ``batch_norm_act`` convert patterns.
* ``fused:inplace_abn`` -- ResNet-50: bn1/bn2 (+ relu) of every bottleneck and the stem become InPlaceABN2d with
  leaky_relu(0.01). That changes the model (relu is not invertible), so its gradients are not eager's.
* ``fused:layer_norm_mlp`` -- GPT-2-like: ln_1 -> qkv, ln_2 -> fc1 and ln_f -> lm_head become LayerNormLinear pairs
  (``fuse_layer_norm_linear``; the tied lm_head weight stays tied), GELU -> fc2 an ActLinear.

None is bitwise lossless (the fused backward kernels round differently from torch's), hence ``lossless=False``;
``batch_norm_act_conv2d`` and ``layer_norm_mlp`` gradients equal eager's within float32 rounding.
"""

from __future__ import annotations

from typing import Optional, Tuple

from torch import nn

from benchmarks.fusion_recipes import fuse_gpt2, fuse_resnet50, fuse_sequentials, is_resnet50
from memsave.measurement.strategies import StrategyContext, register_strategy

__all__ = ["FUSED_STRATEGIES", "fuse_gpt2", "fuse_resnet50"]


#: The fused rows, in table order (``fused:<choice>``).
FUSED_STRATEGIES: Tuple[str, ...] = ("fused:batch_norm_act_conv2d", "fused:inplace_abn", "fused:layer_norm_mlp")


def _fuse(model: nn.Module, arg: Optional[str], ctx: StrategyContext) -> nn.Module:
    if arg == "batch_norm_act_conv2d":
        if is_resnet50(model):
            return fuse_resnet50(model)
        if fuse_sequentials(model, ("batch_norm_act_conv2d", "batch_norm_act")) == 0:
            raise ValueError(f"fused:{arg} found no BatchNorm2d -> activation in {type(model).__name__}")
        return model
    if arg == "inplace_abn":
        if not is_resnet50(model):
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
