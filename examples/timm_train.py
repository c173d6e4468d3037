"""Train a timm Vision Transformer with memsave, and compare it with timm's own gradient checkpointing.

    python examples/timm_train.py                        # a small ViT, random weights, CPU or GPU
    python examples/timm_train.py --size tiny --steps 2  # what the tests run

1. ``memsave.compare`` with a mapping of strategies: memsave's registry names next to your own switch
   (``{"timm set_grad_checkpointing": fn(model) -> model}``), eager first; every row's gradients against eager's and
   the step times interleaved over rounds (median and IQR).
2. A plain training loop on ``memsave.wrap(model)`` (each transformer block recomputed in backward), with
   ``memsave.MemoryMonitor`` reporting each step's memory.
"""

from __future__ import annotations

import timm
import torch
from torch import nn

import memsave
from memsave.cli.options import script_arguments

SIZES = {
    "tiny": dict(image=32, patch=8, d=32, depth=2, heads=2, batch=2),
    "small": dict(image=64, patch=8, d=192, depth=6, heads=3, batch=16),
}


def timm_checkpointing(model: nn.Module) -> nn.Module:
    """timm's own switch: torch.utils.checkpoint around each block."""
    model.set_grad_checkpointing(True)
    return model


def main() -> None:
    args, device, size = script_arguments(__doc__.split("\n\n")[0], tuple(SIZES), steps=5, default="small")
    cfg = SIZES[size]
    torch.manual_seed(0)
    model = timm.create_model(
        "vit_tiny_patch16_224",
        pretrained=False,
        img_size=cfg["image"],
        patch_size=cfg["patch"],
        embed_dim=cfg["d"],
        depth=cfg["depth"],
        num_heads=cfg["heads"],
        num_classes=10,
    ).to(device)
    x = torch.randn(cfg["batch"], 3, cfg["image"], cfg["image"], device=device)
    y = torch.randint(0, 10, (cfg["batch"],), device=device)

    def loss_fn(out: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(out, y)

    result = memsave.compare(
        model,
        x,
        strategies={"checkpoint:blocks": "checkpoint:blocks", "timm set_grad_checkpointing": timm_checkpointing},
        loss_fn=loss_fn,
        steps=max(3, args.steps),
    )
    print(result)

    memsave.wrap(model)  # the transformer blocks (memsave.find_blocks), recomputed in backward
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    monitor = memsave.MemoryMonitor(device)
    for _ in monitor.iterate(range(args.steps)):
        loss = loss_fn(model(x))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        print(f"loss {loss.item():.4f}  {monitor.format(monitor.history[-1]) if monitor.history else ''}".rstrip())
    print(f"largest step peak: {memsave.measurement.format_bytes(monitor.max_peak_bytes)}")


if __name__ == "__main__":
    main()
