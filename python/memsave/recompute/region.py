"""Recompute in backward: :func:`checkpoint`, :func:`checkpointed` and :func:`checkpoint_sequential`.

How a region works (non-reentrant, built on :class:`torch.autograd.graph.saved_tensors_hooks`):

* **Forward** runs ``fn`` normally, so the autograd graph is the real one: inputs that do not require grad
  still give parameter gradients, nested and non-tensor outputs just work, ``torch.autograd.grad`` and
  ``backward(inputs=...)`` see ordinary nodes. Every tensor autograd wants to save is replaced by a small
  handle (its index in the region's *frame*); only its shape, dtype, device and version are kept.
* **Backward**: the first unpack of a handle recomputes ``fn`` from the region's arguments (detached, with
  the same ``requires_grad``) under ``torch.enable_grad()``, with the forward's RNG states, autocast state,
  module ``training`` flags and module buffers (see below) replayed. The recompute stores each saved tensor
  under its handle; unpacking pops it. A handle that is unpacked again later (a second backward with
  ``retain_graph=True``) triggers another recompute. Stored tensors are keyed by weak references to the
  handles, so they die with the graph.
* **Checks**: the recompute must save the same number of tensors with the same shape, dtype and device as
  the forward, or :class:`~memsave.errors.RecomputeMismatchError` names the region. ``strict=True`` also
  keeps the forward's saved tensors and compares values bitwise (debugging only: it uses eager's memory).
  A region that modifies one of its tensor arguments in place, or an argument / saved parameter / saved
  tensor modified in place between forward and backward, raises :class:`~memsave.errors.InplaceModificationError`
  instead of giving a wrong gradient.

**RNG.** With ``preserve_rng_state=True`` the CPU generator and, when CUDA is initialised, the generator of
every CUDA device are saved at region entry and restored (inside :func:`torch.random.fork_rng`, so the
caller's RNG streams are untouched) for the recompute: dropout masks are identical to eager's.

**Buffers (BatchNorm and friends).** While a region's forward runs, global module hooks (registered only while
some region is active, because a global hook turns off ``nn.Module``'s hook-free fast path) snapshot each
called module's own buffers and ``training`` flag, and record the modules whose buffers changed during the
call (a replaced buffer or a bumped version counter: BatchNorm always bumps ``num_batches_tracked``). During
the recompute those buffers are swapped, by name, for fresh copies of their values at region entry; the real
buffers are put back untouched afterwards. So running statistics end bitwise equal to eager (no double
update, ``momentum=None`` included), and a module whose output depends on a buffer it updates (power
iteration in ``spectral_norm``) recomputes the forward's values. Covered: any ``nn.Module`` that updates its
own registered buffers in its forward or forward pre-hooks — ``BatchNorm*d``, ``InstanceNorm*d`` with
``track_running_stats=True``, ``spectral_norm``, custom EMA buffers. Not covered: state mutated by plain
functions, in Python attributes that are not registered buffers, or through another alias of a buffer
tensor; a module that only writes a buffer through raw kernels without bumping any of its buffers' versions.
Cost: each call of a module that has buffers, inside a region's forward, clones that module's own buffers
(dropped at once unless they changed). BatchNorm, SyncBatchNorm and InstanceNorm in training mode are exempt:
their output uses batch statistics and only *writes* their buffers, so their recompute runs on scratch copies taken
when the recompute starts, and a region keeps no more than ``torch.utils.checkpoint`` does.

**Nested regions** are correct: the inner region's frame holds the inner arguments until backward, so an
inner region's arguments stay alive inside an outer region (the outer region frees only what it saves
outside its inner regions).

**Not supported**: calling ``backward``/``torch.autograd.grad`` inside a region on tensors that region saved
(raises :class:`~memsave.errors.CheckpointError`); a region's forward hooks run again during the recompute.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import threading
import warnings
import weakref
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, TypeVar, Union

import torch
from torch import nn

from ..common.rng import RngState
from . import state
from ..errors import CheckpointError, InplaceModificationError, MemsaveWarning, RecomputeMismatchError

__all__ = ["checkpoint", "checkpointed", "checkpoint_sequential"]

F = TypeVar("F", bound=Callable[..., Any])


class _Handle:
    """Stands in, inside the autograd graph, for one tensor a region saved in forward."""

    __slots__ = ("frame", "index", "__weakref__")

    def __init__(self, frame: "_Frame", index: int) -> None:
        self.frame = frame
        self.index = index


class _Frame:
    """Everything one call of a region needs to recompute its saved tensors in backward."""

    def __init__(self, fn: Callable[..., Any], args: Tuple[Any, ...], kwargs: Dict[str, Any], name: str,
                 preserve_rng_state: bool, strict: bool) -> None:
        self.fn = fn
        self.args = args
        self.kwargs = kwargs
        self.name = name
        self.strict = strict
        self.rng = RngState() if preserve_rng_state else None
        self.autocast = state.AutocastState()
        self.module_records: state.ModuleRecords = state.ModuleRecords()
        # Per saved tensor: shape, dtype, device, version at save, whether that version must repeat.
        self.metas: List[Tuple[torch.Size, torch.dtype, torch.device, int, bool]] = []
        self.handles: List["weakref.ref[_Handle]"] = []
        self.leaf_refs: List[Tuple[int, "weakref.ref[torch.Tensor]"]] = []
        self.leaf_checks: List[Tuple[int, "weakref.ref[torch.Tensor]", int]] = []
        self.stale: Dict[int, Tuple[int, int]] = {}
        self.arg_versions: List[Tuple[str, torch.Tensor, int]] = []
        self.strict_values: List[torch.Tensor] = []
        self.stored: "weakref.WeakKeyDictionary[_Handle, Tuple[torch.Tensor, int]]" = weakref.WeakKeyDictionary()
        self.forward_done = False
        self.recomputing = False
        self.lock = threading.RLock()

    # ---- forward -------------------------------------------------------------------------------------------

    def pack(self, t: torch.Tensor) -> _Handle:
        handle = _Handle(self, len(self.metas))
        self.handles.append(weakref.ref(handle))
        # Tensors produced inside the region get fresh version counters in both runs, so their version at save
        # must repeat; tensors from outside (leaves: parameters, buffers, leaf inputs) are checked at exit.
        has_history = t.grad_fn is not None
        self.metas.append((t.shape, t.dtype, t.device, t._version, has_history))
        if not has_history:
            self.leaf_refs.append((handle.index, weakref.ref(t)))
        if self.strict:
            self.strict_values.append(t.detach())
        return handle

    def finish_forward(self, arg_versions: List[Tuple[str, torch.Tensor, int]]) -> None:
        """Close the forward; ``arg_versions`` are the arguments' versions, already checked unchanged since entry."""
        for index, ref in self.leaf_refs:
            t = ref()
            if t is None:
                continue
            saved_version = self.metas[index][3]
            if t._version != saved_version:
                # Modified in place after being saved: eager fails when backward unpacks it; so do we.
                self.stale[index] = (saved_version, t._version)
            self.leaf_checks.append((index, ref, t._version))
        self.leaf_refs = []
        self.arg_versions = arg_versions
        self.forward_done = True

    # ---- backward ------------------------------------------------------------------------------------------

    def check_unchanged(self) -> None:
        for path, t, version in self.arg_versions:
            if t._version != version:
                raise InplaceModificationError(
                    f"memsave: one of the variables needed for gradient computation has been modified by an "
                    f"inplace operation: argument {path} of checkpointed region '{self.name}' "
                    f"({_describe(t)}) is at version {t._version}; expected version {version} (its version when "
                    f"the region's forward ended). The region recomputes from its arguments in backward, so it "
                    f"would compute wrong gradients. Clone the tensor before modifying it in place "
                    f"(x = x.clone()), or use the out-of-place operation.")
        for index, ref, version in self.leaf_checks:
            t = ref()
            if t is not None and t._version != version:
                raise InplaceModificationError(
                    f"memsave: one of the variables needed for gradient computation has been modified by an "
                    f"inplace operation: {self._tensor_label(t, index)} saved by checkpointed region "
                    f"'{self.name}' ({_describe(t)}) is at version {t._version}; expected version {version}. "
                    f"Do not modify parameters or tensors a region uses (e.g. optimizer.step(), x.add_()) "
                    f"between its forward and backward; clone the tensor before modifying it instead.")

    def recompute(self) -> None:
        if self.recomputing:
            raise CheckpointError(
                f"memsave: region '{self.name}' asked for its own saved tensors while recomputing them (a backward "
                f"inside the region?). Move torch.autograd.grad/backward calls out of the checkpointed region.")
        self.check_unchanged()
        args = state.map_tensors(_detach_like, self.args)
        kwargs = state.map_tensors(_detach_like, self.kwargs)
        count = [0]
        n = len(self.metas)

        def pack(t: torch.Tensor) -> torch.Tensor:
            i = count[0]
            count[0] += 1
            if i >= n:
                raise RecomputeMismatchError(
                    f"memsave: the recompute of checkpointed region '{self.name}' saved more tensors for backward "
                    f"than its forward did ({n}); the extra tensor #{i} is {_describe(t)}. {_MISMATCH_ADVICE}")
            shape, dtype, device, version, has_history = self.metas[i]
            if t.shape != shape or t.dtype != dtype or t.device != device:
                raise RecomputeMismatchError(
                    f"memsave: the recompute of checkpointed region '{self.name}' does not match its forward: "
                    f"saved tensor #{i} has shape {tuple(t.shape)}, dtype {t.dtype}, device {t.device} in the "
                    f"recompute but shape {tuple(shape)}, dtype {dtype}, device {device} in the forward. "
                    f"{_MISMATCH_ADVICE}")
            if has_history and t._version != version:
                raise InplaceModificationError(
                    f"memsave: one of the variables needed for gradient computation has been modified by an "
                    f"inplace operation: {self._tensor_label(t, i)} saved by checkpointed region '{self.name}' "
                    f"({_describe(t)}) is at version {t._version} in the recompute but was saved at version "
                    f"{version}. A parameter, or a tensor the region uses without receiving it as an argument (a "
                    f"closure variable), was modified in place between forward and backward; do not modify it "
                    f"before backward (e.g. optimizer.step()), or clone it before modifying it.")
            if self.strict:
                _strict_compare(self.name, i, self.strict_values[i], t)
            detached = t.detach()
            handle = self.handles[i]()
            if handle is not None:
                self.stored[handle] = (detached, t._version)
            return detached

        with _isolated_thread_state(), contextlib.ExitStack() as stack:
            self.recomputing = True
            stack.callback(setattr, self, "recomputing", False)
            stack.enter_context(torch.enable_grad())
            if self.rng is not None:
                stack.enter_context(self.rng.fork_and_restore())
            for ctx in self.autocast.contexts():
                stack.enter_context(ctx)
            stack.enter_context(state.ReplayedModuleState(self.module_records))
            stack.enter_context(torch.autograd.graph.saved_tensors_hooks(pack, _identity))
            self.fn(*args, **kwargs)
        if count[0] != n:
            raise RecomputeMismatchError(
                f"memsave: the recompute of checkpointed region '{self.name}' saved {count[0]} tensors for "
                f"backward but its forward saved {n}. {_MISMATCH_ADVICE}")

    def _tensor_label(self, t: torch.Tensor, index: int) -> str:
        base = t._base if t._base is not None else t  # e.g. weight.t() saved by linear
        owners: List[Any] = [self.fn, getattr(self.fn, "__self__", None)]
        owners += [rec.module_ref() for rec in self.module_records.values()]
        for owner in owners:
            if isinstance(owner, nn.Module):
                for pname, p in owner.named_parameters():
                    if p is base:
                        return f"parameter '{pname}' of {type(owner).__name__}"
                for bname, b in owner.named_buffers():
                    if b is base:
                        return f"buffer '{bname}' of {type(owner).__name__}"
        return f"saved tensor #{index}"


_MISMATCH_ADVICE = (
    "A checkpointed region must do the same operations on the same shapes when it is recomputed in backward. "
    "Make it independent of state that changes between forward and backward (global counters, data-dependent "
    "shapes from non-replayed randomness, flags flipped after forward), or do not checkpoint it.")


def _identity(x: Any) -> Any:
    return x


def _unpack(handle: _Handle) -> torch.Tensor:
    frame = handle.frame
    with frame.lock:
        if not frame.forward_done:
            raise CheckpointError(
                f"memsave: backward reached tensors saved by checkpointed region '{frame.name}' before its forward "
                f"returned (torch.autograd.grad or backward called inside the region). This is not supported: move "
                f"that call out of the region, or do not checkpoint it.")
        stale = frame.stale.get(handle.index)
        if stale is not None:
            raise InplaceModificationError(
                f"memsave: one of the variables needed for gradient computation has been modified by an inplace "
                f"operation: saved tensor #{handle.index} of checkpointed region '{frame.name}' "
                f"({_describe_meta(frame.metas[handle.index])}) was saved at version {stale[0]} and modified to "
                f"version {stale[1]} inside the region. Eager PyTorch fails here too: clone the tensor before "
                f"modifying it in place.")
        entry = frame.stored.pop(handle, None)
        if entry is None:
            frame.recompute()
            entry = frame.stored.pop(handle, None)
            if entry is None:  # pragma: no cover - the recompute checks the count of saved tensors
                raise CheckpointError(
                    f"memsave: internal error: the recompute of region '{frame.name}' did not produce saved "
                    f"tensor #{handle.index}. Please report this with the region's code.")
    t, version = entry
    if t._version != version:
        raise InplaceModificationError(
            f"memsave: one of the variables needed for gradient computation has been modified by an inplace "
            f"operation: saved tensor #{handle.index} of checkpointed region '{frame.name}' ({_describe(t)}) is at "
            f"version {t._version}; expected version {version}. Clone the tensor before modifying it in place.")
    return t


@contextlib.contextmanager
def _isolated_thread_state() -> Any:
    # A recompute is not part of any forward that may be running on this thread (the CPU backward runs on the
    # caller's thread): it must not record into those regions' frames.
    saved = (state.tls.records, state.tls.calls)
    state.tls.records, state.tls.calls = [], []
    try:
        yield
    finally:
        state.tls.records, state.tls.calls = saved


def _detach_like(t: torch.Tensor) -> torch.Tensor:
    return t.detach().requires_grad_(t.requires_grad)


def _tensor_args(args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> List[Tuple[str, torch.Tensor]]:
    found = list(state.iter_tensors(list(args), "args"))
    found += list(state.iter_tensors(kwargs, "kwargs"))
    return found


def _describe(t: torch.Tensor) -> str:
    return f"shape {tuple(t.shape)}, dtype {t.dtype}, device {t.device}"


def _describe_meta(meta: Tuple[torch.Size, torch.dtype, torch.device, int, bool]) -> str:
    return f"shape {tuple(meta[0])}, dtype {meta[1]}, device {meta[2]}"


def _strict_compare(name: str, index: int, expected: torch.Tensor, got: torch.Tensor) -> None:
    same = expected.shape == got.shape and expected.dtype == got.dtype
    if same:
        if expected.is_floating_point() or expected.is_complex():
            same = bool(((expected == got) | (expected.isnan() & got.isnan())).all())
        else:
            same = torch.equal(expected, got)
    if not same:
        detail = ""
        if expected.shape == got.shape and (expected.is_floating_point() or expected.is_complex()):
            detail = f" (max abs difference {(expected.double() - got.double()).abs().max().item():.3g})"
        raise RecomputeMismatchError(
            f"memsave: strict check failed for checkpointed region '{name}': saved tensor #{index} "
            f"({_describe(got)}) has other values in the recompute than in the forward{detail}. The region is not "
            f"deterministic: look for randomness outside torch's generators (numpy, python random), "
            f"preserve_rng_state=False, non-deterministic kernels, or state that changed between forward and "
            f"backward.")


def _region_name(fn: Any, name: Optional[str]) -> str:
    if name is not None:
        return str(name)
    if isinstance(fn, nn.Module):
        return type(fn).__name__
    if isinstance(fn, functools.partial):
        return _region_name(fn.func, None)
    owner = getattr(fn, "__self__", None)
    if inspect.ismethod(fn) and owner is not None:
        return f"{type(owner).__name__}.{fn.__name__}"
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__


def _check_callable(fn: Any, where: str) -> None:
    if not callable(fn):
        raise TypeError(
            f"memsave.{where}: fn must be callable (a function, a bound method or an nn.Module), got "
            f"{type(fn).__name__}. Pass the function first and its arguments after it: {where}(fn, *args, **kwargs).")


def run_region(fn: Callable[..., Any], args: Tuple[Any, ...], kwargs: Dict[str, Any], *, name: str,
                preserve_rng_state: bool, strict: bool, watch: Sequence[nn.Module] = ()) -> Any:
    """Run ``fn(*args, **kwargs)`` as a checkpointed region (the common path of every public entry point).

    Args:
        watch: modules whose own ``__call__`` started outside the region but whose forward body runs inside it
            (a wrapped module, ``self`` of a checkpointed method): their buffers and training flag are recorded
            here, since the global pre-hook ran before the region existed.
    """
    if not torch.is_grad_enabled():
        return fn(*args, **kwargs)
    frame = _Frame(fn, args, kwargs, name, preserve_rng_state, strict)
    entry_versions = [(path, t, t._version) for path, t in _tensor_args(args, kwargs)]
    watched = [(m, state.ModuleSnapshot(m)) for m in watch]
    cuda_was_initialized = torch.cuda.is_available() and torch.cuda.is_initialized()
    state.acquire_module_hooks()
    state.tls.records.append(frame.module_records)
    try:
        with torch.autograd.graph.saved_tensors_hooks(frame.pack, _unpack):
            out = fn(*args, **kwargs)
    finally:
        stack = state.tls.records
        if stack and stack[-1] is frame.module_records:
            stack.pop()
        else:  # pragma: no cover - defensive: keep the stack consistent whatever happened inside
            state.tls.records = [t for t in stack if t is not frame.module_records]
        state.release_module_hooks()
    for module, snap in watched:
        frame.module_records.note(module, snap, snap.buffers_changed(module))
    for path, t, version in entry_versions:
        if t._version != version:
            raise InplaceModificationError(
                f"memsave: checkpointed region '{name}' modified its argument {path} ({_describe(t)}) in place "
                f"during forward (version {version} -> {t._version}). Its recompute in backward would start from "
                f"the modified value and give wrong gradients. Clone the argument inside the region before "
                f"modifying it, use the out-of-place operation (e.g. nn.ReLU(inplace=False)), or move the in-place "
                f"operation out of the region.")
    if frame.rng is not None and not cuda_was_initialized and torch.cuda.is_available() \
            and torch.cuda.is_initialized() and frame.metas:
        warnings.warn(
            f"memsave: CUDA was initialised inside checkpointed region '{name}', so its CUDA RNG state could not be "
            f"saved at region entry and random operations on CUDA (dropout) may differ in the recompute. "
            f"Initialise CUDA before the first checkpointed forward (e.g. torch.cuda.init() or model.cuda()).",
            MemsaveWarning, stacklevel=3)
    frame.finish_forward(entry_versions)  # the loop above checked they are still the versions at exit
    return out


def checkpoint(fn: Callable[..., Any], *args: Any, preserve_rng_state: bool = True, strict: bool = False,
               name: Optional[str] = None, **kwargs: Any) -> Any:
    """Run ``fn(*args, **kwargs)`` without keeping its activations; recompute them in backward.

    Non-reentrant: the forward builds the real autograd graph, so arguments that do not require grad (frozen
    embeddings, images, token ids) still give gradients to the parameters used inside ``fn``; arguments and
    outputs may be tensors nested in tuples, lists and dicts, or non-tensors. Gradients, outputs, BatchNorm
    buffers and the RNG stream are bitwise equal to running ``fn`` without checkpointing (CPU, float32). When
    grad mode is off, ``fn`` is simply called.

    Args:
        fn: the region: a function, bound method or ``nn.Module``.
        *args: positional arguments of ``fn``.
        preserve_rng_state: replay the CPU and CUDA RNG states of the forward in the recompute, so random
            operations (dropout) draw the same numbers. ``False`` saves a little time but is not lossless.
        strict: also keep the tensors the forward saved and compare the recompute's with them bitwise
            (:class:`~memsave.errors.RecomputeMismatchError` on a difference). For debugging only: it uses as much
            memory as not checkpointing.
        name: the region's name in error messages (default: the module's class name or ``fn.__qualname__``).
        **kwargs: keyword arguments of ``fn`` (the names ``preserve_rng_state``, ``strict`` and ``name`` are
            taken by this function; use :func:`checkpointed` or a lambda to pass them to ``fn``).

    Returns:
        Whatever ``fn`` returns.

    Raises:
        TypeError: ``fn`` is not callable.
        RecomputeMismatchError: (in backward) the recompute saved tensors of other shapes/dtypes/devices.
        InplaceModificationError: ``fn`` modified one of its tensor arguments in place (at forward), or an
            argument / tensor the region saved was modified in place before backward (at backward).

    Example:
        >>> block = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))
        >>> y = memsave.checkpoint(block, x)        # block's activations are recomputed in backward
        >>> y.sum().backward()
    """
    _check_callable(fn, "checkpoint")
    watch: Tuple[nn.Module, ...] = ()
    owner = getattr(fn, "__self__", None)
    if inspect.ismethod(fn) and isinstance(owner, nn.Module):
        watch = (owner,)  # a bound method (model.forward) runs without the module's __call__
    return run_region(fn, args, kwargs, name=_region_name(fn, name), preserve_rng_state=preserve_rng_state,
                       strict=strict, watch=watch)


def checkpointed(fn: Optional[F] = None, *, preserve_rng_state: bool = True, strict: bool = False,
                 name: Optional[str] = None) -> Union[F, Callable[[F], F]]:
    """Decorator: every call of the function (or ``forward`` method) runs as a :func:`checkpoint` region.

    Usable bare (``@checkpointed``) or with options (``@checkpointed(strict=True)``). On a ``forward`` method in
    a class body it applies to every instance; the module's buffers and ``training`` flag are handled as for
    modules called inside the region.

    Args:
        fn: the function or method (omit it to pass options).
        preserve_rng_state, strict, name: as for :func:`checkpoint`; the keyword arguments of the decorated
            function are all passed to it unchanged.

    Returns:
        The wrapped function (``functools.wraps`` keeps its name and docstring), or a decorator when ``fn`` is
        omitted.

    Example:
        >>> class Block(nn.Module):
        ...     @memsave.checkpointed
        ...     def forward(self, x):
        ...         return self.mlp(self.norm(x)) + x
    """
    if fn is None:
        def decorate(f: F) -> F:
            return checkpointed(f, preserve_rng_state=preserve_rng_state, strict=strict, name=name)  # type: ignore
        return decorate
    _check_callable(fn, "checkpointed")
    region = _region_name(fn, name)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        # For a method, args[0] is the module: its __call__ (and the global pre-hook) ran before the region.
        watch = (args[0],) if args and isinstance(args[0], nn.Module) else ()
        return run_region(fn, args, kwargs, name=region, preserve_rng_state=preserve_rng_state, strict=strict,
                           watch=watch)

    wrapper.__memsave_checkpointed__ = True  # type: ignore[attr-defined]
    return wrapper  # type: ignore[return-value]


class ModuleChain:
    """Callable running a list of modules one after the other (one segment of checkpoint_sequential)."""

    def __init__(self, modules: Sequence[Callable[..., Any]]) -> None:
        self.modules = list(modules)

    def __call__(self, x: Any) -> Any:
        for module in self.modules:
            x = module(x)
        return x


def _is_inplace(module: Any) -> bool:
    return getattr(module, "inplace", False) is True


def count_leading_inplace(modules: Sequence[Callable[..., Any]]) -> int:
    """Number of leading modules that work in place (``inplace=True``): run outside a region."""
    count = 0
    while count < len(modules) and _is_inplace(modules[count]):
        count += 1
    return count


def checkpoint_sequential(modules: Union[nn.Sequential, nn.ModuleList, Sequence[Callable[..., Any]]],
                          segments: int, x: Any, *, preserve_rng_state: bool = True) -> Any:
    """Run modules one after the other, checkpointing them in ``segments`` segments (drop-in for torch's).

    Like ``torch.utils.checkpoint.checkpoint_sequential``: the modules are split into ``segments`` consecutive
    segments of ``len(modules) // segments`` modules, the last one taking the remainder; every segment but the
    last is a checkpointed region, and the last runs without checkpointing (its activations would be recomputed
    right at the start of backward anyway). So ``segments=1`` checkpoints nothing. Each module receives the
    previous module's output as its single argument, as in ``nn.Sequential`` — a tuple flows as one argument.
    Modules with ``inplace=True`` (e.g. ``nn.ReLU(inplace=True)``) at the start of a segment run just before the
    region instead of inside it, since a region must not modify its input in place.

    Args:
        modules: an ``nn.Sequential``, ``nn.ModuleList`` or a list/tuple of modules or callables.
        segments: number of segments, between 1 and ``len(modules)``.
        x: the input of the first module (a tensor, or anything the first module accepts).
        preserve_rng_state: as for :func:`checkpoint`.

    Returns:
        The output of the last module.

    Raises:
        TypeError: ``modules`` is not a sequence of callables, or ``segments`` is not an int.
        ValueError: ``segments`` is not between 1 and the number of modules.

    Example:
        >>> out = memsave.checkpoint_sequential(vgg.features, 2, images)
    """
    if isinstance(modules, (nn.Sequential, nn.ModuleList)):
        mods: List[Callable[..., Any]] = list(modules)
        prefix = type(modules).__name__
    elif isinstance(modules, (list, tuple)):
        mods = list(modules)
        prefix = "modules"
    else:
        raise TypeError(
            f"memsave.checkpoint_sequential: modules must be an nn.Sequential, an nn.ModuleList or a list of "
            f"modules, got {type(modules).__name__}. For a single module or function use memsave.checkpoint.")
    for i, m in enumerate(mods):
        if not callable(m):
            raise TypeError(f"memsave.checkpoint_sequential: modules[{i}] is a {type(m).__name__}, not callable.")
    n = len(mods)
    if isinstance(segments, bool) or not isinstance(segments, int):
        raise TypeError(f"memsave.checkpoint_sequential: segments must be an int, got {type(segments).__name__}.")
    if segments <= 0 or segments > n:
        raise ValueError(
            f"memsave.checkpoint_sequential: segments must be between 1 and the number of modules ({n}), got "
            f"{segments}. Use at most one segment per module; 2 segments is the classic choice for a plain stack.")
    if not torch.is_grad_enabled():
        return ModuleChain(mods)(x)
    size = n // segments
    out = x
    for k in range(segments - 1):
        start, end = k * size, (k + 1) * size
        seg = mods[start:end]
        skip = count_leading_inplace(seg)
        for module in seg[:skip]:
            out = module(out)
        if skip < len(seg):
            out = run_region(ModuleChain(seg[skip:]), (out,), {}, name=f"{prefix}[{start + skip}:{end}]",
                              preserve_rng_state=preserve_rng_state, strict=False)
    for module in mods[(segments - 1) * size:]:
        out = module(out)
    return out
