"""The torch internals memsave relies on, in one place, each behind a feature check.

memsave supports every torch from :data:`TORCH_FLOOR` up (each tested version is listed in
docs/compatibility.md). What differs between those releases is reached only through this module: a function here
checks that the feature is there (never a version compare, except for the floor itself) and raises
:class:`RuntimeError` naming what this torch lacks, so that a future torch that moves an internal fails in one
readable place instead of deep inside a step.

Examples:
    >>> from memsave.common import compat
    >>> compat.torch_version() >= compat.TORCH_FLOOR
    True
"""

from __future__ import annotations

import contextlib
import functools
import logging
from typing import Any, Callable, ContextManager, Optional, Tuple

import torch
import torch.utils.checkpoint as torch_checkpoint
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = [
    "quiet_raised_error_logs",
    "quiet_torch_import_logs",
    "quiet_torch_logs",
    "SUPPORTED_PYTHON",
    "SUPPORTED_TORCH",
    "TORCH_FLOOR",
    "CheckpointPolicy",
    "CustomGraphPass",
    "FlopCount",
    "checkpoint_exec_group",
    "checkpoint_global_switches",
    "compile_backend",
    "compiling_in",
    "count_flops",
    "custom_op_autograd_kernel",
    "cuda_memory_history",
    "graph_breaks",
    "joint_graph_pass",
    "native_linear_cross_entropy",
    "native_rms_norm",
    "noop_context_fn",
    "partitioner_budget",
    "profiler_event_tree",
    "region_saved_tensors_hooks",
    "require_autograd_redispatch",
    "route_selective_saves",
    "selective_saves_can_use_hooks",
    "torch_version",
    "tracing_context",
]

#: The oldest torch memsave builds and is tested against (major, minor).
TORCH_FLOOR: Tuple[int, int] = (2, 11)
#: The supported range as pip writes it (pyproject's dependency, README, ``memsave info``).
SUPPORTED_TORCH = f"torch>={TORCH_FLOOR[0]}.{TORCH_FLOOR[1]}"
#: The Python versions those torch releases ship wheels for.
SUPPORTED_PYTHON = "Python>=3.10"


def torch_version() -> Tuple[int, int]:
    """Return the running torch's (major, minor) release, local tags and pre-release suffixes dropped.

    Examples:
        >>> torch_version()  # under torch 2.15.0+cu132
        (2, 15)
    """
    parts = torch.__version__.split("+")[0].split(".")
    return int(parts[0]), int("".join(c for c in parts[1] if c.isdigit()) or 0)


def _missing(feature: str, where: str) -> RuntimeError:
    return RuntimeError(
        f"memsave: this torch ({torch.__version__}) has no {where}, which {feature} needs. memsave supports "
        f"{SUPPORTED_TORCH}; see docs/compatibility.md for the versions it was tested with."
    )


def require_autograd_redispatch() -> None:
    """Check the dispatcher entry points memsave's fused operators' autograd kernels redispatch with.

    Raises:
        ImportError: ``torch._C._AutoDispatchBelowAutograd`` or ``torch._C._after_autograd_keyset`` is missing.
    """
    if not hasattr(torch._C, "_AutoDispatchBelowAutograd") or not hasattr(torch._C, "_after_autograd_keyset"):
        raise ImportError(str(_missing("memsave's fused operators", "torch._C._AutoDispatchBelowAutograd")))


def custom_op_autograd_kernel(
    op: torch._ops.OpOverload, backward: Callable[..., Any], setup_context: Optional[Callable[..., Any]]
) -> Callable[..., Any]:
    """The Autograd kernel ``torch.library.register_autograd(op, backward, setup_context=...)`` would register, made
    but not registered, so that memsave can wrap it (forward-mode AD and torch.func checks) before registering it.

    Raises:
        RuntimeError: this torch has no ``torch._library.autograd.make_autograd_impl`` / ``Info``.
    """
    try:
        from torch._library import autograd as library_autograd

        make, info = library_autograd.make_autograd_impl, library_autograd.Info
    except (ImportError, AttributeError) as exc:
        raise _missing("memsave's operators' autograd", "torch._library.autograd.make_autograd_impl") from exc
    return make(op, info(backward, setup_context))


def partitioner_budget(activation_memory_budget: Optional[float]) -> ContextManager[Any]:
    """torch's min-cut partitioner at ``activation_memory_budget`` for what is compiled inside (None: as it is).

    Raises:
        RuntimeError: this torch's functorch config has no ``activation_memory_budget``.
    """
    import torch._functorch.config as config  # not an attribute of torch._functorch until imported

    return _patched(config, "activation_memory_budget", activation_memory_budget, "a partitioner budget")


def _patched(config: Any, name: str, value: Any, feature: str) -> ContextManager[Any]:
    """``config.patch(name=value)`` (None: nothing patched).

    Raises:
        RuntimeError: this torch's ``config`` has no setting ``name``.
    """
    if value is None:
        return contextlib.nullcontext()
    if not hasattr(config, name):
        raise _missing(feature, f"{config.__name__}.{name}")
    return config.patch(**{name: value})


def dynamo_recompile_limit(limit: int) -> ContextManager[Any]:
    """dynamo's limit on compiled entries per code object raised to ``limit`` inside (``recompile_limit``, named
    ``cache_size_limit`` before): past the limit dynamo runs the frame uncompiled, silently but for a warning.

    Raises:
        RuntimeError: this torch's dynamo config has neither setting.
    """
    import torch._dynamo.config as config

    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(config, name):
            return config.patch(**{name: max(limit, getattr(config, name))})
    raise _missing("several compiled programs of one model", "torch._dynamo.config.recompile_limit")


def compile_backend(
    backend: Any, mode: Optional[str], options: Optional[dict], dynamic: Optional[bool]
) -> Callable[..., Any]:
    """The callable ``torch.compile(backend=..., mode=..., options=..., dynamic=...)`` would compile graphs with.

    Raises:
        RuntimeError: this torch has no ``torch._TorchCompileInductorWrapper`` / ``torch._TorchCompileWrapper``.
    """
    if backend == "inductor":
        wrapper = getattr(torch, "_TorchCompileInductorWrapper", None)
        if wrapper is None:
            raise _missing("PartitionerBackend", "torch._TorchCompileInductorWrapper")
        return wrapper(mode or "default", options, dynamic)
    wrapper = getattr(torch, "_TorchCompileWrapper", None)
    if wrapper is None:
        raise _missing("PartitionerBackend", "torch._TorchCompileWrapper")
    return wrapper(backend, mode, options, dynamic)


#: torch's per-operator recompute decision (``torch.utils.checkpoint.CheckpointPolicy``), as compiled graphs carry it.
CheckpointPolicy = torch_checkpoint.CheckpointPolicy

try:  # inductor's base class of a graph pass it may cache around (its uuid() goes into the cache key)
    from torch._inductor.custom_graph_pass import CustomGraphPass
except ImportError:  # pragma: no cover - torch without it cannot run joint_graph_pass

    class CustomGraphPass:  # type: ignore[no-redef]
        """Stand-in on a torch without inductor's custom graph passes (:func:`joint_graph_pass` then raises)."""


def graph_breaks() -> int:
    """How many graph breaks dynamo has counted in this process (0 on a torch without the counter)."""
    from torch._dynamo.utils import counters

    return sum(counters.get("graph_break", {}).values())


def tracing_context() -> Optional[Any]:
    """The tracing context dynamo gave the backend it is calling now (None outside one, or on a torch without)."""
    guards = getattr(torch, "_guards", None)
    context = getattr(guards, "TracingContext", None)
    return None if context is None else context.try_get()


def compiling_in(context: Optional[Any]) -> ContextManager[Any]:
    """What a backend compiles inside runs in ``context`` (:func:`tracing_context`, kept from dynamo's call) with
    AOT autograd's cache off: compiled later, outside dynamo, a graph is compiled as in dynamo's call (its fake
    tensors and shape environment; inductor's FX graph cache, which bypasses a compile without one). AOT autograd's
    cache keys the graph before partitioning, blind to recompute tags on its nodes: a tagged graph could be handed
    another tagging's program. Inductor's own cache keys the partitioned graphs.
    """
    import torch._functorch.config as functorch_config

    stack = contextlib.ExitStack()
    if context is not None:
        stack.enter_context(torch._guards.tracing(context))
    if hasattr(functorch_config, "enable_autograd_cache"):
        stack.enter_context(functorch_config.patch(enable_autograd_cache=False))
    return stack


def joint_graph_pass(graph_pass: Optional[Callable[[Any], None]]) -> ContextManager[Any]:
    """Inductor running ``graph_pass`` on each joint forward-backward graph it partitions inside (None: none).

    Raises:
        RuntimeError: this torch's inductor config has no ``joint_custom_pre_pass``.
    """
    import torch._inductor.config as config

    return _patched(config, "joint_custom_pre_pass", graph_pass, "selective regions in a captured step")


def checkpoint_exec_group() -> Optional[Any]:
    """The ``torch.utils.checkpoint.GraphExecGroup`` whose backward calls share one recompute now (None: none, or
    a torch without the class)."""
    group_cls = getattr(torch_checkpoint, "GraphExecGroup", None)
    return None if group_cls is None else group_cls._get_current_group()


def checkpoint_global_switches() -> Tuple[Optional[bool], Optional[bool]]:
    """torch's global checkpoint switches ``(early_stop, debug)`` as set by ``set_checkpoint_early_stop`` and
    ``set_checkpoint_debug_enabled`` (None: not set, or not in this torch)."""
    early_stop = getattr(torch_checkpoint, "_enable_checkpoint_early_stop", None)
    debug = getattr(torch_checkpoint, "_checkpoint_debug_enabled", None)
    return (None if early_stop is None else bool(early_stop)), (None if debug is None else bool(debug))


def noop_context_fn() -> Optional[Callable[[], Any]]:
    """torch.utils.checkpoint's default ``context_fn`` (None where this torch has none)."""
    return getattr(torch_checkpoint, "noop_context_fn", None)


def region_saved_tensors_hooks(pack: Callable[[Any], Any], unpack: Callable[[Any], Any]) -> ContextManager[Any]:
    """``saved_tensors_hooks(pack, unpack)`` for a checkpoint region's own hooks, marked the way torch marks its
    checkpoint's hooks where torch tells them from a user's.

    Selective checkpointing asks which hooks the *user* set around it (torch 2.15: to warn that it bypasses them,
    or to route its saved tensors through them). Unmarked, memsave's region hooks would count as the user's: a
    selective region inside memsave's would warn about memsave itself. A torch without that question gets plain
    hooks.
    """
    internal = getattr(torch_checkpoint, "_checkpoint_internal_hook", None)
    if internal is None:
        return torch.autograd.graph.saved_tensors_hooks(pack, unpack)
    marked = functools.partial(pack)  # a partial takes attributes; a bound method does not
    marked._checkpoint_internal = True  # type: ignore[attr-defined]
    return internal(marked, unpack)


def selective_saves_can_use_hooks() -> bool:
    """Whether this torch's selective checkpointing can route the tensors it saves through the user's
    ``saved_tensors_hooks`` (``respect_saved_tensors_hooks``, torch 2.15)."""
    caching = getattr(torch_checkpoint, "_CachingTorchDispatchMode", None)
    return caching is not None and hasattr(torch_checkpoint, "_current_user_saved_tensors_hooks")


def route_selective_saves(forward_context: Any, respect_saved_tensors_hooks: Optional[bool]) -> None:
    """Tell a selective forward context (torch's caching mode) whether the tensors it saves go through the user's
    ``saved_tensors_hooks``, as torch's ``checkpoint(..., respect_saved_tensors_hooks=...)`` does; ``None`` leaves
    torch's default. Other contexts save nothing outside autograd and are left alone."""
    caching = getattr(torch_checkpoint, "_CachingTorchDispatchMode", None)
    if respect_saved_tensors_hooks is not None and caching is not None and isinstance(forward_context, caching):
        forward_context.respect_saved_tensors_hooks = respect_saved_tensors_hooks


def profiler_event_tree(prof: Any) -> Tuple[list, Any]:
    """The profiler's event tree and its event-type enum, from which CPU allocation events are read.

    Raises:
        RuntimeError: this torch does not expose ``kineto_results.experimental_event_tree()``.
    """
    try:
        tree = prof.kineto_results.experimental_event_tree()
        from torch._C._profiler import _EventType
    except (AttributeError, ImportError) as exc:
        where = "profiler event tree (kineto_results.experimental_event_tree)"
        raise _missing("the CPU memory measure", where) from exc
    return tree, _EventType


def cuda_memory_history() -> Any:
    """``torch.cuda.memory`` with its ``_record_memory_history`` / ``_dump_snapshot``.

    Raises:
        RuntimeError: this torch lacks them.
    """
    memory = getattr(torch.cuda, "memory", None)
    if not (hasattr(memory, "_record_memory_history") and hasattr(memory, "_dump_snapshot")):
        raise _missing("cuda_memory_snapshot", "torch.cuda.memory._record_memory_history / _dump_snapshot")
    return memory


def native_linear_cross_entropy() -> Optional[Callable[..., torch.Tensor]]:
    """torch's own fused ``F.linear_cross_entropy`` (torch >= 2.15), or None where this torch has none."""
    return getattr(torch.nn.functional, "linear_cross_entropy", None)


def native_rms_norm() -> Optional[Callable[..., torch.Tensor]]:
    """torch's own ``F.rms_norm``, or None where this torch has none."""
    return getattr(torch.nn.functional, "rms_norm", None)


class FlopCount(TorchDispatchMode):
    """Count the FLOPs of the operators run inside, by torch's own formulas (matrix products, convolutions,
    attention), without decomposing any operator.

    torch's ``FlopCounterMode`` decomposes every operator it has no formula for, re-entering itself; from torch 2.15
    on, that breaks a selective checkpoint region's recompute in backward (torch's cached-operator mode then meets
    operators in another order than the forward stored them, "not found in storage"). Operators reach a dispatch
    mode after their composite decomposition anyway, so the products are all seen here.

    Attributes:
        total: the FLOPs counted so far.

    Examples:
        >>> with FlopCount() as flops:
        ...     loss.backward()
        >>> flops.total
        1572864
    """

    def __init__(self) -> None:
        super().__init__()
        self.total = 0
        self._formulas = _flop_formulas()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        formula = self._formulas.get(func.overloadpacket)
        if formula is not None:
            self.total += int(formula(*args, **kwargs, out_val=out))
        return out


def _flop_formulas() -> dict:
    from torch.utils import flop_counter

    registry = getattr(flop_counter, "flop_registry", None)
    if not isinstance(registry, dict):
        raise _missing("FlopCount", "torch.utils.flop_counter.flop_registry")
    return registry


def count_flops() -> FlopCount:
    """A :class:`FlopCount` to use as a context manager (see there)."""
    return FlopCount()


#: torch loggers whose messages on importing a part of torch are not about the caller's run: torch.utils.benchmark
#: (memsave's step timer) imports cpp_extension, which logs "No CUDA runtime is found, using CUDA_HOME=..." with
#: torch's file path on every machine without CUDA.
QUIET_TORCH_LOGGERS = ("torch.utils.cpp_extension",)

#: torch loggers that log, with its traceback, an error they then raise anyway: fake tensors log every meta kernel
#: that fails ("failed while attempting to run meta for aten.max_pool2d_with_indices.default", about 20 lines)
#: before raising its error, which :func:`memsave.estimate` reports in one line (a wrong input shape).
RAISED_ERROR_LOGGERS = ("torch._subclasses.fake_tensor",)


@contextlib.contextmanager
def quiet_torch_logs(names: Tuple[str, ...], level: int) -> Any:
    """Hold back the messages below ``level`` of the torch loggers ``names`` while the ``with`` body runs (then the
    loggers' levels return): the one way memsave keeps torch's log lines that are not about the user's run off
    their screen.

    Args:
        names: the loggers, e.g. :data:`QUIET_TORCH_LOGGERS` or :data:`RAISED_ERROR_LOGGERS`.
        level: the lowest level still shown (``logging.CRITICAL + 1`` shows none).

    Returns:
        A context manager.

    Examples:
        >>> with quiet_torch_logs(RAISED_ERROR_LOGGERS, logging.CRITICAL + 1):
        ...     run_fake_step()                          # its error is raised, not also logged
    """
    loggers = [logging.getLogger(name) for name in names]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(level)
    try:
        yield
    finally:
        for logger, level_before in zip(loggers, levels):
            logger.setLevel(level_before)


def quiet_torch_import_logs() -> ContextManager[Any]:
    """Hold back the :data:`QUIET_TORCH_LOGGERS` below ERROR while the ``with`` body runs (then their levels return).

    Returns:
        A context manager.

    Examples:
        >>> with quiet_torch_import_logs():
        ...     from torch.utils.benchmark.utils.timer import timer    # no "No CUDA runtime is found" line
    """
    return quiet_torch_logs(QUIET_TORCH_LOGGERS, logging.ERROR)


def quiet_raised_error_logs() -> ContextManager[Any]:
    """Hold back every message of the :data:`RAISED_ERROR_LOGGERS` while the ``with`` body runs: the errors they
    log are raised to the caller, who reports them once.

    Returns:
        A context manager.

    Examples:
        >>> with quiet_raised_error_logs():
        ...     runner(*fake_inputs)                     # a wrong shape raises; fake tensors log nothing
    """
    return quiet_torch_logs(RAISED_ERROR_LOGGERS, logging.CRITICAL + 1)
