"""Small deterministic test models: two MLPs, a CNN with BatchNorm and Dropout, a UNet-like net with skip
connections, a transformer with dropout (token ids in), and a module that replaces its running-mean buffer.

Each builder seeds torch itself, so two calls with the same seed give bitwise-identical models. The UNet and
the transformer call their blocks through ``self.region`` (``None``: plain call), so a test can route every
block through ``memsave.checkpoint`` or any other runner without touching the model: ``region(block, *args)``.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Tuple, Type

import torch
from torch import nn

Region = Optional[Callable[..., Any]]


def mlp(seed: int = 0, d_in: int = 16, hidden: int = 32, d_out: int = 8) -> nn.Sequential:
    """Linear/GELU/Tanh/Dropout stack: 7 modules, plain nn.Sequential."""
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(d_in, hidden),
        nn.GELU(),
        nn.Linear(hidden, hidden),
        nn.Tanh(),
        nn.Dropout(0.2),
        nn.Linear(hidden, hidden),
        nn.Linear(hidden, d_out),
    )


def gelu_mlp(seed: int = 0, d_in: int = 6, hidden: int = 16, d_out: int = 3) -> nn.Sequential:
    """Linear/GELU/Linear: BatchNorm- and Dropout-free, so micro-batches add up exactly to one large batch."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(d_in, hidden), nn.GELU(), nn.Linear(hidden, d_out))


class ConvBlock(nn.Sequential):
    """Conv -> BatchNorm -> ReLU(inplace) -> Dropout."""

    def __init__(self, c_in: int, c_out: int, momentum: Optional[float] = 0.1, p: float = 0.2) -> None:
        super().__init__(
            nn.Conv2d(c_in, c_out, 3, padding=1, bias=False),
            nn.BatchNorm2d(c_out, momentum=momentum),
            nn.ReLU(inplace=True),
            nn.Dropout(p),
        )


def cnn(seed: int = 0) -> nn.Sequential:
    """CNN with BatchNorm (one with ``momentum=None``) and Dropout: 8 modules, plain nn.Sequential."""
    torch.manual_seed(seed)
    return nn.Sequential(
        ConvBlock(3, 8),
        ConvBlock(8, 8, momentum=None),
        nn.MaxPool2d(2),
        ConvBlock(8, 16),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Dropout(0.1),
        nn.Linear(16, 10),
    )


class BasicBlock(nn.Module):
    """torchvision's BasicBlock: one ReLU module used twice, an addition, an optional downsample."""

    def __init__(self, c_in: int, c_out: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.downsample = None
        if stride != 1 or c_in != c_out:
            self.downsample = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class DoubleConv(nn.Sequential):
    """The UNet block: (Conv -> BatchNorm -> ReLU(inplace)) x 2."""

    def __init__(self, c_in: int, c_out: int) -> None:
        super().__init__(
            nn.Conv2d(c_in, c_out, 3, padding=1, bias=False),
            nn.BatchNorm2d(c_out),
            nn.ReLU(inplace=True),
            nn.Conv2d(c_out, c_out, 3, padding=1, bias=False),
            nn.BatchNorm2d(c_out),
            nn.ReLU(inplace=True),
        )


class SmallUNet(nn.Module):
    """A 3-level UNet with skip connections (concatenation), 4..16 channels."""

    def __init__(self, c_in: int = 3, n_classes: int = 2, base: int = 4) -> None:
        super().__init__()
        self.region: Region = None
        self.enc1 = DoubleConv(c_in, base)
        self.enc2 = DoubleConv(base, 2 * base)
        self.mid = DoubleConv(2 * base, 4 * base)
        self.pool = nn.MaxPool2d(2)
        self.up2 = nn.ConvTranspose2d(4 * base, 2 * base, 2, stride=2)
        self.dec2 = DoubleConv(4 * base, 2 * base)
        self.up1 = nn.ConvTranspose2d(2 * base, base, 2, stride=2)
        self.dec1 = DoubleConv(2 * base, base)
        self.head = nn.Conv2d(base, n_classes, 1)

    def _block(self, block: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return block(x) if self.region is None else self.region(block, x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s1 = self._block(self.enc1, x)
        s2 = self._block(self.enc2, self.pool(s1))
        h = self._block(self.mid, self.pool(s2))
        h = self._block(self.dec2, torch.cat([self.up2(h), s2], dim=1))
        h = self._block(self.dec1, torch.cat([self.up1(h), s1], dim=1))
        return self.head(h)


def unet(seed: int = 0) -> SmallUNet:
    torch.manual_seed(seed)
    return SmallUNet()


class TransformerBlock(nn.Module):
    """Pre-LayerNorm transformer block with dropout in attention, after attention and in the MLP."""

    def __init__(self, d: int = 32, heads: int = 4, p: float = 0.1) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, dropout=p, batch_first=True)
        self.drop1 = nn.Dropout(p)
        self.norm2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Dropout(p), nn.Linear(4 * d, d))
        self.drop2 = nn.Dropout(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        a, _ = self.attn(h, h, h, need_weights=False)
        x = x + self.drop1(a)
        return x + self.drop2(self.mlp(self.norm2(x)))


class TinyTransformer(nn.Module):
    """Token ids -> embedding (+ learned positions) -> blocks -> LayerNorm -> logits."""

    def __init__(
        self,
        vocab: int = 50,
        d: int = 32,
        n_blocks: int = 4,
        seq: int = 8,
        block_cls: Type[nn.Module] = TransformerBlock,
    ) -> None:
        super().__init__()
        self.region: Region = None
        self.embed = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(seq, d) * 0.02)
        self.blocks = nn.Sequential(*[block_cls(d) for _ in range(n_blocks)])
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)

    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embed(ids) + self.pos[: ids.shape[1]]

    def readout(self, h: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(h))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed_tokens(ids)
        for block in self.blocks:
            h = block(h) if self.region is None else self.region(block, h)
        return self.readout(h)


def transformer(seed: int = 0, block_cls: Type[nn.Module] = TransformerBlock) -> TinyTransformer:
    torch.manual_seed(seed)
    return TinyTransformer(block_cls=block_cls)


def example_input(name: str, seed: int = 1) -> torch.Tensor:
    """A deterministic input batch for the model ``name`` (mlp, cnn, unet, transformer)."""
    g = torch.Generator().manual_seed(seed)
    if name == "mlp":
        return torch.randn(6, 16, generator=g)
    if name == "cnn":
        return torch.randn(4, 3, 8, 8, generator=g)
    if name == "unet":
        return torch.randn(2, 3, 16, 16, generator=g)
    if name == "transformer":
        return torch.randint(0, 50, (2, 8), generator=g)
    raise ValueError(f"unknown test model {name!r}; expected mlp, cnn, unet or transformer")


BUILDERS = {"mlp": mlp, "cnn": cnn, "unet": unet, "transformer": transformer}


def build(name: str, seed: int = 0) -> Tuple[nn.Module, torch.Tensor]:
    """The model ``name`` and its example input."""
    return BUILDERS[name](seed), example_input(name)


class RunningMean(nn.Module):
    """A module that keeps a running mean of its inputs in the buffer ``avg`` and replaces the buffer object on each
    update (``self.avg = ...``, as EMA code does), rather than writing into it: what a checkpointed region must put
    back before it recomputes. Subclasses give ``forward``, calling :meth:`update`.

    Args:
        features: the buffer's size (the input's last dimension).
        decay: how much of the old value each update keeps.
        weight: how much of the input's batch mean it adds.
        shift: a constant it adds (so that the value changes even when the inputs do not).

    Returns:
        The module, with ``avg`` all zeros.

    Raises:
        ValueError: ``features`` is not positive.

    Examples:
        >>> class Scaled(RunningMean):
        ...     def forward(self, x):
        ...         return x * self.update(x)
    """

    def __init__(self, features: int = 4, decay: float = 0.9, weight: float = 0.1, shift: float = 0.0) -> None:
        super().__init__()
        if features < 1:
            raise ValueError(f"RunningMean needs features >= 1, got {features}")
        self.decay, self.weight, self.shift = decay, weight, shift
        self.register_buffer("avg", torch.zeros(features))

    def update(self, x: torch.Tensor) -> torch.Tensor:
        """Replace ``avg`` by ``decay * avg + weight * mean(x over the batch) + shift``; returns the new buffer."""
        self.avg = self.decay * self.avg + self.weight * x.detach().mean(0) + self.shift
        return self.avg
