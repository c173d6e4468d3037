"""Module rules of ``memsave.convert(model, fuse=True)`` for the model zoos: Hugging Face transformers and timm.

Each rule knows one family's ``forward`` code and rewrites inside the module, keeping every state_dict key where it
was (the fused modules share the original parameters). Classes are matched by qualified name, so neither
transformers nor timm is imported here.

==============================================  ===================================================================
module (exact class)                            rewrite
==============================================  ===================================================================
Llama / Mistral / Qwen2 / Qwen3 DecoderLayer    ``input_layernorm`` -> q/k/v_proj and ``post_attention_layernorm``
                                                -> gate/up_proj fused (:func:`memsave.nn.fuse_rms_norm_linear`), the
                                                MLP a :class:`memsave.nn.GatedMLP` (keys ``mlp.gate_proj`` ...)
Llama / Mistral / Qwen2 / Qwen3 MLP             :class:`memsave.nn.GatedMLP` (where no decoder-layer rule did it)
Llama / Mistral / Qwen2 / Qwen3 RMSNorm         :class:`memsave.nn.RMSNorm` (the final norm; norms left unfused)
GPT2MLP (``c_fc -> act -> c_proj``, Conv1D)     ``act`` -> Identity, ``c_proj`` -> :meth:`ActLinear.from_conv1d`
BertLayer (BertIntermediate -> BertOutput)      the intermediate activation -> Identity, ``output.dense`` -> ActLinear
timm ``Mlp`` (fc1, act, drop1, norm, fc2)       ``act`` -> Identity, ``fc2`` -> ActLinear (when drop1 has p=0 and
                                                norm is Identity)
timm ViT ``Block``                              ``norm1`` -> ``attn.qkv`` and ``norm2`` -> ``mlp.fc1`` fused
                                                (:func:`memsave.nn.fuse_layer_norm_linear`)
==============================================  ===================================================================

``convert(model, mlp_chunks=N)`` then runs each of these models' MLPs slice by slice along the sequence
(:func:`chunk_mlps`, :func:`memsave.chunked`): a Llama-family layer's ``mlp``, GPT-2's ``GPT2Block.mlp``, BERT's
``BertLayer.feed_forward_chunk`` (intermediate -> output, with its residual LayerNorm) and a timm ViT ``Block``'s
``mlp``.

A part whose configuration a rule does not support (an activation without a fused kernel, a Linear wrapped by an
adapter, dropout between an activation and its Linear) is left as it was and reported as skipped, with the reason.
The causal language models' loss (``lm_head`` and cross-entropy) is ``causal_lm.py``.
"""

from __future__ import annotations

from typing import Any, List, Optional, Tuple, Union, cast

from torch import nn

from ...common.chunking import chunk_method, chunk_module
from ..functional import GATED_ACTIVATIONS
from ..nn import (
    ActLinear,
    DeferredRMSNorm,
    GatedMLP,
    RMSNorm,
    RMSNormLinear,
    activation_spec,
    fuse_layer_norm_linear,
    fuse_rms_norm_linear,
)
from .registry import ModuleRule, Replacement, Rewrite, add_module_rule, qualified_class_name

__all__ = ["LLAMA_FAMILY", "chunk_mlps", "fused_activation"]

#: Hugging Face decoder families whose layers are Llama's: ``model_type -> class-name prefix``.
LLAMA_FAMILY = {"llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2", "qwen3": "Qwen3"}


def _hf(model_type: str, cls: str) -> str:
    return f"transformers.models.{model_type}.modeling_{model_type}.{cls}"


_RMS_NORMS = {_hf(t, f"{p}RMSNorm") for t, p in LLAMA_FAMILY.items()}
_GATED_MLPS = {_hf(t, f"{p}MLP") for t, p in LLAMA_FAMILY.items()}
_CONV1D = "transformers.pytorch_utils.Conv1D"
_TIMM_MLP = "timm.layers.mlp.Mlp"
_TIMM_LAYER_NORM = "timm.layers.norm.LayerNorm"
_TIMM_ATTENTION = {"timm.layers.attention.Attention", "timm.models.vision_transformer.Attention"}

# Activation modules of transformers and timm, by qualified class name, and the fused operators' name for them
# (equal up to float rounding: NewGELU/FastGELU are the tanh approximation written out in Python).
_LIBRARY_ACTIVATIONS = {
    "transformers.activations.GELUActivation": "gelu",
    "transformers.activations.NewGELUActivation": "gelu_tanh",
    "transformers.activations.GELUTanh": "gelu_tanh",
    "transformers.activations.FastGELUActivation": "gelu_tanh",
    "transformers.activations.SiLUActivation": "silu",
    "timm.layers.activations.GELU": "gelu",
    "timm.layers.activations.GELUTanh": "gelu_tanh",
}


def fused_activation(act: object) -> Union[Tuple[str, Optional[float]], str]:
    """The fused operators' activation equal to ``act``, or the reason there is none.

    Knows torch's activations (:func:`memsave.nn.activation_spec`) and those of transformers (``ACT2FN``: gelu,
    gelu_new, gelu_pytorch_tanh, gelu_fast, silu/swish, relu) and timm (GELU, GELUTanh).

    Args:
        act: an activation module (or anything else, which gets a reason).

    Returns:
        ``(name, param)`` for :func:`memsave.functional.act_linear` / ``gated_act``, or a one-line reason.

    Examples:
        >>> fused_activation(transformers.activations.NewGELUActivation())
        ('gelu_tanh', None)
    """
    if not isinstance(act, nn.Module):
        return f"the activation is a {type(act).__name__}, not a module memsave knows"
    name = _LIBRARY_ACTIVATIONS.get(qualified_class_name(act))
    if name is not None:
        return name, None
    spec = activation_spec(act)
    if spec is None:
        return f"activation {type(act).__name__} has no fused memsave kernel"
    return spec[0], spec[1]


def _is_linear(module: object) -> bool:
    return type(module) is nn.Linear


def _is(module: object, names: object) -> bool:
    return isinstance(module, nn.Module) and (
        qualified_class_name(module) in names
        if isinstance(names, (set, frozenset))
        else qualified_class_name(module) == names
    )


# ---- Llama family -----------------------------------------------------------------------------------------------

_NORM_DETAIL = (
    "keeps its input and one float per row instead of also the normalized tensor (and float32 copies of a 16-bit input)"
)
_GATED_DETAIL = (
    "keeps x, gate and up (2 tensors of the MLP width) instead of gate, act(gate), up and "
    "act(gate) * up (4); the product is recomputed for down_proj's backward"
)


def _gated_mlp(mlp: Any, gate: Any, up: Any) -> Union[GatedMLP, str]:
    """A GatedMLP for a Llama-family MLP with these gate/up modules, or why not."""
    if not _is_linear(mlp.down_proj):
        return f"down_proj is a {type(mlp.down_proj).__name__}, not an nn.Linear"
    act = fused_activation(getattr(mlp, "act_fn", None))
    if isinstance(act, str):
        return act
    if act[0] not in GATED_ACTIVATIONS or act[1]:
        return f"activation {act[0]} is not one of the gated kernels' {GATED_ACTIVATIONS}"
    return GatedMLP.from_modules(gate, up, mlp.down_proj, act=act[0])


def _rewrite_llama_mlp(mlp: Any) -> Rewrite:
    new = _gated_mlp(mlp, mlp.gate_proj, mlp.up_proj)
    if isinstance(new, str):
        return Rewrite(skipped=(("", new),))
    return Rewrite(replacements=(Replacement("", new, _GATED_DETAIL),))


def _rewrite_rms_norm(norm: Any) -> Rewrite:
    return Rewrite(replacements=(Replacement("", RMSNorm.from_module(norm), _NORM_DETAIL),))


def _rewrite_llama_layer(layer: Any) -> Rewrite:
    """input_layernorm -> q/k/v and post_attention_layernorm -> gate/up fused; the MLP a GatedMLP."""
    reps: List[Replacement] = []
    skipped: List[Tuple[str, str]] = []
    attn, mlp = layer.self_attn, layer.mlp
    projs = [getattr(attn, n, None) for n in ("q_proj", "k_proj", "v_proj")]
    if _is(layer.input_layernorm, _RMS_NORMS):
        if all(_is_linear(p) for p in projs):
            deferred, fused = fuse_rms_norm_linear(layer.input_layernorm, *cast(List[nn.Linear], projs))
            reps.append(Replacement("input_layernorm", deferred, "holds the norm's weight; q/k/v_proj apply the norm"))
            for name, new in zip(("q_proj", "k_proj", "v_proj"), cast(Tuple[RMSNormLinear, ...], fused)):
                reps.append(
                    Replacement(
                        f"self_attn.{name}",
                        new,
                        "RMSNormLinear: keeps the norm's input (one "
                        "tensor shared by q/k/v) instead of the norm's intermediates and output",
                    )
                )
        else:
            reps.append(
                Replacement(
                    "input_layernorm",
                    RMSNorm.from_module(layer.input_layernorm),
                    _NORM_DETAIL + "; not fused with q/k/v_proj, which are not plain nn.Linear (adapters?)",
                )
            )
    post = layer.post_attention_layernorm
    post_ok, post_fused = _is(post, _RMS_NORMS), False
    if not _is(mlp, _GATED_MLPS):
        skipped.append(("mlp", f"{type(mlp).__name__} is not a Llama-family gated MLP"))
    else:
        gate, up = mlp.gate_proj, mlp.up_proj
        post_deferred: Optional[DeferredRMSNorm] = None
        if post_ok and _is_linear(gate) and _is_linear(up):
            post_deferred, fused_pair = fuse_rms_norm_linear(post, gate, up)
            gate, up = cast(Tuple[RMSNormLinear, ...], fused_pair)
        new_mlp = _gated_mlp(mlp, gate, up)
        if isinstance(new_mlp, str):
            skipped.append(("mlp", new_mlp))
        elif post_deferred is not None:
            reps.append(
                Replacement(
                    "post_attention_layernorm",
                    post_deferred,
                    "holds the norm's weight; mlp.gate_proj/up_proj apply the norm",
                )
            )
            reps.append(
                Replacement(
                    "mlp",
                    new_mlp,
                    _GATED_DETAIL + "; gate_proj/up_proj are RMSNormLinear (they "
                    "keep the norm's input, not its output)",
                )
            )
            post_fused = True
        else:
            reps.append(Replacement("mlp", new_mlp, _GATED_DETAIL))
    if post_ok and not post_fused:
        reps.append(Replacement("post_attention_layernorm", RMSNorm.from_module(post), _NORM_DETAIL))
    return Rewrite(replacements=tuple(reps), skipped=tuple(skipped))


# ---- GPT-2, BERT ------------------------------------------------------------------------------------------------

_ACT_LINEAR_DETAIL = (
    "keeps the activation's input only, instead of its input and output (and, for a GELU written "
    "in Python such as NewGELUActivation, its intermediates); the activation is recomputed in "
    "backward"
)


def _act_linear_rewrite(act_path: str, act: object, linear_path: str, linear: Any, conv1d: bool) -> Rewrite:
    spec = fused_activation(act)
    if isinstance(spec, str):
        return Rewrite(skipped=((act_path, spec),))
    name, param = spec
    if name in ("relu", "identity"):
        return Rewrite(
            skipped=(
                (
                    act_path,
                    f"{name}: nothing to save (the Linear keeps the activation's output, which "
                    f"is all its backward needs)",
                ),
            )
        )
    new = ActLinear.from_conv1d(linear, name, param) if conv1d else ActLinear.from_linear(linear, name, param)
    return Rewrite(
        replacements=(
            Replacement(act_path, nn.Identity(), f"{type(act).__name__} is applied by {linear_path}"),
            Replacement(linear_path, new, _ACT_LINEAR_DETAIL),
        )
    )


def _rewrite_gpt2_mlp(mlp: Any) -> Rewrite:
    if not _is(mlp.c_proj, _CONV1D):
        return Rewrite(skipped=(("c_proj", f"{type(mlp.c_proj).__name__} is not transformers' Conv1D"),))
    return _act_linear_rewrite("act", mlp.act, "c_proj", mlp.c_proj, conv1d=True)


def _rewrite_bert_layer(layer: Any) -> Rewrite:
    inter, out = getattr(layer, "intermediate", None), getattr(layer, "output", None)
    if inter is None or out is None or not _is_linear(getattr(out, "dense", None)):
        return Rewrite(skipped=(("", "no intermediate -> output.dense (nn.Linear) pair"),))
    return _act_linear_rewrite(
        "intermediate.intermediate_act_fn", inter.intermediate_act_fn, "output.dense", out.dense, conv1d=False
    )


# ---- timm -------------------------------------------------------------------------------------------------------


def _rewrite_timm_mlp(mlp: Any) -> Rewrite:
    if not _is_linear(mlp.fc2):
        return Rewrite(skipped=(("fc2", f"{type(mlp.fc2).__name__} is not an nn.Linear (use_conv?)"),))
    if type(mlp.norm) is not nn.Identity:
        return Rewrite(skipped=(("norm", f"a {type(mlp.norm).__name__} between the activation and fc2"),))
    drop = mlp.drop1
    if not (type(drop) is nn.Identity or (type(drop) is nn.Dropout and drop.p == 0)):
        return Rewrite(skipped=(("drop1", f"dropout (p={getattr(drop, 'p', '?')}) between the activation and fc2"),))
    return _act_linear_rewrite("act", mlp.act, "fc2", mlp.fc2, conv1d=False)


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


add_module_rule(
    ModuleRule(
        "llama_decoder_layer", tuple(_hf(t, f"{p}DecoderLayer") for t, p in LLAMA_FAMILY.items()), _rewrite_llama_layer
    )
)
add_module_rule(ModuleRule("gated_mlp", tuple(sorted(_GATED_MLPS)), _rewrite_llama_mlp))
add_module_rule(ModuleRule("rms_norm", tuple(sorted(_RMS_NORMS)), _rewrite_rms_norm))
add_module_rule(ModuleRule("gpt2_mlp", (_hf("gpt2", "GPT2MLP"),), _rewrite_gpt2_mlp))
add_module_rule(ModuleRule("bert_feed_forward", (_hf("bert", "BertLayer"),), _rewrite_bert_layer))
add_module_rule(ModuleRule("timm_mlp", (_TIMM_MLP,), _rewrite_timm_mlp))
add_module_rule(ModuleRule("timm_vit_block", ("timm.models.vision_transformer.Block",), _rewrite_timm_block))


# ---- chunked MLPs (convert's mlp_chunks) ------------------------------------------------------------------------

#: Layers whose position-wise MLP convert(mlp_chunks=...) chunks, by qualified class name -> the MLP's attribute.
_MLP_OF_LAYER = {
    **{_hf(t, f"{p}DecoderLayer"): "mlp" for t, p in LLAMA_FAMILY.items()},
    _hf("gpt2", "GPT2Block"): "mlp",
    _hf("bert", "BertLayer"): "feed_forward_chunk",
    "timm.models.vision_transformer.Block": "mlp",
}


def chunk_mlps(model: nn.Module, chunks: Union[int, str]) -> List[str]:
    """Chunk, in place, the MLPs of the model-zoo layers ``convert`` knows (``convert(..., mlp_chunks=chunks)``).

    Each such layer's MLP runs slice by slice along the sequence (dim 1), each slice recomputed in its own backward
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
    done = []
    for name, layer in model.named_modules():
        attr = _MLP_OF_LAYER.get(qualified_class_name(layer))
        if attr is None:
            continue
        qualified = f"{name}.{attr}" if name else attr
        target = getattr(layer, attr, None)
        if isinstance(target, nn.Module):
            chunk_module(target, chunks, 1)
        elif callable(target):  # a bound method: the layer gets an instance-level chunked one
            chunk_method(layer, attr, chunks, 1, qualified)
        else:
            continue
        done.append(qualified)
    return done
