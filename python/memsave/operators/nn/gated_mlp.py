"""The gated MLP module (the ``gated_mlp`` operator family): ``down(act(gate(x)) * up(x))``, as in Llama, Mistral,
Qwen2 (SwiGLU: silu) and Gemma / T5 v1.1 (GeGLU: gelu, gelu_tanh).

==============  ====================================================  ======================================
module          eager keeps                                           memsave keeps
==============  ====================================================  ======================================
GatedMLP        x, gate, act(gate), up, act(gate) * up (4 x width)    x, gate, up (2 x width)
PackedGatedMLP  x, [gate, up], act(gate), act(gate) * up (4 x width)  x, [gate, up] (2 x width)
==============  ====================================================  ======================================

State dict: ``gate_proj.weight``, ``up_proj.weight``, ``down_proj.weight`` (and ``.bias`` with ``bias=True``), the
keys of Hugging Face's ``LlamaMLP``; :meth:`GatedMLP.from_modules` takes existing Linears without copying them::

    mlp = layer.mlp                                                     # a Hugging Face LlamaMLP
    layer.mlp = memsave.nn.GatedMLP.from_modules(mlp.gate_proj, mlp.up_proj, mlp.down_proj, act="silu")

Other names keep their keys with ``names=`` (``("w1", "w3", "w2")`` for a Mixtral-style expert).
:class:`PackedGatedMLP` is the form whose gate and up projections are one Linear (Phi-3's ``gate_up_proj``).
"""

from __future__ import annotations

from typing import Any, ClassVar, Sequence, Tuple, cast

import torch
from torch import nn

from .. import functional as F
from ._base import FusedModuleBase, bare_module, check_flag

Tensor = torch.Tensor

__all__ = ["GatedMLP", "PackedGatedMLP"]

_NAMES = ("gate_proj", "up_proj", "down_proj")


def _check_names(names: Any, count: int) -> Tuple[str, ...]:
    if (
        not isinstance(names, (tuple, list))
        or len(names) != count
        or not all(isinstance(n, str) and n.isidentifier() for n in names)
        or len(set(names)) != count
    ):
        raise ValueError(f"names must be {count} distinct attribute names, got {names!r}")
    return tuple(names)


class _GatedMLPBase(FusedModuleBase):
    """What GatedMLP and PackedGatedMLP share: the checked sizes, bias and activation, building from existing
    projections, the input's type check and the repr. Subclasses set ``_label`` (the class as messages name it)."""

    _label: ClassVar[str] = ""
    names: Tuple[str, ...]

    def __init__(self, hidden_size: int, intermediate_size: int, act: str, bias: bool) -> None:
        where = f"memsave.nn.{self._label}"
        super().__init__(where, bias, hidden_size=hidden_size, intermediate_size=intermediate_size)
        self.act = F.resolve_gated_activation(self._label, act)
        self.hidden_size, self.intermediate_size = hidden_size, intermediate_size

    @classmethod
    def _holding(cls, projections: Sequence[nn.Module], act: str, names: Any) -> Any:
        """A new module of this class holding ``projections`` (the last one the down projection) under ``names``."""
        down_proj = projections[-1]
        if not isinstance(down_proj, nn.Linear):
            raise TypeError(
                f"{cls._label}.from_modules: down_proj must be an nn.Linear, got {type(down_proj).__name__}"
            )
        names = _check_names(names, len(projections))
        mlp = bare_module(cls)
        mlp.act = F.resolve_gated_activation(cls._label, act)
        mlp.hidden_size, mlp.intermediate_size = down_proj.out_features, down_proj.in_features
        mlp.names = names
        for name, module in zip(names, projections):
            setattr(mlp, name, module)
        return mlp

    def _check_input(self, input: Any) -> None:
        """TypeError unless ``input`` is a tensor."""
        if not isinstance(input, Tensor):
            raise TypeError(f"memsave.nn.{self._label} expects a torch.Tensor, got {type(input).__name__}")

    def extra_repr(self) -> str:
        return f"hidden_size={self.hidden_size}, intermediate_size={self.intermediate_size}, act={self.act}"


class GatedMLP(_GatedMLPBase):
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
        super().__init__(hidden_size, intermediate_size, act, bias)
        factory = {"device": device, "dtype": dtype}
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=bias, **factory)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=bias, **factory)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=bias, **factory)

    _label = "GatedMLP"
    names: Tuple[str, ...] = _NAMES

    @classmethod
    def from_modules(
        cls,
        gate_proj: nn.Module,
        up_proj: nn.Module,
        down_proj: nn.Linear,
        act: str = "silu",
        names: Tuple[str, ...] = _NAMES,
    ) -> "GatedMLP":
        """A GatedMLP holding the given modules (the same objects: nothing is copied, keys stay ``gate_proj.*`` ...).

        Args:
            gate_proj, up_proj: the gate and up projections (nn.Linear, or any module mapping x to the MLP width).
            down_proj: the down projection, an nn.Linear.
            act: the activation applied to the gate (see the class).
            names: the attribute names of the gate, up and down projections (their state_dict keys), e.g.
                ``("w1", "w3", "w2")``.

        Returns:
            The memsave module; put it where the model's MLP was.

        Raises:
            TypeError: down_proj is not an nn.Linear. ValueError: unknown activation, or bad names.

        Examples:
            >>> layer.mlp = memsave.nn.GatedMLP.from_modules(layer.mlp.gate_proj, layer.mlp.up_proj,
            ...                                              layer.mlp.down_proj, act="silu")
        """
        return cast(GatedMLP, cls._holding((gate_proj, up_proj, down_proj), act, names))

    def forward(self, input: Tensor) -> Tensor:
        self._check_input(input)
        gate, up, down = (self._modules[n] for n in self.names)
        width = getattr(gate, "in_features", None)  # a wrapped projection (LoRA) may not say
        if isinstance(width, int) and (input.dim() < 1 or input.shape[-1] != width):
            raise ValueError(
                f"memsave.nn.GatedMLP: expected an input whose last dimension is gate_proj's in_features={width}, "
                f"got shape {tuple(input.shape)}"
            )
        down = cast(nn.Linear, down)
        return F.gated_act_linear(
            cast(nn.Module, gate)(input), cast(nn.Module, up)(input), down.weight, down.bias, self.act
        )


class PackedGatedMLP(_GatedMLPBase):
    """``down_proj(act(gate) * up)`` with ``gate, up = gate_up_proj(x).chunk(2, -1)``, keeping ``x`` and the packed
    projection for backward.

    The form of :class:`GatedMLP` whose gate and up projections are one Linear of twice the MLP width (Phi-3's
    ``gate_up_proj``; ``gate_first=False`` when the up half comes first). Eager PyTorch keeps the packed projection,
    the activation and the product besides ``x``; this keeps ``x`` and the packed projection
    (:func:`memsave.functional.gated_act_linear` on its two halves).

    Args:
        hidden_size: the model width.
        intermediate_size: the MLP width (the packed projection has twice as many outputs).
        act: one of :data:`memsave.functional.GATED_ACTIVATIONS`.
        bias: the Linears have biases.
        gate_first: the first half of the packed output is the gate.
        device, dtype: factory arguments.

    Raises:
        ValueError: unknown activation, or sizes below 1.

    Examples:
        >>> mlp = memsave.nn.PackedGatedMLP(1024, 2816)
        >>> sorted(mlp.state_dict())
        ['down_proj.weight', 'gate_up_proj.weight']
    """

    _label = "PackedGatedMLP"
    names: Tuple[str, ...] = ("gate_up_proj", "down_proj")

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        act: str = "silu",
        bias: bool = False,
        gate_first: bool = True,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__(hidden_size, intermediate_size, act, bias)
        self.gate_first = check_flag("memsave.nn.PackedGatedMLP", "gate_first", gate_first)
        factory = {"device": device, "dtype": dtype}
        self.gate_up_proj = nn.Linear(hidden_size, 2 * intermediate_size, bias=bias, **factory)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=bias, **factory)

    @classmethod
    def from_modules(
        cls,
        gate_up_proj: nn.Module,
        down_proj: nn.Linear,
        act: str = "silu",
        gate_first: bool = True,
        names: Tuple[str, ...] = ("gate_up_proj", "down_proj"),
    ) -> "PackedGatedMLP":
        """A PackedGatedMLP holding the given modules (the same objects; keys stay where they were).

        Args:
            gate_up_proj: the packed projection (nn.Linear, or any module mapping x to twice the MLP width).
            down_proj: the down projection, an nn.Linear.
            act: the activation applied to the gate half.
            gate_first: the first half of the packed output is the gate.
            names: the attribute names of the two projections (their state_dict keys).

        Returns:
            The memsave module; put it where the model's MLP was.

        Raises:
            TypeError: down_proj is not an nn.Linear. ValueError: unknown activation, or bad names.

        Examples:
            >>> layer.mlp = memsave.nn.PackedGatedMLP.from_modules(layer.mlp.gate_up_proj, layer.mlp.down_proj)
        """
        check_flag("memsave.nn.PackedGatedMLP", "gate_first", gate_first)
        mlp = cast(PackedGatedMLP, cls._holding((gate_up_proj, down_proj), act, names))
        mlp.gate_first = gate_first
        return mlp

    def forward(self, input: Tensor) -> Tensor:
        self._check_input(input)
        packed = cast(nn.Module, self._modules[self.names[0]])(input)
        down = cast(nn.Linear, self._modules[self.names[1]])
        if packed.shape[-1] != 2 * self.intermediate_size:
            raise ValueError(
                f"memsave.nn.PackedGatedMLP: the packed projection gave {packed.shape[-1]} features, expected "
                f"2 x intermediate_size = {2 * self.intermediate_size}"
            )
        first, second = packed.chunk(2, dim=-1)
        gate, up = (first, second) if self.gate_first else (second, first)
        return F.gated_act_linear(gate, up, down.weight, down.bias, self.act)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, gate_first={self.gate_first}"
