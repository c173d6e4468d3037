"""The RNG state a step or a region starts from: saved once, restored as often as needed.

Shared by the recompute (a region replays its forward's dropout masks) and by measurement (every measured step and
every compared strategy starts from the caller's RNG state, which is put back at the end).
"""

from __future__ import annotations

from typing import Any, List

import torch

__all__ = ["RngState"]


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
