"""memsave.plan's plan cache: a second call with the same key returns the stored plan without profiling and says so;
what the key covers (structure, a layer's width, inputs, loss, budget and the other arguments) makes a different call
miss; opting out (``cache=False``, ``MEMSAVE_PLAN_CACHE=0``); the directory from ``MEMSAVE_CACHE_DIR``; corrupt and
unwritable entries. No test asserts a timing: "without profiling" is checked by making profiling raise.

Models: Hugging Face GPT-2 at a tiny config (random weights) and torchvision's ResNet-18 at a small input.
"""

from __future__ import annotations

import functools
import json
import logging
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import memsave
from helpers import hub
from memsave.recompute.planning import cache as plan_cache
from memsave.recompute.planning import planner

pytest.importorskip("transformers")

PLAN = dict(budget=0.9, timing_steps=1, selective=False, progress=False)  # quick plans: one timed step


def gpt2(inner=None):
    torch.manual_seed(0)
    model = hub.gpt2(2, 32, heads=4, vocab=128, positions=16, **({"n_inner": inner} if inner else {}))
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(1))
    return model, ids


def _cross_entropy(out, targets):
    return F.cross_entropy(out, targets)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """The plan cache on (tests/conftest.py turns it off), in a directory under tmp_path via MEMSAVE_CACHE_DIR."""
    monkeypatch.delenv(plan_cache.PLAN_CACHE_ENV, raising=False)
    monkeypatch.setenv(plan_cache.CACHE_DIR_ENV, str(tmp_path / "memsave-cache"))
    return tmp_path / "memsave-cache" / "plans"


@pytest.fixture
def no_profiling(monkeypatch):
    """After this fixture is called, profiling a step raises: a plan must come from the cache."""

    def forbid():
        def boom(*args, **kwargs):
            raise AssertionError("memsave.plan profiled a step although the plan was cached")

        monkeypatch.setattr(planner, "trace_step", boom)

    return forbid


def _fields(p):
    d = json.loads(p.to_json())
    del d["planning_seconds"]
    return d


def _entries(directory: Path):
    return sorted(directory.glob("*.json")) if directory.exists() else []


@pytest.mark.slow  # several plans of a real model (5-20 s on two loaded cores)
def test_second_plan_comes_from_the_cache_without_profiling(cache_dir, no_profiling, caplog):
    model, ids = gpt2()
    options = {**PLAN, "selective": True}  # a selective plan's kept classes travel through the cache too
    first = memsave.plan(model, input_ids=ids, labels=ids, **options)
    assert not first.cached
    (entry,) = _entries(cache_dir)  # under $MEMSAVE_CACHE_DIR/plans
    assert entry.name.startswith("GPT2LMHeadModel-") and json.loads(entry.read_text())["format"] == 1
    no_profiling()
    with caplog.at_level(logging.INFO, logger="memsave"):
        second = memsave.plan(model, input_ids=ids, labels=ids, **options)
    assert second.cached
    assert _fields(second) == _fields(first)  # the same plan, field for field, but the time the call took
    assert "(from the plan cache)" in second.summary() and "(from the plan cache)" not in first.summary()
    (record,) = [r for r in caplog.records if "plan cache" in r.getMessage()]
    assert record.levelno == logging.INFO and record.name.startswith("memsave") and str(entry) in record.getMessage()
    memsave.wrap(model, second)  # it fits the model: the key covers its structure
    assert memsave.unwrap(model) is model


@pytest.mark.slow  # several plans of a real model (5-20 s on two loaded cores)
def test_opting_out_with_cache_false_or_the_environment(cache_dir, monkeypatch):
    model, ids = gpt2()
    memsave.plan(model, input_ids=ids, labels=ids, cache=False, **PLAN)
    assert _entries(cache_dir) == []
    monkeypatch.setenv("MEMSAVE_PLAN_CACHE", "0")
    memsave.plan(model, input_ids=ids, labels=ids, **PLAN)
    assert _entries(cache_dir) == []
    # An explicit cache=True (or a directory) wins over the environment, as progress=True does.
    p = memsave.plan(model, input_ids=ids, labels=ids, cache=True, **PLAN)
    assert not p.cached and len(_entries(cache_dir)) == 1
    assert memsave.plan(model, input_ids=ids, labels=ids, cache=True, **PLAN).cached
    assert not memsave.plan(model, input_ids=ids, labels=ids, **PLAN).cached  # off again: the environment says so


@pytest.mark.slow  # several plans of a real model (5-20 s on two loaded cores)
def test_a_different_budget_or_layer_width_misses(cache_dir):
    model, ids = gpt2()
    memsave.plan(model, input_ids=ids, labels=ids, **PLAN)
    other_budget = memsave.plan(model, input_ids=ids, labels=ids, **{**PLAN, "budget": 0.95})
    assert not other_budget.cached and len(_entries(cache_dir)) == 2
    wider, _ = gpt2(inner=96)  # the MLP's width: 96, not 4 x 32
    p = memsave.plan(wider, input_ids=ids, labels=ids, **PLAN)
    assert not p.cached and len(_entries(cache_dir)) == 3
    memsave.wrap(wider, p)  # the plan made for it fits it (no PlanMismatchError)
    assert memsave.plan(model, input_ids=ids, labels=ids, **PLAN).cached  # the first model's entry is still there


@pytest.mark.slow  # several plans of a real model (5-20 s on two loaded cores)
def test_a_corrupt_entry_is_ignored_with_a_warning_and_replaced(cache_dir, no_profiling):
    model, ids = gpt2()
    memsave.plan(model, input_ids=ids, labels=ids, **PLAN)
    (entry,) = _entries(cache_dir)
    good = entry.read_text()
    entry.write_text(good[: len(good) // 2])  # cut short, as by a crash of an older writer
    with pytest.warns(memsave.MemsaveWarning, match=r"ignoring the plan cache entry .*not JSON"):
        again = memsave.plan(model, input_ids=ids, labels=ids, **PLAN)
    assert not again.cached and json.loads(entry.read_text())["plan"]["segments"] == [list(s) for s in again.segments]
    # A plan field of the wrong type: named by the plan's JSON checks.
    d = json.loads(good)
    d["plan"]["segments"][0][1] = "two"
    entry.write_text(json.dumps(d))
    with pytest.warns(memsave.MemsaveWarning, match=r"its plan is not valid .*segments\[0\]\[1\]"):
        memsave.plan(model, input_ids=ids, labels=ids, **PLAN)
    no_profiling()
    assert memsave.plan(model, input_ids=ids, labels=ids, **PLAN).cached  # replaced by a readable entry


def test_an_unwritable_cache_warns_and_still_returns_the_plan(tmp_path):
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("a file where the cache directory would be")
    model, ids = gpt2()
    with pytest.warns(memsave.MemsaveWarning, match="could not write the plan cache entry"):
        p = memsave.plan(model, input_ids=ids, labels=ids, cache=blocked / "plans", **PLAN)
    assert isinstance(p, memsave.Plan) and not p.cached
    assert not list(tmp_path.glob("**/*.tmp"))  # no temporary file left behind


def test_a_lambda_or_closure_loss_is_not_cached_and_says_why(cache_dir, caplog):
    model, ids = gpt2()
    with caplog.at_level(logging.DEBUG, logger="memsave"):
        memsave.plan(model, input_ids=ids, labels=ids, loss_fn=lambda out: out.loss, **PLAN)
    assert _entries(cache_dir) == []
    (why,) = [r for r in caplog.records if "plan cache is not used" in r.getMessage()]
    assert why.levelno == logging.DEBUG and "lambda" in why.getMessage()


@pytest.mark.slow  # several plans of a real model (5-20 s on two loaded cores)
def test_a_partial_of_a_function_is_keyed_by_its_arguments_shapes(cache_dir, no_profiling):
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None, num_classes=10)
    x = torch.randn(2, 3, 32, 32)
    targets = torch.tensor([1, 7])
    loss = functools.partial(_cross_entropy, targets=targets)
    options = {**PLAN, "budget": None, "solver": "sqrt"}  # a small input: its peak is mostly gradients
    first = memsave.plan(model, x, loss_fn=loss, **options)
    assert not first.cached and len(_entries(cache_dir)) == 1
    no_profiling()
    other_targets = functools.partial(_cross_entropy, targets=torch.tensor([3, 3]))  # same shape: same key
    assert memsave.plan(model, x, loss_fn=other_targets, **options).cached


def _key(model, *inputs, loss_fn=None, budget=0.5, **kwargs):
    settings = dict(budget=planner._budget_key(budget), solver="optimal")
    return plan_cache.plan_key(model, inputs, kwargs, loss_fn, settings, torch.device("cpu"))


def test_the_key_covers_structure_inputs_loss_and_arguments(monkeypatch):
    model, ids = gpt2()
    base = _key(model, input_ids=ids)
    assert _key(model, input_ids=ids) == base
    assert _key(model, input_ids=ids, budget="50%") == base  # the same budget however it is written
    assert _key(model, input_ids=ids, budget=0.6) != base
    assert _key(model, input_ids=ids[:, :8]) != base  # another sequence length
    assert _key(model, input_ids=ids.to(torch.int32)) != base  # another dtype
    assert _key(model, input_ids=ids, labels=ids) != base  # another keyword input
    assert _key(model, input_ids=torch.zeros_like(ids)) == base  # values are not keyed, shapes are
    assert _key(model, input_ids=ids, loss_fn=_cross_entropy) != base
    model.eval()
    assert _key(model, input_ids=ids) != base  # the training flag changes dropout and BatchNorm
    model.train()
    model.transformer.wte.weight.requires_grad_(False)
    assert _key(model, input_ids=ids) != base  # a frozen parameter: no gradient to hold
    model.transformer.wte.weight.requires_grad_(True)
    assert _key(model, input_ids=ids) == base
    monkeypatch.setattr(plan_cache, "COST_MODEL", plan_cache.COST_MODEL + 1)
    assert _key(model, input_ids=ids) != base  # plans of another cost model are not returned
    with pytest.raises(plan_cache.NotKeyable, match="closure"):
        _key(model, input_ids=ids, loss_fn=_closure_loss(ids))
    with pytest.raises(plan_cache.NotKeyable, match="object"):
        _key(model, input_ids=ids, ids_list=[object()])


def _closure_loss(targets):
    def loss_fn(out):
        return F.cross_entropy(out.logits.flatten(0, 1), targets.flatten())

    return loss_fn


def test_cache_argument_of_a_wrong_type_raises_before_profiling():
    model, ids = gpt2()
    with pytest.raises(TypeError, match="cache must be True, False, None"):
        memsave.plan(model, input_ids=ids, labels=ids, cache=3, **PLAN)
