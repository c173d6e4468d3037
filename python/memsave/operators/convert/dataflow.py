"""Which modules read a module's output: ``memsave.convert(model, fuse=True)`` runs the model once on a probe input
and traces it.

A norm can be fused into the Linears that read its output only if nothing else reads it; an activation into the
Linear after it, likewise. Module names and forward code do not say this reliably; one traced forward does. The
trace runs the model (in training mode, under ``no_grad``, RNG forked, buffers restored afterwards) with a forward
pre-hook and hook on every module and a ``TorchFunctionMode`` that sees every torch function applied to a watched
module's output. A use is attributed to the innermost module call that received that tensor as an input (so
``q_proj(hidden)`` is read by ``q_proj``, and ``hidden.shape`` or ``hidden.to(its own dtype)`` by nobody); a use
outside any such call (``residual + hidden``, ``hidden.view(...)`` in the caller) is an operation reader.

The probe input: a model that declares its vocabulary (``config.vocab_size``) and takes ``input_ids`` -- a Hugging Face
language model, a PEFT model around one -- gets 8 random token ids (seeded). A model that declares no input gets no
trace: convert then fuses nothing that needs one (see :mod:`.structure`).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Set, Tuple

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from .probe import PROBE_SEED, seeded, training

Tensor = torch.Tensor

__all__ = ["Dataflow", "Readers", "probe_call", "trace"]

_PROBE_TOKENS = 8

# Tensor functions that read only metadata: not a use of the values.
_METADATA = frozenset(
    (
        "shape", "dtype", "device", "size", "dim", "ndim", "ndimension", "numel", "nelement", "is_floating_point",
        "is_complex", "is_contiguous", "stride", "requires_grad", "layout", "is_cuda", "is_cpu", "is_meta",
        "element_size", "is_sparse", "is_quantized", "data_ptr", "storage_offset", "get_device", "__len__",
        "is_nested", "_version", "grad_fn", "names", "is_leaf", "dim_order", "is_inference", "__format__",
    )
)  # fmt: skip


@dataclass
class Readers:
    """What read one module's output during the traced forward.

    Attributes:
        modules: the modules that read it (by id), each the innermost call that received it as an input.
        ops: torch functions applied to it outside such a call (``"add"``, ``"view"``, ...).

    Examples:
        >>> sorted(flow.readers[id(layer.input_layernorm)].ops)
        []
    """

    modules: Dict[int, nn.Module] = field(default_factory=dict)
    ops: Set[str] = field(default_factory=set)


@dataclass
class Dataflow:
    """The result of :func:`trace`.

    Attributes:
        readers: ``id(producer) -> Readers`` for every watched module that ran.
        first_inputs: ``id(module) -> [id(producer) or None per call]``: which watched module produced the first
            tensor argument of each call of every module that ran (None: something else did).

    Examples:
        >>> flow.only_readers(layer.input_layernorm)                # q_proj, k_proj, v_proj
    """

    readers: Dict[int, Readers] = field(default_factory=dict)
    first_inputs: Dict[int, List[Optional[int]]] = field(default_factory=dict)

    def only_readers(self, producer: nn.Module) -> Optional[List[nn.Module]]:
        """The modules that alone read ``producer``'s output, each called only on it; None if anything else reads it
        (an operation, or a reader also called on other inputs) or ``producer`` did not run."""
        r = self.readers.get(id(producer))
        if r is None or r.ops or not r.modules:
            return None
        for m in r.modules.values():
            if any(owner != id(producer) for owner in self.first_inputs.get(id(m), [None])):
                return None
        return list(r.modules.values())

    def describe(self, producer: nn.Module, names: Dict[int, str]) -> str:
        """What reads ``producer``'s output, for the report: ``"add, model.layers.0.mlp"``."""
        r = self.readers.get(id(producer))
        if r is None:
            return "nothing (it did not run in the probe forward)"
        parts = sorted(r.ops) + [names.get(i, type(m).__name__) for i, m in r.modules.items()]
        return ", ".join(parts) if parts else "nothing"


def _flat_tensors(args: Iterable[Any], kwargs: Optional[Dict[str, Any]] = None) -> List[Tensor]:
    out: List[Tensor] = []
    for a in list(args) + list((kwargs or {}).values()):
        if isinstance(a, Tensor):
            out.append(a)
        elif isinstance(a, (list, tuple)):
            out.extend(t for t in a if isinstance(t, Tensor))
    return out


def _func_name(func: Any) -> str:
    name = getattr(func, "__name__", "")
    if name == "__get__":  # a property of Tensor (shape, dtype, ...)
        name = getattr(getattr(func, "__self__", None), "__name__", name)
    return name or repr(func)


@dataclass
class _Frame:
    module: nn.Module
    inputs: Set[int]


class _Tracer(TorchFunctionMode):
    """Attributes each torch function applied to a watched output to the innermost module call that got it."""

    def __init__(self, owners: Dict[int, int], stack: List[_Frame], flow: Dataflow) -> None:
        super().__init__()
        self.owners, self.stack, self.flow = owners, stack, flow

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in _flat_tensors(args, kwargs):
            owner = self.owners.get(id(t))
            if owner is None or out is t or _func_name(func) in _METADATA:
                continue
            readers = self.flow.readers.setdefault(owner, Readers())
            frame = next((f for f in reversed(self.stack) if id(t) in f.inputs), None)
            if frame is None:
                readers.ops.add(_func_name(func))
            else:
                readers.modules[id(frame.module)] = frame.module
        return out


def probe_call(model: nn.Module) -> Tuple[Optional[nn.Module], Dict[str, Any], str]:
    """The module of ``model`` to run for the trace, with its keyword arguments, or ``(None, {}, why not)``.

    The topmost module (``model`` itself first) that has ``config.vocab_size`` and whose forward takes
    ``input_ids`` gets ``input_ids`` of 8 seeded random tokens (and ``use_cache=False`` where it takes it).

    Examples:
        >>> module, kwargs, _ = probe_call(llama)
        >>> sorted(kwargs)
        ['input_ids', 'use_cache']
    """
    for _, m in model.named_modules():
        vocab = getattr(getattr(m, "config", None), "vocab_size", None)
        if not isinstance(vocab, int) or isinstance(vocab, bool) or vocab <= 0:
            continue
        try:
            params = inspect.signature(m.forward).parameters
        except (TypeError, ValueError):
            continue
        if "input_ids" not in params:
            continue
        first = next(iter(m.parameters()), None)
        device = first.device if first is not None else torch.device("cpu")
        gen = torch.Generator().manual_seed(PROBE_SEED)
        kwargs: Dict[str, Any] = {"input_ids": torch.randint(0, vocab, (1, _PROBE_TOKENS), generator=gen).to(device)}
        if "use_cache" in params:
            kwargs["use_cache"] = False
        return m, kwargs, ""
    return None, {}, "the model declares no input to probe it with (no config.vocab_size and input_ids)"


def _hooks(model: nn.Module, watched: Set[int], owners: Dict[int, int], stack: List[_Frame], flow: Dataflow) -> list:
    keep: List[Tensor] = []  # watched outputs stay alive, so their ids stay unique during the trace

    def pre(module: nn.Module, args: Any, kwargs: Any) -> None:
        tensors = _flat_tensors(args, kwargs)
        stack.append(_Frame(module, {id(t) for t in tensors}))
        first = tensors[0] if tensors else None
        flow.first_inputs.setdefault(id(module), []).append(owners.get(id(first)) if first is not None else None)

    def post(module: nn.Module, args: Any, kwargs: Any, output: Any) -> None:
        if stack and stack[-1].module is module:
            stack.pop()
        if id(module) in watched and isinstance(output, Tensor):
            owners[id(output)] = id(module)
            keep.append(output)
            flow.readers.setdefault(id(module), Readers())

    handles = []
    for m in model.modules():
        handles.append(m.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(m.register_forward_hook(post, with_kwargs=True, always_call=True))
    return handles


def trace(model: nn.Module, call: Callable[[], Any], producers: Iterable[nn.Module]) -> Dataflow:
    """Run ``call()`` (a forward of ``model`` on its probe input) and record who reads the outputs of ``producers``.

    Args:
        model: the model (every module of it is hooked for the call; the hooks are removed afterwards).
        call: runs the forward, e.g. ``lambda: module(**kwargs)`` with :func:`probe_call`'s answer.
        producers: the modules whose outputs to follow.

    Returns:
        The :class:`Dataflow`. The model is left as it was: training flags, buffers, RNG state, hooks.

    Raises:
        Exception: whatever the forward raises (the caller reports it).

    Examples:
        >>> module, kwargs, _ = probe_call(llama)
        >>> flow = trace(llama, lambda: module(**kwargs), [llama.model.layers[0].input_layernorm])
    """
    flow = Dataflow()
    owners: Dict[int, int] = {}
    stack: List[_Frame] = []
    watched = {id(p) for p in producers}
    buffers = [(b, b.detach().clone()) for b in model.buffers()]
    handles = _hooks(model, watched, owners, stack, flow)
    first = next(iter(model.parameters()), None)
    try:
        with torch.no_grad(), seeded([first] if first is not None else []) as reseed, training([model]):
            reseed()
            with _Tracer(owners, stack, flow):
                call()
    finally:
        for h in handles:
            h.remove()
        with torch.no_grad():
            for b, saved in buffers:
                b.copy_(saved)
    return flow
