"""Benchmark models with fixed seeds and synthetic data (benchmarks/README.md).

Four models, written here (no torchvision), each at three sizes:

========  ============================================  ==============================================  ==============
model     full (the protocol; a GPU)                    cpu (committed CPU runs, 2 cores)               tiny (tests)
========  ============================================  ==============================================  ==============
vgg16     batch 64, 3x224x224, widths 64..512,          batch 4, 3x64x64, widths 64..512, no 7x7 pool,  batch 2, 32x32,
          7x7 pool, classifier 4096, 1000 classes       classifier 1024, 100 classes                    widths 8..64
unet      batch 8, 3x512x512, widths 64..1024,          batch 2, 3x64x64, widths 64..1024 (the          batch 1, 32x32,
          2 classes (5 levels, BatchNorm)               classic ones), 2 classes                        widths 8..128
resnet50  batch 64, 3x224x224, bottlenecks [3,4,6,3],   batch 8, 3x64x64, widths 64..512 (x4),          batch 2, 32x32,
          widths 64..512 (x4), 1000 classes             100 classes                                     widths 8..64
gpt2      batch 8, seq 1024, 12 layers, d 768,          batch 2, seq 256, 6 layers, d 384, 6 heads,     batch 1, seq 32,
          12 heads, vocab 50257, dropout 0.1            vocab 4096, dropout 0.1                         2 layers, d 64
========  ============================================  ==============================================  ==============

Every model exposes the two views the checkpointing strategies need:

* ``checkpoint_blocks()``: the qualified names of the blocks that "checkpoint per block" wraps
  (VGG16: the 5 convolution stages and the classifier; UNet: inc, down1..4, up1..4, outc; ResNet-50: every
  bottleneck; GPT: every transformer block);
* ``as_sequential()``: an ``nn.Sequential`` running the same computation with the *same* parameter objects, for
  ``checkpoint_sequential``. UNet's stages pass a tuple (the skip connections so far) from one stage to the next.

:func:`build` returns a :class:`BenchCase`: the model (seeded), the inputs (seeded), the loss function.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["BenchCase", "MODELS", "SIZES", "build", "VGG16", "UNet", "ResNet50", "GPT"]


# ------------------------------------------------------------------------------------------------------------ VGG16
class VGG16(nn.Module):
    """VGG16 (configuration "D"): 13 3x3 convolutions in 5 stages, each ending in a 2x2 max pool, then 3 linears.

    Args:
        width: channels of the first stage (64 in the original); stages use width x (1, 2, 4, 8, 8).
        hidden: width of the two hidden classifier layers (4096 in the original).
        num_classes: output classes.
        pool7: adaptive-average-pool the features to 7x7 as torchvision does (the classifier then has
            ``8 * width * 49`` inputs); without it the classifier takes the flattened features of a ``image``-sized
            input.
        image: input height = width, needed to size the classifier when ``pool7`` is off.
    """

    STAGES = ((1, 1), (2, 2), (4, 4, 4), (8, 8, 8), (8, 8, 8))

    def __init__(
        self,
        width: int = 64,
        hidden: int = 4096,
        num_classes: int = 1000,
        pool7: bool = True,
        image: int = 224,
        dropout: float = 0.5,
    ) -> None:
        super().__init__()
        stages, c_in = [], 3
        for mults in self.STAGES:
            layers: List[nn.Module] = []
            for m in mults:
                layers += [nn.Conv2d(c_in, width * m, 3, padding=1), nn.ReLU()]
                c_in = width * m
            layers.append(nn.MaxPool2d(2))
            stages.append(nn.Sequential(*layers))
        self.features = nn.Sequential(*stages)
        self.avgpool = nn.AdaptiveAvgPool2d(7) if pool7 else nn.Identity()
        flat = c_in * (49 if pool7 else (image // 32) ** 2)
        self.classifier = nn.Sequential(
            nn.Flatten(1),
            nn.Linear(flat, hidden),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.avgpool(self.features(x)))

    def checkpoint_blocks(self) -> List[str]:
        return [f"features.{i}" for i in range(len(self.features))] + ["classifier"]

    def as_sequential(self) -> nn.Sequential:
        return nn.Sequential(*self.features, self.avgpool, self.classifier)


# ------------------------------------------------------------------------------------------------------------- UNet
class DoubleConv(nn.Module):
    """(3x3 convolution -> BatchNorm -> ReLU) twice, as in the classic UNet."""

    def __init__(self, c_in: int, c_out: int, c_mid: int = 0) -> None:
        super().__init__()
        c_mid = c_mid or c_out
        self.net = nn.Sequential(
            nn.Conv2d(c_in, c_mid, 3, padding=1, bias=False),
            nn.BatchNorm2d(c_mid),
            nn.ReLU(inplace=True),
            nn.Conv2d(c_mid, c_out, 3, padding=1, bias=False),
            nn.BatchNorm2d(c_out),
            nn.ReLU(inplace=True),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class Down(nn.Module):
    """2x2 max pool, then DoubleConv."""

    def __init__(self, c_in: int, c_out: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.MaxPool2d(2), DoubleConv(c_in, c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class Up(nn.Module):
    """2x2 transposed convolution of the coarse map, concatenation with the skip connection, DoubleConv."""

    def __init__(self, c_in: int, c_out: int) -> None:
        super().__init__()
        self.up = nn.ConvTranspose2d(c_in, c_in // 2, 2, stride=2)
        self.conv = DoubleConv(c_in, c_out)

    def forward(self, x: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        return self.conv(torch.cat([skip, self.up(x)], dim=1))


class UNet(nn.Module):
    """The classic 5-level UNet: widths w, 2w, 4w, 8w, 16w (64..1024 for w = 64), BatchNorm, transposed-conv upsampling.

    Args:
        in_channels: input image channels.
        num_classes: output channels (per-pixel classes).
        width: channels of the first level.
    """

    def __init__(self, in_channels: int = 3, num_classes: int = 2, width: int = 64) -> None:
        super().__init__()
        w = width
        self.inc = DoubleConv(in_channels, w)
        self.down1, self.down2 = Down(w, 2 * w), Down(2 * w, 4 * w)
        self.down3, self.down4 = Down(4 * w, 8 * w), Down(8 * w, 16 * w)
        self.up1, self.up2 = Up(16 * w, 8 * w), Up(8 * w, 4 * w)
        self.up3, self.up4 = Up(4 * w, 2 * w), Up(2 * w, w)
        self.outc = nn.Conv2d(w, num_classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x1 = self.inc(x)
        x2 = self.down1(x1)
        x3 = self.down2(x2)
        x4 = self.down3(x3)
        x5 = self.down4(x4)
        x = self.up1(x5, x4)
        x = self.up2(x, x3)
        x = self.up3(x, x2)
        x = self.up4(x, x1)
        return self.outc(x)

    def checkpoint_blocks(self) -> List[str]:
        return ["inc", "down1", "down2", "down3", "down4", "up1", "up2", "up3", "up4", "outc"]

    def as_sequential(self) -> nn.Sequential:
        return nn.Sequential(
            _Push(self.inc, first=True),
            _Push(self.down1),
            _Push(self.down2),
            _Push(self.down3),
            _Push(self.down4),
            _Merge(self.up1),
            _Merge(self.up2),
            _Merge(self.up3),
            _Merge(self.up4),
            _Last(self.outc),
        )


class _Push(nn.Module):
    """Sequential UNet stage: applies ``block`` to the newest map and appends the result to the tuple of maps."""

    def __init__(self, block: nn.Module, first: bool = False) -> None:
        super().__init__()
        self.block, self.first = block, first

    def forward(self, maps: Any) -> Tuple[torch.Tensor, ...]:
        if self.first:
            return (self.block(maps),)
        return (*maps, self.block(maps[-1]))


class _Merge(nn.Module):
    """Sequential UNet stage: upsamples the newest map, merges it with the skip before it, replaces both."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block

    def forward(self, maps: Tuple[torch.Tensor, ...]) -> Tuple[torch.Tensor, ...]:
        return (*maps[:-2], self.block(maps[-1], maps[-2]))


class _Last(nn.Module):
    """Sequential UNet stage: the 1x1 output convolution of the single map left."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block

    def forward(self, maps: Tuple[torch.Tensor, ...]) -> torch.Tensor:
        return self.block(maps[-1])


# -------------------------------------------------------------------------------------------------------- ResNet-50
class Bottleneck(nn.Module):
    """1x1 reduce -> 3x3 (stride) -> 1x1 expand (x4), BatchNorm after each, identity or projection shortcut."""

    expansion = 4

    def __init__(self, c_in: int, width: int, stride: int = 1) -> None:
        super().__init__()
        c_out = width * self.expansion
        self.conv1, self.bn1 = nn.Conv2d(c_in, width, 1, bias=False), nn.BatchNorm2d(width)
        self.conv2, self.bn2 = nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width)
        self.conv3, self.bn3 = nn.Conv2d(width, c_out, 1, bias=False), nn.BatchNorm2d(c_out)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or c_in != c_out:
            self.downsample = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        identity = x if self.downsample is None else self.downsample(x)
        return self.relu(out + identity)


class ResNet50(nn.Module):
    """ResNet-50: 7x7 stem, bottleneck stages [3, 4, 6, 3] of widths w, 2w, 4w, 8w (x4 expansion), average pool, fc.

    Args:
        width: width of the first stage (64 in the original).
        num_classes: output classes.
    """

    LAYERS = (3, 4, 6, 3)
    # Built by setattr in __init__; declared for the type checker.
    layer1: nn.Sequential
    layer2: nn.Sequential
    layer3: nn.Sequential
    layer4: nn.Sequential

    def __init__(self, width: int = 64, num_classes: int = 1000) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 7, 2, 3, bias=False)
        self.bn1, self.relu, self.maxpool = nn.BatchNorm2d(width), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1)
        c_in = width
        for i, n in enumerate(self.LAYERS):
            w = width * 2**i
            blocks = []
            for j in range(n):
                blocks.append(Bottleneck(c_in, w, stride=2 if (j == 0 and i > 0) else 1))
                c_in = w * Bottleneck.expansion
            setattr(self, f"layer{i + 1}", nn.Sequential(*blocks))
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(c_in, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))

    def checkpoint_blocks(self) -> List[str]:
        return [f"layer{i + 1}.{j}" for i, n in enumerate(self.LAYERS) for j in range(n)]

    def as_sequential(self) -> nn.Sequential:
        return nn.Sequential(
            self.conv1,
            self.bn1,
            self.relu,
            self.maxpool,
            *self.layer1,
            *self.layer2,
            *self.layer3,
            *self.layer4,
            self.avgpool,
            nn.Flatten(1),
            self.fc,
        )


# -------------------------------------------------------------------------------------------------------------- GPT
class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention (one qkv Linear, scaled_dot_product_attention, an output Linear)."""

    def __init__(self, d: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.resid_drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
        return self.resid_drop(self.proj(y.transpose(1, 2).reshape(b, t, d)))


class TransformerBlock(nn.Module):
    """Pre-norm GPT-2 block: x + attn(ln(x)), then x + mlp(ln(x)) with a 4x GELU MLP."""

    def __init__(self, d: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(d), CausalSelfAttention(d, heads, dropout)
        self.ln_2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(
            nn.Linear(d, 4 * d), nn.GELU(approximate="tanh"), nn.Linear(4 * d, d), nn.Dropout(dropout)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class _Embed(nn.Module):
    def __init__(self, vocab: int, seq: int, d: int, dropout: float) -> None:
        super().__init__()
        self.wte, self.wpe, self.drop = nn.Embedding(vocab, d), nn.Embedding(seq, d), nn.Dropout(dropout)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        return self.drop(self.wte(idx) + self.wpe(pos))


class _Head(nn.Module):
    """Final LayerNorm and the language-model head, whose weight *is* the token embedding's (tied, as in GPT-2)."""

    def __init__(self, d: int, wte: nn.Embedding) -> None:
        super().__init__()
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, wte.num_embeddings, bias=False)
        self.lm_head.weight = wte.weight  # one Parameter, two names; deepcopy keeps the tie

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.ln_f(x))


class GPT(nn.Module):
    """GPT-2-like decoder: token + position embeddings, ``layers`` pre-norm blocks, final LayerNorm, tied LM head.

    Args:
        vocab: vocabulary size (50257 for GPT-2).
        seq: maximum sequence length (1024).
        d: model width (768); heads: attention heads (12); layers: blocks (12); dropout: 0.1 as in GPT-2.
    """

    def __init__(
        self, vocab: int = 50257, seq: int = 1024, d: int = 768, heads: int = 12, layers: int = 12, dropout: float = 0.1
    ) -> None:
        super().__init__()
        self.embed = _Embed(vocab, seq, d, dropout)
        self.h = nn.ModuleList([TransformerBlock(d, heads, dropout) for _ in range(layers)])
        self.head = _Head(d, self.embed.wte)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx)
        for block in self.h:
            x = block(x)
        return self.head(x)

    def checkpoint_blocks(self) -> List[str]:
        return [f"h.{i}" for i in range(len(self.h))]

    def as_sequential(self) -> nn.Sequential:
        return nn.Sequential(self.embed, *self.h, self.head)


# ------------------------------------------------------------------------------------------------------ the catalogue
SIZES: Dict[str, Dict[str, Dict[str, Any]]] = {
    "vgg16": {
        "full": dict(batch=64, image=224, width=64, hidden=4096, num_classes=1000, pool7=True),
        "cpu": dict(batch=4, image=64, width=64, hidden=1024, num_classes=100, pool7=False),
        "tiny": dict(batch=2, image=32, width=8, hidden=32, num_classes=10, pool7=False),
    },
    "unet": {
        "full": dict(batch=8, image=512, width=64, num_classes=2),
        "cpu": dict(batch=2, image=64, width=64, num_classes=2),
        "tiny": dict(batch=1, image=32, width=8, num_classes=2),
    },
    "resnet50": {
        "full": dict(batch=64, image=224, width=64, num_classes=1000),
        "cpu": dict(batch=8, image=64, width=64, num_classes=100),
        "tiny": dict(batch=2, image=32, width=8, num_classes=10),
    },
    "gpt2": {
        "full": dict(batch=8, seq=1024, d=768, heads=12, layers=12, vocab=50257, dropout=0.1),
        "cpu": dict(batch=2, seq=256, d=384, heads=6, layers=6, vocab=4096, dropout=0.1),
        "tiny": dict(batch=1, seq=32, d=64, heads=2, layers=2, vocab=128, dropout=0.1),
    },
}

MODELS = tuple(SIZES)


@dataclass
class BenchCase:
    """One benchmark model at one size: ``loss_fn(model(*inputs))`` is a training step's loss.

    Attributes:
        name: model name (a key of :data:`SIZES`); size: "full" | "cpu" | "tiny"; config: the size's settings.
        model: the model, initialised from ``seed``; inputs: synthetic inputs from ``seed``;
        loss_fn: output -> scalar loss (cross-entropy against synthetic targets).
    """

    name: str
    size: str
    config: Dict[str, Any]
    model: nn.Module
    inputs: Tuple[Any, ...]
    loss_fn: Callable[[Any], torch.Tensor] = field(repr=False)


class _CrossEntropy:
    """Cross-entropy against fixed targets; a class (not a closure) so a case can be deep-copied or pickled."""

    def __init__(self, target: torch.Tensor) -> None:
        self.target = target

    def __call__(self, out: torch.Tensor) -> torch.Tensor:
        if out.dim() == 3:  # language model: (B, T, V) against (B, T)
            return F.cross_entropy(out.flatten(0, 1).float(), self.target.flatten())
        return F.cross_entropy(out.float(), self.target)


def build(name: str, size: str = "cpu", device: str = "cpu", seed: int = 0, batch: Optional[int] = None) -> BenchCase:
    """Build benchmark model ``name`` at ``size`` with seeded weights and synthetic inputs and targets.

    Args:
        name: one of :data:`MODELS`: "vgg16", "unet", "resnet50", "gpt2".
        size: "full" (the protocol), "cpu" (a 2-core CPU), "tiny" (tests).
        device: where the model and the data go.
        seed: seeds the weights (``torch.manual_seed(seed)``) and the data (a separate generator, ``seed + 1``).
        batch: the batch size instead of the size's own.

    Returns:
        a :class:`BenchCase`, model in training mode.

    Raises:
        ValueError: unknown model or size.

    Examples:
        >>> case = build("unet", "tiny")
        >>> case.loss_fn(case.model(*case.inputs)).backward()
    """
    if name not in SIZES:
        raise ValueError(f"unknown benchmark model {name!r}; choose from {', '.join(MODELS)}")
    if size not in SIZES[name]:
        raise ValueError(f"unknown size {size!r} for {name}; choose from {', '.join(SIZES[name])}")
    cfg = dict(SIZES[name][size])
    if batch is not None:
        if not isinstance(batch, int) or batch < 1:
            raise ValueError(f"batch must be an int >= 1, got {batch!r}")
        cfg["batch"] = batch
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed + 1)
    b = cfg["batch"]
    if name == "vgg16":
        model: nn.Module = VGG16(cfg["width"], cfg["hidden"], cfg["num_classes"], cfg["pool7"], cfg["image"])
        x = torch.randn(b, 3, cfg["image"], cfg["image"], generator=g)
        target = torch.randint(0, cfg["num_classes"], (b,), generator=g)
    elif name == "unet":
        model = UNet(3, cfg["num_classes"], cfg["width"])
        x = torch.randn(b, 3, cfg["image"], cfg["image"], generator=g)
        target = torch.randint(0, cfg["num_classes"], (b, cfg["image"], cfg["image"]), generator=g)
    elif name == "resnet50":
        model = ResNet50(cfg["width"], cfg["num_classes"])
        x = torch.randn(b, 3, cfg["image"], cfg["image"], generator=g)
        target = torch.randint(0, cfg["num_classes"], (b,), generator=g)
    else:
        model = GPT(cfg["vocab"], cfg["seq"], cfg["d"], cfg["heads"], cfg["layers"], cfg["dropout"])
        tokens = torch.randint(0, cfg["vocab"], (b, cfg["seq"] + 1), generator=g)
        x, target = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    model.to(device).train()
    return BenchCase(name, size, cfg, model, (x.to(device),), _CrossEntropy(target.to(device)))


class ShapeCrossEntropy:
    """Cross-entropy against all-zero targets shaped from the output: works at any batch size and on fake tensors.

    (B, C) -> targets (B,); (B, C, H, W) -> (B, H, W); (B, T, V) -> flattened to (B*T, V) against (B*T,).
    Memory does not depend on the target values.
    """

    def __call__(self, out: torch.Tensor) -> torch.Tensor:
        if out.dim() == 3:
            out = out.flatten(0, 1)
        target = torch.zeros(out.shape[:1] + out.shape[2:], dtype=torch.long, device=out.device)
        return F.cross_entropy(out.float(), target)
