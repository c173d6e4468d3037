"""Wrong calls of the recompute API: checkpoint, checkpointed, checkpoint_sequential, wrap, unwrap, find_blocks, plan,
Plan.from_json and selective. Each raises its documented type naming the argument and leaves the model, optimizer, RNG
and scaler as they were (a wrap or plan that fails halfway included)."""

from __future__ import annotations

import functools
import json
from typing import Any, Callable, Dict, List

import pytest
import torch
from torch import nn
from torch.utils import checkpoint as torch_checkpoint

import memsave
from bad_input.checking import Case, World, check, params, rand, tiny_model
from memsave.errors import PlanMismatchError

ckpt = memsave.checkpoint
seq = memsave.checkpoint_sequential


def plan_call(**options: Any) -> Any:
    """A case's call: ``memsave.plan`` of the world's model and input with ``options``."""
    return lambda w: memsave.plan(w.model, w.x, **options)


def wrap_call(*args: Any, **options: Any) -> Any:
    """A case's call: ``memsave.wrap`` of the world's model with ``args`` (a policy or plan) and ``options``."""
    return lambda w: memsave.wrap(w.model, *args, **options)


def wrap_plan(edit: Callable[[Dict[str, Any]], Any]) -> Any:
    """A case's call: ``memsave.wrap`` of the world's model with :func:`tiny_model`'s plan, edited by ``edit``."""
    return lambda w: memsave.wrap(w.model, _edited_plan(edit))


def plan_on_other_model(case_id: str, blocks: int, width: int, names: str, apply: str = "wrap") -> Case:
    """:func:`tiny_model`'s plan applied to a ``tiny_model(blocks, width)`` (with ``memsave.wrap``, or ``compile``d):
    PlanMismatchError naming how the two models differ."""

    def call(w: World) -> Any:
        plan = _edited_plan(lambda d: None)
        return plan.compile(w.model) if apply == "compile" else memsave.wrap(w.model, plan)

    return Case(case_id, call, PlanMismatchError, names, model=lambda: tiny_model(blocks=blocks, width=width))


def checkpointed_call(**options: Any) -> Any:
    """A case's call: ``memsave.checkpointed`` of the world's model with ``options``."""
    return lambda w: memsave.checkpointed(w.model, **options)


@functools.lru_cache(maxsize=None)
def _plan_json() -> str:
    """A plan for :func:`tiny_model` (every piece its own region), made once: cases edit copies of it."""
    with torch.random.fork_rng(devices=[]):  # made inside a case's call: the case's RNG check must not see it
        model = tiny_model()
        x = torch.randn(4, 8)
        return memsave.plan(model, x, solver="all", verify=False, selective=False, timing_steps=1).to_json()


def _edited_plan(edit: Any) -> memsave.Plan:
    d = json.loads(_plan_json())
    edit(d)
    return memsave.Plan.from_json(json.dumps(d))


def _rename(d: Dict[str, Any], old: str, new: str) -> None:
    for piece in d["stage_modules"]:
        piece["modules"] = [new if m == old else m for m in piece["modules"]]


def _group_across_parents(d: Dict[str, Any]) -> None:
    # Regions 0:1 and 1:3: the second groups block 0's ReLU with block 1's Linear (two Sequential parents), so
    # applying fails after the first region is installed.
    stages = d["stage_modules"]
    names = [p["modules"] for p in stages]
    i = names.index(["0.2"])
    d["segments"] = [[0, 1, True], [i, i + 2, True], [i + 2, len(stages), False]]


def _raise_on_third_block() -> Any:
    seen: List[str] = []

    def predicate(name: str, module: nn.Module) -> bool:
        if name in ("0", "1", "2"):
            seen.append(name)
            if len(seen) == 3:
                raise RuntimeError(f"predicate failed on block {name}")
            return True
        return False

    return predicate


def _wrapped_tiny() -> nn.Module:
    return memsave.wrap(tiny_model())


def _frozen_tiny() -> nn.Module:
    model = tiny_model()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def _later_failing_loss() -> Any:
    calls = [0]

    def loss_fn(out: torch.Tensor) -> torch.Tensor:
        calls[0] += 1
        if calls[0] > 1:
            raise AttributeError("'NoneType' object has no attribute 'loss'")
        return out.sum()

    return loss_fn


def _wrapped_everywhere() -> nn.Module:
    return memsave.wrap(tiny_model(), nn.Sequential)  # the model and its blocks: four regions


def _unwrap_failing_halfway(world: World) -> None:
    from memsave.recompute import wrapping

    original, calls = wrapping.unwrap_module, [0]

    def failing(module: nn.Module) -> bool:
        calls[0] += 1
        if calls[0] == 3:
            raise RuntimeError("unwrap_module failed on the third module")
        return original(module)

    wrapping.unwrap_module = failing  # type: ignore[assignment]
    try:
        memsave.unwrap(world.model)
    finally:
        wrapping.unwrap_module = original  # type: ignore[assignment]


def _set(path: str, value: Any) -> Any:
    """An edit of the plan's JSON: the field at ``path`` (keys and list indices joined by dots) set to ``value``."""

    def edit(d: Dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = d
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        node[int(last) if isinstance(node, list) else last] = value

    return edit


def _drop(path: str) -> Any:
    def edit(d: Dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = d
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        del node[last]

    return edit


def from_json(edit: Any) -> Any:
    return lambda w: _edited_plan(edit)


def bad_field(case_id: str, path: str, value: Any, names: str) -> Case:
    """Plan.from_json of the plan's JSON with the field at ``path`` set to ``value`` raises ValueError naming it."""
    return Case(case_id, from_json(_set(path, value)), ValueError, names)


def missing_field(case_id: str, path: str, names: str) -> Case:
    """Plan.from_json of the plan's JSON without the field at ``path`` raises ValueError naming it."""
    return Case(case_id, from_json(_drop(path)), ValueError, names)


def _region_counting(extra: int = 0, shape_change: bool = False, fewer: bool = False) -> Any:
    """A region whose recompute differs from its forward (a counter that changes between the two runs): it saves
    ``extra`` more tensors, a tensor of another shape, or fewer tensors."""
    calls = [0]

    def region(x: torch.Tensor) -> torch.Tensor:
        calls[0] += 1
        again = calls[0] > 1
        y = x[: 2 if (shape_change and again) else 3].sin()
        steps = 3 + (extra if again else 0) - (2 if (fewer and again) else 0)
        for _ in range(steps):
            y = y.cos()
        return y

    return region


def _backward_through(region: Any, **options: Any) -> Any:
    def call(w: World) -> None:
        x = torch.ones(4, 3, requires_grad=True)
        ckpt(region, x, **options).sum().backward()

    return call


class _ReadsSavedTwice(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x * 2

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        (x_again,) = ctx.saved_tensors  # a second read of a recomputed tensor in one backward
        return grad * 2 + 0 * x * x_again


def _reads_saved_twice(x: torch.Tensor) -> torch.Tensor:
    return _ReadsSavedTwice.apply(x.sin())


CASES = [
    # ---- checkpoint
    Case("checkpoint-fn-None", lambda w: ckpt(None, w.x), TypeError, r"fn must be callable.*NoneType"),
    Case("checkpoint-fn-str", lambda w: ckpt("model", w.x), TypeError, r"fn must be callable.*str"),
    Case("checkpoint-fn-tensor", lambda w: ckpt(w.x, w.x), TypeError, r"fn must be callable.*Tensor"),
    Case(
        "checkpoint-determinism_check",
        lambda w: ckpt(w.model, w.x, determinism_check="bogus"),
        ValueError,
        r"determinism_check must be one of",
    ),
    Case("checkpoint-debug-str", lambda w: ckpt(w.model, w.x, debug="yes"), TypeError, r"debug .*bools.*'yes'"),
    Case("checkpoint-early_stop-int", lambda w: ckpt(w.model, w.x, early_stop=1), TypeError, r"early_stop must be"),
    Case("checkpoint-context_fn-int", lambda w: ckpt(w.model, w.x, context_fn=3), TypeError, r"context_fn must be"),
    Case(
        "checkpoint-context_fn-returns-int",
        lambda w: ckpt(w.model, w.x, context_fn=lambda: 3),
        TypeError,
        r"context_fn .*must return a tuple of two context managers",
    ),
    Case(
        "checkpoint-context_fn-returns-one",
        lambda w: ckpt(w.model, w.x, context_fn=lambda: (torch.no_grad(),)),
        TypeError,
        r"context_fn .*must return a tuple of two context managers",
    ),
    # ---- checkpointed
    Case("checkpointed-fn-int", lambda w: memsave.checkpointed(3), TypeError, r"checkpointed: fn must be callable"),
    Case(
        "checkpointed-context_fn-int",
        checkpointed_call(context_fn=5),
        TypeError,
        r"checkpointed: context_fn must be",
    ),
    Case("checkpointed-name-int", checkpointed_call(name=3), TypeError, r"name must be a str"),
    Case("checkpointed-strict-str", checkpointed_call(strict="x"), TypeError, r"strict must be"),
    Case(
        "checkpointed-preserve_rng_state-str",
        checkpointed_call(preserve_rng_state="no"),
        TypeError,
        r"preserve_rng_state must be",
    ),
    Case(
        "checkpointed-decorator-options",
        lambda w: memsave.checkpointed(early_stop=None)(w.model),
        TypeError,
        r"early_stop must be",
    ),
    # ---- checkpoint_sequential
    Case("sequential-modules-module", lambda w: seq(w.model[0][0], 1, w.x), TypeError, r"modules must be an nn\."),
    Case("sequential-modules-str", lambda w: seq("abc", 1, w.x), TypeError, r"modules must be"),
    Case("sequential-modules-element", lambda w: seq([w.model[0], 3], 1, w.x), TypeError, r"modules\[1\]"),
    Case("sequential-segments-0", lambda w: seq(w.model, 0, w.x), ValueError, r"segments must be between 1 and"),
    Case("sequential-segments-too-many", lambda w: seq(w.model, 9, w.x), ValueError, r"segments must be between"),
    Case("sequential-segments-negative", lambda w: seq(w.model, -2, w.x), ValueError, r"segments must be between"),
    Case("sequential-segments-str", lambda w: seq(w.model, "2", w.x), TypeError, r"segments must be an int"),
    Case("sequential-segments-bool", lambda w: seq(w.model, True, w.x), TypeError, r"segments must be an int"),
    Case("sequential-segments-float", lambda w: seq(w.model, 2.0, w.x), TypeError, r"segments must be an int"),
    Case("sequential-empty", lambda w: seq([], 1, w.x), ValueError, r"segments must be between 1 and .*\(0\)"),
    # ---- wrap
    Case("wrap-model-str", lambda w: memsave.wrap("model"), TypeError, r"wrap: model must be an nn\.Module"),
    Case("wrap-model-list", lambda w: memsave.wrap([w.model]), TypeError, r"model must be an nn\.Module.*list"),
    Case("wrap-policy-instance", lambda w: memsave.wrap(w.model, w.model[0]), TypeError, r"policy is a module inst"),
    Case("wrap-policy-int", wrap_call(3), TypeError, r"policy must be"),
    Case(
        "wrap-policy-unknown-class-name",
        wrap_call("Bogus"),
        ValueError,
        r"'Bogus' is neither a submodule name nor a module class",
    ),
    Case(
        "wrap-policy-blocks-none",
        wrap_call("blocks"),
        ValueError,
        r"no repeated blocks",
        model=lambda: nn.Sequential(nn.Linear(8, 2)),
    ),
    Case("wrap-policy-int-class", wrap_call((nn.Linear, int)), TypeError, r"policy class int"),
    Case("wrap-policy-empty-tuple", wrap_call(()), TypeError, r"policy must be"),
    Case("wrap-predicate-one-argument", wrap_call(lambda m: True), TypeError, r"predicate .*\(name, module\) -> bool"),
    Case(
        "wrap-predicate-three-arguments",
        wrap_call(lambda a, b, c: True),
        TypeError,
        r"predicate .*\(name, module\) -> bool",
    ),
    Case(
        "wrap-predicate-raises-on-third-block",
        lambda w: memsave.wrap(w.model, _raise_on_third_block()),
        RuntimeError,
        r"predicate failed on block 2",
    ),
    Case("wrap-context_fn-int", wrap_call(context_fn=3), TypeError, r"wrap: context_fn must"),
    Case("wrap-strict-str", wrap_call(strict="yes"), TypeError, r"strict must be True or Fal"),
    Case("wrap-preserve_rng_state-none", wrap_call(preserve_rng_state=None), TypeError, r"preserve_rng_state must be"),
    Case(
        "wrap-plan-with-context_fn",
        lambda w: memsave.wrap(w.model, _edited_plan(lambda d: None), context_fn=memsave.selective("matmul")),
        TypeError,
        r"apply the plan without context_fn",
    ),
    Case("wrap-plan-missing-module", wrap_plan(lambda d: _rename(d, "2.0", "9.0")), PlanMismatchError, r"lacks: 9\.0"),
    plan_on_other_model("wrap-plan-for-fewer-blocks", 4, 8, r"modules of this model the plan does not know: 4\b"),
    plan_on_other_model("wrap-plan-for-wider-model", 3, 16, r"same module names, but .*shapes"),
    Case(
        "wrap-plan-segments-out-of-range",
        wrap_plan(lambda d: d.update(segments=[[0, 99, True]])),
        PlanMismatchError,
        r"segments .*outside its \d+ stages",
    ),
    Case(
        "wrap-plan-region-across-parents",
        wrap_plan(_group_across_parents),
        PlanMismatchError,
        r"not a run of consecutive children",
    ),
    # ---- Plan.compile (refused before the model is touched or anything compiles)
    Case(
        "plan-compile-mode-and-options",
        lambda w: _edited_plan(lambda d: d.update(activation_memory_budget=0.5)).compile(
            w.model, mode="default", options={}
        ),
        ValueError,
        r"mode= or options=, not both",
    ),
    plan_on_other_model("plan-compile-other-model", 4, 8, r"modules of this model the plan does not know", "compile"),
    # ---- unwrap
    Case("unwrap-str", lambda w: memsave.unwrap("str"), TypeError, r"unwrap: model must be .*got str"),
    Case("unwrap-None", lambda w: memsave.unwrap(None), TypeError, r"unwrap: model must be .*NoneType"),
    Case(
        "unwrap-fails-halfway",
        _unwrap_failing_halfway,
        RuntimeError,
        r"unwrap_module failed on the third",
        model=_wrapped_everywhere,
    ),
    # ---- find_blocks
    Case("find_blocks-str", lambda w: memsave.find_blocks("x"), TypeError, r"find_blocks: model must be"),
    Case("find_blocks-None", lambda w: memsave.find_blocks(None), TypeError, r"find_blocks: model must be"),
    # ---- plan (all refused before profiling, but the last four)
    Case(
        "plan-model-str", lambda w: memsave.plan("m", w.x, budget=0.5), TypeError, r"plan: model must be an nn\.Module"
    ),
    Case("plan-solver", plan_call(solver="bogus"), ValueError, r"solver"),
    Case("plan-uniform-0", plan_call(solver="uniform:0"), ValueError, r"uniform:K"),
    Case("plan-no-budget", plan_call(), ValueError, r"needs a budget"),
    Case("plan-budget-text", plan_call(budget="lots"), ValueError, r"budget: cannot pars"),
    Case("plan-budget-negative", plan_call(budget=-1), ValueError, r"budget: must be > 0"),
    Case("plan-budget-zero-fraction", plan_call(budget=0.0), ValueError, r"budget: a fr"),
    Case("plan-budget-nan", lambda w: memsave.plan(w.model, w.x, budget=float("nan")), ValueError, r"budget"),
    Case("plan-budget-list", plan_call(budget=[1]), TypeError, r"budget: expected a mem"),
    Case("plan-budget-bool", plan_call(budget=True), TypeError, r"budget: expected"),
    Case(
        "plan-timing_steps-0",
        plan_call(budget=0.5, timing_steps=0),
        ValueError,
        r"timing_steps must be an int >= 1.*got 0",
    ),
    Case(
        "plan-timing_steps-float",
        plan_call(budget=0.5, timing_steps=1.5),
        ValueError,
        r"timing_steps must be an int",
    ),
    Case("plan-selective-unknown", plan_call(budget=0.5, selective=["bogus"]), ValueError, r"selective names 'bogus'"),
    Case("plan-selective-empty", plan_call(budget=0.5, selective=[]), ValueError, r"selective names no operator class"),
    Case(
        "plan-selective-str",
        plan_call(budget=0.5, selective="matmul"),
        TypeError,
        r"selective must be True, False or a list",
    ),
    Case(
        "plan-example_kwargs-int",
        plan_call(budget=0.5, example_kwargs=3),
        TypeError,
        r"example_kwargs must be a dict",
    ),
    Case(
        "plan-keyword-twice",
        plan_call(budget=0.5, example_kwargs={"a": 1}, a=2),
        ValueError,
        r"keyword input\(s\) a given both",
    ),
    Case(
        "plan-selective-int",
        plan_call(budget=0.5, selective=3),
        TypeError,
        r"selective must be True, False or a list",
    ),
    Case("plan-loss_fn-int", plan_call(budget=0.5, loss_fn=3), TypeError, r"loss_fn must"),
    Case(
        "plan-wrapped-model",
        plan_call(budget=0.5),
        ValueError,
        r"already has checkpointed modules.*unwrap",
        model=_wrapped_tiny,
    ),
    Case(
        "plan-nothing-requires-grad",
        plan_call(budget=0.5),
        ValueError,
        r"no parameter that requires grad",
        model=_frozen_tiny,
    ),
    Case(
        "plan-wrong-input-shape",
        lambda w: memsave.plan(w.model, rand(4, 5), budget=0.5),
        ValueError,
        r"one training step of Sequential on the example inputs failed",
    ),
    Case(
        "plan-loss_fn-not-scalar",
        plan_call(budget=0.5, loss_fn=lambda out: out),
        ValueError,
        r"loss_fn must return a scalar",
    ),
    Case(
        "plan-loss_fn-fails-in-a-later-step",
        lambda w: memsave.plan(w.model, w.x, solver="all", loss_fn=_later_failing_loss(), timing_steps=1),
        ValueError,
        r"loss_fn failed in profiling step 2 \(AttributeError",
    ),
    Case(
        "plan-budget-infeasible",
        plan_call(budget=1, selective=False, timing_steps=1, verify=False),
        memsave.InfeasibleBudgetError,
        r"budget",
    ),
    # ---- Plan.from_json
    Case("from_json-not-json", lambda w: memsave.Plan.from_json("not json"), ValueError, r"not valid JSON"),
    Case("from_json-None", lambda w: memsave.Plan.from_json(None), ValueError, r"not valid JSON"),
    Case("from_json-list", lambda w: memsave.Plan.from_json("[]"), ValueError, r"not a memsave plan of format"),
    Case(
        "from_json-format-2",
        lambda w: memsave.Plan.from_json('{"format": 2}'),
        ValueError,
        r"not a memsave plan of format 1 \(field 'format' is 2 \(an int\)",
    ),
    Case(
        "from_json-partitioner-budget-out-of-range",
        lambda w: memsave.Plan.from_json(
            _plan_json().replace('"activation_memory_budget": null', '"activation_memory_budget": 1.5')
        ),
        ValueError,
        r"field 'activation_memory_budget' must be in \[0, 1\] or null, got 1\.5",
    ),
    Case(
        "from_json-no-fields",
        lambda w: memsave.Plan.from_json('{"format": 1}'),
        ValueError,
        r"lacks the field 'solver'",
    ),
    Case(
        "from_json-bad-segment",
        lambda w: memsave.Plan.from_json(_plan_json().replace('"segments": [', '"segments": [7, ', 1)),
        ValueError,
        r"field 'segments\[0\]' must be a \[begin, end, recompute\] triple, got 7 \(an int\)",
    ),
    # ---- Plan.from_json, field by field: the type a field must have, named, before anything uses it
    bad_field("from_json-format-str", "format", "1", r"field 'format' is '1' \(a string\); it must"),
    bad_field("from_json-format-true", "format", True, r"field 'format' is True \(a bool\)"),
    bad_field("from_json-format-float", "format", 1.0, r"field 'format' is 1\.0 \(a float\)"),
    missing_field("from_json-format-missing", "format", r"field 'format' is missing"),
    bad_field("from_json-solver-int", "solver", 3, r"field 'solver' must be a string, got 3"),
    bad_field(
        "from_json-peak-str",
        "predicted_peak_bytes",
        "57048",
        r"field 'predicted_peak_bytes' must be an int, got '57048' \(a string\)",
    ),
    bad_field(
        "from_json-peak-float", "predicted_peak_bytes", 1.5, r"field 'predicted_peak_bytes' must be an int, got 1\.5"
    ),
    bad_field(
        "from_json-peak-negative", "eager_peak_bytes", -1, r"field 'eager_peak_bytes' must be an int >= 0, got -1"
    ),
    bad_field(
        "from_json-peak-bool",
        "min_feasible_bytes",
        True,
        r"field 'min_feasible_bytes' must be an int, got True \(a bool\)",
    ),
    bad_field("from_json-budget-str", "budget_bytes", "4GiB", r"field 'budget_bytes' must be an int, got '4GiB'"),
    bad_field(
        "from_json-measured-list",
        "measured_peak_bytes",
        [1],
        r"field 'measured_peak_bytes' must be an int, got \[1\] \(a list\)",
    ),
    bad_field(
        "from_json-seconds-str",
        "eager_step_seconds",
        "0.3",
        r"field 'eager_step_seconds' must be a finite number, got '0\.3'",
    ),
    bad_field(
        "from_json-seconds-nan",
        "planning_seconds",
        float("nan"),
        r"field 'planning_seconds' must be a finite number, got nan",
    ),
    bad_field(
        "from_json-seconds-negative",
        "predicted_extra_seconds",
        -0.5,
        r"field 'predicted_extra_seconds' must be a number >= 0, got -0\.5",
    ),
    bad_field(
        "from_json-compiled-str-false",
        "compiled",
        "false",
        r"field 'compiled' must be true or false \(a JSON bool\), got 'false'",
    ),
    bad_field("from_json-compiled-int", "compiled", 0, r"field 'compiled' must be true or false"),
    bad_field("from_json-device-int", "device", 0, r"field 'device' must be a string, got 0"),
    bad_field("from_json-fingerprint-null", "fingerprint", None, r"'fingerprint' must be a string"),
    missing_field("from_json-model_class-missing", "model_class", r"lacks the field 'model_class'"),
    bad_field(
        "from_json-segment-end-float",
        "segments.0.1",
        2.5,
        r"field 'segments\[0\]\[1\] \(end\)' must be an int, got 2\.5",
    ),
    bad_field(
        "from_json-segment-recompute-str",
        "segments.1.2",
        "false",
        r"field 'segments\[1\]\[2\] \(recompute\)' must be true or false",
    ),
    bad_field(
        "from_json-segment-begin-str",
        "segments.0.0",
        "0",
        r"field 'segments\[0\]\[0\] \(begin\)' must be an int, got '0'",
    ),
    bad_field(
        "from_json-segment-empty",
        "segments.0",
        [1, 1, True],
        r"segments\[0\] must satisfy 0 <= begin < end .*got \[1, 1\]",
    ),
    bad_field(
        "from_json-segment-pair",
        "segments.0",
        [0, 1],
        r"field 'segments\[0\]' must be a \[begin, end, recompute\] triple, got \[0, 1\]",
    ),
    bad_field(
        "from_json-segments-object",
        "segments",
        {"0": 1},
        r"field 'segments' must be a list of \[begin, end, recompute\] triples",
    ),
    bad_field(
        "from_json-stage_modules-kind-int",
        "stage_modules.0.kind",
        1,
        r"field 'stage_modules\[0\]\.kind' must be a string, got 1",
    ),
    bad_field(
        "from_json-stage_modules-modules-str",
        "stage_modules.1.modules",
        "0.1",
        r"field 'stage_modules\[1\]\.modules' must be a list of str, got '0\.1'",
    ),
    bad_field(
        "from_json-stage_modules-child_index-str",
        "stage_modules.0.child_index",
        ["0"],
        r"field 'stage_modules\[0\]\.child_index\[0\]' must be an int, got '0'",
    ),
    bad_field(
        "from_json-stage_modules-unknown-field",
        "stage_modules.0.colour",
        "red",
        r"stage_modules\[0\] has unknown field\(s\) \['colour'\]",
    ),
    missing_field(
        "from_json-stage_modules-missing-kind", "stage_modules.0.kind", r"stage_modules\[0\] lacks the field 'kind'"
    ),
    bad_field(
        "from_json-chain-stage-fwd_time-str",
        "chain.stages.2.fwd_time",
        "fast",
        r"field 'chain\.stages\[2\]\.fwd_time' must be a finite number, got 'fast'",
    ),
    bad_field(
        "from_json-chain-stage-bytes-float",
        "chain.stages.0.output_bytes",
        128.5,
        r"field 'chain\.stages\[0\]\.output_bytes' must be an int, got 128\.5",
    ),
    bad_field(
        "from_json-chain-stage-recomputable-str",
        "chain.stages.0.recomputable",
        "true",
        r"field 'chain\.stages\[0\]\.recomputable' must be true or false",
    ),
    bad_field(
        "from_json-chain-stage-selective-str",
        "chain.stages.0.selective_fwd_time",
        "0.1",
        r"field 'chain\.stages\[0\]\.selective_fwd_time' must be a list of float",
    ),
    bad_field(
        "from_json-chain-stage-unknown",
        "chain.stages.0.speed",
        3,
        r"chain\.stages\[0\] has unknown field\(s\) \['speed'\]",
    ),
    missing_field("from_json-chain-stages-missing", "chain.stages", r"chain lacks the field 'stages'"),
    bad_field("from_json-chain-base_bytes-str", "chain.base_bytes", "0", r"field 'chain\.base_bytes' must be an int"),
    bad_field(
        "from_json-chain-skips-str", "chain.skips", "none", r"field 'chain\.skips' must be a list of Skip objects"
    ),
    bad_field("from_json-chain-unknown-field", "chain.extra", 1, r"chain has unknown field\(s\) \['extra'\]"),
    bad_field(
        "from_json-chain-operator_classes-int",
        "chain.operator_classes",
        [1],
        r"field 'chain\.operator_classes\[0\]' must be a string, got 1",
    ),
    bad_field(
        "from_json-selective-str",
        "selective",
        "matmul",
        r"field 'selective' must be a list of List\[str\], got 'matmul'",
    ),
    bad_field(
        "from_json-selective-entry-int", "selective.0", [3], r"field 'selective\[0\]\[0\]' must be a string, got 3"
    ),
    bad_field(
        "from_json-activation_memory_budget-str",
        "activation_memory_budget",
        "0.5",
        r"field 'activation_memory_budget' must be a finite number, got '0\.5'",
    ),
    # ---- checkpoint mismatch errors keep torch's key phrases (code matching torch's messages keeps working)
    Case(
        "checkpoint-recompute-saves-more",
        _backward_through(_region_counting(extra=2), early_stop=False),
        memsave.RecomputeMismatchError,
        r"torch\.utils\.checkpoint: trying to save more tensors during recomputation than during the original forward "
        r"pass: the recompute of checkpointed region",
    ),
    Case(
        "checkpoint-recompute-other-metadata",
        _backward_through(_region_counting(shape_change=True)),
        memsave.RecomputeMismatchError,
        r"torch\.utils\.checkpoint: Recomputed values for the following tensors have different metadata than during "
        r"the forward pass: .*saved tensor #\d+ has shape \(2, 3\)",
    ),
    Case(
        "checkpoint-recompute-saves-fewer",
        _backward_through(_region_counting(fewer=True), early_stop=False),
        memsave.RecomputeMismatchError,
        r"torch\.utils\.checkpoint: A different number of tensors was saved during the original forward and "
        r"recomputation",
    ),
    Case(
        "checkpoint-unpacked-twice",
        _backward_through(_reads_saved_twice),
        memsave.CheckpointError,
        r"torch\.utils\.checkpoint: Unpack is being triggered for a tensor that was already unpacked once",
    ),
    Case(
        "checkpoint-caught-as-torch-CheckpointError",  # memsave's errors are torch's CheckpointError too
        _backward_through(_region_counting(shape_change=True)),
        torch_checkpoint.CheckpointError,
        r"Recomputed values for the following tensors have different metadata",
    ),
    # ---- torch's keyword arguments of checkpoint / checkpoint_sequential: wrong types refused, not read as truthy
    Case(
        "checkpoint-use_reentrant-str",
        lambda w: ckpt(w.model, w.x, use_reentrant="no"),
        TypeError,
        r"checkpoint: use_reentrant must be None, True or False, got 'no'",
    ),
    Case(
        "checkpoint-preserve_rng_state-str",
        lambda w: ckpt(w.model, w.x, preserve_rng_state="no"),
        TypeError,
        r"checkpoint: preserve_rng_state must be True or False, got 'no'",
    ),
    Case(
        "sequential-use_reentrant-int",
        lambda w: seq(w.model, 2, w.x, use_reentrant=0),
        TypeError,
        r"checkpoint_sequential: use_reentrant must be None, True or False, got 0",
    ),
    Case(
        "sequential-preserve_rng_state-none",
        lambda w: seq(w.model, 2, w.x, preserve_rng_state=None),
        TypeError,
        r"checkpoint_sequential: preserve_rng_state must be True or False, got None",
    ),
    Case(
        "selective-list",
        lambda w: memsave.selective(["matmul", "conv"]),
        TypeError,
        r"give the operator classes as separate arguments.*selective\(\*\['matmul', 'conv'\]\)",
    ),
    Case("selective-bytes", lambda w: memsave.selective(b"matmul"), ValueError, r"unknown operator class b'matmul'"),
    # ---- selective
    Case("selective-nothing", lambda w: memsave.selective(), ValueError, r"name at least one operator class"),
    Case("selective-unknown", lambda w: memsave.selective("bogus"), ValueError, r"unknown operator class 'bogus'"),
    Case("selective-int", lambda w: memsave.selective(3), ValueError, r"unknown operator class 3"),
]


@pytest.mark.parametrize("case", params(CASES))
def test_bad_recompute_call(case: Case) -> None:
    check(case)
