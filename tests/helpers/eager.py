"""Hugging Face's Llama modules written out in plain torch (transformers/models/llama/modeling_llama.py): the eager
compositions that memsave.nn.RMSNorm, RMSNormLinear and GatedMLP replace, and half a decoder layer around them
(:func:`pre_norm_layer`), for the operator tests
(``from helpers.eager import ...``) and ``benchmarks/transformer_ops.py`` (``from tests.helpers.eager import ...``).
Test scaffolding, not part of the memsave package."""

from __future__ import annotations

import copy
import functools
from typing import Callable, Dict, Tuple

import torch
import torch.nn.functional as F
from torch import nn

#: The gated MLP's activations by name (the names memsave.nn.GatedMLP takes).
ACTS: Dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu,
    "gelu": F.gelu,
    "gelu_tanh": functools.partial(F.gelu, approximate="tanh"),
}


class LlamaRMSNorm(nn.Module):
    """LlamaRMSNorm, verbatim."""

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """Normalize in float32, scale in the input's dtype."""
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class LlamaMLP(nn.Module):
    """LlamaMLP, ``down(act(gate(x)) * up(x))``, with the activation (a name of :data:`ACTS`) as an argument."""

    def __init__(self, hidden_size: int, intermediate_size: int, act: str = "silu", bias: bool = False) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=bias)
        self.act_fn = ACTS[act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The gated MLP."""
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class PreNormResidual(nn.Module):
    """Half a Llama decoder layer, ``x + block(norm(x))``, under the layer's own attribute names (``input_layernorm``
    and ``self_attn``, or ``post_attention_layernorm`` and ``mlp``): its state_dict keys are the layer's.

    Args:
        norm_name: the norm's attribute name.
        norm: the norm (a :class:`LlamaRMSNorm`).
        block_name: the block's attribute name.
        block: the block; its output has the input's shape.

    Returns:
        The module.

    Raises:
        KeyError: ``norm_name`` and ``block_name`` are the same.

    Examples:
        >>> PreNormResidual("post_attention_layernorm", LlamaRMSNorm(64), "mlp", LlamaMLP(64, 176))
    """

    def __init__(self, norm_name: str, norm: nn.Module, block_name: str, block: nn.Module) -> None:
        super().__init__()
        if norm_name == block_name:
            raise KeyError(f"PreNormResidual: the norm and the block need two attribute names, got {norm_name!r} twice")
        self.names = (norm_name, block_name)
        self.add_module(norm_name, norm)
        self.add_module(block_name, block)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The residual around the block of the normalized input."""
        norm, block = (getattr(self, name) for name in self.names)
        return x + block(norm(x))


def pre_norm_layer(
    norm_name: str, block_name: str, make_block: Callable[[], nn.Module], hidden: int, seed: int = 0
) -> Tuple[PreNormResidual, PreNormResidual]:
    """A seeded :class:`PreNormResidual` with a :class:`LlamaRMSNorm` whose weight is drawn from [0.5, 1.5) (not all
    ones, so a fused norm that dropped it would show), and a deep copy of it: the eager reference.

    Args:
        norm_name: the norm's attribute name (``input_layernorm``).
        block_name: the block's attribute name (``self_attn``).
        make_block: builds the block (called after the seed is set).
        hidden: the model width (the norm's size).
        seed: the seed of the global RNG the block and the norm weight draw from.

    Returns:
        (the layer, its deep copy).

    Raises:
        KeyError: ``norm_name`` and ``block_name`` are the same.

    Examples:
        >>> layer, ref = pre_norm_layer("post_attention_layernorm", "mlp", lambda: LlamaMLP(64, 176), 64)
    """
    torch.manual_seed(seed)
    layer = PreNormResidual(norm_name, LlamaRMSNorm(hidden), block_name, make_block())
    with torch.no_grad():
        getattr(layer, norm_name).weight.uniform_(0.5, 1.5)
    return layer, copy.deepcopy(layer)
