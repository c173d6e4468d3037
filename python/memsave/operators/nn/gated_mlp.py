"""The gated MLP module (the ``gated_mlp`` operator family): ``down(act(gate(x)) * up(x))``, as in Llama, Mistral,
Qwen2 (SwiGLU: silu) and Gemma / T5 v1.1 (GeGLU: gelu, gelu_tanh).

=========  ====================================================  ======================================
module     eager keeps                                           memsave keeps
=========  ====================================================  ======================================
GatedMLP   x, gate, act(gate), up, act(gate) * up (4 x width)    x, gate, up (2 x width)
=========  ====================================================  ======================================

State dict: ``gate_proj.weight``, ``up_proj.weight``, ``down_proj.weight`` (and ``.bias`` with ``bias=True``), the
keys of Hugging Face's ``LlamaMLP``; :meth:`GatedMLP.from_modules` takes existing Linears without copying them::

    mlp = layer.mlp                                                     # a Hugging Face LlamaMLP
    layer.mlp = memsave.nn.GatedMLP.from_modules(mlp.gate_proj, mlp.up_proj, mlp.down_proj, act="silu")
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import nn

from .. import functional as F
from ._base import check_sizes

Tensor = torch.Tensor

__all__ = ["GatedMLP"]


class GatedMLP(nn.Module):
    """``down_proj(act(gate_proj(x)) * up_proj(x))`` keeping ``x``, the gate and the up projection for backward.

    Eager PyTorch keeps the gate projection, its activation, the up projection and their product (four tensors of
    the MLP width, plus ``x``); this keeps two and recomputes the product in backward for the down projection's
    weight gradient (:func:`memsave.functional.gated_act_linear`). ``gate_proj`` and ``up_proj`` are called as
    modules, so they may be wrapped (LoRA adapters, quantized Linears); ``down_proj`` must be an nn.Linear.

    Args:
        hidden_size: the model width (in and out features).
        intermediate_size: the MLP width.
        act: one of :data:`memsave.functional.GATED_ACTIVATIONS` -- ``"silu"`` (SwiGLU, default), ``"gelu"``,
            ``"gelu_tanh"`` (GeGLU; Hugging Face's ``gelu_pytorch_tanh``), ``"relu"``, ``"identity"``.
        bias: the three Linears have biases (False, as in Llama).
        device, dtype: factory arguments.

    Raises:
        ValueError: unknown activation.

    Examples:
        >>> mlp = memsave.nn.GatedMLP(1024, 2816, act="silu")
        >>> sorted(mlp.state_dict())
        ['down_proj.weight', 'gate_proj.weight', 'up_proj.weight']
    """

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        act: str = "silu",
        bias: bool = False,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        check_sizes(hidden_size=hidden_size, intermediate_size=intermediate_size)
        factory = {"device": device, "dtype": dtype}
        self.act = F.resolve_gated_activation("GatedMLP", act)
        self.hidden_size, self.intermediate_size = hidden_size, intermediate_size
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=bias, **factory)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=bias, **factory)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=bias, **factory)

    @classmethod
    def from_modules(
        cls, gate_proj: nn.Module, up_proj: nn.Module, down_proj: nn.Linear, act: str = "silu"
    ) -> "GatedMLP":
        """A GatedMLP holding the given modules (the same objects: nothing is copied, keys stay ``gate_proj.*`` ...).

        Args:
            gate_proj, up_proj: the gate and up projections (nn.Linear, or any module mapping x to the MLP width).
            down_proj: the down projection, an nn.Linear.
            act: the activation applied to the gate (see the class).

        Returns:
            The memsave module; put it where the model's MLP was.

        Raises:
            TypeError: down_proj is not an nn.Linear. ValueError: unknown activation.

        Examples:
            >>> layer.mlp = memsave.nn.GatedMLP.from_modules(layer.mlp.gate_proj, layer.mlp.up_proj,
            ...                                              layer.mlp.down_proj, act="silu")
        """
        if not isinstance(down_proj, nn.Linear):
            raise TypeError(f"GatedMLP.from_modules: down_proj must be an nn.Linear, got {type(down_proj).__name__}")
        mlp = cls.__new__(cls)
        nn.Module.__init__(mlp)
        mlp.act = F.resolve_gated_activation("GatedMLP", act)
        mlp.hidden_size, mlp.intermediate_size = down_proj.out_features, down_proj.in_features
        mlp.gate_proj, mlp.up_proj, mlp.down_proj = cast(nn.Linear, gate_proj), cast(nn.Linear, up_proj), down_proj
        return mlp

    def forward(self, input: Tensor) -> Tensor:
        return F.gated_act_linear(
            self.gate_proj(input), self.up_proj(input), self.down_proj.weight, self.down_proj.bias, self.act
        )

    def extra_repr(self) -> str:
        return f"hidden_size={self.hidden_size}, intermediate_size={self.intermediate_size}, act={self.act}"
