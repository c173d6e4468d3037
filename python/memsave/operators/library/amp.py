"""memsave::unscale_and_check_ and memsave::amp_update_scale_: the device-side halves of dynamic loss scaling.

Both operators only mutate their arguments (declared ``Tensor(a!)`` in the schemas,
``csrc/ops/amp/unscale_and_check.cpp`` and ``amp_update_scale.cpp``),
so their fake kernels return nothing; they carry no autograd formula because they run on gradients outside the
graph.
"""

from __future__ import annotations

from typing import List, Optional

import torch

from .autograd import register_fake


@register_fake("memsave::unscale_and_check_")
def _unscale_and_check_fake(
    grads: List[torch.Tensor],
    found_inf: torch.Tensor,
    inv_scale: torch.Tensor,
    per_tensor: Optional[torch.Tensor] = None,
) -> None:
    return None


@register_fake("memsave::amp_update_scale_")
def _amp_update_scale_fake(
    scale: torch.Tensor,
    growth_tracker: torch.Tensor,
    overflow_tracker: torch.Tensor,
    found_inf: torch.Tensor,
    growth_factor: float,
    backoff_factor: float,
    growth_interval: int,
    hysteresis: int,
) -> None:
    return None
