"""Train the 5-level UNet with the three memory levers at once: checkpointing, 16-bit autocast, gradient accumulation.

A batch of K*b images that does not fit is split into K micro-batches of b; each micro-batch runs under autocast
(float16 on a GPU with memsave's GradScaler; bfloat16 on CPU, where the scaler is a documented pass-through because
bfloat16 has float32's exponent range) with every UNet block checkpointed by memsave. ``memsave.accumulate`` divides
each micro-batch's loss by K, skips nothing but the optimizer step on an overflow, unscales before clipping, steps
and updates the scale once per window, and zeroes the gradients.

The script first measures one training step of each configuration (peak and activation memory; docs/design.md,
"Measuring memory"), then trains the last one for a few windows and prints loss and scale.

Run::

    python3 examples/amp_accumulate.py                         # --size cpu on a CPU, --size full on a GPU
    python3 examples/amp_accumulate.py --size tiny --steps 1   # seconds; what the tests run
    python3 examples/amp_accumulate.py --dtype float16 --device cuda

Note: the UNet has BatchNorm, whose statistics see a micro-batch, not the whole batch, so accumulation is not
exactly the large batch here (it is for BatchNorm-free models; tests/amp/test_accumulate.py checks that).
"""

from __future__ import annotations

import argparse
import copy
from typing import Any, Dict, List, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

import memsave
from memsave.amp import GradScaler
from memsave.cli.options import script_arguments
from memsave.measurement import format_bytes
from memsave.models import UNet

SIZES = {  # micro-batch b, micro-batches per step K, image side, first-level width, training windows
    "full": dict(micro=4, k=4, image=256, width=64, windows=4),
    "cpu": dict(micro=2, k=4, image=64, width=16, windows=3),
    "tiny": dict(micro=1, k=3, image=32, width=4, windows=2),
}


class Autocast(nn.Module):
    """Runs ``model``'s forward under ``torch.autocast(device_type, dtype)``; backward runs outside autocast, as
    torch recommends. The parameters stay float32 (``model`` is a submodule: ``parameters()`` are its own)."""

    def __init__(self, model: nn.Module, dtype: torch.dtype) -> None:
        super().__init__()
        self.model, self.dtype = model, dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        device_type = next(self.model.parameters()).device.type
        with torch.autocast(device_type=device_type, dtype=self.dtype):
            return self.model(x)


def checkpointed(model: UNet) -> UNet:
    """memsave.wrap around every UNet block (inc, down1..4, up1..4, outc)."""
    names = set(model.checkpoint_blocks())
    return memsave.wrap(model, lambda name, module: name in names)


def _add_dtype(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--dtype",
        choices=("float16", "bfloat16"),
        default=None,
        help="autocast dtype; default float16 on CUDA, bfloat16 on CPU",
    )


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    args, device, size = script_arguments(__doc__.split("\n")[0], tuple(SIZES), steps=2, argv=argv, extra=_add_dtype)
    cfg = SIZES[size]
    dtype = getattr(torch, args.dtype or ("float16" if device.type == "cuda" else "bfloat16"))
    b, k, side = cfg["micro"], cfg["k"], cfg["image"]

    torch.manual_seed(0)
    base = UNet(3, 2, cfg["width"]).to(device)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(k * b, 3, side, side, generator=gen).to(device)
    target = torch.randint(0, 2, (k * b, side, side), generator=gen).to(device)
    print(
        f"UNet widths {cfg['width']}..{16 * cfg['width']}, {side}x{side} images, batch {k * b} = {k} x {b} on "
        f"{device}; autocast {str(dtype).replace('torch.', '')} (size {size!r})"
    )

    def loss_on(t: torch.Tensor):
        return lambda out: F.cross_entropy(out.float(), t)

    # One training step of each configuration. Accumulated rows run one micro-batch: the step's peak.
    configs = [
        ("float32, one batch of K*b", copy.deepcopy(base), x, target),
        ("float32, K x b accumulated", copy.deepcopy(base), x[:b], target[:b]),
        (f"{str(dtype)[6:]} autocast, K x b", Autocast(copy.deepcopy(base), dtype), x[:b], target[:b]),
        (
            f"{str(dtype)[6:]} + memsave checkpoint, K x b",
            Autocast(checkpointed(copy.deepcopy(base)), dtype),
            x[:b],
            target[:b],
        ),
    ]
    what = "max_memory_allocated" if device.type == "cuda" else "CPU allocator events"
    print(f"\n{'configuration':<40}{'peak (' + what + ')':>34}{'activations':>14}{'step':>12}")
    measurements = {}
    for name, model, xi, ti in configs:
        m = memsave.measure(model, xi, loss_fn=loss_on(ti), steps=args.steps)
        measurements[name] = m
        print(
            f"{name:<40}{format_bytes(m.peak_bytes):>34}{format_bytes(m.activation_bytes):>14}"
            f"{m.step_seconds * 1e3:>9.1f} ms"
        )
    first, last = measurements[configs[0][0]], measurements[configs[-1][0]]
    print(
        f"\nlast vs first: peak {last.peak_bytes / first.peak_bytes:.0%}, "
        f"activations {last.activation_bytes / first.activation_bytes:.0%}"
    )

    # Train the last configuration: checkpointing + autocast + scaler + accumulation.
    model = checkpointed(copy.deepcopy(base))
    runner = Autocast(model, dtype)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = GradScaler.for_autocast(device.type, dtype, init_scale=2.0**14)  # pass-through for bfloat16
    losses: List[float] = []
    with memsave.accumulate(model, optimizer, steps=k, scaler=scaler, clip_grad_norm=1.0) as acc:
        for window in range(cfg["windows"]):
            total = 0.0
            for i in range(k):
                s = slice(i * b, (i + 1) * b)
                loss = F.cross_entropy(runner(x[s]).float(), target[s])
                total += float(loss.detach()) / k
                stepped = acc.backward(loss)
            assert stepped, "the K-th micro-batch steps the optimizer"
            losses.append(total)
            state = "skipped (overflow)" if acc.last_skipped else "stepped"
            print(
                f"window {window}: loss {total:.4f}, {state}, scale {scaler.get_scale():g}"
                f"{'' if scaler.is_enabled() else ' (scaler disabled: ' + str(dtype)[6:] + ' needs no scaling)'}"
            )
    return {"size": size, "dtype": str(dtype), "measurements": measurements, "losses": losses}


if __name__ == "__main__":
    main()
