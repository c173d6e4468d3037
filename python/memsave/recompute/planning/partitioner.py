"""torch's own recompute under compile, as a plan uses it: the *partitioner budget*
(``torch._functorch.config.activation_memory_budget``; 1.0 is torch's default, 0.0 recomputes all it can).

torch reads that setting when it compiles, which is the first call of a ``torch.compile``'d module (and every
recompile, such as a new input shape), not when ``torch.compile`` is called. :class:`PartitionerBackend` binds the
setting to the compiled module instead: a ``torch.compile`` backend that compiles each graph under it. Each instance
also keeps dynamo cache entries of its own, so several compiled copies of one model class, at different partitioner
budgets, can live and be timed side by side (two plain ``torch.compile`` calls on copies of a model would share one
compiled program, compiled under whichever setting came first).
"""

from __future__ import annotations

from typing import Any, Callable, ContextManager, Optional, Union

import torch
from torch import nn

from ...common import compat

__all__ = ["PartitionerBackend", "compile_at", "partitioner_context"]


def partitioner_context(activation_memory_budget: Optional[float]) -> ContextManager[Any]:
    """torch's partitioner at ``activation_memory_budget`` for what is compiled inside (None: as torch has it)."""
    return compat.partitioner_budget(activation_memory_budget)


class PartitionerBackend:
    """A ``torch.compile`` backend: ``backend`` (inductor by default) compiling every graph with torch's partitioner
    at ``activation_memory_budget`` (None: as torch has it).

    Args:
        activation_memory_budget: the partitioner budget in [0, 1], or None.
        backend: the backend that compiles, as ``torch.compile`` takes it (a name or a callable).
        mode, options, dynamic: as ``torch.compile`` takes them, for ``backend``.

    Raises:
        ValueError: a budget outside [0, 1], or both ``mode`` and ``options``.

    Examples:
        >>> step_model = torch.compile(model, backend=PartitionerBackend(0.5))
        >>> loss_fn(step_model(x)).backward()      # compiled here, under activation_memory_budget 0.5
    """

    def __init__(
        self,
        activation_memory_budget: Optional[float],
        backend: Union[str, Callable[..., Any]] = "inductor",
        mode: Optional[str] = None,
        options: Optional[dict] = None,
        dynamic: Optional[bool] = None,
    ) -> None:
        if activation_memory_budget is not None and not 0.0 <= activation_memory_budget <= 1.0:
            raise ValueError(
                "PartitionerBackend: activation_memory_budget must be in [0, 1] or None, "
                f"got {activation_memory_budget}"
            )
        if mode is not None and options is not None:
            raise ValueError("PartitionerBackend: give mode= or options=, not both (as torch.compile)")
        self.activation_memory_budget = activation_memory_budget
        self.compiler_name = f"{getattr(backend, '__name__', backend)} (partitioner budget {activation_memory_budget})"
        self._inner: Callable[..., Any] = compat.compile_backend(backend, mode, options, dynamic)

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        # torch partitions forward and backward here, inside this call; the backward's later compile reads nothing
        # of the setting.
        with partitioner_context(self.activation_memory_budget):
            return self._inner(gm, example_inputs)

    def reset(self) -> None:
        """What ``torch._dynamo.reset()`` calls on a backend: passed on to the one that compiles."""
        if hasattr(self._inner, "reset"):
            self._inner.reset()


def compile_at(model: nn.Module, activation_memory_budget: Optional[float], **compile_kwargs: Any) -> nn.Module:
    """``torch.compile(model, **compile_kwargs)`` with torch's partitioner at ``activation_memory_budget``, bound to
    the compiled module (:class:`PartitionerBackend`; its own dynamo cache entries).

    Args:
        model: the module to compile.
        activation_memory_budget: the partitioner budget in [0, 1], or None (torch's default).
        **compile_kwargs: ``torch.compile``'s (``backend=``, ``mode=``, ``options=``, ``dynamic=``, ``fullgraph=``).

    Returns:
        the compiled module (``torch.compile``'s ``OptimizedModule``).

    Raises:
        ValueError: as :class:`PartitionerBackend`.

    Examples:
        >>> step_model = compile_at(model, 0.25, dynamic=False)
    """
    backend = PartitionerBackend(
        activation_memory_budget,
        compile_kwargs.pop("backend", "inductor"),
        compile_kwargs.pop("mode", None),
        compile_kwargs.pop("options", None),
        compile_kwargs.get("dynamic"),
    )
    return torch.compile(model, backend=backend, **compile_kwargs)  # type: ignore[return-value]
