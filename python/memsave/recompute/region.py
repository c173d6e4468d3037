"""Recompute in backward: :func:`checkpoint`, :func:`checkpointed` and :func:`checkpoint_sequential`.

How a region works (non-reentrant, built on :class:`torch.autograd.graph.saved_tensors_hooks`):

* **Forward** runs ``fn`` normally, so the autograd graph is the real one: inputs that do not require grad
  still give parameter gradients, nested and non-tensor outputs just work, ``torch.autograd.grad`` and
  ``backward(inputs=...)`` see ordinary nodes. Every tensor autograd wants to save is replaced by a small
  handle (its index in the region's *frame*); only its shape, dtype, device and version are kept, plus a weak
  reference when the tensor is a leaf (no ``grad_fn``: parameters, buffers, inputs, constants). The region's
  arguments are kept with their containers copied at the call (lists, tuples and dicts, nested), so a list the
  caller appends to afterwards (DenseNet's growing feature list) does not change the recompute.
* **Backward**: a saved leaf that is still alive is handed back as the very object the forward saved (Python
  attributes and identity kept, nothing recomputed; a region whose saved tensors are all leaves, a single
  matrix product of a leaf input and a weight, never recomputes). Any other handle triggers a recompute of ``fn``
  from the region's arguments (those that require grad detached, the others as they are) under
  ``torch.enable_grad()``, with the
  forward's RNG states, autocast state, default-device context (``with torch.device(...)``,
  ``torch.set_default_device``), module ``training`` flags and module buffers (see below) replayed. The
  recompute stores the tensors this backward still needs under their handles and **stops early** once it has
  produced the last of them (``early_stop=False`` reruns the whole region); unpacking pops a stored tensor.
  Recomputes are per backward (autograd graph task, or torch's ``GraphExecGroup``, whose backward calls share one
  recompute): a second backward with ``retain_graph=True`` recomputes again, and what one backward recomputed but
  did not unpack is dropped when that backward ends. Saved leaves (inputs, parameters) are handed back as they
  are; a backward that reads only those still reruns the region once, as torch's checkpoint does, and that rerun
  stores nothing (with early stop it ends at its first saved tensor).
* **Double unpack**: reading the same recomputed saved tensor twice in one backward (a custom
  ``autograd.Function`` that reads ``ctx.saved_tensors`` twice) raises :class:`~memsave.errors.CheckpointError`,
  as ``torch.utils.checkpoint`` does: recomputed tensors are freed as soon as they are read. Leaves handed back by
  identity may be read any number of times.
* **Backward inside the region** (gradient penalty, meta-learning: ``torch.autograd.grad`` on tensors the region
  saved, called while its forward runs) works: the recompute starts from the region's arguments and stops once it
  has the tensors saved so far (with ``early_stop=False`` it runs to the end and ignores what the forward has not
  saved yet); modules whose call is still in progress have their buffers replayed from their call's start.
* **Checks**: the recompute must save the same number of tensors with the same shape, dtype and device as
  the forward, or :class:`~memsave.errors.RecomputeMismatchError` names the region (``determinism_check="none"``
  skips the shape/dtype/device comparison, ``debug=True`` adds both runs' lists of saved tensors to the error).
  ``strict=True`` (:func:`checkpointed`, :func:`~memsave.wrap`) also keeps the forward's saved tensors and compares
  values bitwise (debugging only: it uses eager's memory). A region that modifies one of its tensor arguments in
  place, or an argument / saved parameter / saved tensor modified in place between forward and backward, raises
  :class:`~memsave.errors.InplaceModificationError` instead of giving a wrong gradient.

**RNG.** With ``preserve_rng_state=True`` the CPU generator and, when CUDA is initialised, the generator of
every CUDA device are saved at region entry and restored (inside :func:`torch.random.fork_rng`, so the
caller's RNG streams are untouched) for the recompute: dropout masks are identical to eager's. Explicit
``torch.Generator`` objects the forward draws from (``torch.rand(..., generator=g)``) are noted with their state before
the first draw (a torch function mode, :class:`~memsave.common.rng.GeneratorRecorder`, active during the forward) and
replayed the same way: the recompute draws the forward's numbers, and each generator ends where eager leaves it
(advanced once, not twice).

**Buffers (BatchNorm and friends).** While a region's forward runs, global module hooks (registered only while
some region is active, because a global hook turns off ``nn.Module``'s hook-free fast path) snapshot each
called module's own buffers and ``training`` flag, and record the modules whose buffers changed during the
call (a replaced buffer or a bumped version counter: BatchNorm always bumps ``num_batches_tracked``). During
the recompute those buffers are swapped, by name, for fresh copies of their values at region entry; the real
buffers are put back untouched afterwards — also when the recompute stops early. So running statistics end
bitwise equal to eager (no double update, ``momentum=None`` included), and a module whose output depends on a
buffer it updates (power iteration in ``spectral_norm``) recomputes the forward's values. Covered: any
``nn.Module`` that updates its own registered buffers in its forward or forward pre-hooks — ``BatchNorm*d``,
``InstanceNorm*d`` with ``track_running_stats=True``, ``spectral_norm``, custom EMA buffers. Not covered: state
mutated by plain functions, in Python attributes that are not registered buffers, or through another alias of a
buffer tensor; a module that only writes a buffer through raw kernels without bumping any of its buffers'
versions. Cost: each call of a module that has buffers, inside a region's forward, clones that module's own
buffers (dropped at once unless they changed). BatchNorm, SyncBatchNorm and InstanceNorm in training mode are
exempt: their output uses batch statistics and only *writes* their buffers, so their recompute runs on scratch
copies taken when the recompute starts, and a region keeps no more than ``torch.utils.checkpoint`` does.

**Nested regions** are correct: the inner region's frame holds the inner arguments until backward, so an
inner region's arguments stay alive inside an outer region (the outer region frees only what it saves
outside its inner regions).

**torch.utils.checkpoint's keywords** (``use_reentrant``, ``preserve_rng_state``, ``context_fn``,
``determinism_check``, ``debug``, ``early_stop``, and the global ``set_checkpoint_early_stop`` /
``set_checkpoint_debug_enabled`` switches) are taken by :func:`checkpoint` with torch's meaning; see its docstring.
Selective checkpointing contexts (``create_selective_checkpoint_contexts``, :func:`memsave.selective`) work with
torch's semantics: the operators the policy saves keep their forward outputs, which the recompute reads back instead
of running them again (one backward per forward, as in torch). Not supported: a region's forward hooks run again
during the recompute.

**torch.compile.** While dynamo traces (``torch.compile(memsave.wrap(model))``, or :func:`checkpoint` inside a
compiled function, ``fullgraph=True`` included), a region lowers to ``torch.utils.checkpoint.checkpoint(...,
use_reentrant=False)`` with the same ``preserve_rng_state``, ``determinism_check`` and ``context_fn``: dynamo puts it
in the graph as a tagged subgraph, and the compiled backward recomputes that subgraph's activations instead of
saving them, so the compiled step keeps a checkpointed step's memory. Buffers (BatchNorm) are updated once, in the
compiled forward. Gradients match eager within float tolerance (inductor reorders floating-point operations);
random operations draw from inductor's generator, as they do without memsave. What only memsave's eager regions do
is not done in compiled code: ``strict`` value checks, ``debug`` tables, early stop and the in-place checks (torch's
compiled checkpoint handles in-place updates itself). A graph break inside a region runs that region eagerly, with
memsave's own mechanism.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import threading
import warnings
import weakref
from typing import Any, Callable, Dict, Hashable, List, Optional, Sequence, Set, Tuple, TypeVar, Union

import torch
from torch import nn
from torch.overrides import _get_current_function_mode_stack
from torch.utils import checkpoint as torch_checkpoint
from torch.utils._device import DeviceContext

from ..common import compat
from ..common.rng import GeneratorRecorder, RngState, replayed_generators
from ..errors import CheckpointError, InplaceModificationError, MemsaveWarning, RecomputeMismatchError
from . import state

__all__ = ["checkpoint", "checkpointed", "checkpoint_sequential"]

F = TypeVar("F", bound=Callable[..., Any])

# Per saved tensor: shape, dtype, device, version at save, whether it has history (a grad_fn).
_Meta = Tuple[torch.Size, torch.dtype, torch.device, int, bool]


@dataclasses.dataclass(frozen=True)
class RegionOptions:
    """The options a checkpointed region runs with: what every entry point hands :func:`run_region`.

    The public entry points take them as keywords (torch's names where torch has them); :meth:`checked` turns
    those into one value, checked once, that wrappers and plans keep and pass on.

    Attributes:
        preserve_rng_state: replay the forward's RNG states (default and explicit generators) in the recompute.
        strict: keep the forward's saved tensors and compare the recompute's with them bitwise (debugging).
        early_stop: stop the recompute once it has every saved tensor the backward still needs.
        check_metadata: compare the recomputed saved tensors' shapes, dtypes and devices with the forward's
            (torch's ``determinism_check="default"``).
        debug: keep each saved tensor's producer, for mismatch errors.
        context_fn: returns ``(forward context, recompute context)`` for each call (torch's ``context_fn``), or
            ``None``.
        respect_saved_tensors_hooks: whether a selective ``context_fn`` routes the tensors it saves through the
            user's ``saved_tensors_hooks`` (torch's option of that name); ``None``: torch's default.

    Examples:
        >>> options = RegionOptions.checked("wrap", strict=True)
        >>> run_region(block, (x,), {}, options, name="block")
    """

    preserve_rng_state: bool = True
    strict: bool = False
    early_stop: bool = True
    check_metadata: bool = True
    debug: bool = False
    context_fn: Optional[Callable[[], Tuple[Any, Any]]] = None
    respect_saved_tensors_hooks: Optional[bool] = None

    @classmethod
    def checked(cls, where: str, **options: Any) -> "RegionOptions":
        """The options given by keyword to the public function ``where``, checked.

        Args:
            where: the public function's name, for the error messages (``"wrap"``).
            **options: any of the attributes; ``context_fn`` may be torch's ``noop_context_fn`` (read as None).

        Returns:
            The options, the others at their defaults.

        Raises:
            TypeError: an unknown option, a flag that is not a bool, or a ``context_fn`` that is not callable.

        Examples:
            >>> RegionOptions.checked("checkpointed", preserve_rng_state=False)
            RegionOptions(preserve_rng_state=False, strict=False, early_stop=True, ...)
        """
        unknown = sorted(set(options) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise TypeError(f"memsave.{where}: unknown region option(s) {', '.join(unknown)}")
        check_region_options(where, **{k: v for k, v in options.items() if k != "context_fn"})
        if "context_fn" in options:
            options["context_fn"] = check_context_fn(where, options["context_fn"])
        return cls(**options)

    def under_global_switches(self) -> "RegionOptions":
        """These options with torch's global checkpoint switches applied where set (``set_checkpoint_early_stop``,
        ``set_checkpoint_debug_enabled``): read at each region call, as torch reads them at each ``checkpoint``.

        Examples:
            >>> with torch.utils.checkpoint.set_checkpoint_early_stop(False):
            ...     DEFAULT_OPTIONS.under_global_switches().early_stop
            False
        """
        early_stop, debug = compat.checkpoint_global_switches()
        if (early_stop is None or early_stop == self.early_stop) and (debug is None or debug == self.debug):
            return self
        return dataclasses.replace(
            self,
            early_stop=self.early_stop if early_stop is None else early_stop,
            debug=self.debug if debug is None else debug,
        )


#: The options of a region nobody configured (frozen, so one value serves every default).
DEFAULT_OPTIONS = RegionOptions()


class _Handle:
    """Stands in, inside the autograd graph, for one tensor a region saved in forward."""

    __slots__ = ("__weakref__", "frame", "index")

    def __init__(self, frame: "_Frame", index: int) -> None:
        self.frame = frame
        self.index = index


class _StopRecompute(BaseException):
    """Raised by a recompute's pack hook once it has every tensor the backward needs (early stop).

    A ``BaseException`` so that a region catching ``Exception`` cannot swallow it.
    """


class _Run:
    """What one backward (graph task) got from a region: recomputed tensors not read yet, indices already read,
    and whether the region has been rerun for it."""

    __slots__ = ("recomputed", "stored", "unpacked")

    def __init__(self) -> None:
        self.stored: "weakref.WeakKeyDictionary[_Handle, Tuple[torch.Tensor, int]]" = weakref.WeakKeyDictionary()
        self.unpacked: Set[int] = set()
        self.recomputed = False


class _Frame:
    """Everything one call of a region needs to recompute its saved tensors in backward."""

    def __init__(
        self,
        fn: Callable[..., Any],
        args: Tuple[Any, ...],
        kwargs: Dict[str, Any],
        name: str,
        options: RegionOptions,
        recompute_context: Optional[Any] = None,
    ) -> None:
        self.fn = fn
        # Containers are copied at the call: a later append to a list argument must not reach the recompute.
        self.args: Tuple[Any, ...] = state.map_tensors(_same, args)
        self.kwargs: Dict[str, Any] = state.map_tensors(_same, kwargs)
        self.name = name
        self.strict = options.strict
        self.early_stop = options.early_stop
        self.check_metadata = options.check_metadata
        self.recompute_context = recompute_context
        # torch's create_selective_checkpoint_contexts(..., allow_cache_entry_mutation=True): the caller allows a
        # cached operator output to be modified in place after it was cached, so the recompute may see it at another
        # version than the forward saved; torch then skips its check, and so does the recompute here.
        self.allow_cache_entry_mutation = bool(getattr(recompute_context, "allow_cache_entry_mutation", False))
        self.rng = RngState() if options.preserve_rng_state else None
        # Explicit generators the forward drew from, with their states before (filled by run_region's recorder).
        self.generators: List[Tuple[torch.Generator, torch.Tensor]] = []
        self.autocast = state.AutocastState()
        self.device = _default_device()
        self.module_records: state.ModuleRecords = state.ModuleRecords()
        # Modules whose call began before the region and runs its body inside it (see run_region's ``watch``), and
        # the thread's stack of module calls in progress with its height at entry: both say, for a recompute that
        # starts before the forward has ended, which modules are mid-call.
        self.watched: List[Tuple[nn.Module, state.ModuleSnapshot]] = []
        self.calls: List[Tuple[nn.Module, state.ModuleSnapshot]] = state.tls.calls
        self.calls_base = len(self.calls)
        self.metas: List[_Meta] = []
        self.handles: List["weakref.ref[_Handle]"] = []
        self.leaves: Dict[int, "weakref.ref[torch.Tensor]"] = {}
        self.leaf_checks: List[Tuple[int, "weakref.ref[torch.Tensor]", int]] = []
        self.stale: Dict[int, Tuple[int, int]] = {}
        self.arg_versions: List[Tuple[str, torch.Tensor, int]] = []
        self.strict_values: List[torch.Tensor] = []
        self.trace: Optional[List[str]] = [] if options.debug else None
        self.runs: Dict[Hashable, _Run] = {}
        self.forward_done = False
        self.recomputing = False
        self.lock = threading.RLock()

    # ---- forward -------------------------------------------------------------------------------------------

    def pack(self, t: torch.Tensor) -> _Handle:
        handle = _Handle(self, len(self.metas))
        self.handles.append(weakref.ref(handle))
        # Tensors produced inside the region get fresh version counters in both runs, so their version at save
        # must repeat; tensors from outside (leaves: parameters, buffers, leaf inputs) are checked at exit, and
        # handed back by identity in backward while they are alive.
        has_history = t.grad_fn is not None
        self.metas.append((t.shape, t.dtype, t.device, t._version, has_history))
        if not has_history:
            self.leaves[handle.index] = weakref.ref(t)
        if self.strict:
            self.strict_values.append(t.detach())
        if self.trace is not None:
            self.trace.append(_trace_label(t))
        return handle

    def finish_forward(self) -> None:
        """Close the forward; ``arg_versions`` were checked unchanged since entry by the caller."""
        for index, ref in self.leaves.items():
            t = ref()
            if t is None:
                continue
            saved_version = self.metas[index][3]
            if t._version != saved_version:
                # Modified in place after being saved: eager fails when backward unpacks it; so do we.
                self.stale[index] = (saved_version, t._version)
            self.leaf_checks.append((index, ref, t._version))
        self.forward_done = True

    # ---- backward ------------------------------------------------------------------------------------------

    def check_unchanged(self) -> None:
        for path, t, version in self.arg_versions:
            if t._version != version:
                if not self.forward_done:
                    raise InplaceModificationError(
                        f"memsave: checkpointed region '{self.name}' modified its argument {path} ({_describe(t)}) "
                        f"in place (version {version} -> {t._version}) before a backward inside the region needed "
                        f"its recompute, which would start from the modified value and give wrong gradients. Clone "
                        f"the argument inside the region before modifying it, or use the out-of-place operation."
                    )
                raise InplaceModificationError(
                    f"memsave: one of the variables needed for gradient computation has been modified by an "
                    f"inplace operation: argument {path} of checkpointed region '{self.name}' "
                    f"({_describe(t)}) is at version {t._version}; expected version {version} (its version when "
                    f"the region's forward ended). The region recomputes from its arguments in backward, so it "
                    f"would compute wrong gradients. Clone the tensor before modifying it in place "
                    f"(x = x.clone()), or use the out-of-place operation."
                )
        for index, ref, version in self.leaf_checks:
            leaf = ref()
            if leaf is not None and leaf._version != version:
                raise InplaceModificationError(
                    f"memsave: one of the variables needed for gradient computation has been modified by an "
                    f"inplace operation: {self._tensor_label(leaf, index)} saved by checkpointed region "
                    f"'{self.name}' ({_describe(leaf)}) is at version {leaf._version}; expected version {version}. "
                    f"Do not modify parameters or tensors a region uses (e.g. optimizer.step(), x.add_()) "
                    f"between its forward and backward; clone the tensor before modifying it instead."
                )

    def live_leaf(self, index: int) -> Optional[torch.Tensor]:
        """The leaf the forward saved at ``index``, when it is one and still alive, else ``None``."""
        ref = self.leaves.get(index)
        return None if ref is None else ref()

    def unpack_leaf(self, index: int, t: torch.Tensor) -> torch.Tensor:
        """Hand back a live saved leaf by identity, after checking it was not modified since it was saved."""
        saved_version = self.metas[index][3]
        if t._version != saved_version:
            if self.forward_done and index not in self.stale:
                raise InplaceModificationError(
                    f"memsave: one of the variables needed for gradient computation has been modified by an "
                    f"inplace operation: {self._tensor_label(t, index)} saved by checkpointed region "
                    f"'{self.name}' ({_describe(t)}) is at version {t._version}; expected version {saved_version}. "
                    f"Do not modify parameters or tensors a region uses (e.g. optimizer.step(), x.add_()) "
                    f"between its forward and backward; clone the tensor before modifying it instead."
                )
            raise self.stale_error(index, saved_version, t._version)
        return t

    def stale_error(self, index: int, saved: int, now: int) -> InplaceModificationError:
        return InplaceModificationError(
            f"memsave: one of the variables needed for gradient computation has been modified by an inplace "
            f"operation: saved tensor #{index} of checkpointed region '{self.name}' "
            f"({_describe_meta(self.metas[index])}) was saved at version {saved} and modified to "
            f"version {now} inside the region. Eager PyTorch fails here too: clone the tensor before "
            f"modifying it in place."
        )

    def records_for_recompute(self) -> state.ModuleRecords:
        """The module records the recompute replays: the forward's, plus module calls still in progress.

        A recompute started by a backward inside the region (before its forward returned) must also restore the
        buffers of modules whose call has begun but not ended, the watched module included.
        """
        pending = self.watched + self.calls[self.calls_base :]
        if self.forward_done or not pending:
            return self.module_records
        return self.module_records.including(pending)

    def needed(self, run: _Run, index: Optional[int], temporary: bool) -> Set[int]:
        """Indices the recompute must store for this backward: ``index`` (when given), and live handles not read yet
        and not leaves."""
        if temporary:
            return set() if index is None else {index}
        needed = set() if index is None else {index}
        for i, ref in enumerate(self.handles):
            handle = ref()
            if handle is None or i in run.unpacked or handle in run.stored:
                continue
            if self.live_leaf(i) is None:
                needed.add(i)
        return needed

    def check_recomputed(self, i: int, t: torch.Tensor, trace: Optional[List[str]]) -> None:
        """Raise when the recompute's saved tensor #i differs from the forward's (metadata, version, strict values)."""
        shape, dtype, device, version, has_history = self.metas[i]
        if self.check_metadata and (t.shape != shape or t.dtype != dtype or t.device != device):
            raise RecomputeMismatchError(
                f"memsave: torch.utils.checkpoint: Recomputed values for the following tensors have different "
                f"metadata than during the forward pass: the recompute of checkpointed region '{self.name}' does not "
                f"match its forward: saved tensor #{i} has shape {tuple(t.shape)}, dtype {t.dtype}, device "
                f"{t.device} in the recompute but shape {tuple(shape)}, dtype {dtype}, device {device} in the forward. "
                f"{_MISMATCH_ADVICE}{self.debug_table(trace, i)}"
            )
        if has_history and t._version != version and not self.allow_cache_entry_mutation:
            raise InplaceModificationError(
                f"memsave: one of the variables needed for gradient computation has been modified by an "
                f"inplace operation: {self._tensor_label(t, i)} saved by checkpointed region '{self.name}' "
                f"({_describe(t)}) is at version {t._version} in the recompute but was saved at version "
                f"{version}. A parameter, or a tensor the region uses without receiving it as an argument (a "
                f"closure variable), was modified in place between forward and backward; do not modify it "
                f"before backward (e.g. optimizer.step()), or clone it before modifying it."
            )
        if self.strict:
            _strict_compare(self.name, i, self.strict_values[i], t)

    def recompute(self, run: _Run, index: Optional[int], temporary: bool = False) -> None:
        if self.recomputing:
            raise CheckpointError(
                f"memsave: region '{self.name}' asked for its own saved tensors while recomputing them. Please "
                f"report this with the region's code."
            )
        self.check_unchanged()
        forward_done = self.forward_done
        needed = self.needed(run, index, temporary)
        run.recomputed = True
        # With nothing to store (a backward that only reads saved leaves) an early stop comes at the first pack.
        last = max(needed, default=-1)
        n = len(self.metas)
        records = self.records_for_recompute()
        args = state.map_tensors(_detach_like, self.args)
        kwargs = state.map_tensors(_detach_like, self.kwargs)
        count = [0]
        stopped = [False]
        trace: Optional[List[str]] = [] if self.trace is not None else None

        def pack(t: torch.Tensor) -> torch.Tensor:
            i = count[0]
            count[0] += 1
            value = t.detach() if t.requires_grad else t
            if trace is not None:
                trace.append(_trace_label(t))
            if i >= n:
                if not forward_done:
                    # early_stop=False in a backward inside the region: the rest of the region has not been saved by
                    # the forward yet, so there is nothing to compare with.
                    return value
                raise RecomputeMismatchError(
                    f"memsave: torch.utils.checkpoint: trying to save more tensors during recomputation than during "
                    f"the original forward pass: the recompute of checkpointed region '{self.name}' saved more "
                    f"tensors for backward than its forward did ({n}); the extra tensor #{i} is {_describe(t)}. "
                    f"{_MISMATCH_ADVICE}{self.debug_table(trace, i)}"
                )
            self.check_recomputed(i, t, trace)
            if i in needed:
                handle = self.handles[i]()
                if handle is not None:
                    run.stored[handle] = (value, t._version)
            if i >= last and self.early_stop:
                stopped[0] = True
                raise _StopRecompute()
            return value

        try:
            with _isolated_thread_state(), contextlib.ExitStack() as stack:
                self.recomputing = True
                stack.callback(setattr, self, "recomputing", False)
                stack.enter_context(torch.enable_grad())
                if self.rng is not None:
                    stack.enter_context(self.rng.fork_and_restore())
                if self.generators:
                    stack.enter_context(replayed_generators(self.generators))
                for ctx in self.autocast.contexts():
                    stack.enter_context(ctx)
                if self.device != _default_device():
                    stack.enter_context(torch.device(self.device if self.device is not None else "cpu"))
                stack.enter_context(state.ReplayedModuleState(records))
                stack.enter_context(compat.region_saved_tensors_hooks(pack, _identity))
                if self.recompute_context is not None:
                    stack.enter_context(self.recompute_context)
                self.fn(*args, **kwargs)
        except _StopRecompute:
            if not stopped[0]:  # pragma: no cover - only our own pack hook raises it
                raise
        if not stopped[0] and forward_done and count[0] != n:
            raise RecomputeMismatchError(
                f"memsave: torch.utils.checkpoint: A different number of tensors was saved during the original "
                f"forward and recomputation: the recompute of checkpointed region '{self.name}' saved {count[0]} "
                f"tensors for backward but its forward saved {n}. {_MISMATCH_ADVICE}{self.debug_table(trace, count[0])}"
            )

    def debug_table(self, recompute: Optional[List[str]], at: int) -> str:
        """With ``debug=True``: the saved tensors of both runs around index ``at``, for a mismatch error."""
        if self.trace is None or recompute is None:
            return ""
        lo = max(0, at - 4)
        hi = max(len(self.trace), len(recompute))
        hi = min(hi, at + 3)
        rows = [
            f"  #{i}: forward {self.trace[i] if i < len(self.trace) else '-'} | recompute "
            f"{recompute[i] if i < len(recompute) else '-'}"
            for i in range(lo, hi)
        ]
        # torch's key phrase first, so code matching torch's debug error matches this one too.
        head = (
            "\nYou are seeing this error because you passed `debug=True` to checkpoint (or "
            "set_checkpoint_debug_enabled(True)). Saved tensors, forward | recompute:\n"
        )
        return (head + "\n".join(rows)) if rows else ""

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
    "shapes from non-replayed randomness, flags flipped after forward), or do not checkpoint it."
)


def _identity(x: Any) -> Any:
    return x


def _same(t: torch.Tensor) -> torch.Tensor:
    return t


def _trace_label(t: torch.Tensor) -> str:
    producer = type(t.grad_fn).__name__ if t.grad_fn is not None else "leaf"
    return f"{producer} {tuple(t.shape)} {str(t.dtype).replace('torch.', '')} {t.device}"


def _default_device() -> Optional[torch.device]:
    """The device of the innermost default-device context (``with torch.device(...)``, ``set_default_device``)."""
    for mode in reversed(_get_current_function_mode_stack()):
        if isinstance(mode, DeviceContext):
            return torch.device(mode.device)
    return None


def _backward_key() -> Tuple[Optional[Hashable], bool]:
    """What identifies the backward running now: (key, whether it is a graph task that ends by itself).

    torch's ``GraphExecGroup`` (backward calls sharing one recompute) wins over the graph task id; ``None`` outside
    any backward (``grad_fn._saved_*`` read from Python), where each read recomputes.
    """
    group = compat.checkpoint_exec_group()
    if group is not None:
        return group, False
    gid = torch._C._current_graph_task_id()
    return (None, False) if gid == -1 else (gid, True)


def _drop_run_when_backward_ends(frame: _Frame, key: Hashable) -> None:
    frame_ref = weakref.ref(frame)

    def drop() -> None:
        f = frame_ref()
        if f is not None:
            f.runs.pop(key, None)

    with contextlib.suppress(RuntimeError):  # not inside the engine: the run stays until the frame dies
        torch.autograd.Variable._execution_engine.queue_callback(drop)


def _run_for(frame: _Frame, key: Optional[Hashable], ends: bool) -> _Run:
    """The frame's run for this backward (a fresh unregistered one when the backward has no key)."""
    run = frame.runs.get(key) if key is not None else None
    if run is None:
        run = _Run()
        if key is not None:
            frame.runs[key] = run
            if ends:
                _drop_run_when_backward_ends(frame, key)
    return run


def _rerun_for_leaves(frame: _Frame, key: Optional[Hashable], ends: bool) -> None:
    """Rerun the region once for a backward that reads only saved leaves (its inputs, parameters).

    torch.utils.checkpoint reruns a region at the first unpack of each backward whatever it unpacks, so a region's
    Python side effects happen as often under memsave as under torch. The rerun stores nothing: with early stop it
    ends at its first saved tensor, before that operator's kernel runs.
    """
    if key is None or not frame.forward_done or frame.recomputing:
        return
    run = _run_for(frame, key, ends)
    if run.recomputed or frame.needed(run, None, False):
        return  # rerun already, or it reruns when backward reads one of the tensors it did not keep
    frame.recompute(run, None)


def _unpack(handle: _Handle) -> torch.Tensor:
    frame = handle.frame
    index = handle.index
    key, ends = _backward_key()
    with frame.lock:
        stale = frame.stale.get(index)
        if stale is not None:
            raise frame.stale_error(index, *stale)
        leaf = frame.live_leaf(index)
        if leaf is not None:
            _rerun_for_leaves(frame, key, ends)
            return frame.unpack_leaf(index, leaf)
        run = _run_for(frame, key, ends)
        if index in run.unpacked:
            group = (
                ""
                if ends
                else (
                    " Performing two backward calls that overlap (i.e. require the same saved activation in order to "
                    "compute gradients) is not allowed while under the torch.utils.checkpoint.GraphExecGroup context: "
                    "they share one recompute."
                )
            )
            raise CheckpointError(
                f"memsave: torch.utils.checkpoint: Unpack is being triggered for a tensor that was already unpacked "
                f"once: saved tensor #{index} of checkpointed region '{frame.name}' "
                f"({_describe_meta(frame.metas[index])}) is unpacked a second time in the same backward. A region's "
                f"recomputed tensors are freed as soon as backward reads them (as in torch.utils.checkpoint): if a "
                f"custom autograd.Function reads ctx.saved_tensors in its backward, read it once and keep the result. "
                f"A new backward (retain_graph=True) recomputes them again.{group}"
            )
        entry = run.stored.pop(handle, None)
        if entry is None:
            frame.recompute(run, index, temporary=key is None)
            entry = run.stored.pop(handle, None)
            if entry is None:  # pragma: no cover - the recompute checks the count of saved tensors
                raise CheckpointError(
                    f"memsave: internal error: the recompute of region '{frame.name}' did not produce saved "
                    f"tensor #{index}. Please report this with the region's code."
                )
        run.unpacked.add(index)
    t, version = entry
    if t._version != version:
        raise InplaceModificationError(
            f"memsave: one of the variables needed for gradient computation has been modified by an inplace "
            f"operation: saved tensor #{index} of checkpointed region '{frame.name}' ({_describe(t)}) is at "
            f"version {t._version}; expected version {version}. Clone the tensor before modifying it in place."
        )
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
    # A tensor that does not require grad has no graph to cut: the recompute gets the object itself (its identity
    # and Python attributes kept, as torch's recompute does).
    return t.detach().requires_grad_() if t.requires_grad else t


def _tensor_args(args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> List[Tuple[str, torch.Tensor]]:
    found = list(state.iter_tensors(list(args), "args"))
    found += list(state.iter_tensors(kwargs, "kwargs"))
    return found


def _describe(t: torch.Tensor) -> str:
    return f"shape {tuple(t.shape)}, dtype {t.dtype}, device {t.device}"


def _describe_meta(meta: _Meta) -> str:
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
            f"backward."
        )


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


def _watched_modules(fn: Any) -> Tuple[nn.Module, ...]:
    """Modules whose forward body ``fn`` runs without their ``__call__``: a bound ``model.forward``, or a
    ``functools.partial(forward, module, ...)`` (how Hugging Face layers call their checkpoint function)."""
    owner = getattr(fn, "__self__", None)
    if inspect.ismethod(fn) and isinstance(owner, nn.Module):
        return (owner,)
    if (
        isinstance(fn, functools.partial)
        and fn.args
        and isinstance(fn.args[0], nn.Module)
        and not isinstance(fn.func, nn.Module)
    ):
        return (fn.args[0],)
    return ()


def _check_callable(fn: Any, where: str) -> None:
    if not callable(fn):
        raise TypeError(
            f"memsave.{where}: fn must be callable (a function, a bound method or an nn.Module), got "
            f"{type(fn).__name__}. Pass the function first and its arguments after it: {where}(fn, *args, **kwargs)."
        )


def check_region_options(where: str, **options: Any) -> None:
    """Raise a TypeError naming the option when one of memsave's own region options has a wrong type.

    ``name`` must be a str or None; ``respect_saved_tensors_hooks`` None or a bool (True only on a torch that has
    it); every other option (``strict``, ``preserve_rng_state``, ``early_stop``) a bool.
    """
    for option, value in options.items():
        if option == "name":
            if value is not None and not isinstance(value, str):
                raise TypeError(
                    f"memsave.{where}: name must be a str (the region's name in error messages) or None, got "
                    f"{type(value).__name__}"
                )
        elif option == "respect_saved_tensors_hooks":
            _check_respect_saved_tensors_hooks(where, value)
        elif not isinstance(value, bool):
            raise TypeError(f"memsave.{where}: {option} must be True or False, got {value!r}")


def _check_respect_saved_tensors_hooks(where: str, value: Any) -> None:
    if value is not None and not isinstance(value, bool):
        raise TypeError(f"memsave.{where}: respect_saved_tensors_hooks must be None, True or False, got {value!r}")
    if value and not compat.selective_saves_can_use_hooks():
        raise TypeError(
            f"memsave.{where}: respect_saved_tensors_hooks=True needs a torch whose selective checkpoint can route its "
            f"saved tensors through saved_tensors_hooks (torch {torch.__version__} cannot; torch 2.15 can). Leave it "
            f"None or False on this torch"
        )


def run_region(
    fn: Callable[..., Any],
    args: Tuple[Any, ...],
    kwargs: Dict[str, Any],
    options: RegionOptions,
    *,
    name: str,
    watch: Sequence[nn.Module] = (),
) -> Any:
    """Run ``fn(*args, **kwargs)`` as a checkpointed region (the common path of every public entry point).

    Args:
        fn, args, kwargs: the region and its arguments.
        options: how it runs (checked beforehand, e.g. by :meth:`RegionOptions.checked`).
        name: the region's name in error messages.
        watch: modules whose own ``__call__`` started outside the region but whose forward body runs inside it
            (a wrapped module, ``self`` of a checkpointed method): their buffers and training flag are recorded
            here, since the global pre-hook ran before the region existed.

    Returns:
        Whatever ``fn`` returns.
    """
    if not torch.is_grad_enabled():
        return fn(*args, **kwargs)
    if torch.compiler.is_compiling():
        return _compiled_region(fn, args, kwargs, options)
    options = options.under_global_switches()  # as torch, at each call: a wrapped module's region too
    forward_context, recompute_context = _open_contexts(name, options.context_fn)
    compat.route_selective_saves(forward_context, options.respect_saved_tensors_hooks)
    frame = _Frame(fn, args, kwargs, name, options, recompute_context)
    entry_versions = [(path, t, t._version) for path, t in _tensor_args(args, kwargs)]
    frame.arg_versions = entry_versions
    frame.watched = [(m, state.ModuleSnapshot(m)) for m in watch]
    cuda_was_initialized = torch.cuda.is_available() and torch.cuda.is_initialized()
    state.acquire_module_hooks()
    state.tls.records.append(frame.module_records)
    # Explicit torch.Generator objects are replayed too (the default generators are in frame.rng).
    recorder = GeneratorRecorder() if options.preserve_rng_state else None
    try:
        with (
            compat.region_saved_tensors_hooks(frame.pack, _unpack),
            forward_context if forward_context is not None else contextlib.nullcontext(),
            recorder if recorder is not None else contextlib.nullcontext(),
        ):
            out = fn(*args, **kwargs)
        frame.generators = recorder.states if recorder is not None else []
    finally:
        stack = state.tls.records
        if stack and stack[-1] is frame.module_records:
            stack.pop()
        else:  # pragma: no cover - defensive: keep the stack consistent whatever happened inside
            state.tls.records = [t for t in stack if t is not frame.module_records]
        state.release_module_hooks()
    for module, snap in frame.watched:
        frame.module_records.note(module, snap, snap.buffers_changed(module))
    frame.watched = []
    for path, t, version in entry_versions:
        if t._version != version:
            raise InplaceModificationError(
                f"memsave: checkpointed region '{name}' modified its argument {path} ({_describe(t)}) in place "
                f"during forward (version {version} -> {t._version}). Its recompute in backward would start from "
                f"the modified value and give wrong gradients. Clone the argument inside the region before "
                f"modifying it, use the out-of-place operation (e.g. nn.ReLU(inplace=False)), or move the in-place "
                f"operation out of the region."
            )
    if (
        frame.rng is not None
        and not cuda_was_initialized
        and torch.cuda.is_available()
        and torch.cuda.is_initialized()
        and frame.metas
    ):
        warnings.warn(
            f"memsave: CUDA was initialised inside checkpointed region '{name}', so its CUDA RNG state could not be "
            f"saved at region entry and random operations on CUDA (dropout) may differ in the recompute. "
            f"Initialise CUDA before the first checkpointed forward (e.g. torch.cuda.init() or model.cuda()).",
            MemsaveWarning,
            stacklevel=3,
        )
    frame.finish_forward()  # the loop above checked the arguments are still at their entry versions
    return out


def _compiled_region(
    fn: Callable[..., Any], args: Tuple[Any, ...], kwargs: Dict[str, Any], options: RegionOptions
) -> Any:
    """A region met while dynamo traces (``torch.compile``): lowered to torch's own checkpoint.

    memsave's saved-tensor hooks and recompute run Python that dynamo cannot put in a graph. torch's non-reentrant
    checkpoint is what dynamo understands: it becomes a tagged subgraph, and AOTAutograd's partitioner recomputes
    that subgraph's activations in the compiled backward instead of saving them. Buffer updates (BatchNorm) happen
    once, in the forward graph, since the compiled backward recomputes only the pure operations.
    """
    region = functools.partial(fn, **kwargs) if kwargs else fn
    determinism_check = "default" if options.check_metadata else "none"
    preserve_rng_state, context_fn = options.preserve_rng_state, options.context_fn
    if context_fn is None:  # torch's default context_fn is a function dynamo would try to trace
        return torch_checkpoint.checkpoint(
            region,
            *args,
            use_reentrant=False,
            preserve_rng_state=preserve_rng_state,
            determinism_check=determinism_check,
        )
    # dynamo calls context_fn itself, at compile time: it must be the caller's function or partial, not a closure.
    return torch_checkpoint.checkpoint(
        region,
        *args,
        use_reentrant=False,
        preserve_rng_state=preserve_rng_state,
        determinism_check=determinism_check,
        context_fn=context_fn,
    )


_DETERMINISM_CHECKS = ("default", "none")


def _is_noop_context_fn(context_fn: Any) -> bool:
    return context_fn is None or context_fn is compat.noop_context_fn()


def _torch_options(
    where: str,
    use_reentrant: Optional[bool],
    preserve_rng_state: bool,
    context_fn: Optional[Callable[[], Any]],
    determinism_check: str,
    debug: bool,
    early_stop: bool,
    respect_saved_tensors_hooks: Optional[bool] = None,
) -> RegionOptions:
    """Check torch.utils.checkpoint's keyword arguments as :func:`checkpoint` takes them (see its docstring).

    Returns:
        The region's options (torch's global switches are applied at each call, by :func:`run_region`).
    """
    check_region_options(
        where, preserve_rng_state=preserve_rng_state, respect_saved_tensors_hooks=respect_saved_tensors_hooks
    )
    if use_reentrant is not None and not isinstance(use_reentrant, bool):
        raise TypeError(f"memsave.{where}: use_reentrant must be None, True or False, got {use_reentrant!r}")
    if use_reentrant:
        warnings.warn(
            f"memsave.{where}: use_reentrant=True asks for torch's reentrant checkpoint; memsave's regions are always "
            f"non-reentrant (the same gradients, and parameter gradients even when no input requires grad). Pass "
            f"use_reentrant=False to silence this warning.",
            MemsaveWarning,
            stacklevel=3,
        )
    if determinism_check not in _DETERMINISM_CHECKS:
        raise ValueError(
            f"memsave.{where}: determinism_check must be one of {', '.join(_DETERMINISM_CHECKS)} "
            f"(as for torch.utils.checkpoint), got {determinism_check!r}"
        )
    if not isinstance(debug, bool) or not isinstance(early_stop, bool):
        raise TypeError(f"memsave.{where}: debug and early_stop must be bools, got {debug!r} and {early_stop!r}")
    return RegionOptions(
        preserve_rng_state=preserve_rng_state,
        early_stop=early_stop,
        check_metadata=determinism_check == "default",
        debug=debug,
        context_fn=check_context_fn(where, context_fn),
        respect_saved_tensors_hooks=respect_saved_tensors_hooks,
    )


def check_context_fn(where: str, context_fn: Any) -> Optional[Callable[[], Tuple[Any, Any]]]:
    """``context_fn`` as :func:`run_region` takes it: ``None`` for none (torch's ``noop_context_fn`` included).

    Raises:
        TypeError: ``context_fn`` is not callable.
    """
    if _is_noop_context_fn(context_fn):
        return None
    if not callable(context_fn):
        raise TypeError(
            f"memsave.{where}: context_fn must be a function returning two context managers (forward, "
            f"recompute), as for torch.utils.checkpoint; got {type(context_fn).__name__}"
        )
    return context_fn


def _open_contexts(name: str, context_fn: Optional[Callable[[], Tuple[Any, Any]]]) -> Tuple[Any, Any]:
    """One call's ``(forward, recompute)`` context managers from ``context_fn``: ``(None, None)`` without one."""
    if context_fn is None:
        return None, None
    pair = context_fn()
    if not (
        isinstance(pair, tuple)
        and len(pair) == 2
        and all(hasattr(c, "__enter__") and hasattr(c, "__exit__") for c in pair)
    ):
        raise TypeError(
            f"memsave: context_fn of checkpointed region '{name}' must return a tuple of two context "
            f"managers (forward, recompute), got {pair!r}"
        )
    return pair[0], pair[1]


def checkpoint(
    fn: Callable[..., Any],
    *args: Any,
    use_reentrant: Optional[bool] = None,
    preserve_rng_state: bool = True,
    context_fn: Optional[Callable[[], Tuple[Any, Any]]] = None,
    determinism_check: str = "default",
    debug: bool = False,
    early_stop: bool = True,
    respect_saved_tensors_hooks: Optional[bool] = None,
    **kwargs: Any,
) -> Any:
    """Run ``fn(*args, **kwargs)`` without keeping its activations; recompute them in backward.

    A drop-in for ``torch.utils.checkpoint.checkpoint``: it takes torch's keyword arguments with torch's meaning (see
    below), and every other keyword argument goes to ``fn`` untouched (a region function may take ``name`` or
    ``strict``). memsave's own region options, a name for error messages and the strict value check, are set with
    :func:`checkpointed` (``checkpointed(fn, name="encoder", strict=True)(*args)``) or :func:`~memsave.wrap`.

    Non-reentrant: the forward builds the real autograd graph, so arguments that do not require grad (frozen
    embeddings, images, token ids) still give gradients to the parameters used inside ``fn``; arguments and
    outputs may be tensors nested in tuples, lists and dicts, or non-tensors; ``torch.autograd.grad`` may be
    called inside ``fn`` (gradient penalty). Gradients, outputs, BatchNorm buffers and the RNG stream are bitwise
    equal to running ``fn`` without checkpointing (CPU, float32). When grad mode is off, ``fn`` is simply called.

    Hugging Face transformers models checkpoint their layers through their own switch
    (``model.activation_checkpointing_enable()``); :func:`memsave.integrations.transformers.enable` makes that
    switch run memsave's regions, and the ``Memsave`` Trainer callback does it in one line.

    Args:
        fn: the region: a function, bound method, ``functools.partial`` or ``nn.Module``.
        *args: positional arguments of ``fn``.
        use_reentrant: torch's choice of implementation. memsave is always non-reentrant: ``None`` (memsave's
            default; torch's warns and means ``True``) and ``False`` run as usual; ``True`` runs non-reentrant too,
            with a :class:`~memsave.errors.MemsaveWarning`: where torch's reentrant checkpoint works the gradients
            are the same, and it also gives parameter gradients when no input requires grad.
        preserve_rng_state: replay the CPU and CUDA RNG states of the forward in the recompute, so random
            operations (dropout) draw the same numbers. ``False`` saves a little time but is not lossless.
        context_fn: a function returning two context managers; the forward runs inside the first, every
            recompute inside the second (as in torch). ``None`` or torch's ``noop_context_fn``: none. Selective
            recompute: :func:`memsave.selective` or torch's ``create_selective_checkpoint_contexts`` (the
            operators the policy saves are not run again in backward).
        determinism_check: ``"default"``: compare the shapes, dtypes and devices of the recomputed saved tensors
            with the forward's (:class:`~memsave.errors.RecomputeMismatchError` naming the region); ``"none"``: skip
            that comparison (the count of saved tensors and in-place checks stay).
        debug: on a recompute mismatch, list both runs' saved tensors (producer, shape, dtype, device) around the
            first difference in the error. torch's ``set_checkpoint_debug_enabled`` overrides it.
        early_stop: stop the recompute as soon as it has every saved tensor backward still needs (the default);
            ``False`` reruns the whole region. Buffers, RNG and the caller's state are restored either way.
            torch's ``set_checkpoint_early_stop`` overrides it.
        respect_saved_tensors_hooks: with a selective ``context_fn`` inside the user's ``saved_tensors_hooks``
            (``save_on_cpu``): ``True`` routes the tensors the policy saves through those hooks, ``False`` keeps
            them as they are, ``None`` is torch's default (torch 2.15: as ``False``, with torch's
            ``FutureWarning``). memsave's own hooks never count as the user's. ``True`` needs torch 2.15 or newer.
        **kwargs: keyword arguments of ``fn``, passed to it unchanged.

    Returns:
        Whatever ``fn`` returns.

    Raises:
        TypeError: ``fn`` is not callable, ``debug``/``early_stop``/``preserve_rng_state`` are not bools,
            ``use_reentrant`` or ``respect_saved_tensors_hooks`` is not None or a bool (or is True on a torch
            without it), or ``context_fn`` does not return two context managers.
        ValueError: an unknown ``determinism_check``.
        RecomputeMismatchError: (in backward) the recompute saved tensors of other shapes/dtypes/devices.
        InplaceModificationError: ``fn`` modified one of its tensor arguments in place (at forward), or an
            argument / tensor the region saved was modified in place before backward (at backward).
        CheckpointError: (in backward) a recomputed saved tensor was read twice in one backward.

    Warns:
        MemsaveWarning: ``use_reentrant=True``.

    Examples:
        >>> block = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))
        >>> y = memsave.checkpoint(block, x, use_reentrant=False)   # as with torch.utils.checkpoint
        >>> y.sum().backward()
    """
    _check_callable(fn, "checkpoint")
    options = _torch_options(
        "checkpoint",
        use_reentrant,
        preserve_rng_state,
        context_fn,
        determinism_check,
        debug,
        early_stop,
        respect_saved_tensors_hooks,
    )
    return run_region(fn, args, kwargs, options, name=_region_name(fn, None), watch=_watched_modules(fn))


def checkpointed(
    fn: Optional[F] = None,
    *,
    name: Optional[str] = None,
    strict: bool = False,
    preserve_rng_state: bool = True,
    early_stop: bool = True,
    context_fn: Optional[Callable[[], Tuple[Any, Any]]] = None,
) -> Union[F, Callable[[F], F]]:
    """Decorator: every call of the function (or ``forward`` method) runs as a :func:`checkpoint` region.

    Usable bare (``@checkpointed``), with options (``@checkpointed(strict=True)``), or for one call with region
    options (``checkpointed(f, name="encoder", strict=True)(x)``). On a ``forward`` method in a class body it applies
    to every instance; the module's buffers and ``training`` flag are handled as for modules called inside the
    region. Every argument of the decorated function, keywords included, is passed to it unchanged.

    Args:
        fn: the function or method (omit it to pass options).
        name: the region's name in error messages (default: the module's class name or ``fn.__qualname__``).
        strict: also keep the tensors the forward saved and compare the recompute's with them bitwise
            (:class:`~memsave.errors.RecomputeMismatchError` on a difference). For debugging only: it uses as much
            memory as not checkpointing.
        preserve_rng_state, early_stop, context_fn: as for :func:`checkpoint` (``context_fn`` is called once per
            call of the region).

    Returns:
        The wrapped function (``functools.wraps`` keeps its name and docstring), or a decorator when ``fn`` is
        omitted.

    Raises:
        TypeError: ``fn`` or ``context_fn`` is not callable, ``name`` is not a str, or ``strict``,
            ``preserve_rng_state`` or ``early_stop`` is not a bool.

    Examples:
        >>> class Block(nn.Module):
        ...     @memsave.checkpointed
        ...     def forward(self, x):
        ...         return self.mlp(self.norm(x)) + x
        >>> y = memsave.checkpointed(f, name="encoder", strict=True)(x)   # one call with region options
    """
    if fn is None:

        def decorate(f: F) -> F:
            return checkpointed(
                f,
                name=name,
                strict=strict,
                preserve_rng_state=preserve_rng_state,  # type: ignore
                early_stop=early_stop,
                context_fn=context_fn,
            )

        return decorate
    _check_callable(fn, "checkpointed")
    check_region_options("checkpointed", name=name)
    options = RegionOptions.checked(
        "checkpointed",
        strict=strict,
        preserve_rng_state=preserve_rng_state,
        early_stop=early_stop,
        context_fn=context_fn,
    )
    region = _region_name(fn, name)
    fixed_watch = _watched_modules(fn)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        # For a method, args[0] is the module: its __call__ (and the global pre-hook) ran before the region.
        watch = (args[0],) if args and isinstance(args[0], nn.Module) else fixed_watch
        return run_region(fn, args, kwargs, options, name=region, watch=watch)

    wrapper.__memsave_checkpointed__ = True  # type: ignore[attr-defined]
    return wrapper


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


def checkpoint_sequential(
    modules: Union[nn.Sequential, nn.ModuleList, Sequence[Callable[..., Any]]],
    segments: int,
    input: Any,
    use_reentrant: Optional[bool] = None,
    *,
    preserve_rng_state: bool = True,
    context_fn: Optional[Callable[[], Tuple[Any, Any]]] = None,
    determinism_check: str = "default",
    debug: bool = False,
) -> Any:
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
        input: the input of the first module (a tensor, or anything the first module accepts); positional or
            ``input=`` as in torch's signature.
        use_reentrant, preserve_rng_state, context_fn, determinism_check, debug: as for :func:`checkpoint`
            (``use_reentrant=True`` warns and runs non-reentrant), for every segment's region.

    Returns:
        The output of the last module.

    Raises:
        TypeError: ``modules`` is not a sequence of callables, or ``segments`` is not an int.
        ValueError: ``segments`` is not between 1 and the number of modules.

    Warns:
        MemsaveWarning: ``use_reentrant=True``.

    Examples:
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
            f"modules, got {type(modules).__name__}. For a single module or function use memsave.checkpoint."
        )
    for i, m in enumerate(mods):
        if not callable(m):
            raise TypeError(f"memsave.checkpoint_sequential: modules[{i}] is a {type(m).__name__}, not callable.")
    n = len(mods)
    if isinstance(segments, bool) or not isinstance(segments, int):
        raise TypeError(f"memsave.checkpoint_sequential: segments must be an int, got {type(segments).__name__}.")
    if segments <= 0 or segments > n:
        raise ValueError(
            f"memsave.checkpoint_sequential: segments must be between 1 and the number of modules ({n}), got "
            f"{segments}. Use at most one segment per module; 2 segments is the classic choice for a plain stack."
        )
    # torch's checkpoint_sequential has no early_stop of its own; its global switch applies.
    options = _torch_options(
        "checkpoint_sequential", use_reentrant, preserve_rng_state, context_fn, determinism_check, debug, True
    )
    if not torch.is_grad_enabled():
        return ModuleChain(mods)(input)
    size = n // segments
    out = input
    for k in range(segments - 1):
        start, end = k * size, (k + 1) * size
        seg = mods[start:end]
        skip = count_leading_inplace(seg)
        for module in seg[:skip]:
            out = module(out)
        if skip < len(seg):
            out = run_region(ModuleChain(seg[skip:]), (out,), {}, options, name=f"{prefix}[{start + skip}:{end}]")
    for module in mods[(segments - 1) * size :]:
        out = module(out)
    return out
