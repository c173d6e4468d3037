"""The RNG state a step or a region starts from: saved once, restored as often as needed.

Shared by the recompute (a region replays its forward's dropout masks, and the numbers it drew from explicit
``torch.Generator`` objects: :class:`GeneratorRecorder`, :func:`replayed_generators`) and by measurement (every
measured step and every compared strategy starts from the caller's RNG state, which is put back at the end).
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, List, Sequence, Set, Tuple

import torch
from torch.overrides import TorchFunctionMode

__all__ = ["GeneratorRecorder", "RngState", "replayed_generators"]


class RngState:
    """The CPU generator state and, when CUDA is initialised, the state of every CUDA device's generator."""

    __slots__ = ("cpu", "cuda")

    def __init__(self) -> None:
        self.cpu = torch.get_rng_state()
        self.cuda: List[torch.Tensor] = []
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            self.cuda = [torch.cuda.get_rng_state(i) for i in range(torch.cuda.device_count())]

    def restore(self) -> None:
        """Set the CPU generator and the saved CUDA generators back to these states."""
        torch.set_rng_state(self.cpu)
        for i, s in enumerate(self.cuda):
            torch.cuda.set_rng_state(s, i)

    def fork_and_restore(self) -> Any:
        """A context manager that restores these states and, on exit, puts the caller's RNG streams back."""
        return _ForkedRng(self)


class _ForkedRng:
    def __init__(self, state: RngState) -> None:
        self.state = state
        self.fork = torch.random.fork_rng(devices=list(range(len(state.cuda))), device_type="cuda")

    def __enter__(self) -> None:
        self.fork.__enter__()
        self.state.restore()

    def __exit__(self, *exc: Any) -> Any:
        return self.fork.__exit__(*exc)


class GeneratorRecorder(TorchFunctionMode):
    """Notes the explicit ``torch.Generator`` objects a region's forward draws from (``torch.rand(...,
    generator=g)``, ``t.bernoulli_(p, generator=g)``, ``torch.randperm(n, generator=g)``), each with its state
    before the first draw, so that the recompute can replay their numbers as :class:`RngState` replays the default
    generators'.

    Every torch function that draws random numbers takes its generator as the keyword-only ``generator``; only that
    keyword (and, defensively, positional arguments) is looked at.

    Attributes:
        states: ``(generator, state before its first use)`` in order of first use.

    Examples:
        >>> with GeneratorRecorder() as recorder:
        ...     y = x + torch.rand(x.shape, generator=g)
        >>> [gen is g for gen, _ in recorder.states]
        [True]
    """

    def __init__(self) -> None:
        super().__init__()
        self.states: List[Tuple[torch.Generator, torch.Tensor]] = []
        self._seen: Set[int] = set()

    def _note(self, value: Any) -> None:
        if isinstance(value, torch.Generator) and id(value) not in self._seen:
            self._seen.add(id(value))
            self.states.append((value, value.get_state()))

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if kwargs:
            self._note(kwargs.get("generator"))
        for a in args:
            if isinstance(a, torch.Generator):
                self._note(a)
        return func(*args, **kwargs)


@contextlib.contextmanager
def replayed_generators(states: Sequence[Tuple[torch.Generator, torch.Tensor]]) -> Iterator[None]:
    """Inside: each generator at the state it had before the forward's first draw (``GeneratorRecorder.states``).
    On exit: each back at the state it had on entry, so that a recompute draws the forward's numbers again and does
    not advance any generator twice.

    Examples:
        >>> with replayed_generators(recorder.states):
        ...     recompute()
    """
    current = [(g, g.get_state()) for g, _ in states]
    try:
        for g, state in states:
            g.set_state(state)
        yield
    finally:
        for g, state in current:
            g.set_state(state)
