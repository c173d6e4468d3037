"""Hugging Face's Llama modules written out in plain torch (transformers/models/llama/modeling_llama.py): the eager
compositions that memsave.nn.RMSNorm, RMSNormLinear and GatedMLP replace, for the operator tests
(``from helpers.eager import ...``) and ``benchmarks/transformer_ops.py`` (``from tests.helpers.eager import ...``).
Test scaffolding, not part of the memsave package."""

from __future__ import annotations

import functools
from typing import Callable, Dict

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
