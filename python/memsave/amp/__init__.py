"""Mixed precision: dynamic loss scaling with a fused unscale-and-check kernel, and gradient accumulation.

=================  ==============================================================================================
``grad_scaler``    :class:`GradScaler` (``torch.amp.GradScaler``'s interface; one fused pass per device over the
                   gradients: ``torch.ops.memsave.unscale_and_check_``, kernels in ``csrc/ops/amp``)
``accumulation``   :func:`accumulate` / :class:`Accumulator`: micro-batches, DDP ``no_sync``, the scaler's step
``strategies``     the ``amp:fp16`` / ``amp:bf16`` strategies of :func:`memsave.compare`
=================  ==============================================================================================
"""

from .accumulation import Accumulator, accumulate
from .grad_scaler import GradScaler, needs_grad_scaling

__all__ = ["Accumulator", "GradScaler", "accumulate", "needs_grad_scaling"]
