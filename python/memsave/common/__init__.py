"""Mechanisms more than one part of memsave uses: the RNG state of a step (:mod:`.rng`), the progress bar
(:mod:`.progress`) and the torch internals that differ between supported releases (:mod:`.compat`). Nothing here
imports any part."""

from .progress import progress_bar
from .rng import RngState

__all__ = ["RngState", "progress_bar"]
