"""Norm/activation -> Linear modules (the ``linear`` operator family): LayerNormLinear, ActLinear.

============================  =====================================  ==========================================
module                        torch keeps                            memsave keeps
============================  =====================================  ==========================================
LayerNormLinear               LN input + normalized tensor           LN input + per-row mean/rstd
ActLinear (gelu, silu, ...)   act input + act output                 act input
============================  =====================================  ==========================================

State dicts: ActLinear has nn.Linear's; LayerNormLinear has ``weight``/``bias`` (the Linear's) and ``norm.weight`` /
``norm.bias`` (the LayerNorm's). :func:`fuse_layer_norm_linear` fuses a LayerNorm and a Linear that live in different
places of a model while keeping every state_dict key where it was. In a custom architecture, replace the modules in
``__init__`` or fuse existing ones in place (the forward code does not change, and neither do the state_dict keys)::

    class Block(nn.Module):                       # a pre-norm transformer block
        def __init__(self, d):
            super().__init__()
            self.ln_1, self.attn = nn.LayerNorm(d), Attention(d)          # attn starts with self.qkv = Linear
            self.ln_2 = nn.LayerNorm(d)
            self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    for block in model.blocks:
        block.ln_1, block.attn.qkv = memsave.nn.fuse_layer_norm_linear(block.ln_1, block.attn.qkv)
        block.ln_2, block.mlp[0] = memsave.nn.fuse_layer_norm_linear(block.ln_2, block.mlp[0])
        block.mlp[1], block.mlp[2] = nn.Identity(), memsave.nn.ActLinear.from_linear(block.mlp[2], act="gelu")

New code can use the modules directly: ``LayerNormLinear(d, 3 * d)`` for ``nn.LayerNorm(d), nn.Linear(d, 3 * d)``,
``ActLinear(4 * d, d)`` for ``nn.GELU(), nn.Linear(4 * d, d)``.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, Tuple, Union, cast

import torch
from torch import nn

from .. import functional as F
from ._base import LinearParamsBase, NormLinearBase, ScriptGuard, bare_module, check_eps, check_flag, check_size

Tensor = torch.Tensor

__all__ = ["ActLinear", "DeferredLayerNorm", "LayerNormLinear", "fuse_layer_norm_linear"]


class DeferredLayerNorm(ScriptGuard, nn.Module):
    """Holds a LayerNorm's parameters where the LayerNorm was; the norm itself is applied by the next module.

    Made by :func:`fuse_layer_norm_linear` and ``memsave.convert``: the LayerNorm's place in the model keeps its
    parameters (so state_dict keys do not move) while the following :class:`LayerNormLinear` applies the norm
    inside its fused operator. Its forward returns its input unchanged, which is right only in that position.

    Examples:
        >>> deferred, fused = memsave.nn.fuse_layer_norm_linear(nn.LayerNorm(64), nn.Linear(64, 256))
        >>> y = fused(deferred(x))                              # equals linear(layer_norm(x))
    """

    def __init__(self, norm: nn.LayerNorm) -> None:
        super().__init__()
        if not isinstance(norm, nn.LayerNorm):
            raise TypeError(f"DeferredLayerNorm expects an nn.LayerNorm, got {type(norm).__name__}")
        self.normalized_shape: Tuple[int, ...] = tuple(norm.normalized_shape)
        self.eps = norm.eps
        self.elementwise_affine = norm.elementwise_affine
        self.weight = norm.weight
        self.bias = norm.bias

    def forward(self, input: Tensor) -> Tensor:
        return input

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, applied by the next LayerNormLinear"


class LayerNormLinear(NormLinearBase):
    """``Linear(LayerNorm(x))`` keeping ``x`` and per-row mean/rstd instead of the normalized tensor.

    torch keeps the LayerNorm input *and* the normalized tensor (the Linear's input); this keeps the first and
    recomputes the second in backward with one elementwise pass. Typical places: the QKV projection and the first
    MLP Linear of a pre-norm transformer block.

    Parameters: ``weight``/``bias`` (the Linear's, initialized as nn.Linear) and ``norm.weight``/``norm.bias``
    (an nn.LayerNorm, initialized as usual; it holds parameters only, its forward is not called).

    Args:
        normalized_shape: the LayerNorm's shape; its last entry is the Linear's in_features.
        out_features: the Linear's output size.
        bias: the Linear has a bias.
        eps, elementwise_affine: as for nn.LayerNorm; norm_bias: the LayerNorm has a bias (nn.LayerNorm's ``bias``).
        device, dtype: factory arguments.

    Examples:
        >>> qkv = memsave.nn.LayerNormLinear(768, 3 * 768)
        >>> q, k, v = qkv(x).split(768, dim=-1)
    """

    deferred_name = "DeferredLayerNorm"

    def __init__(
        self,
        normalized_shape: Union[int, Sequence[int]],
        out_features: int,
        bias: bool = True,
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        norm_bias: bool = True,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        for size in [normalized_shape] if isinstance(normalized_shape, int) else normalized_shape:
            check_size("normalized_shape", size)
        super().__init__("memsave.nn.LayerNormLinear", bias, out_features=out_features)
        check_eps(eps)
        check_flag("memsave.nn.LayerNormLinear", "norm_bias", norm_bias)
        factory = {"device": device, "dtype": dtype}
        self.norm = nn.LayerNorm(
            cast(Any, normalized_shape), eps=eps, elementwise_affine=elementwise_affine, bias=norm_bias, **factory
        )
        self.take_linear(nn.Linear(self.norm.normalized_shape[-1], out_features, bias=bias, **factory))

    @classmethod
    def from_modules(cls, norm: nn.LayerNorm, linear: nn.Linear, register_norm: bool = True) -> "LayerNormLinear":
        """A LayerNormLinear sharing ``norm``'s and ``linear``'s parameters (the same tensors).

        Args:
            norm: an nn.LayerNorm over the Linear's input features (last entry of normalized_shape).
            linear: the nn.Linear that consumes the norm's output.
            register_norm: hold ``norm`` as the submodule ``norm`` (its keys become ``norm.*``). With False the norm
                is only referenced: its parameters stay registered wherever they are (see
                :func:`fuse_layer_norm_linear`).

        Returns:
            The fused module.

        Raises:
            TypeError: wrong module types. ValueError: the shapes do not chain.

        Examples:
            >>> fused = memsave.nn.LayerNormLinear.from_modules(block.ln_2, block.mlp.fc1)
        """
        if not isinstance(norm, (nn.LayerNorm, DeferredLayerNorm)):
            raise TypeError(f"expected an nn.LayerNorm, got {type(norm).__name__}")
        fused = cls._wrap(norm, linear, register_norm)
        if tuple(norm.normalized_shape)[-1] != linear.in_features:
            raise ValueError(
                f"LayerNorm{tuple(norm.normalized_shape)} does not feed Linear(in_features={linear.in_features}): "
                f"the last normalized dimension must equal in_features"
            )
        return fused

    def forward(self, input: Tensor) -> Tensor:
        norm = self._norm()
        return F.layer_norm_linear(
            input, norm.normalized_shape, norm.weight, norm.bias, self.weight, self.bias, norm.eps
        )

    def norm_repr(self, norm: Any) -> Tuple[str, str]:
        return f"normalized_shape={tuple(norm.normalized_shape)}, eps={norm.eps}, ", ""


def fuse_layer_norm_linear(norm: nn.LayerNorm, linear: nn.Linear) -> Tuple[DeferredLayerNorm, LayerNormLinear]:
    """Fuse a LayerNorm and the Linear that consumes its output, keeping every state_dict key where it was.

    Put the first returned module where ``norm`` was and the second where ``linear`` was. Only valid when the norm's
    output feeds nothing but this Linear (true for a pre-norm transformer's ln_1 -> qkv and ln_2 -> fc1).

    Args:
        norm: the nn.LayerNorm.
        linear: the nn.Linear applied to ``norm``'s output.

    Returns:
        ``(DeferredLayerNorm, LayerNormLinear)`` sharing the original parameters.

    Examples:
        >>> block.ln_2, block.mlp.fc1 = memsave.nn.fuse_layer_norm_linear(block.ln_2, block.mlp.fc1)
    """
    deferred = DeferredLayerNorm(norm)
    return deferred, LayerNormLinear.from_modules(cast(nn.LayerNorm, deferred), linear, register_norm=False)


class ActLinear(LinearParamsBase):
    """``Linear(act(x))`` keeping only ``x`` for backward.

    torch keeps the activation's input and its output (gelu, silu, leaky_relu, elu: two full tensors); this keeps
    the input and recomputes the activation in backward. Typical place: GELU -> fc2 in a transformer MLP (with
    :class:`LayerNormLinear` for LayerNorm -> fc1, the MLP keeps its input and the fc1 output only). relu is
    accepted but saves nothing: torch's relu and Linear already share relu's output.

    Parameters ``weight``/``bias`` as nn.Linear (same initialization, same state_dict keys).

    Args:
        in_features, out_features, bias, device, dtype: as for nn.Linear.
        act: ``"gelu"`` (default), ``"gelu_tanh"``, ``"silu"``, ``"relu"``, ``"leaky_relu"``, ``"elu"``, ``"identity"``.
        act_param: leaky_relu's negative_slope (0.01) or elu's alpha (1.0).

    Examples:
        >>> mlp = torch.nn.Sequential(torch.nn.Linear(768, 3072), memsave.nn.ActLinear(3072, 768, act="gelu"))
    """

    out_features: int

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        act: str = "gelu",
        act_param: Optional[float] = None,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__("memsave.nn.ActLinear", bias, in_features=in_features, out_features=out_features)
        self.act, self.act_param = F.resolve_activation(act, act_param)
        self.weight_transposed = False
        self.take_linear(nn.Linear(in_features, out_features, bias=bias, device=device, dtype=dtype))

    @classmethod
    def from_linear(cls, linear: nn.Linear, act: str = "gelu", act_param: Optional[float] = None) -> "ActLinear":
        """An ActLinear sharing ``linear``'s parameters, applying ``act`` before it.

        Args:
            linear: the nn.Linear after the activation.
            act, act_param: the activation (see the class).

        Returns:
            The fused module.

        Examples:
            >>> block.mlp.act, block.mlp.fc2 = torch.nn.Identity(), memsave.nn.ActLinear.from_linear(block.mlp.fc2)
        """
        fused = cls._adopting(linear, "ActLinear.from_linear expects")
        fused.act, fused.act_param = F.resolve_activation(act, act_param)
        fused.weight_transposed = False
        return fused

    @classmethod
    def from_conv1d(cls, conv: nn.Module, act: str = "gelu", act_param: Optional[float] = None) -> "ActLinear":
        """An ActLinear sharing the parameters of a GPT-2-style ``Conv1D`` (a Linear whose weight is stored
        ``[in_features, out_features]``, as in Hugging Face's ``transformers.pytorch_utils.Conv1D``).

        The weight keeps its layout and its state_dict key (``weight``, shape ``[in, out]``); forward passes its
        transpose (a view) to the fused operator.

        Args:
            conv: a module with ``weight [in_features, out_features]`` and ``bias [out_features]`` (or None) whose
                forward is ``x @ weight + bias``.
            act, act_param: the activation applied before it (see the class).

        Returns:
            The fused module.

        Raises:
            TypeError: ``conv`` has no 2-D weight or a bias of the wrong shape.

        Examples:
            >>> mlp = gpt2.transformer.h[0].mlp                    # c_fc -> act -> c_proj, Conv1D layers
            >>> mlp.act, mlp.c_proj = torch.nn.Identity(), memsave.nn.ActLinear.from_conv1d(mlp.c_proj, "gelu_tanh")
        """
        weight, bias = getattr(conv, "weight", None), getattr(conv, "bias", None)
        if (
            not isinstance(weight, Tensor)
            or weight.dim() != 2
            or (bias is not None and (not isinstance(bias, Tensor) or tuple(bias.shape) != (weight.shape[1],)))
        ):
            raise TypeError(
                f"ActLinear.from_conv1d expects a Conv1D-style module (weight [in, out], bias [out]), got "
                f"{type(conv).__name__}"
            )
        fused = bare_module(cls)
        fused.act, fused.act_param = F.resolve_activation(act, act_param)
        fused.in_features, fused.out_features = weight.shape[0], weight.shape[1]
        fused.weight_transposed = True
        fused.weight = cast(nn.Parameter, weight)  # the Conv1D's own parameters, shared
        fused.bias = cast(nn.Parameter, bias)  # its Parameter, or None
        return fused

    def forward(self, input: Tensor) -> Tensor:
        weight = self.weight.t() if self.weight_transposed else self.weight
        return F.act_linear(input, weight, self.bias, self.act, self.act_param)

    def extra_repr(self) -> str:
        act = self.act if self.act_param == 0.0 else f"{self.act}({self.act_param})"
        layout = ", weight stored [in, out] (Conv1D)" if self.weight_transposed else ""
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
            f"act={act}{layout}"
        )
