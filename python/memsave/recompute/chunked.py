"""Chunked position-wise modules: :func:`chunked` runs a module slice by slice along the sequence.

A position-wise module (an MLP, a gated MLP, a norm followed by an MLP) treats every position of its input on its own,
so it can run on slices of the input along the sequence dimension and concatenate the results. Each slice runs as a
checkpointed region (:func:`memsave.checkpoint`'s runtime): its forward keeps only its input, a view of the module's
input, and its backward recomputes that slice's intermediates just before using them. Only one slice's intermediates
are alive at a time, in forward and in backward, so the module's activation memory is divided by the number of slices
(the idea of the tiled MLP of Arctic Long Sequence Training). Parameter gradients are summed over the slices by
autograd: equal to the unchunked module's up to float rounding, not bitwise.

Inside a checkpointed region (:func:`memsave.wrap`, a plan) the slices are regions nested in the outer one: the outer
recompute runs the module slice by slice again. Under ``torch.compile`` each slice lowers to torch's non-reentrant
checkpoint, as every memsave region does.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
from typing import Any, Callable, List, Optional, Sequence, Tuple

import torch
from torch import nn

from ..common.chunking import Chunks, check_chunks
from .region import DEFAULT_OPTIONS, run_region
from .wrapping import ModuleT

__all__ = [
    "AUTO_CHUNK_POSITIONS",
    "ChunkedForward",
    "auto_chunks",
    "batch_statistics_modules",
    "check_chunks",
    "chunked",
    "chunked_call",
    "chunked_method",
    "default_dim",
    "is_chunked",
]

#: ``chunks="auto"``: slices hold at most ``max(hidden, AUTO_CHUNK_POSITIONS)`` positions, ``hidden`` being the
#: input's last dimension (the rule of Arctic Long Sequence Training's tiled MLP, ``ceil(length / hidden)`` slices,
#: with a floor on the slice length so that short sequences run unchunked and slices stay large enough for efficient
#: matrix products).
AUTO_CHUNK_POSITIONS = 256


def auto_chunks(length: int, hidden: int) -> int:
    """The slice count ``chunks="auto"`` uses for a sequence of ``length`` positions of width ``hidden``.

    ``ceil(length / max(hidden, AUTO_CHUNK_POSITIONS))``: one slice per ``hidden`` positions (at least 256), so a
    slice's intermediates stay about the size of one of the module's weight matrices whatever the sequence length.

    Examples:
        >>> memsave.recompute.chunked.auto_chunks(8192, 256)
        32
    """
    return max(1, math.ceil(length / max(int(hidden), AUTO_CHUNK_POSITIONS)))


def _slice_count(chunks: Chunks, x: torch.Tensor, dim: int) -> int:
    length = x.shape[dim]
    n = auto_chunks(length, x.shape[-1]) if chunks == "auto" else int(chunks)
    return max(1, min(n, length))


def _join(outs: List[Any], dim: int, name: str) -> Any:
    """The slices' outputs concatenated along ``dim`` (a tensor, or a tuple / list of tensors)."""
    first = outs[0]
    if isinstance(first, torch.Tensor):
        return torch.cat(outs, dim=dim)
    if isinstance(first, (tuple, list)) and all(isinstance(t, torch.Tensor) for t in first):
        return type(first)(torch.cat([o[k] for o in outs], dim=dim) for k in range(len(first)))
    raise TypeError(
        f"memsave.chunked: {name} returned a {type(first).__name__}; a chunked module must return a tensor or a "
        f"tuple of tensors with the sequence along the chunked dimension"
    )


def default_dim(x: torch.Tensor) -> int:
    """The dimension :func:`chunked` slices when none is given: 1 (the sequence of ``[batch, sequence, hidden]``)
    for inputs of 3 or more dimensions, 0 (the rows of ``[rows, features]``) for 2-d ones; never the last one, which
    holds the features each position's computation reads.

    Examples:
        >>> default_dim(torch.ones(4, 8)), default_dim(torch.ones(2, 16, 8))
        (0, 1)
    """
    return 1 if x.dim() >= 3 else 0


def batch_statistics_modules(module: nn.Module) -> List[str]:
    """The modules inside ``module`` (itself included) that normalize with statistics over the whole batch in training:
    torch's batch norms (``BatchNorm1d/2d/3d``, ``SyncBatchNorm``, the lazy ones) and any module declaring
    ``memsave_batch_statistics = True`` (memsave's ``BatchNormAct2d``, ``InPlaceABN2d``, ``BatchNormActConv2d``).

    Returns:
        ``"name (Class)"`` for each, in module order (``""`` names ``module`` itself).

    Examples:
        >>> batch_statistics_modules(nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8)))
        ['1 (BatchNorm1d)']
    """
    return [
        f"{name or '(the module itself)'} ({type(m).__name__})"
        for name, m in module.named_modules()
        if isinstance(m, nn.modules.batchnorm._BatchNorm) or getattr(m, "memsave_batch_statistics", False)
    ]


def _contiguous_call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return fn(*(a.contiguous() if isinstance(a, torch.Tensor) else a for a in args), **kwargs)


def chunked_call(
    fn: Callable[..., Any],
    args: Tuple[Any, ...],
    kwargs: Any,
    *,
    chunks: Chunks,
    dim: Optional[int],
    name: str,
    watch: Sequence[nn.Module] = (),
) -> Any:
    """``fn(*args, **kwargs)`` run slice by slice along ``dim`` (None: :func:`default_dim` of the input), each slice
    a checkpointed region.

    The first positional argument must be a tensor; it and every other positional tensor of the same size along
    ``dim`` are sliced, everything else is passed to each slice as it is. With grad mode off, one slice, or a 0-d or
    1-d input (one position), ``fn`` runs once on the whole input.
    """
    x = args[0] if args else None
    if not isinstance(x, torch.Tensor):
        raise TypeError(
            f"memsave.chunked: {name} was called with a {type(x).__name__} first; a chunked module takes the tensor "
            f"to slice as its first positional argument"
        )
    if dim is None:
        if x.dim() < 2:  # a single position (or none): nothing to slice
            return fn(*args, **kwargs)
        dim = default_dim(x)
    if not -x.dim() <= dim < x.dim():
        raise ValueError(f"memsave.chunked: dim {dim} is out of range for {name}'s {x.dim()}-d input")
    n = _slice_count(chunks, x, dim)
    if n == 1 or not torch.is_grad_enabled():
        return fn(*args, **kwargs)
    length = x.shape[dim]
    sliced = [isinstance(a, torch.Tensor) and a.dim() == x.dim() and a.shape[dim] == length for a in args]
    pieces = [torch.tensor_split(a, n, dim=dim) if s else None for a, s in zip(args, sliced)]
    # A slice along dim 1 of a batch is not contiguous, and modules may view their input (transformers' Conv1D):
    # the region makes its slice contiguous, so that copy is one of its recomputed intermediates, not kept.
    region = functools.partial(_contiguous_call, fn)
    outs = []
    for k in range(n):
        part = tuple(p[k] if p is not None else a for a, p in zip(args, pieces))
        outs.append(run_region(region, part, kwargs, DEFAULT_OPTIONS, name=f"{name}[slice {k}/{n}]", watch=watch))
    return _join(outs, dim, name)


class ChunkedForward:
    """The instance-level ``forward`` (or other ``method``) :func:`chunked` gives a module.

    Picklable, and :func:`memsave.wrap` may wrap it. Its signature is the original method's, so code that inspects
    the method (transformers' ``apply_chunking_to_forward`` counts its parameters) sees the same one.
    """

    def __init__(
        self,
        module: nn.Module,
        chunks: Chunks,
        dim: Optional[int],
        name: str,
        previous: Optional[Callable[..., Any]],
        method: str = "forward",
    ) -> None:
        self.module, self.chunks, self.dim, self.name, self.previous = module, chunks, dim, name, previous
        self.method = method
        with contextlib.suppress(TypeError, ValueError):
            self.__signature__ = inspect.signature(self.original())

    def original(self) -> Callable[..., Any]:
        if self.previous is not None:
            return self.previous
        # A partial rather than types.MethodType: dynamo (torch.compile) traces partials.
        return functools.partial(getattr(type(self.module), self.method), self.module)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return chunked_call(
            self.original(), args, kwargs, chunks=self.chunks, dim=self.dim, name=self.name, watch=(self.module,)
        )


def is_chunked(module: nn.Module) -> bool:
    """Whether :func:`chunked` gave ``module`` a chunked forward.

    Examples:
        >>> memsave.recompute.is_chunked(memsave.chunked(mlp, 4))
        True
    """
    return isinstance(module.__dict__.get("forward"), ChunkedForward)


def chunked(module: ModuleT, chunks: Chunks, dim: Optional[int] = None) -> ModuleT:
    """Run a position-wise module on ``chunks`` slices of its input along ``dim``, each recomputed in its own backward.

    In place, like :func:`memsave.wrap`: the module gets an instance-level ``forward``; no wrapper module is
    inserted, so ``state_dict`` keys and parameters are unchanged. The module must treat every position along ``dim``
    independently (an MLP, a gated MLP, a norm followed by an MLP: not attention). Each slice's forward keeps only its
    input slice, and its backward recomputes the slice's intermediates, so only one slice's intermediates are alive at
    a time: the module's activation memory is about ``1 / chunks`` of eager's, for one extra forward of the module.
    Outputs equal eager's up to float rounding; parameter gradients are summed over slices (float rounding, not
    bitwise). Random operations replay per slice (dropout masks of a slice are the same in forward and recompute, but
    drawn slice by slice, so not eager's masks). Works inside :func:`memsave.wrap` regions and plans (nested regions)
    and under ``torch.compile`` (each slice lowers to torch's non-reentrant checkpoint). Calling ``chunked`` again
    replaces the slice count; ``chunks=1`` restores the module's plain forward.

    Args:
        module: the position-wise module; its first positional argument is the tensor to slice. Other positional
            tensors of the same size along ``dim`` are sliced too; keyword arguments are passed to every slice.
        chunks: the number of slices (at most the input's length along ``dim``), or ``"auto"``: decided at each call
            from the input's length along ``dim`` and its last dimension (:func:`auto_chunks`:
            ``ceil(length / max(hidden, 256))``, so sequences up to ``max(hidden, 256)`` positions run unchunked).
        dim: the dimension of the positions; default (None): decided at each call from the input
            (:func:`default_dim`): 1 for ``[batch, sequence, hidden]`` (and more dimensions), 0 for
            ``[rows, features]``.

    Returns:
        ``module``, typed as the class it was given.

    Raises:
        TypeError: ``module`` is not an ``nn.Module``, ``chunks`` or ``dim`` has a wrong type; at call time, a first
            argument that is not a tensor or an output that is not a tensor or a tuple of tensors.
        ValueError: ``chunks`` < 1 or a string other than ``"auto"``; ``module`` holds a batch norm
            (:func:`batch_statistics_modules`: its batch statistics would be computed per slice, changing the outputs,
            and its running statistics updated once per slice); at call time, ``dim`` out of range.

    Examples:
        >>> mlp = model.model.layers[0].mlp
        >>> memsave.chunked(mlp, 8)                         # [batch, seq, hidden]: 8 slices of seq / 8 positions
        >>> memsave.convert(model, fuse=True, mlp_chunks="auto")   # every MLP of a known model zoo
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"memsave.chunked: module must be an nn.Module, got {type(module).__name__}")
    chunks = check_chunks(chunks, "chunked")
    if dim is not None and (isinstance(dim, bool) or not isinstance(dim, int)):
        raise TypeError(f"memsave.chunked: dim must be an int or None, got {type(dim).__name__}")
    norms = batch_statistics_modules(module) if chunks != 1 else []
    if norms:
        raise ValueError(
            f"memsave.chunked: {type(module).__name__} holds {', '.join(norms)}, which normalizes with statistics "
            f"over the whole batch in training: run slice by slice it would normalize each slice with its own "
            f"statistics (other outputs than the module's) and update its running statistics once per slice. Chunk "
            f"a position-wise part without the batch norm (e.g. the MLP after it), or recompute the whole module "
            f"with memsave.wrap / memsave.checkpoint."
        )
    current = module.__dict__.get("forward")
    previous = current.previous if isinstance(current, ChunkedForward) else current
    if chunks == 1:
        if isinstance(current, ChunkedForward):
            if previous is None:
                del module.__dict__["forward"]
            else:
                module.__dict__["forward"] = previous
        return module
    module.__dict__["forward"] = ChunkedForward(module, chunks, dim, type(module).__name__, previous)
    return module


def chunked_method(module: nn.Module, method: str, chunks: Chunks, dim: int, name: str) -> nn.Module:
    """Like :func:`chunked`, for another method of ``module`` than ``forward``: the module gets an instance-level
    ``method`` that runs the class's (or a previous instance-level one) on ``chunks`` slices along ``dim``.

    Calling it again replaces the slice count. ``name`` names the method in errors and in its regions' names.
    :func:`memsave.convert` uses it for BERT's ``feed_forward_chunk`` (``mlp_chunks``).

    Returns:
        ``module``.

    Examples:
        >>> chunked_method(bert_layer, "feed_forward_chunk", 4, 1, "encoder.layer.0.feed_forward_chunk")
    """
    previous = module.__dict__.get(method)
    if isinstance(previous, ChunkedForward):
        previous = previous.previous
    module.__dict__[method] = ChunkedForward(module, chunks, dim, name, previous, method=method)
    return module
