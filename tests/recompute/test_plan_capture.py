"""One dynamo capture, compiled per candidate (``memsave.recompute.planning.capture``).

What ``plan(compile=True)`` measures must be what the plan does when compiled: on a Hugging Face GPT-2, a timm ViT
and a torchvision ResNet (tiny sizes, no dropout), a captured step compiled with a plan's regions as recompute tags
peaks at exactly the bytes of ``torch.compile(memsave.wrap(model, plan))`` -- regions recomputed whole, keeping
their matrix products and attention, keeping every other matrix product (torchtitan's rule), keeping convolutions --
and gives its gradients within float32 rounding. Plus: dynamo source names map to module names, and a region the
capture never ran is reported as not covered (the planner then compiles it the old way).
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Dict, Tuple

import pytest
import torch
from torch import nn

import memsave
from helpers import hub
from memsave.measurement.allocator import step_peak_bytes
from memsave.recompute.planning.capture import CapturedStep, module_path, region_tags
from memsave.recompute.planning.plan import apply_regions

pytestmark = pytest.mark.slow
CPU = torch.device("cpu")
REL = 1e-4  # normwise, as in test_compile.py
Case = Tuple[nn.Module, Dict[str, Any], Callable[[Any], torch.Tensor]]


def _gpt2() -> Case:
    pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = hub.gpt2(layers=3, hidden=64, heads=4, vocab=256, positions=64, bos_token_id=0, eos_token_id=0)
    ids = torch.randint(0, 256, (4, 64), generator=torch.Generator().manual_seed(1))
    return model, {"input_ids": ids}, lambda out: out.logits.float().sum()


def _vit() -> Case:
    vt = pytest.importorskip("timm.models.vision_transformer")
    torch.manual_seed(0)
    model = vt.VisionTransformer(img_size=32, patch_size=4, embed_dim=64, depth=3, num_heads=2, num_classes=10)
    return model.train(), {"x": torch.randn(8, 3, 32, 32)}, lambda out: out.float().sum()


def _resnet() -> Case:
    models = pytest.importorskip("torchvision.models")
    torch.manual_seed(0)
    model = models.resnet18(num_classes=10).train()
    return model, {"x": torch.randn(4, 3, 32, 32)}, lambda out: out.float().sum()


# model, the operator classes its selective regions keep ("" : regions recomputed whole)
CASES = {
    "gpt2-whole": (_gpt2, ()),
    "gpt2-alternate": (_gpt2, ("alternate_matmul", "attention")),
    "vit-matmul": (_vit, ("matmul", "attention")),
    "resnet-conv": (_resnet, ("conv",)),
}


def _plan(model: nn.Module, inputs: Dict[str, Any], loss_fn: Callable[[Any], torch.Tensor], keeps: Tuple[str, ...]):
    p = memsave.plan(model, solver="sqrt", loss_fn=loss_fn, cache=False, progress=False, selective=False, **inputs)
    assert p.regions(), p.summary()
    p.selective = [keeps if rec else () for _, _, rec in p.segments]
    return p


def _measure(model: nn.Module, run: Callable[..., Any], inputs: Dict[str, Any], loss_fn: Callable) -> Tuple[int, Dict]:
    def step() -> None:
        model.zero_grad(set_to_none=True)
        loss_fn(run(**inputs)).backward()

    step()  # compiles
    model.zero_grad(set_to_none=True)
    peak = step_peak_bytes(step, CPU)
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return peak, grads


def _sharing_copy(model: nn.Module) -> nn.Module:
    return copy.deepcopy(model, {id(t): t for t in [*model.parameters(), *model.buffers()]})


@pytest.mark.parametrize("name", sorted(CASES))
def test_captured_program_peaks_as_the_compiled_plan(name: str) -> None:
    build, keeps = CASES[name]
    model, inputs, loss_fn = build()
    p = _plan(model, inputs, loss_fn, keeps)
    torch._dynamo.reset()
    capture = CapturedStep(_sharing_copy(model))
    tags = region_tags(p)
    _measure(model, capture.program((), None), inputs, loss_fn)  # the capture, as the planner's first program
    assert capture.covers(tags)
    peak, grads = _measure(model, capture.program(tags, None), inputs, loss_fn)
    reference = _sharing_copy(model)
    apply_regions(reference, p)
    want_peak, want_grads = _measure(model, torch.compile(reference), inputs, loss_fn)
    assert peak == want_peak, (peak, want_peak, p.summary())
    assert grads.keys() == want_grads.keys()
    for n, g in grads.items():
        err = (g - want_grads[n]).norm() / want_grads[n].norm().clamp_min(1e-30)
        assert err <= REL, (n, float(err))


class _Break(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        torch._dynamo.graph_break()
        return x


class _Broken(nn.Module):
    """Linear, a graph break, Identity, Linear (dynamo skips nn.Sequential's own frames after a break)."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.brk, self.idle, self.last = nn.Linear(8, 8), _Break(), nn.Identity(), nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.last(self.idle(self.brk(self.first(x))))


def test_covers_only_regions_the_capture_ran() -> None:
    model = nn.Sequential(nn.Linear(8, 8), nn.Identity(), nn.Linear(8, 8))
    torch._dynamo.reset()
    capture = CapturedStep(model)
    assert not capture.covers(((("0",), ()),))  # nothing captured yet
    capture.program((), None)(torch.randn(2, 8)).sum().backward()
    assert capture.covers(((("0",), ()), (("2",), ("matmul",))))
    assert capture.covers(((("1",), ()),))  # no graph break: Identity ran nothing to tag
    assert capture.covers(())


def test_a_graph_break_leaves_unseen_regions_uncovered() -> None:
    model = _Broken()
    torch._dynamo.reset()
    capture = CapturedStep(model)
    capture.program((), None)(torch.randn(2, 8)).sum().backward()
    assert len(capture.graphs) == 2
    assert capture.covers(((("first",), ()), (("last",), ())))
    assert not capture.covers(((("idle",), ()),))  # ran nothing, or outside the graphs: not known
    assert not capture.covers(((("first",), ()), (("brk",), ())))
    graphs = len(capture.graphs)
    capture.program(((("first",), ()),), 0.5)(torch.randn(2, 8)).sum().backward()
    assert len(capture.graphs) == graphs  # a new program: compiled from the capture, not traced again
    assert {key[0] for key in capture.programs} == set(range(graphs))


def test_another_backend_sees_the_tagged_graphs_under_the_budget() -> None:
    seen = []

    def backend(gm: torch.fx.GraphModule, example_inputs: Any) -> Callable[..., Any]:
        tagged = {n.meta["ac_graph_id"] for n in gm.graph.nodes if "recompute" in n.meta}
        seen.append((tagged, torch._functorch.config.activation_memory_budget))
        return gm.forward

    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))
    torch._dynamo.reset()
    capture = CapturedStep(model, backend)
    capture.program((), None)(torch.randn(2, 8)).sum().backward()
    default = torch._functorch.config.activation_memory_budget
    capture.program(((("0", "1"), ()), (("2",), ())), 0.5)(torch.randn(2, 8)).sum().backward()
    assert seen == [(set(), default), ({1, 2}, 0.5)]


@pytest.mark.parametrize(
    "source, name",
    [
        ("L['self'].transformer.h[0]", "transformer.h.0"),
        ("L['self']._modules['blocks']._modules['3'].attn", "blocks.3.attn"),
        ("getattr(L['self'].layers, '2').mlp", "layers.2.mlp"),
        ("L['self']", ""),
    ],
)
def test_module_path(source: str, name: str) -> None:
    assert module_path(source) == name
