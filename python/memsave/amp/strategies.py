"""The mixed-precision part's strategy for :func:`memsave.compare`, :func:`memsave.estimate` and the command line:
``amp:fp16`` / ``amp:bf16``, ``torch.autocast`` around the forward (lossy: gradients differ from float32 eager).
"""

from __future__ import annotations

from typing import Any, ContextManager, Optional

import torch

from ..measurement.strategies import register_strategy

__all__ = ["register_strategies"]

_AMP_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def _amp_context(arg: Optional[str], device: torch.device) -> ContextManager[Any]:
    return torch.autocast(device_type=device.type if device.type != "meta" else "cpu", dtype=_AMP_DTYPES[arg or "bf16"])


def register_strategies() -> None:
    """Register the ``amp:fp16`` / ``amp:bf16`` strategies (called once by ``memsave/__init__.py``)."""
    register_strategy(
        "amp",
        "torch.autocast around the forward (lossy)",
        choices=("fp16", "bf16"),
        context=_amp_context,
        lossless=False,
    )
