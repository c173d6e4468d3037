"""Mechanisms more than one part of memsave uses: the RNG state of a step (:mod:`.rng`) and the progress bar
(:mod:`.progress`). Nothing here imports any part."""

from .progress import progress_bar
from .rng import RngState

__all__ = ["RngState", "progress_bar"]
