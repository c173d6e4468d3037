"""VGG16 with ``checkpoint_sequential`` in 2 segments: the classic walk-through, with memsave.

The walk-through wraps VGG16 (batch 64, 224x224) in ``torch.utils.checkpoint.checkpoint_sequential(model, 2, x)``
and reports 14,222 MB -> 10,550 MB of GPU memory at about +35% step time. ``memsave.checkpoint_sequential`` is a
drop-in: the first segment's activations are dropped in forward and recomputed in backward (the last segment runs
as usual), gradients bitwise equal to eager on CPU.

Run::

    python3 examples/vgg16_sequential.py               # --size cpu on a CPU, --size full (the article's) on a GPU
    python3 examples/vgg16_sequential.py --size tiny   # seconds; what the tests run
"""

from __future__ import annotations

import copy
import sys
from typing import Any, Dict, List, Optional, Sequence

import torch
from torch import nn

import memsave
from memsave.cli.options import script_arguments
from memsave.measurement.units import format_bytes

SIZES = {  # batch, image side, first-stage width, classifier width, classes
    "full": dict(batch=64, image=224, width=64, hidden=4096, classes=1000),
    "cpu": dict(batch=4, image=64, width=64, hidden=1024, classes=100),
    "tiny": dict(batch=2, image=32, width=8, hidden=32, classes=10),
}


def vgg16(width: int, hidden: int, classes: int, image: int) -> nn.Sequential:
    """VGG16 as one flat ``nn.Sequential``: 13 conv+ReLU, 5 max pools, 3 linears (torchvision's layout at 224)."""
    layers: List[nn.Module] = []
    c_in = 3
    for stage in ((1, 1), (2, 2), (4, 4, 4), (8, 8, 8), (8, 8, 8)):
        for m in stage:
            layers += [nn.Conv2d(c_in, width * m, 3, padding=1), nn.ReLU(inplace=True)]
            c_in = width * m
        layers.append(nn.MaxPool2d(2))
    side = 7 if image >= 224 else image // 32
    if image >= 224:
        layers.append(nn.AdaptiveAvgPool2d(7))
    layers += [
        nn.Flatten(1),
        nn.Linear(c_in * side * side, hidden),
        nn.ReLU(inplace=True),
        nn.Dropout(),
        nn.Linear(hidden, hidden),
        nn.ReLU(inplace=True),
        nn.Dropout(),
        nn.Linear(hidden, classes),
    ]
    return nn.Sequential(*layers)


class Segmented(nn.Module):
    """Runs ``fn(model, segments, x)`` (a checkpoint_sequential) on the wrapped sequential model."""

    def __init__(self, model: nn.Sequential, fn: Any, segments: int = 2, **kwargs: Any) -> None:
        super().__init__()
        self.model, self.fn, self.segments, self.kwargs = model, fn, segments, kwargs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(self.model, self.segments, x, **self.kwargs)


def grads_after_step(runner: nn.Module, params: nn.Module, x: torch.Tensor, y: torch.Tensor) -> List[torch.Tensor]:
    params.zero_grad(set_to_none=True)
    torch.manual_seed(0)  # the same dropout masks for every variant
    nn.functional.cross_entropy(runner(x), y).backward()
    return [p.grad.clone() for p in params.parameters()]


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    description = "VGG16 with checkpoint_sequential in 2 segments"
    args, device, size = script_arguments(description, tuple(SIZES), steps=3, argv=argv)
    cfg = SIZES[size]

    torch.manual_seed(0)
    model = vgg16(cfg["width"], cfg["hidden"], cfg["classes"], cfg["image"]).to(device)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(cfg["batch"], 3, cfg["image"], cfg["image"], generator=g).to(device)
    y = torch.randint(0, cfg["classes"], (cfg["batch"],), generator=g).to(device)
    print(f"VGG16, widths {cfg['width']}..{8 * cfg['width']}, input {tuple(x.shape)} on {device} (size {size!r})")

    variants = {
        "eager": lambda m: m,
        "torch checkpoint_sequential(2)": lambda m: Segmented(
            m, torch.utils.checkpoint.checkpoint_sequential, use_reentrant=False
        ),
        "memsave checkpoint_sequential(2)": lambda m: Segmented(m, memsave.checkpoint_sequential),
    }
    loss_fn = lambda out: nn.functional.cross_entropy(out, y)  # noqa: E731
    results, grads = {}, {}
    for name, make in variants.items():
        copy_ = copy.deepcopy(model)
        runner = make(copy_)
        grads[name] = grads_after_step(runner, copy_, x, y)
        results[name] = memsave.measure(runner, x, loss_fn=loss_fn, steps=args.steps)

    base = results["eager"]
    what = "torch.cuda.max_memory_allocated" if device.type == "cuda" else "CPU allocator events"
    print(f"\n{'':<34}{'peak (' + what + ')':>42}{'activations':>14}{'step time':>12}{'max |grad diff|':>17}")
    for name, m in results.items():
        diff = max(float((a - b).abs().max()) for a, b in zip(grads[name], grads["eager"]))
        print(
            f"{name:<34}{format_bytes(m.peak_bytes):>42}{format_bytes(m.activation_bytes):>14}"
            f"{m.step_seconds / base.step_seconds:>11.2f}x{diff:>17.3g}"
        )
    ms = results["memsave checkpoint_sequential(2)"]
    print(
        f"\nmemsave: peak {ms.peak_bytes / base.peak_bytes:.0%} of eager, activations "
        f"{ms.activation_bytes / base.activation_bytes:.0%} of eager."
        "\nThe walk-through reported 14,222 MB -> 10,550 MB (74%) at about +35% time on a GPU (batch 64, 224x224)."
    )
    identical = all(torch.equal(a, b) for a, b in zip(grads["memsave checkpoint_sequential(2)"], grads["eager"]))
    return {"size": size, "results": results, "identical": identical}


if __name__ == "__main__":
    result = main()
    sys.exit(0 if result["identical"] or torch.cuda.is_available() else 1)
