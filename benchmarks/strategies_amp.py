"""Mixed-precision rows for the benchmark harness: autocast alone and combined with memsave checkpointing.

The ``amp:<dtype>`` strategy is memsave's own (:mod:`memsave.amp.strategies`); this module only names the rows::

    python3 benchmarks/run.py --models unet --size cpu \\
        --strategies eager amp:bf16 checkpoint:blocks amp:bf16+checkpoint:blocks
    python3 benchmarks/run.py --device cuda --strategies eager amp:fp16

Autocast keeps activations in 16 bits, so these rows are lossy (their gradient column shows the distance to float32
eager). Loss scaling does not change memory or the forward/backward the harness times; its own cost (one fused
pass over the gradients per step) is measured by ``benchmarks/amp_unscale_speed.py``. float16 rows are meant for a
GPU: on CPU, autocast to float16 runs but is slow, and bfloat16 is the CPU's 16-bit format.
"""

from __future__ import annotations

from typing import Tuple

__all__ = ["AMP_STRATEGIES"]

#: The mixed-precision rows, in table order.
AMP_STRATEGIES: Tuple[str, ...] = ("amp:bf16", "amp:fp16", "amp:bf16+checkpoint:blocks", "amp:fp16+checkpoint:blocks")
