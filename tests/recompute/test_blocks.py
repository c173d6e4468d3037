"""memsave.find_blocks on small synthetic models, one rule each, and memsave.wrap(model) with no policy.

The real architectures (Hugging Face, timm, torchvision) are in test_real_models.py.
"""

from __future__ import annotations

import copy
import warnings
from typing import Any, ClassVar, Dict, List, Optional

import pytest
import torch
from torch import nn

import memsave
from helpers import models
from memsave import models as bench_models
from memsave.errors import MemsaveWarning
from memsave.measurement.strategies import StrategyContext, parse_strategy
from memsave.recompute import find_blocks, is_wrapped, resolve_checkpoint_policy
from memsave.recompute.blocks import explain_blocks


def _wrapped(model: nn.Module) -> List[str]:
    return [n for n, m in model.named_modules() if is_wrapped(m)]


class Block(nn.Module):
    def __init__(self, d: int = 8, hidden: int = 16) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc1, self.fc2 = nn.Linear(d, hidden), nn.Linear(hidden, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.norm(x))))


class Stage(nn.Module):
    """A downsampling layer, then a run of blocks (ConvNeXt's and Swin's stages)."""

    def __init__(self, d: int, depth: int) -> None:
        super().__init__()
        self.down = nn.Linear(d, d)
        self.blocks = nn.Sequential(*[Block(d) for _ in range(depth)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(self.down(x))


# ---------------------------------------------------------------------------------------------- the structure
def test_the_family_of_blocks_in_a_layer_list_not_single_layers() -> None:
    model = models.transformer()  # embed, pos, blocks (Sequential of 4 TransformerBlock), norm, head
    assert find_blocks(model) == [f"blocks.{i}" for i in range(4)]
    # The CNN is an nn.Sequential: its ConvBlocks, not its pooling/flatten/dropout/linear leaves.
    assert find_blocks(models.cnn()) == ["0", "1", "3"]
    # A stack of single layers has no blocks.
    assert find_blocks(models.mlp()) == []
    assert find_blocks(nn.Linear(2, 2)) == []


def test_stages_give_way_to_their_blocks() -> None:
    model = nn.Sequential(nn.Linear(8, 8), nn.Sequential(Stage(8, 2), Stage(8, 1)), nn.Linear(8, 2))
    assert find_blocks(model) == ["1.0.blocks.0", "1.0.blocks.1", "1.1.blocks.0"]
    # Not when the blocks are a minority of the stage's parameters (a wide downsampling layer) ...
    wide = Stage(8, 1)
    wide.down = nn.Sequential(nn.Linear(8, 512), nn.Linear(512, 8))
    model = nn.Sequential(wide, Stage(8, 1))
    assert find_blocks(model) == ["0", "1"]
    # ... nor when the stage holds a mixed list (blocks of one class among other layers).
    mixed = nn.ModuleList([nn.ModuleList([Block(), nn.Sequential(nn.Linear(8, 8), nn.ReLU())]) for _ in range(2)])
    assert find_blocks(mixed) == ["0", "1"]


class ConvNormAct(nn.Sequential):
    def __init__(self, c_in: int, c_out: int) -> None:
        super().__init__(nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU())


class Squeeze(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Conv2d(c, 64, 1), nn.Conv2d(64, c, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.fc2(self.fc1(x.mean((2, 3), keepdim=True)).relu()).sigmoid()


class Residual(nn.Module):
    """MobileNet's inverted residual: a Sequential of conv-norm-act layers and a squeeze-excitation."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.block = nn.Sequential(ConvNormAct(c, 2 * c), Squeeze(2 * c), ConvNormAct(2 * c, c))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.block(x)


def test_parts_of_blocks_give_way_to_the_blocks() -> None:
    # The ConvNormAct family (more members, and with the stem and head more parameters than the residual blocks'
    # own) and the Squeeze family (most of the blocks' parameters) are parts of the residual blocks.
    model = nn.Sequential(ConvNormAct(3, 8), *[Residual(8) for _ in range(3)], ConvNormAct(8, 64))
    assert find_blocks(model) == ["1", "2", "3"]


class Lin(nn.Module):
    def __init__(self, n: int = 1) -> None:
        super().__init__()
        self.fcs = nn.ModuleList([nn.Linear(4, 4, bias=False) for _ in range(n)])  # 16 parameters each


class OtherLin(Lin):
    pass


def _holder(**lists: List[nn.Module]) -> nn.Module:
    model = nn.Module()
    for name, members in lists.items():
        setattr(model, name, nn.ModuleList(members))
    return model


def test_largest_family_by_parameters_then_members_then_order() -> None:
    # Fewer members but more parameters wins.
    model = _holder(
        small=[nn.Sequential(nn.Linear(4, 4), nn.ReLU()) for _ in range(5)], big=[Block(8, 64) for _ in range(2)]
    )
    assert find_blocks(model) == ["big.0", "big.1"]
    # The same parameters (64): more members wins.
    model = _holder(two=[Lin(2) for _ in range(2)], four=[OtherLin(1) for _ in range(4)])
    assert find_blocks(model) == [f"four.{i}" for i in range(4)]
    # The same parameters and members: the first in module order.
    model = _holder(a=[OtherLin(1) for _ in range(2)], b=[Lin(1) for _ in range(2)])
    assert find_blocks(model) == ["a.0", "a.1"]
    # A parameter shared by two members counts once.
    shared = [Lin(4) for _ in range(3)]
    for m in shared[1:]:
        m.fcs = shared[0].fcs
    model = _holder(shared=shared, own=[OtherLin(2) for _ in range(2)])  # 64 unique in both; 3 members win...
    assert find_blocks(model) == ["shared.0", "shared.1", "shared.2"]
    model = _holder(shared=shared, own=[OtherLin(3) for _ in range(2)])  # ... unless the other has more (96)
    assert find_blocks(model) == ["own.0", "own.1"]


def test_outermost_members_and_meta_device() -> None:
    # A family whose members nest (Sequentials of Sequentials): the outermost ones.
    inner = lambda: nn.Sequential(nn.Linear(8, 8), nn.ReLU())  # noqa: E731
    model = nn.ModuleList([nn.Sequential(inner(), inner()) for _ in range(2)])
    assert find_blocks(model) == ["0", "1"]
    with torch.device("meta"):
        big = nn.Sequential(*[Block(4096, 16384) for _ in range(3)])
    assert find_blocks(big) == ["0", "1", "2"]


# -------------------------------------------------------------- the model's own, and the libraries' checkpoint units
def test_checkpoint_blocks_first() -> None:
    gpt = bench_models.build("gpt2", "tiny").model
    assert find_blocks(gpt) == gpt.checkpoint_blocks() == [f"h.{i}" for i in range(len(gpt.h))]
    vgg = bench_models.build("vgg16", "tiny").model
    assert find_blocks(vgg) == vgg.checkpoint_blocks()  # its stages and classifier, as the benchmarks define

    class Wrong(nn.Sequential):
        def checkpoint_blocks(self) -> List[str]:
            return ["0", "nope"]

    with pytest.raises(ValueError, match=r"Wrong.checkpoint_blocks\(\) names nope, which are not submodules"):
        find_blocks(Wrong(nn.Linear(2, 2)))


class Embeddings(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok, self.norm = nn.Embedding(10, 8), nn.LayerNorm(8)


class Layer(Block):
    pass


class PreTrained(nn.Module):
    """Hugging Face's device-map convention: the layer classes to keep whole, by name (embeddings listed too)."""

    _no_split_modules: ClassVar[List[str]] = ["Embeddings", "Layer"]

    def __init__(self) -> None:
        super().__init__()
        self.embed = Embeddings()
        self.layers = nn.ModuleList([Layer() for _ in range(2)])
        self.extra = nn.ModuleList([Block(8, 256) for _ in range(3)])  # larger, and not the listed class


def test_no_split_modules_is_not_a_checkpoint_unit() -> None:
    choice = explain_blocks(PreTrained())
    assert choice.names == ["extra.0", "extra.1", "extra.2"]  # the structure's largest family, not the listed one
    assert choice.source == "structure"


def _named_like(name: str, module: str, **attributes: Any) -> type:
    """A module class called ``name`` defined in ``module``: find_blocks knows a library's classes by these names
    along the class hierarchy (it imports no library), so these stand in for the libraries' own base classes."""
    return type(name, (nn.Module,), {"__module__": module, **attributes})


# Hugging Face transformers' and diffusers' base classes, as find_blocks sees them.
HFLayer = _named_like("GradientCheckpointingLayer", "transformers.modeling_layers", gradient_checkpointing=False)
HFModel = _named_like("PreTrainedModel", "transformers.modeling_utils", supports_gradient_checkpointing=True)
DiffusersModel = _named_like("ModelMixin", "diffusers.models.modeling_utils", _supports_gradient_checkpointing=True)


class ConvLayer(HFLayer):  # type: ignore[misc,valid-type]
    """Wav2Vec2's feature encoder layer: a convolution that Hugging Face checkpoints beside the encoder layers."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.norm = nn.Conv1d(8, 8, 3, padding=1), nn.GroupNorm(1, 8)


class EncoderLayer(HFLayer):  # type: ignore[misc,valid-type]
    def __init__(self) -> None:
        super().__init__()
        self.block = Block()


class EncoderStage(HFLayer):  # type: ignore[misc,valid-type]
    """Swin's stage: a checkpoint unit holding checkpoint units (its blocks) and a downsampling layer."""

    def __init__(self, down: int = 8) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([EncoderLayer() for _ in range(2)])
        self.down = nn.Sequential(nn.Linear(8, down), nn.Linear(down, 8))


class Transformer(HFModel):  # type: ignore[misc,valid-type]
    _no_split_modules: ClassVar[List[str]] = ["EncoderStage"]

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.ModuleList([ConvLayer() for _ in range(3)])
        self.stages = nn.ModuleList([EncoderStage() for _ in range(2)])
        self.extra = nn.ModuleList([Block(8, 256) for _ in range(3)])  # larger, but not a checkpoint unit


def test_hugging_face_checkpoint_layers_first() -> None:
    model = Transformer()
    blocks = [f"stages.{s}.blocks.{b}" for s in range(2) for b in range(2)]
    choice = explain_blocks(model)
    assert choice.names == ["features.0", "features.1", "features.2", *blocks]  # the convolutions too
    assert choice.source == "transformers" and "GradientCheckpointingLayer" in choice.reason, choice
    assert "EncoderStage gave way to the units inside" in choice.reason, choice.reason
    outer = nn.Module()
    outer.base = model  # read from submodules too (a PEFT model holds the transformers model)
    assert find_blocks(outer) == [f"base.{n}" for n in choice.names]
    # A unit holding units gives way to them only when they hold at least half of its parameters.
    model.stages[1] = EncoderStage(down=512)
    assert find_blocks(model) == ["features.0", "features.1", "features.2", *blocks[:2], "stages.1"]


class OldEncoder(nn.Module):
    """A Hugging Face encoder from before GradientCheckpointingLayer: it checkpoints its layers itself."""

    def __init__(self) -> None:
        super().__init__()
        self.gradient_checkpointing = False
        self.embed = Embeddings()
        self.layers = nn.ModuleList([Layer() for _ in range(3)])


class OldTransformer(HFModel):  # type: ignore[misc,valid-type]
    def __init__(self) -> None:
        super().__init__()
        self.encoder = OldEncoder()
        self.extra = nn.ModuleList([Block(8, 256) for _ in range(3)])


def test_hugging_face_models_before_checkpoint_layers() -> None:
    model = OldTransformer()
    choice = explain_blocks(model)
    assert choice.names == ["encoder.layers.0", "encoder.layers.1", "encoder.layers.2"], choice
    assert choice.source == "transformers" and "gradient_checkpointing switch" in choice.reason
    model.supports_gradient_checkpointing = False  # no switch: the structure
    assert find_blocks(model) == ["extra.0", "extra.1", "extra.2"]


class TimmStage(nn.Module):
    def __init__(self, depth: int) -> None:
        super().__init__()
        self.grad_checkpointing = False
        self.down = nn.Sequential(nn.LayerNorm(8), nn.Linear(8, 8))
        self.blocks = nn.Sequential(*[Block() for _ in range(depth)])


class NumberedStage(nn.Module):
    """timm's RegStage: blocks held as attributes, run by ``checkpoint_seq(self.children(), x)``."""

    def __init__(self) -> None:
        super().__init__()
        self.grad_checkpointing = False
        self.b1, self.b2 = Layer(), Layer()


class TimmNet(nn.Module):
    """timm's convention: ``set_grad_checkpointing`` turns on the ``grad_checkpointing`` of the model or its stages,
    which run their layer lists through ``checkpoint_seq``."""

    def __init__(self) -> None:
        super().__init__()
        self.grad_checkpointing = False
        self.stem = nn.Sequential(nn.Linear(8, 8), nn.GELU())  # single layers: not blocks
        self.stages = nn.Sequential(nn.Sequential(Block(), Layer()), nn.Sequential(Block()))  # plain stages: opened
        self.deep = nn.ModuleList([TimmStage(2), NumberedStage()])
        self.head1, self.head2 = Block(8, 512), Block(8, 512)  # the structure's largest family: not in a list

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        for module in self.modules():
            if hasattr(module, "grad_checkpointing"):
                module.grad_checkpointing = enable


def test_timm_set_grad_checkpointing_units() -> None:
    choice = explain_blocks(TimmNet())
    deep = ["deep.0.blocks.0", "deep.0.blocks.1", "deep.1.b1", "deep.1.b2"]
    # The model's lists of blocks give their members, plain stages are opened into their blocks, and the TimmStage
    # unit gives way to the blocks its own switch runs; the stem (single layers) and the heads (not in a list) are
    # not run through checkpoint_seq.
    assert choice.names == ["stages.0.0", "stages.0.1", "stages.1.0", *deep], choice
    assert choice.source == "timm"


class Resnets(DiffusersModel):  # type: ignore[misc,valid-type]
    """diffusers' down block: checkpoints its ResNet blocks; its attentions are models checkpointing their own."""

    def __init__(self) -> None:
        super().__init__()
        self.gradient_checkpointing = False
        self.resnets = nn.ModuleList([Block() for _ in range(2)])
        self.attentions = nn.ModuleList([Attentions() for _ in range(2)])


class Attentions(DiffusersModel):  # type: ignore[misc,valid-type]
    def __init__(self) -> None:
        super().__init__()
        self.gradient_checkpointing = False
        self.proj_in = nn.Linear(8, 8)
        self.transformer_blocks = nn.ModuleList([Layer() for _ in range(2)])


def test_diffusers_checkpoint_units() -> None:
    choice = explain_blocks(Resnets())
    attention = [f"attentions.{a}.transformer_blocks.{b}" for a in range(2) for b in range(2)]
    assert choice.names == ["resnets.0", "resnets.1", *attention], choice
    assert choice.source == "diffusers"


def test_the_libraries_in_order() -> None:
    # A model following both conventions: Hugging Face's checkpoint layers first.
    model = TimmNet()
    model.stem = nn.Sequential(EncoderLayer(), EncoderLayer())
    assert find_blocks(model) == ["stem.0", "stem.1"]
    assert explain_blocks(model).source == "transformers"


class Branches(nn.Module):
    """An Inception module: four branches side by side, their outputs concatenated; three of them short runs."""

    def __init__(self, c: int = 8) -> None:
        super().__init__()
        self.branch1 = ConvNormAct(c, c)
        self.branch2 = nn.Sequential(ConvNormAct(c, c), ConvNormAct(c, c))
        self.branch3 = nn.Sequential(ConvNormAct(c, c), ConvNormAct(c, c))
        self.branch4 = nn.Sequential(nn.MaxPool2d(3, 1, 1), ConvNormAct(c, c))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.branch1(x), self.branch2(x), self.branch3(x), self.branch4(x)], 1)


class Aux(nn.Module):
    """An auxiliary classifier: large in parameters (its Linear), small in activations."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.fc = ConvNormAct(32, 8), nn.Linear(8 * 16, 4096)


def test_a_multi_branch_block_is_one_block_and_auxiliary_heads_are_not_blocks() -> None:
    model = nn.Module()
    model.stem = ConvNormAct(3, 8)
    model.mixed1, model.mixed2 = Branches(), Branches()
    model.pool = nn.MaxPool2d(2)
    model.mixed3 = Branches()
    assert find_blocks(model) == ["mixed1", "mixed2", "mixed3"]  # not each branch's convolutions
    model.aux1, model.aux2 = Aux(), Aux()  # the largest family, but auxiliary heads
    choice = explain_blocks(model)
    assert choice.names == ["mixed1", "mixed2", "mixed3"] and "Aux are auxiliary heads" in choice.reason, choice


# ------------------------------------------------------------------------------------------ wrap and strategies
def test_wrap_without_policy_wraps_exactly_find_blocks() -> None:
    model = models.transformer()
    eager = copy.deepcopy(model)
    assert memsave.wrap(model) is model
    assert _wrapped(model) == find_blocks(eager) == resolve_checkpoint_policy(eager, "blocks")
    x = models.example_input("transformer")
    grads = []
    for m in (eager, model):
        torch.manual_seed(3)
        m(x).float().pow(2).mean().backward()
        grads.append([p.grad for p in m.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*grads))
    # The strategies: checkpoint:blocks and torch's baseline around the same modules.
    ctx = StrategyContext((x,), None, torch.device("cpu"))
    ours = parse_strategy("checkpoint:blocks").prepare(copy.deepcopy(eager), ctx)
    assert _wrapped(ours) == find_blocks(eager)


def test_wrap_without_policy_warns_when_there_are_no_blocks() -> None:
    model = models.mlp()
    with pytest.warns(MemsaveWarning, match=r"found no repeated blocks in Sequential, so nothing is checkpointed"):
        memsave.wrap(model)
    assert _wrapped(model) == []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        memsave.wrap(models.cnn())  # blocks found: no warning


# ------------------------------------------------------------------ Hugging Face layers that write a KV cache
class CacheWritingLayer(nn.Module):
    """Like a Hugging Face decoder layer: appends its keys to its slot of the cache it is given (positional or
    keyword) and attends to all the keys there."""

    _can_checkpoint_with_cache = False

    def __init__(self) -> None:
        super().__init__()
        self.k = nn.Linear(4, 4)

    def forward(
        self,
        h: torch.Tensor,
        past_key_values: Optional[Dict[int, List[torch.Tensor]]] = None,
        use_cache: bool = False,
        **kwargs: Any,
    ) -> torch.Tensor:
        k = self.k(h)
        if use_cache and past_key_values is not None:
            past_key_values.setdefault(id(self), []).append(k)
            k = torch.cat(past_key_values[id(self)], 0)
        return (h @ k.T).softmax(-1) @ k


@pytest.mark.parametrize("positional", [True, False])
def test_a_region_never_writes_a_hugging_face_cache_twice(positional: bool) -> None:
    layers = nn.ModuleList([CacheWritingLayer() for _ in range(2)])
    eager = copy.deepcopy(layers)
    memsave.wrap(layers, CacheWritingLayer)
    x = torch.randn(3, 4)
    outs = []
    for stack in (eager, layers):
        cache: Dict[int, List[torch.Tensor]] = {}  # empty, so falsy: the layers still get it
        h = x
        for layer in stack:
            h = layer(h, cache, True) if positional else layer(h, past_key_values=cache, use_cache=True)
        h.pow(2).sum().backward()
        outs.append((h, cache))
    # Inside a region the layer runs without the cache (as under Hugging Face's own gradient checkpointing), so its
    # recompute cannot append a second time; the output is the same.
    assert sorted(map(len, outs[0][1].values())) == [1, 1] and outs[1][1] == {}
    assert torch.equal(outs[0][0], outs[1][0])
    for p, q in zip(eager.parameters(), layers.parameters()):
        assert torch.equal(p.grad, q.grad)
    # Without grad there is no region: the cache is written as usual (generation).
    cache = {}
    with torch.no_grad():
        layers[0](x, cache, True)
    assert [len(v) for v in cache.values()] == [1]
