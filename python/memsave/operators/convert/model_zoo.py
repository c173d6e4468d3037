"""What ``memsave.convert`` still knows by class name: timm's ViT rules, and the layers whose MLP ``mlp_chunks``
chunks.

Hugging Face decoder layers, gated MLPs, RMS norms, GPT-2's and BERT's MLPs and causal LMs are recognised by what
they compute (:mod:`.structure`, :mod:`.causal_lm`); their rules by class name are gone. Two things stay here, by
class name (qualified, so neither library is imported), because structure cannot cover them:

==============================================  ===================================================================
module (exact class)                            rewrite
==============================================  ===================================================================
timm ``Mlp`` (fc1, act, drop1, norm, fc2)       ``act`` -> Identity, ``fc2`` -> ActLinear (when drop1 has p=0 and
                                                norm is Identity)
timm ViT ``Block``                              ``norm1`` -> ``attn.qkv`` and ``norm2`` -> ``mlp.fc1`` fused
                                                (:func:`memsave.nn.fuse_layer_norm_linear`)
==============================================  ===================================================================

Why these stay: fusing a norm or an activation into the Linear after it needs to know that nothing else reads its
output, which :mod:`.dataflow` learns by running the model on a probe input -- and a timm model declares no input
convert could make one from (its ``img_size`` is a constructor argument, not an attribute every model has). These
rules know timm's forward code instead.

``convert(model, mlp_chunks=N)`` runs MLPs slice by slice along the sequence (:func:`chunk_mlps`,
:func:`memsave.chunked`): every gated MLP (recognised by structure, or memsave's :class:`~memsave.nn.GatedMLP` /
:class:`~memsave.nn.PackedGatedMLP` after ``fuse=True``), and by class name GPT-2's ``GPT2Block.mlp``, BERT's
``BertLayer.feed_forward_chunk`` (intermediate -> output, with its residual LayerNorm) and a timm ViT ``Block``'s
``mlp`` -- a gated MLP's probe shows it computes ``down(act(gate(x)) * up(x))`` row by row, so slicing it along the
sequence is exact; that these other MLPs are position-wise is known from their code, not probed.
"""

from __future__ import annotations

from typing import Any, List, Tuple, Union, cast

from torch import nn

from ...common.chunking import chunk_method, chunk_module
from ..nn import ActLinear, GatedMLP, PackedGatedMLP, fuse_layer_norm_linear
from .registry import ModuleRule, Replacement, Rewrite, add_module_rule, qualified_class_name
from .structure import fused_activation, is_gated_mlp

__all__ = ["chunk_mlps", "fused_activation"]

_TIMM_MLP = "timm.layers.mlp.Mlp"
_TIMM_LAYER_NORM = "timm.layers.norm.LayerNorm"
_TIMM_ATTENTION = {"timm.layers.attention.Attention", "timm.models.vision_transformer.Attention"}


def _is_linear(module: object) -> bool:
    return type(module) is nn.Linear


def _is(module: object, names: object) -> bool:
    return isinstance(module, nn.Module) and (
        qualified_class_name(module) in names
        if isinstance(names, (set, frozenset))
        else qualified_class_name(module) == names
    )


_ACT_LINEAR_DETAIL = (
    "keeps the activation's input only, instead of its input and output; the activation is recomputed in backward"
)


def _act_linear_rewrite(act_path: str, act: object, linear_path: str, linear: Any) -> Rewrite:
    spec = fused_activation(act)
    if isinstance(spec, str):
        return Rewrite(skipped=((act_path, spec),))
    name, param = spec
    if name in ("relu", "identity"):
        return Rewrite(
            skipped=(
                (
                    act_path,
                    f"{name}: nothing to save (the Linear keeps the activation's output, which is all its backward "
                    f"needs)",
                ),
            )
        )
    return Rewrite(
        replacements=(
            Replacement(act_path, nn.Identity(), f"{type(act).__name__} is applied by {linear_path}"),
            Replacement(linear_path, ActLinear.from_linear(linear, name, param), _ACT_LINEAR_DETAIL),
        )
    )


def _rewrite_timm_mlp(mlp: Any) -> Rewrite:
    if not _is_linear(mlp.fc2):
        return Rewrite(skipped=(("fc2", f"{type(mlp.fc2).__name__} is not an nn.Linear (use_conv?)"),))
    if type(mlp.norm) is not nn.Identity:
        return Rewrite(skipped=(("norm", f"a {type(mlp.norm).__name__} between the activation and fc2"),))
    drop = mlp.drop1
    if not (type(drop) is nn.Identity or (type(drop) is nn.Dropout and drop.p == 0)):
        return Rewrite(skipped=(("drop1", f"dropout (p={getattr(drop, 'p', '?')}) between the activation and fc2"),))
    return _act_linear_rewrite("act", mlp.act, "fc2", mlp.fc2)


def _is_layer_norm(norm: object) -> bool:
    """torch's LayerNorm, or timm's when it runs F.layer_norm (not its fast_norm path, which changes the dtype)."""
    if type(norm) is nn.LayerNorm:
        return True
    return _is(norm, _TIMM_LAYER_NORM) and not getattr(norm, "_fast_norm", False)


def _rewrite_timm_block(block: Any) -> Rewrite:
    reps: List[Replacement] = []
    skipped: List[Tuple[str, str]] = []
    detail = "LayerNormLinear: keeps the norm's input and per-row mean/rstd instead of also the normalized tensor"
    attn, mlp = getattr(block, "attn", None), getattr(block, "mlp", None)
    pairs = (
        ("norm1", "attn.qkv", _is(attn, _TIMM_ATTENTION) and _is_linear(getattr(attn, "qkv", None))),
        ("norm2", "mlp.fc1", _is(mlp, _TIMM_MLP) and _is_linear(getattr(mlp, "fc1", None))),
    )
    for norm_name, linear_path, linear_ok in pairs:
        norm = getattr(block, norm_name, None)
        if not _is_layer_norm(norm) or not linear_ok:
            skipped.append((norm_name, f"not an nn.LayerNorm feeding an nn.Linear {linear_path}"))
            continue
        deferred, fused = fuse_layer_norm_linear(
            cast(nn.LayerNorm, norm), cast(nn.Linear, block.get_submodule(linear_path))
        )
        reps.append(Replacement(norm_name, deferred, f"holds the LayerNorm's parameters; {linear_path} applies it"))
        reps.append(Replacement(linear_path, fused, detail))
    return Rewrite(replacements=tuple(reps), skipped=tuple(skipped))


def register_rules() -> None:
    """Register the module rules by class name (timm's ViT Mlp and Block); called once by
    :func:`memsave.operators.convert.register_rules`."""
    add_module_rule(ModuleRule("timm_mlp", (_TIMM_MLP,), _rewrite_timm_mlp))
    add_module_rule(ModuleRule("timm_vit_block", ("timm.models.vision_transformer.Block",), _rewrite_timm_block))


# ---- chunked MLPs (convert's mlp_chunks) ------------------------------------------------------------------------


def _hf(model_type: str, cls: str) -> str:
    return f"transformers.models.{model_type}.modeling_{model_type}.{cls}"


#: Layers whose position-wise MLP convert(mlp_chunks=...) chunks, by qualified class name -> the MLP's attribute.
_MLP_OF_LAYER = {
    _hf("gpt2", "GPT2Block"): "mlp",
    _hf("bert", "BertLayer"): "feed_forward_chunk",
    "timm.models.vision_transformer.Block": "mlp",
}


def _chunk_listed(name: str, layer: nn.Module, chunks: Union[int, str]) -> List[str]:
    attr = _MLP_OF_LAYER.get(qualified_class_name(layer))
    if attr is None:
        return []
    qualified = f"{name}.{attr}" if name else attr
    target = getattr(layer, attr, None)
    if isinstance(target, nn.Module):
        chunk_module(target, chunks, 1)
    elif callable(target):  # a bound method: the layer gets an instance-level chunked one
        chunk_method(layer, attr, chunks, 1, qualified)
    else:
        return []
    return [qualified]


def chunk_mlps(model: nn.Module, chunks: Union[int, str]) -> List[str]:
    """Chunk, in place, the MLPs ``convert(..., mlp_chunks=chunks)`` chunks (see the module docstring).

    Each MLP runs slice by slice along the sequence (dim 1), each slice recomputed in its own backward
    (:func:`memsave.chunked`). BERT's MLP is the layer's ``feed_forward_chunk`` method (intermediate -> output with
    its residual LayerNorm, which takes the attention output twice), given an instance-level chunked version.

    Args:
        model: the model; changed in place.
        chunks: slices per call, or ``"auto"`` (:func:`memsave.recompute.chunked.auto_chunks`).

    Returns:
        the qualified names of the chunked MLPs (``"layers.0.mlp"``, ``"encoder.layer.0.feed_forward_chunk"``).

    Examples:
        >>> chunk_mlps(llama, "auto")
        ['model.layers.0.mlp', 'model.layers.1.mlp']
    """
    done: List[str] = []
    claimed: set = set()  # modules inside an MLP already chunked
    for name, module in model.named_modules():
        if id(module) in claimed or "forward" in vars(module):  # inside a chunked MLP, or already chunked
            continue
        listed = _chunk_listed(name, module, chunks)
        if not listed and (isinstance(module, (GatedMLP, PackedGatedMLP)) or is_gated_mlp(module)):
            chunk_module(module, chunks, 1)
            listed = [name]
        if listed:
            done += listed
            claimed.update(id(m) for m in module.modules())
    return done
