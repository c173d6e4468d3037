"""Mixed-precision rows for the benchmark harness: autocast alone and combined with memsave checkpointing.

Import it as a plugin of ``benchmarks/run.py``::

    python3 benchmarks/run.py --models unet --size cpu --plugins benchmarks.strategies_amp \\
        --strategies eager amp:bf16 memsave.checkpoint/block amp:bf16+memsave.checkpoint/block
    python3 benchmarks/run.py --device cuda --plugins benchmarks.strategies_amp --strategies eager amp:fp16

Autocast keeps activations in 16 bits, so these rows are lossy (their gradient column shows the distance to float32
eager). Loss scaling does not change memory or the forward/backward the harness times; its own cost (one fused
pass over the gradients per step) is measured by ``benchmarks/amp_unscale_speed.py``. float16 rows are meant for a
GPU: on CPU, autocast to float16 runs but is slow, and bfloat16 is the CPU's 16-bit format.
"""
from __future__ import annotations

from typing import Any, Tuple

import torch
from torch import nn

from benchmarks.strategies import register

__all__ = ["AutocastRunner"]


class AutocastRunner(nn.Module):
    """Runs ``model`` under ``torch.autocast`` and returns float32 outputs (the loss is then taken in float32, as
    autocast would); shares the model's parameters, so the harness reads their gradients."""

    def __init__(self, model: nn.Module, dtype: torch.dtype) -> None:
        super().__init__()
        self.model, self.dtype = model, dtype

    def forward(self, *inputs: Any) -> Any:
        device_type = next((t.device.type for t in inputs if isinstance(t, torch.Tensor)), "cpu")
        with torch.autocast(device_type, dtype=self.dtype):
            out = self.model(*inputs)
        return out.float() if isinstance(out, torch.Tensor) and out.is_floating_point() else out


def _memsave_blocks(model: nn.Module) -> nn.Module:
    from memsave.recompute.wrapping import wrap

    names = set(model.checkpoint_blocks())  # type: ignore[operator]
    return wrap(model, lambda name, module: name in names)


@register("amp:bf16", "torch.autocast(bfloat16) forward; no loss scaling needed", lossless=False)
def _amp_bf16(model: nn.Module, inputs: Tuple[Any, ...]) -> nn.Module:
    return AutocastRunner(model, torch.bfloat16)


@register("amp:fp16", "torch.autocast(float16) forward (memsave.amp.GradScaler scales its loss)", lossless=False)
def _amp_fp16(model: nn.Module, inputs: Tuple[Any, ...]) -> nn.Module:
    return AutocastRunner(model, torch.float16)


@register("amp:bf16+memsave.checkpoint/block", "autocast(bfloat16) with memsave.wrap around every block",
          lossless=False, requires=("memsave.recompute:wrap",))
def _amp_bf16_blocks(model: nn.Module, inputs: Tuple[Any, ...]) -> nn.Module:
    return AutocastRunner(_memsave_blocks(model), torch.bfloat16)


@register("amp:fp16+memsave.checkpoint/block", "autocast(float16) with memsave.wrap around every block",
          lossless=False, requires=("memsave.recompute:wrap",))
def _amp_fp16_blocks(model: nn.Module, inputs: Tuple[Any, ...]) -> nn.Module:
    return AutocastRunner(_memsave_blocks(model), torch.float16)
