"""Batch norm + activation modules (the ``norm_act`` operator family): BatchNormAct2d, InPlaceABN2d,
BatchNormActConv2d.

Each replaces torch modules and keeps less for backward, recomputing the cheap intermediate there:

============================  =====================================  ==========================================
module                        torch keeps                            memsave keeps
============================  =====================================  ==========================================
BatchNormAct2d                BN input + BN output (+ act input)     BN input + 2 per-channel vectors
BatchNormActConv2d            BN input + act output (+ act input)    BN input + 2 per-channel vectors
InPlaceABN2d                  BN input + BN output (+ act input)     the output (written over the input)
============================  =====================================  ==========================================

State dicts: BatchNormAct2d and InPlaceABN2d have nn.BatchNorm2d's parameters and buffers under the same names
(``weight``, ``bias``, ``running_mean``, ``running_var``, ``num_batches_tracked``), so BatchNorm2d checkpoints load
unchanged. :func:`fuse_batch_norm_act_conv2d` fuses BatchNorm2d -> activation -> Conv2d that live in different places
of a model while keeping every state_dict key where it was::

    # a ResNet bottleneck: bn1 -> relu -> conv2 (its forward then calls bn1 without the relu)
    block.bn1, block.conv2 = memsave.nn.fuse_batch_norm_act_conv2d(block.bn1, "relu", block.conv2)

Which to use after a BatchNorm: with gelu/silu/leaky_relu/elu, BatchNormAct2d already saves a full tensor. With
relu it saves nothing on its own (torch's relu keeps only its output, which the next layer keeps anyway); there
BatchNormActConv2d, which recomputes the conv's input, is what frees a tensor. InPlaceABN2d frees the most but needs
an invertible activation. New code can use the modules directly: ``BatchNormAct2d(c, act="silu")`` where
``nn.BatchNorm2d(c), nn.SiLU()`` were. ``memsave.convert(model, fuse=True)`` does this for nn.Sequential children.

SyncBatchNorm: not supported. Statistics are per process, as with nn.BatchNorm2d under DDP without
SyncBatchNorm. ``memsave.convert`` leaves ``nn.SyncBatchNorm`` untouched, :meth:`BatchNormAct2d.from_batchnorm`
raises TypeError for one, and ``nn.SyncBatchNorm.convert_sync_batchnorm`` does not recognize these modules (they
are not ``_BatchNorm`` subclasses, deliberately: it would replace them with a SyncBatchNorm and drop the
activation), so convert to SyncBatchNorm first and fuse only the layers that stay per-process.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple, Union

import torch
from torch import nn

from .. import functional as F
from ._base import ScriptGuard, bare_module, check_eps, check_momentum, check_size
from .activation import activation_spec

Tensor = torch.Tensor

__all__ = [
    "BatchNormAct2d",
    "BatchNormActConv2d",
    "DeferredBatchNormAct2d",
    "InPlaceABN2d",
    "fuse_batch_norm_act_conv2d",
]


class _BatchNormActBase(ScriptGuard, nn.Module):
    """nn.BatchNorm2d's parameters, buffers, state_dict handling and running-statistics policy.

    Its ``__init__`` is BatchNormAct2d's and DeferredBatchNormAct2d's (arguments: see :class:`BatchNormAct2d`).
    """

    _version = 2  # nn.BatchNorm2d's state_dict version (num_batches_tracked present)
    memsave_batch_statistics = True  # normalizes with batch statistics in training (memsave.chunked refuses it)
    _invertible = False
    _default_act = "relu"

    def __init__(
        self,
        num_features: int,
        act: Optional[str] = None,
        eps: float = 1e-5,
        momentum: Optional[float] = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        device: Any = None,
        dtype: Any = None,
        act_param: Optional[float] = None,
    ) -> None:
        super().__init__()
        check_size("num_features", num_features)
        check_eps(eps)
        check_momentum(momentum)
        factory = {"device": device, "dtype": dtype}
        act = self._default_act if act is None else act
        self.act, self.act_param = F.resolve_activation(act, act_param, invertible=self._invertible)
        self.num_features = int(num_features)
        self.eps = eps
        self.momentum = momentum
        self.affine = affine
        self.track_running_stats = track_running_stats
        if affine:
            self.weight = nn.Parameter(torch.empty(num_features, **factory))
            self.bias = nn.Parameter(torch.empty(num_features, **factory))
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        if track_running_stats:
            self.register_buffer("running_mean", torch.zeros(num_features, **factory))
            self.register_buffer("running_var", torch.ones(num_features, **factory))
            self.running_mean: Optional[Tensor]
            self.running_var: Optional[Tensor]
            self.register_buffer(
                "num_batches_tracked",
                torch.tensor(0, dtype=torch.long, **{k: v for k, v in factory.items() if k != "dtype"}),
            )
            self.num_batches_tracked: Optional[Tensor]
        else:
            self.register_buffer("running_mean", None)
            self.register_buffer("running_var", None)
            self.register_buffer("num_batches_tracked", None)
        self.reset_parameters()

    def reset_running_stats(self) -> None:
        """Zero the running mean, set the running variance to one, reset num_batches_tracked (as nn.BatchNorm2d)."""
        if self.track_running_stats:
            self.running_mean.zero_()  # type: ignore[union-attr]
            self.running_var.fill_(1)  # type: ignore[union-attr]
            self.num_batches_tracked.zero_()  # type: ignore[union-attr]

    def reset_parameters(self) -> None:
        """Reset running statistics; weight to 1 and bias to 0 (as nn.BatchNorm2d)."""
        self.reset_running_stats()
        if self.affine:
            nn.init.ones_(self.weight)
            nn.init.zeros_(self.bias)

    def extra_repr(self) -> str:
        act = self.act if self.act_param == 0.0 else f"{self.act}({self.act_param})"
        return (
            f"{self.num_features}, act={act}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
            f"track_running_stats={self.track_running_stats}"
        )

    def _load_from_state_dict(
        self,
        state_dict: dict,
        prefix: str,
        local_metadata: dict,
        strict: bool,
        missing_keys: list,
        unexpected_keys: list,
        error_msgs: list,
    ) -> None:
        # Checkpoints from before num_batches_tracked existed (version < 2) load with 0, as nn.BatchNorm2d does.
        version = local_metadata.get("version")
        if (version is None or version < 2) and self.track_running_stats:
            key = prefix + "num_batches_tracked"
            if key not in state_dict:
                state_dict[key] = (
                    self.num_batches_tracked
                    if self.num_batches_tracked is not None and self.num_batches_tracked.device != torch.device("meta")
                    else torch.tensor(0, dtype=torch.long)
                )
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )

    def _check_input_dim(self, input: Tensor) -> None:
        if input.dim() != 4:
            raise ValueError(
                f"{type(self).__name__} expected 4D input [N, C, H, W] (got {input.dim()}D input of shape "
                f"{tuple(input.shape)})"
            )
        if input.shape[1] != self.num_features:
            raise ValueError(f"{type(self).__name__}({self.num_features}) got an input with {input.shape[1]} channels")

    def _bn_arguments(self) -> Tuple[bool, float, Optional[Tensor], Optional[Tensor]]:
        """nn.BatchNorm2d's policy: (use batch statistics, momentum factor, running_mean, running_var to pass);
        bumps num_batches_tracked in training."""
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            factor = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
        bn_training = self.training or (self.running_mean is None and self.running_var is None)
        use_stats = not self.training or self.track_running_stats
        return (
            bn_training,
            factor,
            self.running_mean if use_stats else None,
            self.running_var if use_stats else None,
        )

    def _run(self, fn: Any, input: Tensor) -> Tensor:
        """``fn`` (functional batch_norm_act or inplace_abn) on ``input`` with this module's state."""
        self._check_input_dim(input)
        bn_training, factor, running_mean, running_var = self._bn_arguments()
        w, b = self.weight, self.bias
        return fn(input, running_mean, running_var, w, b, bn_training, factor, self.eps, self.act, self.act_param)

    @classmethod
    def from_batchnorm(cls, bn: nn.Module, act: Optional[str] = None, act_param: Optional[float] = None) -> Any:
        """A fused module sharing ``bn``'s parameters and buffers (the same tensors, so optimizers keep working).

        Args:
            bn: an ``nn.BatchNorm2d`` (exactly; not SyncBatchNorm).
            act: the activation that follows it, one of the fused activations (InPlaceABN2d: an invertible one);
                None: the class's default (relu; InPlaceABN2d: leaky_relu).
            act_param: its parameter (leaky_relu's negative_slope, elu's alpha).

        Returns:
            The fused module, in ``bn``'s training mode.

        Raises:
            TypeError: ``bn`` is a SyncBatchNorm or not a BatchNorm2d.

        Examples:
            >>> fused = memsave.nn.BatchNormAct2d.from_batchnorm(model.bn1, act="relu")
        """
        if isinstance(bn, nn.SyncBatchNorm):
            raise TypeError(
                f"{cls.__name__} does not implement SyncBatchNorm semantics (statistics across processes); "
                f"keep nn.SyncBatchNorm for this layer"
            )
        if not isinstance(bn, nn.BatchNorm2d):
            raise TypeError(f"{cls.__name__}.from_batchnorm expects an nn.BatchNorm2d, got {type(bn).__name__}")
        fused = cls(
            bn.num_features,
            act=act,
            act_param=act_param,
            eps=bn.eps,
            momentum=bn.momentum,
            affine=bn.affine,
            track_running_stats=bn.track_running_stats,
            device="meta",
        )
        if bn.affine:
            fused.weight, fused.bias = bn.weight, bn.bias
        for name in ("running_mean", "running_var", "num_batches_tracked"):
            setattr(fused, name, getattr(bn, name))
        fused.train(bn.training)
        return fused

    def to_batchnorm(self) -> nn.BatchNorm2d:
        """An nn.BatchNorm2d sharing this module's parameters and buffers (the activation is not included)."""
        bn = nn.BatchNorm2d(
            self.num_features, self.eps, self.momentum, self.affine, self.track_running_stats, device="meta"
        )
        if self.affine:
            bn.weight, bn.bias = self.weight, self.bias
        for name in ("running_mean", "running_var", "num_batches_tracked"):
            setattr(bn, name, getattr(self, name))
        bn.train(self.training)
        return bn


class BatchNormAct2d(_BatchNormActBase):
    """``act(BatchNorm2d(x))`` keeping only ``x`` and two per-channel vectors for backward.

    Drop-in for ``nn.Sequential(nn.BatchNorm2d(C), act)``: same outputs (torch's own batch-norm kernel, then the
    activation), same running statistics, same parameters, buffers and state_dict keys as nn.BatchNorm2d. torch
    keeps the BN output for backward (and, for gelu/silu/leaky_relu, the activation's input too: a second full
    tensor); this keeps neither and recomputes them in one fused backward kernel (C++ / CUDA).

    Args:
        num_features: channels C of the ``[N, C, H, W]`` input.
        act: ``"relu"`` (default, also for None), ``"leaky_relu"``, ``"elu"``, ``"gelu"``, ``"gelu_tanh"``,
            ``"silu"`` or ``"identity"``.
        eps, momentum, affine, track_running_stats, device, dtype: as for nn.BatchNorm2d (``momentum=None`` is the
            cumulative average; ``track_running_stats=False`` always uses batch statistics).
        act_param: leaky_relu's negative_slope (default 0.01) or elu's alpha (default 1.0).

    Examples:
        >>> block = torch.nn.Sequential(torch.nn.Conv2d(3, 64, 3), memsave.nn.BatchNormAct2d(64, act="relu"))
        >>> bn_act = memsave.nn.BatchNormAct2d(64); bn_act.load_state_dict(torch.nn.BatchNorm2d(64).state_dict())
    """

    def forward(self, input: Tensor) -> Tensor:
        return self._run(F.batch_norm_act, input)


class InPlaceABN2d(_BatchNormActBase):
    """In-Place Activated BatchNorm: ``act(BatchNorm2d(x))`` written over ``x``, keeping only that output.

    Backward inverts the activation and the affine map to recover the normalized input, so the activation must be
    invertible: ``"leaky_relu"`` (default, negative_slope > 0), ``"elu"`` (alpha > 0) or ``"identity"``.

    Standard parametrization: unlike the original In-Place ABN (which uses ``|gamma| + eps``), the output is
    ``act(gamma * xhat + beta)`` exactly as nn.BatchNorm2d + activation, so BatchNorm2d weights and checkpoints load
    unchanged and give the same outputs. The price is the division by gamma in backward:

    * gamma exactly 0: that channel's xhat is lost. Its input gradient is 0 (exact: the output does not depend on
      the input) and its bias gradient exact, but its weight gradient is NaN. Zero-initialized gammas
      (``zero_init_residual``) therefore need BatchNormAct2d, not this module.
    * gamma near 0: xhat = (y - beta) / gamma amplifies the rounding of the stored output by about
      ``|beta| / |gamma|``; keep |gamma| well above the dtype's epsilon times |beta|.
    * elu saturates at -alpha: pre-activations below about log(machine epsilon of the dtype) (-16 in float32,
      -7 in float16) cannot be recovered and are clamped there.
    * float16/bfloat16: the output is stored in the input dtype, so the recovered xhat carries that rounding. The
      input and bias gradients stay as accurate as torch's; the weight gradient (a sum of g * xhat) has a relative
      error up to the dtype's epsilon, about 100x torch's (which keeps the exact input). BatchNormAct2d has no such
      limit.

    The input is overwritten, so it must not be needed afterwards (autograd raises, as for any in-place op, if a
    tensor saved by an earlier op is modified). Running statistics follow nn.BatchNorm2d exactly.

    Args:
        num_features: channels C of the ``[N, C, H, W]`` input.
        act: ``"leaky_relu"`` (default, also for None), ``"elu"`` or ``"identity"``.
        eps, momentum, affine, track_running_stats, device, dtype: as for nn.BatchNorm2d.
        act_param: negative_slope (default 0.01) or alpha (default 1.0); must be positive.

    Raises:
        ValueError: a non-invertible activation (relu, gelu, silu) or a non-positive act_param.

    Examples:
        >>> abn = memsave.nn.InPlaceABN2d(64, act="leaky_relu", act_param=0.01)
        >>> y = abn(conv(x))          # conv's output is overwritten and returned
    """

    _invertible = True
    _default_act = "leaky_relu"

    def forward(self, input: Tensor) -> Tensor:
        return self._run(F.inplace_abn, input)


class DeferredBatchNormAct2d(_BatchNormActBase):
    """A BatchNorm2d's parameters, buffers and settings (plus an activation) applied by the next module.

    Made by :func:`fuse_batch_norm_act_conv2d` and ``memsave.convert``: it stays where the BatchNorm2d was (same
    state_dict keys, same running-statistics policy) while the following :class:`BatchNormActConv2d` applies the norm
    and the activation inside its fused operator. Its forward returns its input unchanged, which is right only there.

    Args: as :class:`BatchNormAct2d`.

    Examples:
        >>> deferred, fused = memsave.nn.fuse_batch_norm_act_conv2d(nn.BatchNorm2d(16), nn.ReLU(), nn.Conv2d(16, 32, 3))
        >>> y = fused(deferred(x))                              # equals conv(relu(bn(x)))
    """

    def forward(self, input: Tensor) -> Tensor:
        return input

    def extra_repr(self) -> str:
        return super().extra_repr() + ", applied by the next BatchNormActConv2d"


class BatchNormActConv2d(ScriptGuard, nn.Module):
    """``Conv2d(act(BatchNorm2d(x)))`` keeping ``x`` and two per-channel vectors for backward.

    torch keeps the BatchNorm input and the activation's output (the convolution's input), and for
    gelu/silu/leaky_relu/elu the activation's input too; this keeps only the first and recomputes the convolution's
    input in backward with one elementwise pass. It is the fused form that saves memory around a ReLU.

    Parameters: ``weight``/``bias`` (the convolution's, initialized as nn.Conv2d) and ``bn`` (a
    :class:`DeferredBatchNormAct2d` with nn.BatchNorm2d's parameters and buffers; with :meth:`from_modules` and
    ``register_bn=False`` the batch norm is only referenced, its keys stay where they are).

    Args:
        in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias, device, dtype: as for
            nn.Conv2d (zero padding; padding given as numbers).
        act, act_param: the activation between the two (see :class:`BatchNormAct2d`).
        eps, momentum, affine, track_running_stats: the batch norm's, as for nn.BatchNorm2d.

    Examples:
        >>> layer = memsave.nn.BatchNormActConv2d(64, 128, 3, padding=1, act="relu")
        >>> y = layer(conv1(x))   # conv(relu(bn(conv1(x)))), keeping conv1's output only
    """

    memsave_batch_statistics = True  # its batch norm may be only referenced, not a submodule

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: Union[int, Tuple[int, int]],
        stride: Union[int, Tuple[int, int]] = 1,
        padding: Union[int, Tuple[int, int]] = 0,
        dilation: Union[int, Tuple[int, int]] = 1,
        groups: int = 1,
        bias: bool = True,
        act: str = "relu",
        act_param: Optional[float] = None,
        eps: float = 1e-5,
        momentum: Optional[float] = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        sizes = [kernel_size] * 2 if isinstance(kernel_size, int) else list(kernel_size)
        if any(not isinstance(k, int) or k < 1 for k in sizes):
            raise ValueError(f"BatchNormActConv2d: kernel_size must be positive ints, got {kernel_size!r}")
        check_size("out_channels", out_channels)
        for name, value, low in (("stride", stride, 1), ("padding", padding, 0), ("dilation", dilation, 1)):
            pair = [value] * 2 if isinstance(value, int) else list(value)
            if len(pair) != 2 or any(isinstance(v, bool) or not isinstance(v, int) or v < low for v in pair):
                raise ValueError(f"BatchNormActConv2d: {name} must be an int >= {low} or a pair of them, got {value!r}")
        self.bn = DeferredBatchNormAct2d(
            in_channels, act, eps, momentum, affine, track_running_stats, device, dtype, act_param
        )
        conv = nn.Conv2d(
            in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias, device=device, dtype=dtype
        )
        self._take_conv(conv)

    def _take_conv(self, conv: nn.Conv2d) -> None:
        if not isinstance(conv, nn.Conv2d) or isinstance(conv, nn.LazyConv2d):
            raise TypeError(f"BatchNormActConv2d needs an nn.Conv2d, got {type(conv).__name__}")
        if conv.padding_mode != "zeros" or isinstance(conv.padding, str):
            raise ValueError(
                f"BatchNormActConv2d supports zero padding given as numbers, got padding={conv.padding!r}, "
                f"padding_mode={conv.padding_mode!r}"
            )
        self.in_channels, self.out_channels = conv.in_channels, conv.out_channels
        self.kernel_size: Tuple[int, ...] = tuple(conv.kernel_size)
        self.stride: Tuple[int, ...] = tuple(conv.stride)
        self.padding: Tuple[int, ...] = tuple(conv.padding)
        self.dilation: Tuple[int, ...] = tuple(conv.dilation)
        self.groups = conv.groups
        self.weight = conv.weight
        self.bias = conv.bias

    @classmethod
    def from_modules(
        cls, bn: DeferredBatchNormAct2d, conv: nn.Conv2d, register_bn: bool = True
    ) -> "BatchNormActConv2d":
        """A BatchNormActConv2d sharing ``bn``'s and ``conv``'s parameters and buffers (the same tensors).

        Args:
            bn: a :class:`DeferredBatchNormAct2d` (``DeferredBatchNormAct2d.from_batchnorm(bn, act)`` makes one).
            conv: the nn.Conv2d that consumes the activation's output.
            register_bn: hold ``bn`` as the submodule ``bn``; with False it is only referenced (see
                :func:`fuse_batch_norm_act_conv2d`).

        Returns:
            The fused module.

        Raises:
            TypeError: wrong module types. ValueError: the channels do not chain, or unsupported padding.
        """
        if not isinstance(bn, DeferredBatchNormAct2d):
            raise TypeError(
                f"expected a DeferredBatchNormAct2d (DeferredBatchNormAct2d.from_batchnorm(bn, act) makes one), got "
                f"{type(bn).__name__}"
            )
        if isinstance(conv, nn.Conv2d) and conv.in_channels != bn.num_features:
            raise ValueError(f"BatchNorm2d({bn.num_features}) does not feed Conv2d(in_channels={conv.in_channels})")
        fused = bare_module(cls)
        fused._take_conv(conv)
        if register_bn:
            fused.bn = bn
        else:
            fused.__dict__["_external_bn"] = bn  # referenced, not registered: its keys stay where they are
        fused.train(conv.training)
        return fused

    def _bn(self) -> DeferredBatchNormAct2d:
        bn = self._modules.get("bn")
        return bn if bn is not None else self.__dict__["_external_bn"]  # type: ignore[return-value]

    def forward(self, input: Tensor) -> Tensor:
        bn = self._bn()
        bn._check_input_dim(input)
        bn_training, factor, running_mean, running_var = bn._bn_arguments()
        return F.batch_norm_act_conv2d(
            input,
            running_mean,
            running_var,
            bn.weight,
            bn.bias,
            self.weight,
            self.bias,
            bn_training,
            factor,
            bn.eps,
            bn.act,
            bn.act_param,
            self.stride,
            self.padding,
            self.dilation,
            self.groups,
        )

    def extra_repr(self) -> str:
        bn = self._bn()
        where = "" if "bn" in self._modules else ", batch norm held by the preceding DeferredBatchNormAct2d"
        return (
            f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}, "
            f"padding={self.padding}, act={bn.act}, bias={self.bias is not None}{where}"
        )


def fuse_batch_norm_act_conv2d(
    bn: nn.BatchNorm2d, act: Union[str, nn.Module], conv: nn.Conv2d
) -> Tuple[DeferredBatchNormAct2d, BatchNormActConv2d]:
    """Fuse BatchNorm2d -> activation -> Conv2d, keeping every state_dict key where it was.

    Put the first returned module where ``bn`` was, ``nn.Identity()`` where the activation was and the second
    module where ``conv`` was. Only valid when the activation's output feeds nothing but this convolution.

    Args:
        bn: the nn.BatchNorm2d (not SyncBatchNorm).
        act: the activation module (nn.ReLU, nn.GELU, ...) or its name.
        conv: the nn.Conv2d applied to the activation's output (zero padding).

    Returns:
        ``(DeferredBatchNormAct2d, BatchNormActConv2d)`` sharing the original parameters and buffers.

    Raises:
        TypeError / ValueError: unsupported modules (see :meth:`BatchNormActConv2d.from_modules`).

    Examples:
        >>> block.bn1, block.conv2 = memsave.nn.fuse_batch_norm_act_conv2d(block.bn1, "relu", block.conv2)
    """
    if isinstance(act, nn.Module):
        spec = activation_spec(act)
        if spec is None:
            raise ValueError(f"{type(act).__name__} is not an activation the fused operators implement")
        name, param = spec
    else:
        name, param = act, None
    deferred = DeferredBatchNormAct2d.from_batchnorm(bn, act=name, act_param=param)
    return deferred, BatchNormActConv2d.from_modules(deferred, conv, register_bn=False)
