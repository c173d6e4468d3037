"""The classic UNet with every block checkpointed, the walk-through that breaks with reentrant checkpointing.

The popular UNet tutorial checkpoints each block of a 5-level UNet (64..1024 channels) with
``torch.utils.checkpoint.checkpoint(block, x)``. In reentrant mode that dies on the first step: the input image does
not require grad, so no block's output does, and ``loss.backward()`` raises
``RuntimeError: element 0 of tensors does not require grad and does not have a grad_fn``. ``memsave.checkpoint``
gives every parameter its gradient, bitwise equal to eager, and BatchNorm statistics updated once.

Run::

    python3 examples/unet.py                # --size cpu on a CPU, --size full (batch 8, 512x512) on a GPU
    python3 examples/unet.py --size tiny    # seconds; what the tests run
"""

from __future__ import annotations

import copy
import sys
from typing import Any, Callable, Dict, Optional, Sequence

import torch
from torch import nn

import memsave
import memsave.models
from memsave.cli.options import script_arguments
from memsave.measurement.units import format_bytes

SIZES = memsave.models.SIZES["unet"]  # size -> batch, image side, first-level width, classes


class UNet(memsave.models.UNet):
    """The classic 5-level UNet (:class:`memsave.models.UNet`: widths w..16w, 64..1024 for the classic w = 64) whose
    forward calls every block through ``self.run``, as the tutorial's does."""

    def __init__(self, in_channels: int = 3, num_classes: int = 2, w: int = 64) -> None:
        super().__init__(in_channels, num_classes, width=w)
        self.run: Callable[..., Any] = lambda block, *args: block(*args)

    def use_checkpointing(self, checkpoint_fn: Callable[..., Any]) -> None:
        """Call every block through ``checkpoint_fn(block, *args)``, as the tutorial does."""
        self.run = checkpoint_fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        r = self.run
        x1 = r(self.inc, x)
        x2 = r(self.down1, x1)
        x3 = r(self.down2, x2)
        x4 = r(self.down3, x3)
        x5 = r(self.down4, x4)
        x = r(self.up1, x5, x4)
        x = r(self.up2, x, x3)
        x = r(self.up3, x, x2)
        x = r(self.up4, x, x1)
        return r(self.outc, x)


def one_step(model: nn.Module, x: torch.Tensor, seed: int = 0) -> Dict[str, torch.Tensor]:
    """One training step from a fixed seed; returns gradients and buffers by name."""
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    model(x).float().sum().backward()
    state = {f"grad:{n}": p.grad.clone() for n, p in model.named_parameters()}
    state.update({f"buffer:{n}": b.clone() for n, b in model.named_buffers()})
    return state


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    description = "UNet checkpointed per block: eager vs memsave.checkpoint"
    args, device, size = script_arguments(description, tuple(SIZES), steps=3, argv=argv)
    cfg = SIZES[size]

    torch.manual_seed(0)
    eager = UNet(w=cfg["width"]).to(device)
    x = torch.randn(cfg["batch"], 3, cfg["image"], cfg["image"], device=device)  # an image: requires_grad=False
    print(f"UNet, widths {cfg['width']}..{16 * cfg['width']}, input {tuple(x.shape)} on {device} (size {size!r})")

    # 1. What the tutorial does, in reentrant mode: the input does not require grad, nothing after it does either.
    reentrant = copy.deepcopy(eager)
    reentrant.use_checkpointing(lambda block, *a: torch.utils.checkpoint.checkpoint(block, *a, use_reentrant=True))
    try:
        reentrant(x).sum().backward()
        reentrant_result = "ran (no error)"
    except RuntimeError as e:
        reentrant_result = f"RuntimeError: {str(e).splitlines()[0]}"
    print(f"torch.utils.checkpoint, reentrant: {reentrant_result}")

    # 2. The same model with memsave.checkpoint around every block.
    ckpt = copy.deepcopy(eager)
    ckpt.use_checkpointing(memsave.checkpoint)
    ref, got = one_step(copy.deepcopy(eager), x), one_step(copy.deepcopy(ckpt), x)
    identical = all(torch.equal(ref[k], got[k]) for k in ref)
    print(f"memsave.checkpoint: gradients and BatchNorm buffers bitwise equal to eager: {identical}")

    m_eager = memsave.measure(eager, x, steps=args.steps)
    m_ckpt = memsave.measure(ckpt, x, steps=args.steps)
    what = "torch.cuda.max_memory_allocated" if device.type == "cuda" else "CPU allocator events"
    print(f"\n{'':<22}{'peak (' + what + ')':>42}{'activations':>16}{'step time':>12}")
    for name, m in (("eager", m_eager), ("memsave.checkpoint", m_ckpt)):
        print(
            f"{name:<22}{format_bytes(m.peak_bytes):>42}{format_bytes(m.activation_bytes):>16}"
            f"{m.step_seconds * 1e3:>9.1f} ms"
        )
    act = m_ckpt.activation_bytes / m_eager.activation_bytes
    print(
        f"\nactivations kept: {act:.0%} of eager; peak: {m_ckpt.peak_bytes / m_eager.peak_bytes:.0%} of eager; "
        f"step time x{m_ckpt.step_seconds / m_eager.step_seconds:.2f}"
    )
    return {"size": size, "reentrant": reentrant_result, "identical": identical, "eager": m_eager, "checkpoint": m_ckpt}


if __name__ == "__main__":
    result = main()
    sys.exit(0 if result["identical"] else 1)
