"""Running a position-wise module slice by slice, as a part other than recompute sees it: the ``chunks`` argument
check and the seam through which the recompute part provides the slicing.

:func:`memsave.chunked` lives in the recompute part (each slice is a recompute region), but
``memsave.convert(..., mlp_chunks=...)`` in the operators part chunks the model zoos' MLPs too, and one part never
imports another (docs/architecture.md). So the operators part calls :func:`chunk_module` and :func:`chunk_method`
here, and ``memsave/__init__.py`` hands it the recompute part's implementation with one explicit
:func:`provide_chunking` call (importing any memsave module runs it first). Nothing here imports any part.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Tuple, Union

from torch import nn

__all__ = ["Chunks", "check_chunks", "chunk_method", "chunk_module", "provide_chunking"]

#: A slice count: an int >= 1, or ``"auto"`` (decided at each call from the input's shape).
Chunks = Union[int, str]

#: ``(module, chunks, dim)``: the module's forward run slice by slice (:func:`memsave.chunked`).
ChunkModule = Callable[[nn.Module, Chunks, int], Any]
#: ``(module, method, chunks, dim, name)``: another method of the module run slice by slice.
ChunkMethod = Callable[[nn.Module, str, Chunks, int, str], Any]

_PROVIDED: List[Optional[Tuple[ChunkModule, ChunkMethod]]] = [None]


def check_chunks(chunks: Any, where: str) -> Chunks:
    """``chunks`` checked (an int >= 1 or ``"auto"``); ``where`` names the caller in the error.

    Raises:
        TypeError: neither an int nor a string.
        ValueError: below 1, or a string other than ``"auto"``.

    Examples:
        >>> check_chunks("auto", "convert: mlp_chunks")
        'auto'
    """
    if isinstance(chunks, bool) or not isinstance(chunks, (int, str)):
        raise TypeError(f"memsave.{where}: chunks must be an int >= 1 or 'auto', got {type(chunks).__name__}")
    if isinstance(chunks, str) and chunks != "auto":
        raise ValueError(f"memsave.{where}: chunks must be an int >= 1 or 'auto', got {chunks!r}")
    if isinstance(chunks, int) and chunks < 1:
        raise ValueError(f"memsave.{where}: chunks must be >= 1, got {chunks}")
    return chunks


def provide_chunking(chunk_module: ChunkModule, chunk_method: ChunkMethod) -> None:
    """Register the implementation of :func:`chunk_module` and :func:`chunk_method` (the recompute part's).

    Examples:
        >>> provide_chunking(chunked, chunked_method)     # memsave/__init__.py, once
    """
    _PROVIDED[0] = (chunk_module, chunk_method)


def _provided() -> Tuple[ChunkModule, ChunkMethod]:
    provided = _PROVIDED[0]
    if provided is None:
        raise RuntimeError(
            "memsave: no chunking implementation is registered; import memsave (memsave.recompute.chunked "
            "provides it) before chunking a module"
        )
    return provided


def chunk_module(module: nn.Module, chunks: Chunks, dim: int) -> None:
    """Run ``module``'s forward on ``chunks`` slices along ``dim``, in place (:func:`memsave.chunked`)."""
    _provided()[0](module, chunks, dim)


def chunk_method(module: nn.Module, method: str, chunks: Chunks, dim: int, name: str) -> None:
    """Run ``module``'s method ``method`` on ``chunks`` slices along ``dim``, in place; ``name`` names it in errors
    and region names (:func:`memsave.recompute.chunked.chunked_method`)."""
    _provided()[1](module, method, chunks, dim, name)
