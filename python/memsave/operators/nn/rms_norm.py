"""RMSNorm modules (the ``rms_norm`` operator family): RMSNorm, RMSNormLinear and the fusion of an existing
RMSNorm with the Linear(s) that read it.

=====================================  ==========================================  ===============================
module                                 eager keeps (Hugging Face LlamaRMSNorm)     memsave keeps
=====================================  ==========================================  ===============================
RMSNorm                                input (+ a float32 copy if 16-bit), the     input + one float per row
                                       float32 normalized tensor, its rounded copy
RMSNormLinear / fuse_rms_norm_linear   the above + the Linears' input              input
=====================================  ==========================================  ===============================

Both compute LlamaRMSNorm's formula (``weight * (x.float() * rsqrt(mean(x.float()^2) + eps)).to(x.dtype)``) and load
its weights: parameter ``weight``, ``eps`` (also readable as ``variance_epsilon``). ``weight_offset=1.0`` multiplies
by ``1 + weight`` instead, as Gemma's norms do (their weight starts at zero). State dicts: RMSNorm has
``weight``; RMSNormLinear has ``weight``/``bias`` (the Linear's) and ``norm.weight``; :func:`fuse_rms_norm_linear`
keeps every key where it was::

    for layer in model.model.layers:                               # a Hugging Face Llama / Mistral / Qwen2 decoder
        attn, mlp = layer.self_attn, layer.mlp
        layer.input_layernorm, (attn.q_proj, attn.k_proj, attn.v_proj) = memsave.nn.fuse_rms_norm_linear(
            layer.input_layernorm, attn.q_proj, attn.k_proj, attn.v_proj)
"""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence, Tuple, Union, cast

import torch
from torch import nn

from .. import functional as F
from ._base import NormLinearBase, ScriptGuard, bare_module, check_eps, check_size

Tensor = torch.Tensor

__all__ = ["DeferredRMSNorm", "RMSNorm", "RMSNormLinear", "fuse_rms_norm_linear"]


def _hidden_size(normalized_shape: Union[int, Sequence[int]]) -> int:
    if isinstance(normalized_shape, int):
        shape: Tuple[int, ...] = (normalized_shape,)
    elif isinstance(normalized_shape, (str, bytes)):  # iterable, and int() of its characters would pass
        raise TypeError(f"normalized_shape must be an int or a 1-tuple of ints, got the string {normalized_shape!r}")
    elif not isinstance(normalized_shape, (tuple, list, torch.Size)):
        raise TypeError(
            f"normalized_shape must be an int or a 1-tuple of ints, got {type(normalized_shape).__name__} "
            f"{normalized_shape!r}"
        )
    else:
        shape = tuple(int(s) for s in normalized_shape)
    if len(shape) != 1:
        raise ValueError(
            f"memsave's RMSNorm normalizes the last dimension only; normalized_shape must be an int or a 1-tuple, "
            f"got {shape}"
        )
    return check_size("normalized_shape", shape[0])


def _norm_eps(norm: Any) -> Optional[float]:
    # Hugging Face's RMSNorms call it variance_epsilon, torch.nn.RMSNorm eps (None: the dtype's machine epsilon).
    if hasattr(norm, "variance_epsilon"):
        return float(norm.variance_epsilon)
    if hasattr(norm, "eps"):
        return None if norm.eps is None else float(norm.eps)
    raise TypeError(f"{type(norm).__name__} has neither variance_epsilon nor eps: is it an RMSNorm?")


def _weight_offset(norm: Any, weight_offset: Optional[float]) -> float:
    # None: the norm's own (a memsave norm carries it), else 0 (weight * x, Llama's).
    value = getattr(norm, "weight_offset", 0.0) if weight_offset is None else weight_offset
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"weight_offset must be a finite number (1.0 for Gemma's 1 + weight), got {value!r}")
    return float(value)


def _applied_weight(norm: Any) -> Optional[Tensor]:
    """The factor the norm multiplies by: ``weight``, or ``weight + weight_offset`` (Gemma's ``1 + weight``)."""
    weight, offset = norm.weight, getattr(norm, "weight_offset", 0.0)
    return weight if weight is None or not offset else weight + offset


def _check_rms_norm_module(norm: nn.Module) -> None:
    weight = getattr(norm, "weight", None)
    if not isinstance(norm, nn.Module) or (
        weight is not None and (not isinstance(weight, Tensor) or weight.dim() != 1)
    ):
        raise TypeError(
            f"expected an RMSNorm module with a 1-D weight (LlamaRMSNorm, torch.nn.RMSNorm over one dimension, "
            f"memsave.nn.RMSNorm), got {type(norm).__name__}"
        )
    _norm_eps(norm)


class RMSNorm(ScriptGuard, nn.Module):
    """RMSNorm over the last dimension keeping its input and one float per row for backward.

    A drop-in for Hugging Face's ``LlamaRMSNorm`` (and Mistral's, Qwen2's): the same formula value for value (see
    :func:`memsave.functional.rms_norm`), the same parameter ``weight`` (initialized to ones) and state_dict. Eager
    LlamaRMSNorm keeps, for a bfloat16 input of N elements, 2N bytes of input, 4N of float32 copy, 4N of normalized
    float32 tensor and 2N of its rounded copy; this keeps the 2N bytes of input and 4 bytes per row.

    Args:
        normalized_shape: the hidden size (an int, or a 1-tuple).
        eps: added to the mean of squares (``variance_epsilon`` in Hugging Face); None: ``torch.finfo(dtype).eps``.
        elementwise_affine: has a ``weight``.
        device, dtype: factory arguments.
        weight_offset: multiply by ``weight_offset + weight`` (1.0: Gemma's ``1 + weight``, weight initialized to
            zeros); 0.0 (default): by ``weight``, initialized to ones.

    Raises:
        ValueError: a normalized_shape of more than one dimension or below 1, a negative or non-finite eps, or a
            non-finite weight_offset.
        TypeError: a normalized_shape given as a string.

    Examples:
        >>> norm = memsave.nn.RMSNorm(4096, eps=1e-5)
        >>> norm.load_state_dict(llama.model.layers[0].input_layernorm.state_dict())
        >>> y = norm(x)
    """

    def __init__(
        self,
        normalized_shape: Union[int, Sequence[int]],
        eps: Optional[float] = 1e-6,
        elementwise_affine: bool = True,
        device: Any = None,
        dtype: Any = None,
        weight_offset: float = 0.0,
    ) -> None:
        super().__init__()
        hidden = _hidden_size(normalized_shape)
        check_eps(eps, allow_none=True)
        self.normalized_shape: Tuple[int, ...] = (hidden,)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        self.weight_offset = _weight_offset(None, weight_offset)
        if elementwise_affine:
            init = torch.zeros if self.weight_offset else torch.ones
            self.weight = nn.Parameter(init(hidden, device=device, dtype=dtype))
        else:
            self.register_parameter("weight", None)

    @property
    def variance_epsilon(self) -> Optional[float]:
        """``eps`` under Hugging Face's name."""
        return self.eps

    @classmethod
    def from_module(cls, norm: nn.Module, weight_offset: Optional[float] = None) -> "RMSNorm":
        """An RMSNorm sharing ``norm``'s weight (the same tensor) and eps.

        Args:
            norm: a ``LlamaRMSNorm``-style module (``weight`` and ``variance_epsilon``) or a ``torch.nn.RMSNorm`` over
                one dimension (``weight`` and ``eps``). torch.nn.RMSNorm multiplies by the weight before rounding a
                16-bit result, so for 16-bit inputs the two differ by one rounding; float32 results are the same.
            weight_offset: 1.0 for a norm that multiplies by ``1 + weight`` (Gemma's); None: ``norm``'s own
                ``weight_offset`` if it has one, else 0.0.

        Returns:
            The memsave module; put it where ``norm`` was (state_dict keys do not change).

        Raises:
            TypeError: ``norm`` has no 1-D weight or no eps. ValueError: a non-finite weight_offset.

        Examples:
            >>> layer.input_layernorm = memsave.nn.RMSNorm.from_module(layer.input_layernorm)
        """
        _check_rms_norm_module(norm)
        weight = getattr(norm, "weight", None)
        hidden = weight.shape[0] if weight is not None else _hidden_size(getattr(norm, "normalized_shape", 0))
        new = bare_module(cls)
        new.normalized_shape = (hidden,)
        new.eps = _norm_eps(norm)
        new.elementwise_affine = weight is not None
        new.weight_offset = _weight_offset(norm, weight_offset)
        if weight is not None:
            new.weight = weight
        else:
            new.register_parameter("weight", None)
        return new

    def forward(self, input: Tensor) -> Tensor:
        return F.rms_norm(input, _applied_weight(self), self.eps)

    def extra_repr(self) -> str:
        offset = f", weight_offset={self.weight_offset}" if self.weight_offset else ""
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}{offset}"


class DeferredRMSNorm(ScriptGuard, nn.Module):
    """Holds an RMSNorm's weight where the RMSNorm was; the norm itself is applied by the next module(s).

    Made by :func:`fuse_rms_norm_linear`: the norm's place keeps its parameter (so state_dict keys do not move) while
    the following :class:`RMSNormLinear` module(s) apply the norm inside their fused operator. Its forward returns its
    input unchanged, which is right only in that position.

    Examples:
        >>> attn = layer.self_attn                               # a Llama decoder layer's
        >>> deferred, (q, k, v) = memsave.nn.fuse_rms_norm_linear(
        ...     layer.input_layernorm, attn.q_proj, attn.k_proj, attn.v_proj)
        >>> queries = q(deferred(x))                            # equal to q_proj(input_layernorm(x))
    """

    def __init__(self, norm: nn.Module, weight_offset: Optional[float] = None) -> None:
        super().__init__()
        _check_rms_norm_module(norm)
        self.weight_offset = _weight_offset(norm, weight_offset)
        weight = getattr(norm, "weight", None)
        self.normalized_shape: Tuple[int, ...] = (
            (weight.shape[0],) if weight is not None else tuple(getattr(norm, "normalized_shape", ()))
        )
        self.eps = _norm_eps(norm)
        if weight is not None:
            self.weight = weight
        else:
            self.register_parameter("weight", None)

    @property
    def variance_epsilon(self) -> Optional[float]:
        """``eps`` under Hugging Face's name."""
        return self.eps

    def forward(self, input: Tensor) -> Tensor:
        return input

    def extra_repr(self) -> str:
        offset = f", weight_offset={self.weight_offset}" if self.weight_offset else ""
        return f"{self.normalized_shape}, eps={self.eps}{offset}, applied by the next RMSNormLinear"


class RMSNormLinear(NormLinearBase):
    """``Linear(RMSNorm(x))`` keeping only ``x`` for backward.

    torch keeps the norm's input and intermediates plus the normalized tensor (the Linear's input); this keeps ``x``
    and recomputes the rest in backward. Parameters: ``weight``/``bias`` (the Linear's, initialized as nn.Linear) and
    ``norm.weight`` (an :class:`RMSNorm`; it holds the parameter only, its forward is not called). For a norm read by
    several Linears (q/k/v, gate/up) use :func:`fuse_rms_norm_linear`: each Linear becomes an RMSNormLinear, and
    since they all keep the same input tensor, it is kept once.

    Args:
        in_features: the hidden size (normalized and fed to the Linear).
        out_features: the Linear's output size.
        bias: the Linear has a bias (False by default, as in Llama).
        eps, elementwise_affine: the RMSNorm's (see :class:`RMSNorm`).
        device, dtype: factory arguments.

    Examples:
        >>> qkv = memsave.nn.RMSNormLinear(1024, 3 * 1024)
        >>> q, k, v = qkv(x).split(1024, dim=-1)
    """

    deferred_name = "DeferredRMSNorm"

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = False,
        eps: Optional[float] = 1e-6,
        elementwise_affine: bool = True,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__("memsave.nn.RMSNormLinear", bias, in_features=in_features, out_features=out_features)
        factory = {"device": device, "dtype": dtype}
        self.norm = RMSNorm(in_features, eps=eps, elementwise_affine=elementwise_affine, **factory)
        self.take_linear(nn.Linear(in_features, out_features, bias=bias, **factory))

    @classmethod
    def from_modules(cls, norm: nn.Module, linear: nn.Linear, register_norm: bool = True) -> "RMSNormLinear":
        """An RMSNormLinear sharing ``norm``'s and ``linear``'s parameters (the same tensors, nothing copied).

        Args:
            norm: a LlamaRMSNorm-style module, torch.nn.RMSNorm over one dimension, :class:`RMSNorm` or
                :class:`DeferredRMSNorm`, over the Linear's in_features.
            linear: the nn.Linear that consumes the norm's output.
            register_norm: hold ``norm`` as the submodule ``norm`` (its keys become ``norm.*``). With False the norm
                is only referenced; its parameters stay registered wherever they are (see :func:`fuse_rms_norm_linear`).

        Returns:
            The fused module.

        Raises:
            TypeError: wrong module types. ValueError: the shapes do not chain.

        Examples:
            >>> fused = memsave.nn.RMSNormLinear.from_modules(model.norm, model.lm_head)
        """
        _check_rms_norm_module(norm)
        fused = cls._wrap(norm, linear, register_norm)
        weight = getattr(norm, "weight", None)
        if weight is not None and weight.shape[0] != linear.in_features:
            raise ValueError(
                f"an RMSNorm over {weight.shape[0]} features does not feed Linear(in_features={linear.in_features})"
            )
        return fused

    def forward(self, input: Tensor) -> Tensor:
        norm = self._norm()
        out = F.rms_norm_linear(input, _applied_weight(norm), self.weight, self.bias, _norm_eps(norm))
        return cast(Tensor, out)  # one weight: one output

    def norm_repr(self, norm: Any) -> Tuple[str, str]:
        return "", f", eps={_norm_eps(norm)}"


def fuse_rms_norm_linear(
    norm: nn.Module, *linears: nn.Linear, weight_offset: Optional[float] = None
) -> Tuple[DeferredRMSNorm, Union[RMSNormLinear, Tuple[RMSNormLinear, ...]]]:
    """Fuse an RMSNorm and the Linear(s) that read its output, keeping every state_dict key where it was.

    Put the first returned module where ``norm`` was and the others where the Linears were. Only valid when the
    norm's output feeds nothing but these Linears (true of a Llama / Mistral / Qwen2 block: input_layernorm ->
    q/k/v_proj, post_attention_layernorm -> gate/up_proj). Each Linear becomes an :class:`RMSNormLinear` that applies
    the norm itself; they keep the same input tensor, so together they keep it once, and none keeps a normalized
    tensor. The price is one normalization (an elementwise pass and a row reduction) per Linear in forward and
    backward instead of one in all; :func:`memsave.functional.rms_norm_linear` with a list of weights computes
    several Linears in one call when the code can be written that way.

    Args:
        norm: the RMSNorm (LlamaRMSNorm-style, torch.nn.RMSNorm over one dimension, or memsave's).
        *linears: one or more nn.Linear applied to ``norm``'s output.
        weight_offset: 1.0 for a norm that multiplies by ``1 + weight`` (Gemma's); None: ``norm``'s own, else 0.0.

    Returns:
        ``(DeferredRMSNorm, RMSNormLinear)`` for one Linear, ``(DeferredRMSNorm, (RMSNormLinear, ...))`` for several,
        sharing the original parameters.

    Raises:
        TypeError: wrong module types. ValueError: no Linear, or shapes that do not chain.

    Examples:
        >>> attn = layer.self_attn
        >>> layer.input_layernorm, (attn.q_proj, attn.k_proj, attn.v_proj) = memsave.nn.fuse_rms_norm_linear(
        ...     layer.input_layernorm, attn.q_proj, attn.k_proj, attn.v_proj)
    """
    if not linears:
        raise ValueError("fuse_rms_norm_linear needs at least one Linear after the norm")
    deferred = DeferredRMSNorm(norm, weight_offset)
    fused = [RMSNormLinear.from_modules(deferred, linear, register_norm=False) for linear in linears]
    return deferred, (fused[0] if len(fused) == 1 else tuple(fused))
