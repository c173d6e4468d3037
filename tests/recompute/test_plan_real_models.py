"""``memsave.plan`` on the models people train: Hugging Face GPT-2 and Llama called with keyword inputs
(``input_ids``, ``attention_mask``, ``labels``) and returning a ``ModelOutput``, torchvision and timm ResNet-50 and
ViTs, each with the loss a user would write (the model's own ``.loss``, or a ``loss_fn`` taking the output).

For each model, at a small config with random weights (nothing is downloaded), CPU float32, in training mode
(dropout, stochastic depth and BatchNorm on): the plan is made for a budget half way from the peak of per-block
checkpointing (``memsave.wrap(model)``) to eager's, and

* its measured peak -- memsave's allocator-level measure of one step of the planned model, taken here again --
  is within the budget, with at least one checkpointed region;
* the planned model's gradients and buffers equal eager's bitwise, from the same RNG seed.

Plus the inputs plan cannot take, each with a clear error. The module runs with one intra-op thread (restored
afterwards): on the shared 2-core machines two threads competing with another process make each step several times
slower, and bitwise comparisons never mix thread counts.
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Dict, Tuple

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import memsave
from helpers import hub
from helpers.steps import Args, Kwargs, LossFn, assert_same_step, one_thread
from helpers.steps import generator as _g
from helpers.steps import step_peak as _peak
from helpers.steps import train_step as _step

__all__ = ["one_thread"]  # the module's autouse fixture (one intra-op thread)

VOCAB, SEQ, BATCH, CLASSES = 96, 64, 2, 10


# ----------------------------------------------------------------------------------------------------- models
def _transformers() -> Any:
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()  # the tiny vocabulary's bos/eos warnings
    return transformers


def _gpt2() -> nn.Module:
    _transformers()
    return hub.gpt2(4, 64, heads=4, vocab=VOCAB, positions=SEQ, dropout=None, use_cache=True)  # dropout 0.1


def _llama() -> nn.Module:
    _transformers()
    tokens = {"bos_token_id": 0, "eos_token_id": 0, "use_cache": True}
    return hub.llama(4, 64, 128, heads=4, kv_heads=2, vocab=VOCAB, positions=SEQ, attention_dropout=0.1, **tokens)


def _lm_inputs() -> Kwargs:
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=_g())
    mask = torch.ones(BATCH, SEQ, dtype=torch.long)
    mask[1, :5] = 0  # left padding in the second sequence
    labels = ids.masked_fill(mask == 0, -100)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def _tv_resnet50() -> nn.Module:
    return pytest.importorskip("torchvision").models.resnet50(weights=None, num_classes=CLASSES)


def _timm_resnet50() -> nn.Module:
    return pytest.importorskip("timm").create_model(
        "resnet50", pretrained=False, num_classes=CLASSES, drop_path_rate=0.1
    )


def _timm_vit() -> nn.Module:
    pytest.importorskip("timm")
    return hub.timm_vit(size=32, patch=4, dim=64, depth=4, heads=2, classes=CLASSES, dropout=0.1)


def _tv_vit() -> nn.Module:
    pytest.importorskip("torchvision")
    return hub.torchvision_vit(size=32, patch=4, layers=4, heads=2, hidden=64, mlp=128, classes=CLASSES, dropout=0.1)


def _images(batch: int, size: int) -> Callable[[], Args]:
    return lambda: (torch.randn(batch, 3, size, size, generator=_g()),)


_TARGETS = torch.randint(0, CLASSES, (8,), generator=_g(2))


def _classify(out: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(out, _TARGETS[: out.shape[0]])


def _lm_loss_from_logits(out: Any) -> torch.Tensor:
    """A loss_fn reading the ModelOutput's logits (next-token cross entropy written by hand)."""
    ids = _lm_inputs()["input_ids"]
    return F.cross_entropy(out.logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())


#: name -> (model builder, positional inputs, keyword inputs, loss_fn (None: the default, the model's .loss),
#: the per-layer blocks the plan must have as candidate stages)
Case = Tuple[Callable[[], nn.Module], Callable[[], Args], Callable[[], Kwargs], Any, list]
CASES: Dict[str, Case] = {
    "hf-gpt2": (_gpt2, lambda: (), _lm_inputs, None, [f"transformer.h.{i}" for i in range(4)]),
    "hf-llama": (_llama, lambda: (), _lm_inputs, _lm_loss_from_logits, [f"model.layers.{i}" for i in range(4)]),
    "tv-resnet50": (
        _tv_resnet50,
        _images(4, 96),
        dict,
        _classify,
        [f"layer{s}.{i}" for s, n in enumerate((3, 4, 6, 3), 1) for i in range(n)],
    ),
    "timm-resnet50": (
        _timm_resnet50,
        _images(4, 64),
        dict,
        _classify,
        [f"layer{s}.{i}" for s, n in enumerate((3, 4, 6, 3), 1) for i in range(n)],
    ),
    "timm-vit": (_timm_vit, _images(8, 32), dict, _classify, [f"blocks.{i}" for i in range(4)]),
    "tv-vit": (_tv_vit, _images(8, 32), dict, _classify, [f"encoder.layers.encoder_layer_{i}" for i in range(4)]),
}


# ----------------------------------------------------------------------------------------------------- steps
def _loss_of(loss_fn: Any) -> LossFn:
    return loss_fn if loss_fn is not None else (lambda out: out.loss)


@pytest.mark.parametrize("name", list(CASES))
def test_plan_meets_budget_and_is_exact(name: str) -> None:
    build, make_args, make_kwargs, loss_fn, blocks = CASES[name]
    torch.manual_seed(0)
    model = build().train()
    args, kwargs = make_args(), make_kwargs()
    loss = _loss_of(loss_fn)
    reference = copy.deepcopy(model)
    eager_peak = _peak(copy.deepcopy(model), args, kwargs, loss)  # copies: a step updates BatchNorm statistics
    per_block_peak = _peak(memsave.wrap(copy.deepcopy(model)), args, kwargs, loss)
    budget = (eager_peak + per_block_peak) // 2  # half way from per-block checkpointing's peak to eager's

    plan = memsave.plan(model, *args, **kwargs, budget=budget, loss_fn=loss_fn, timing_steps=1)

    candidates = {m for piece in plan.stage_modules for m in piece.modules}
    assert set(blocks) <= candidates, sorted(candidates)  # the plan sees the per-layer blocks
    assert plan.regions(), plan.summary()
    assert plan.measured_peak_bytes is not None and plan.measured_peak_bytes <= budget, plan.summary()
    memsave.wrap(model, plan)

    grads_eager = _step(reference, args, kwargs, loss)
    grads_plan = _step(model, args, kwargs, loss)
    assert_same_step(grads_eager, grads_plan, reference, model)  # BatchNorm statistics updated once

    peak = _peak(model, args, kwargs, loss)
    assert peak <= budget, f"measured {peak} > budget {budget} (eager {eager_peak})\n{plan.summary()}"
    assert peak < eager_peak


# ------------------------------------------------------------------------------------------- how inputs are given
@pytest.fixture(scope="module")
def gpt2() -> nn.Module:
    torch.manual_seed(0)
    return _gpt2().train()


def test_example_kwargs_dict_and_strategy(gpt2: nn.Module) -> None:
    """A batch dict as ``example_kwargs``, mixed with keyword inputs, and a baseline strategy."""
    batch = _lm_inputs()
    labels = batch.pop("labels")
    plan = memsave.plan(gpt2, example_kwargs=batch, labels=labels, solver="all", timing_steps=1)
    assert plan.regions()
    assert plan.measured_peak_bytes < plan.eager_peak_bytes


def test_positional_input_ids_with_keyword_labels(gpt2: nn.Module) -> None:
    batch = _lm_inputs()
    plan = memsave.plan(gpt2, batch["input_ids"], labels=batch["labels"], solver="sqrt", timing_steps=1)
    assert plan.regions()


def test_model_rejecting_a_keyword_names_the_keywords() -> None:
    vit = _tv_vit()  # forward(x): no **kwargs to swallow a misspelt keyword
    with pytest.raises(ValueError, match=r"keyword input\(s\) images \(every keyword .*goes to the model"):
        memsave.plan(vit, images=_images(2, 32)()[0], budget=0.5, loss_fn=_classify)


def test_loss_none_without_labels_says_pass_labels(gpt2: nn.Module) -> None:
    with pytest.raises(ValueError, match=r"loss is None.*labels="):
        memsave.plan(gpt2, input_ids=_lm_inputs()["input_ids"], loss_fn=lambda out: out.loss, budget=0.5)


def test_loss_without_grad_is_refused(gpt2: nn.Module) -> None:
    with pytest.raises(ValueError, match="does not require grad"):
        memsave.plan(gpt2, **_lm_inputs(), loss_fn=lambda out: out.loss.detach(), budget=0.5)


def test_non_scalar_loss_is_refused(gpt2: nn.Module) -> None:
    with pytest.raises(ValueError, match=r"scalar tensor, got a tensor of shape \(2, 64, 96\)"):
        memsave.plan(gpt2, **_lm_inputs(), loss_fn=lambda out: out.logits, budget=0.5)


def test_keyword_given_twice_is_refused(gpt2: nn.Module) -> None:
    batch = _lm_inputs()
    with pytest.raises(ValueError, match="labels given both"):
        memsave.plan(gpt2, example_kwargs=batch, labels=batch["labels"], budget=0.5)


def test_example_kwargs_must_be_a_dict(gpt2: nn.Module) -> None:
    with pytest.raises(TypeError, match="example_kwargs must be a dict"):
        memsave.plan(gpt2, example_kwargs=[("input_ids", _lm_inputs()["input_ids"])], budget=0.5)


def test_errors_leave_the_model_unchanged(gpt2: nn.Module) -> None:
    """A failed plan leaves no region installed and the gradients as they were."""
    with pytest.raises(ValueError):
        memsave.plan(gpt2, **_lm_inputs(), loss_fn=lambda out: out.logits, budget=0.5)
    assert not any(memsave.recompute.is_wrapped(m) for m in gpt2.modules())
    assert all(p.grad is None for p in gpt2.parameters())
