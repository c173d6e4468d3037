"""What memsave.nn's modules share: the mixin of the drop-in replacements for torch.nn modules (ReLU, LeakyReLU,
Dropout, MaxPool2d) and the checks of constructor arguments."""

from __future__ import annotations

import math
from typing import Any, ClassVar, Optional, Tuple, Type, TypeVar

from torch import Tensor, nn

from ...errors import UnsupportedTransformError

ModuleT = TypeVar("ModuleT", bound=nn.Module)


class ScriptGuard:
    """Makes ``torch.jit.script`` of a memsave module (or of a model holding one) fail at once with a message naming
    memsave and what to use instead, rather than deep inside TorchScript's compiler ("Unknown type name 'object'").

    The modules' forwards call memsave's custom operators through Python (argument checks, autocast casts, the
    functional forms' options) that TorchScript cannot compile; ``torch.compile`` runs them (fake kernels and
    autograd are registered for it). TorchScript calls ``__prepare_scriptable__`` on every module before compiling.

    Examples:
        >>> torch.jit.script(memsave.convert(model))  # doctest: +SKIP
        UnsupportedTransformError: torch.jit.script cannot compile memsave.ReLU ...
    """

    def __prepare_scriptable__(self) -> Any:
        name = type(self).__name__
        raise UnsupportedTransformError(
            f"torch.jit.script cannot compile memsave.nn.{name}: its forward calls memsave's custom operators "
            f"(torch.ops.memsave) through Python that TorchScript does not support. Use torch.compile(model), which "
            f"runs memsave's operators, or script the model before memsave.convert (TorchScript keeps no memsave "
            f"memory saving anyway)."
        )


class MemsaveModuleMixin(ScriptGuard):
    """Mixed in before the torch.nn class a memsave module subclasses (``class ReLU(MemsaveModuleMixin, nn.ReLU)``).

    It declares, for memsave.convert's summary, that the module keeps neither its input nor its output for backward
    (only a mask or a 1-byte argmax), and names the module ``memsave.<Class>`` so ``print(model)`` shows what was
    converted.

    Examples:
        >>> class ReLU(MemsaveModuleMixin, torch.nn.ReLU): ...  # doctest: +SKIP
        >>> ReLU()
        memsave.ReLU()
    """

    memsave_keeps_input = False
    memsave_keeps_output = False

    def _get_name(self) -> str:
        return "memsave." + type(self).__name__


def check_size(name: str, value: Any) -> int:
    """``value`` as a positive int (a feature count, a hidden size), or ValueError naming the argument.

    Examples:
        >>> check_size("in_features", -4)
        Traceback (most recent call last):
        ValueError: in_features must be a positive int, got -4
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def check_flag(where: str, name: str, value: Any) -> bool:
    """``value`` when it is a bool, else TypeError naming the argument (a string such as ``"no"`` is truthy, and would
    silently mean True).

    Examples:
        >>> check_flag("memsave.nn.ReLU", "inplace", "no")
        Traceback (most recent call last):
        TypeError: memsave.nn.ReLU: inplace must be True or False, got 'no'
    """
    if not isinstance(value, bool):
        raise TypeError(f"{where}: {name} must be True or False, got {value!r}")
    return value


def check_sizes(**sizes: Any) -> None:
    """:func:`check_size` for each keyword argument, in order.

    Examples:
        >>> check_sizes(in_features=768, out_features=0)
        Traceback (most recent call last):
        ValueError: out_features must be a positive int, got 0
    """
    for name, value in sizes.items():
        check_size(name, value)


def bare_module(cls: Type[ModuleT]) -> ModuleT:
    """A new instance of the module class ``cls`` with nn.Module's init only: where the ``from_*`` constructors start,
    to adopt existing parameters instead of drawing new ones.

    Examples:
        >>> fused = bare_module(ActLinear)  # doctest: +SKIP
        >>> fused.take_linear(linear)
    """
    module = cls.__new__(cls)
    nn.Module.__init__(module)
    return module


class FusedModuleBase(ScriptGuard, nn.Module):
    """The base of the fused modules built from sizes and a ``bias`` flag (GatedMLP, PackedGatedMLP and, through
    :class:`LinearParamsBase`, the fused Linear modules and LinearCrossEntropy): their constructors' shared checks.

    Args:
        where: the module as messages name it, e.g. ``"memsave.nn.ActLinear"``.
        bias: the constructor's ``bias`` (a bool).
        sizes: the constructor's sizes by name (positive ints), checked in order.

    Raises:
        ValueError: a size that is not a positive int. TypeError: a ``bias`` that is not a bool.

    Examples:
        >>> class MyLinear(FusedModuleBase):  # doctest: +SKIP
        ...     def __init__(self, in_features: int, bias: bool = True) -> None:
        ...         super().__init__("MyLinear", bias, in_features=in_features)
    """

    def __init__(self, where: str, bias: Any, **sizes: Any) -> None:
        super().__init__()
        check_sizes(**sizes)
        check_flag(where, "bias", bias)


class LinearParamsBase(FusedModuleBase):
    """A module holding one Linear's parameters as its own ``weight``/``bias`` (the fused Linear modules and
    LinearCrossEntropy), and :meth:`take_linear`, which adopts them from an nn.Linear.

    Examples:
        >>> class MyActLinear(LinearParamsBase): ...  # doctest: +SKIP
    """

    in_features: int
    weight: Tensor
    bias: Optional[Tensor]

    @classmethod
    def _adopting(cls, linear: Any, expects: str, out_name: str = "out_features") -> Any:
        """A new module of this class holding ``linear``'s parameters (see :meth:`take_linear`), nothing else set.

        Raises:
            TypeError: ``linear`` is not an nn.Linear; the message starts with ``expects``.

        Examples:
            >>> head = LinearCrossEntropy._adopting(lm_head, "expected", out_name="num_classes")  # doctest: +SKIP
        """
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"{expects} an nn.Linear, got {type(linear).__name__}")
        module = bare_module(cls)
        module.take_linear(linear, out_name)
        return module

    def take_linear(self, linear: nn.Linear, out_name: str = "out_features") -> None:
        """Take ``linear``'s sizes (``in_features`` and ``out_name``) and its ``weight`` and ``bias`` (the same
        Parameters: nothing is copied, a tied weight stays tied).

        Examples:
            >>> head.take_linear(model.lm_head, out_name="num_classes")  # doctest: +SKIP
        """
        self.in_features = linear.in_features
        setattr(self, out_name, linear.out_features)
        self.weight = linear.weight
        self.bias = linear.bias


def check_eps(eps: Optional[float], allow_none: bool = False) -> None:
    """A norm's eps: a finite number >= 0 (None too when ``allow_none``), or ValueError naming it.

    Examples:
        >>> check_eps(-1.0)
        Traceback (most recent call last):
        ValueError: eps must be a finite number >= 0, got -1.0
    """
    if eps is None and allow_none:
        return
    try:
        value = float(eps)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        value = math.nan
    if not (math.isfinite(value) and value >= 0.0):
        raise ValueError(f"eps must be a finite number >= 0, got {eps!r}")


def check_momentum(momentum: Optional[float]) -> None:
    """A batch norm's momentum: None (cumulative average) or a number in [0, 1], or ValueError (TypeError for a
    non-number) naming it."""
    if momentum is not None and (isinstance(momentum, bool) or not isinstance(momentum, (int, float))):
        raise TypeError(f"momentum must be None or a number in [0, 1], got {momentum!r}")
    if momentum is not None and not 0.0 <= float(momentum) <= 1.0:
        raise ValueError(f"momentum must be None or a number in [0, 1], got {momentum!r}")


class NormLinearBase(LinearParamsBase):
    """What the norm -> Linear fused modules (:class:`~memsave.nn.LayerNormLinear`, :class:`~memsave.nn.RMSNormLinear`)
    share: the Linear's ``weight``/``bias``, the norm held as the submodule ``norm`` or only referenced (when a
    preceding Deferred norm keeps its parameters where they were), building from existing modules, and the repr.

    Subclasses set ``deferred_name`` (the Deferred norm class that holds a referenced norm) and implement
    ``forward`` and ``norm_repr``.

    Examples:
        >>> class MyNormLinear(NormLinearBase):  # doctest: +SKIP
        ...     deferred_name = "DeferredMyNorm"
    """

    deferred_name: ClassVar[str] = ""
    out_features: int

    @classmethod
    def _wrap(cls, norm: nn.Module, linear: nn.Linear, register_norm: bool) -> Any:
        """A new module of this class sharing ``norm``'s and ``linear``'s parameters (the same tensors)."""
        fused = cls._adopting(linear, "expected")
        if register_norm:
            fused.norm = norm
        else:
            fused.__dict__["_external_norm"] = norm  # referenced, not registered: its keys stay where they are
        return fused

    def _norm(self) -> Any:
        norm = self._modules.get("norm")
        return norm if norm is not None else self.__dict__["_external_norm"]

    def norm_repr(self, norm: Any) -> Tuple[str, str]:
        """(what to print before the Linear's sizes, after them) for ``norm``."""
        raise NotImplementedError

    def extra_repr(self) -> str:
        before, after = self.norm_repr(self._norm())
        where = "" if "norm" in self._modules else f", norm held by the preceding {self.deferred_name}"
        bias = self.bias is not None
        return f"{before}in_features={self.in_features}, out_features={self.out_features}, bias={bias}{after}{where}"
