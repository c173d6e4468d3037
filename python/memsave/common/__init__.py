"""Mechanisms more than one part of memsave uses: the RNG state of a step (:mod:`.rng`), the progress bar
(:mod:`.progress`), the torch internals that differ between supported releases (:mod:`.compat`) and the
all-or-nothing snapshot of a model that wrap and convert share (:mod:`.snapshot`). Nothing here imports any part."""

from .progress import progress_bar
from .rng import RngState

__all__ = ["RngState", "progress_bar"]
