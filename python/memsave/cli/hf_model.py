"""A Hugging Face transformers model on the command line, built locally: ``--model hf:<model type>`` or
``--model hf:<directory with a config.json>``.

==============================  ====================================================================================
``hf:llama``, ``hf:qwen2``,     a model type transformers knows (``transformers.CONFIG_MAPPING``): its config's own
``hf:gpt2``, ``hf:vit``         defaults, scaled down by ``--size`` (``tiny``, ``cpu``; ``full`` keeps them), random
                                weights
``hf:./my_model``               a local directory holding a ``config.json`` (``save_pretrained`` writes one): that
                                config as it is (``--size`` scales it too), random weights; no weight file is read
==============================  ====================================================================================

Nothing is downloaded: a Hub id (``hf:meta-llama/Llama-3.1-8B``) that is not a local directory gets a message saying
how to fetch its ``config.json`` and point at it. A causal language model gets its causal-LM head
(``AutoModelForCausalLM``), any other model its base class (``AutoModel``). Without ``--input``, a model with a
vocabulary reads token ids (``tokens:B,S:vocab``) and a vision model images (``B,C,H,W``); the batch and sequence
length follow ``--size``, and ``--batch`` replaces the batch.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Tuple

import torch
from torch import nn

from .usage import CommandError, UsageError, one_line
from .user_model import InputSpec

__all__ = ["HF_PREFIX", "build_hf_model", "default_hf_inputs", "hf_config", "is_hf_model"]

#: The ``--model`` prefix of a transformers model.
HF_PREFIX = "hf:"

#: Per ``--size``: the model's width, depth, heads and vocabulary, and the default batch and sequence length.
_SCALES: Dict[str, Dict[str, int]] = {
    "tiny": {"hidden": 64, "layers": 2, "heads": 4, "vocab": 1024, "batch": 2, "seq": 32, "image": 32},
    "cpu": {"hidden": 256, "layers": 4, "heads": 4, "vocab": 8192, "batch": 4, "seq": 128, "image": 64},
    "full": {"batch": 1, "seq": 1024, "image": 224},
}

#: Config fields by meaning: transformers' families spell them differently (Llama, GPT-2, T5, ...).
_FIELDS = {
    "hidden": ("hidden_size", "n_embd", "d_model"),
    "layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "heads": ("num_attention_heads", "n_head"),
    "kv_heads": ("num_key_value_heads",),
    "intermediate": ("intermediate_size", "n_inner", "ffn_dim", "d_ff"),
    "vocab": ("vocab_size",),
    "positions": ("max_position_embeddings", "n_positions"),
}


def is_hf_model(name: str) -> bool:
    """Whether ``--model`` names a transformers model (``hf:<type>`` or ``hf:<directory>``).

    Args:
        name: the ``--model`` value.

    Returns:
        True for the ``hf:`` form.

    Examples:
        >>> is_hf_model("hf:llama"), is_hf_model("torchvision.models:resnet18")
        (True, False)
    """
    return name.startswith(HF_PREFIX)


def _transformers() -> Any:
    try:
        import transformers
    except ImportError:
        raise UsageError("--model hf:...: needs transformers (pip install transformers)") from None
    return transformers


def _base_config(spec: str) -> Any:
    """The unscaled config ``hf:<what>`` names, read locally (never downloaded)."""
    transformers = _transformers()
    what = spec[len(HF_PREFIX) :]
    if not what:
        raise UsageError("--model hf: needs a model type (hf:llama) or a directory with a config.json (hf:./my_model)")
    if os.path.isdir(what):
        if not os.path.isfile(os.path.join(what, "config.json")):
            raise UsageError(f"--model {spec}: {what} has no config.json (save_pretrained or the Hub writes one)")
        try:
            return transformers.AutoConfig.from_pretrained(what, local_files_only=True)
        except Exception as e:
            raise CommandError(f"--model {spec}: reading {what}/config.json failed: {one_line(e)}") from e
    if what in transformers.CONFIG_MAPPING:
        return transformers.CONFIG_MAPPING[what]()
    if "/" in what or os.sep in what:
        raise UsageError(
            f"--model {spec}: {what!r} is not a local directory, and memsave downloads nothing. Fetch its config "
            f"(huggingface-cli download {what} config.json --local-dir ./{what.rsplit('/', 1)[-1]}) and pass "
            f"--model hf:./{what.rsplit('/', 1)[-1]}, or name a model type such as hf:llama"
        )
    near = sorted(t for t in transformers.CONFIG_MAPPING if what.lower().replace("-", "_") in t)[:8]
    hint = f"; close: {', '.join(near)}" if near else "; e.g. hf:llama, hf:gpt2, hf:qwen2, hf:mistral, hf:vit, hf:bert"
    raise UsageError(f"--model {spec}: transformers {transformers.__version__} has no model type {what!r}{hint}")


def _set(config: Any, meaning: str, value: int) -> None:
    for name in _FIELDS[meaning]:
        if isinstance(getattr(config, name, None), int):
            setattr(config, name, value)


def _scale(config: Any, size: str) -> Any:
    """``config`` scaled to ``size``: width, depth, heads (keeping the query / key-value head ratio when it fits),
    intermediate width (keeping its ratio to the width) and vocabulary; ``full`` leaves it as it is."""
    scale = _SCALES[size]
    if "hidden" not in scale:
        return config
    hidden = next((getattr(config, n) for n in _FIELDS["hidden"] if isinstance(getattr(config, n, None), int)), None)
    inter = next(
        (getattr(config, n) for n in _FIELDS["intermediate"] if isinstance(getattr(config, n, None), int)), None
    )
    heads = next((getattr(config, n) for n in _FIELDS["heads"] if isinstance(getattr(config, n, None), int)), None)
    kv = getattr(config, "num_key_value_heads", None)
    _set(config, "hidden", scale["hidden"])
    _set(config, "layers", scale["layers"])
    _set(config, "heads", scale["heads"])
    if isinstance(kv, int) and kv > 0:  # keep grouped-query attention's ratio where it divides, else one group each
        ratio = heads // kv if heads and heads % kv == 0 else 1
        _set(config, "kv_heads", scale["heads"] // ratio if scale["heads"] % ratio == 0 else scale["heads"])
    if isinstance(getattr(config, "head_dim", None), int):
        config.head_dim = scale["hidden"] // scale["heads"]
    if inter and hidden:
        _set(config, "intermediate", max(8, round(scale["hidden"] * inter / hidden)))
    _set(config, "vocab", scale["vocab"])
    return config


def hf_config(spec: str, size: str) -> Any:
    """The config of ``--model hf:...`` at ``--size`` ``size``.

    Args:
        spec: the ``--model`` value (``hf:llama``, ``hf:./my_model``).
        size: ``tiny``, ``cpu`` or ``full``.

    Returns:
        a ``transformers.PretrainedConfig``.

    Raises:
        UsageError: transformers missing, an unknown model type, a Hub id, a directory without config.json.
        CommandError: the directory's config.json cannot be read.

    Examples:
        >>> hf_config("hf:llama", "tiny").hidden_size
        64
    """
    return _scale(_base_config(spec), size)


def build_hf_model(spec: str, size: str, seed: int = 0) -> nn.Module:
    """``--model hf:...``: the model with random weights (seeded), in training mode.

    Args:
        spec: the ``--model`` value. size: ``--size``. seed: ``--seed``.

    Returns:
        an ``AutoModelForCausalLM`` for a causal language model's config, else an ``AutoModel``.

    Raises:
        UsageError: see :func:`hf_config`.
        CommandError: transformers could not build the model from the config.

    Examples:
        >>> model = build_hf_model("hf:qwen2", "tiny")
        >>> type(model).__name__
        'Qwen2ForCausalLM'
    """
    transformers = _transformers()
    config = hf_config(spec, size)
    causal = type(config) in transformers.MODEL_FOR_CAUSAL_LM_MAPPING
    auto = transformers.AutoModelForCausalLM if causal else transformers.AutoModel
    if hasattr(config, "use_cache"):
        config.use_cache = False  # a training step keeps no KV cache (as Trainer sets under checkpointing)
    torch.manual_seed(seed)
    try:
        model = auto.from_config(config)
    except Exception as e:
        raise CommandError(f"--model {spec}: transformers could not build it ({size}): {one_line(e)}") from e
    return model.train()


def default_hf_inputs(model: nn.Module, size: str) -> List[InputSpec]:
    """The inputs ``--model hf:...`` gets without ``--input``: token ids when the config has a vocabulary, else
    images when it has an image size.

    Args:
        model: the model :func:`build_hf_model` made. size: ``--size``.

    Returns:
        one :class:`InputSpec`.

    Raises:
        UsageError: the model reads neither (give ``--input``).

    Examples:
        >>> default_hf_inputs(build_hf_model("hf:gpt2", "tiny"), "tiny")[0].spelling()
        'tokens:2,32:1024'
    """
    config, scale = getattr(model, "config", None), _SCALES[size]
    vocab = getattr(config, "vocab_size", None)
    if isinstance(vocab, int) and vocab > 0:
        limits = [getattr(config, n) for n in _FIELDS["positions"] if isinstance(getattr(config, n, None), int)]
        return [InputSpec((scale["batch"], min([scale["seq"], *limits])), vocab)]
    image, channels = getattr(config, "image_size", None), getattr(config, "num_channels", None)
    if image is not None and isinstance(channels, int):
        side = image if isinstance(image, int) else int(image[0])
        return [InputSpec((scale["batch"], channels, side, side))]
    raise UsageError(
        f"--model: {type(model).__name__} reads neither token ids nor images by default; give its inputs with "
        "--input (e.g. --input tokens:2,128:32000 or --input 2,3,224,224)"
    )


def describe(model: nn.Module) -> Tuple[str, Dict[str, Any]]:
    """A short title and the JSON record of a transformers model's config (its type and the scaled fields).

    Examples:
        >>> describe(build_hf_model("hf:llama", "tiny"))[0]
        'LlamaForCausalLM (hidden 64, 2 layers)'
    """
    config = getattr(model, "config", None)
    fields = {n: getattr(config, n) for names in _FIELDS.values() for n in names if hasattr(config, n)}
    hidden = next((fields[n] for n in _FIELDS["hidden"] if n in fields), "?")
    layers = next((fields[n] for n in _FIELDS["layers"] if n in fields), "?")
    model_type = getattr(config, "model_type", None)
    return f"{type(model).__name__} (hidden {hidden}, {layers} layers)", {"model_type": model_type, **fields}
