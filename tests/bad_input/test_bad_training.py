"""Wrong calls of the training and measurement API: GradScaler, accumulate, convert, chunked, Plan.apply_to, measure,
compare, estimate and max_batch_size. Each raises its documented type naming the argument and changes nothing."""

from __future__ import annotations

from typing import Any, Callable, List

import pytest
import torch
from torch import nn

import memsave
from bad_input.checking import Case, World, check, params, tiny_model
from bad_input.checking import rand as r
from memsave.errors import NoFakeKernelError


class ReadsValues(nn.Module):
    """A model whose forward calls ``.item()``: fake tensors have no values, so estimate cannot run it."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear(x)
        return y * float(y.sum().item())


def batch(b: int) -> torch.Tensor:
    return r(b, 8)


def _plan(world: World) -> memsave.Plan:
    with torch.random.fork_rng(devices=[]):  # made inside the call: the RNG check must not see it
        return memsave.plan(tiny_model(), r(4, 8), solver="all", verify=False, selective=False, timing_steps=1)


def scaler(**kwargs: Any) -> Any:
    return lambda w: memsave.amp.GradScaler("cpu", **kwargs)


def new_scale(value: Any) -> Any:
    """update(new_scale=value) on the world's scaler, once scale() has created its scale tensor."""

    def call(w: World) -> None:
        w.scaler.scale(w.x.sum())
        w.scaler.update(new_scale=value)

    return call


def load(**changes: Any) -> Any:
    """load_state_dict of a state that differs from the world's scaler in every entry, with ``changes``: a partial
    load would show in the scaler's state_dict."""
    state = {
        "scale": 2.0**4,
        "growth_factor": 4.0,
        "backoff_factor": 0.25,
        "growth_interval": 7,
        "_growth_tracker": 2,
        "hysteresis": 3,
        "_hysteresis_tracker": 1,
    }
    return lambda w: w.scaler.load_state_dict({**state, **changes})


def acc(*args: Any, **kwargs: Any) -> Any:
    return lambda w: memsave.accumulate(w.model, w.optimizer, *args, **kwargs)


def est(**kwargs: Any) -> Any:
    return lambda w: memsave.estimate(w.model, w.x, **{"device": "cpu", **kwargs})


def mbs(**kwargs: Any) -> Any:
    return lambda w: memsave.max_batch_size(w.model, batch, **{"device": "cpu", **kwargs})


def bn_module(make: Any) -> Any:
    """``memsave.chunked`` on a module holding a batch norm, built without drawing from the global RNG."""

    def call(w: World) -> Any:
        with torch.random.fork_rng(devices=[]):
            module = make()
        return memsave.chunked(module, 2)

    return call


def nonscalar(out: torch.Tensor) -> torch.Tensor:
    return out  # the model's [4, 2] output: not a scalar loss


def _acc_backward(loss: Any) -> Any:
    def call(w: World) -> None:
        memsave.accumulate(w.model, w.optimizer, 2).backward(loss(w) if callable(loss) else loss)

    return call


#: Scales that are not a finite number > 0: the case id's suffix, the value, what the message says it got.
BAD_SCALES = [
    ("0", 0.0, r"0\.0"),
    ("negative", -1.0, r"-1\.0"),
    ("nan", float("nan"), "nan"),
    ("inf", float("inf"), "inf"),
]


def bad_scales(prefix: str, call: Callable[[Any], Any], names: str) -> List[Case]:
    """One case per :data:`BAD_SCALES` value: ``call(value)`` raises ValueError naming ``names`` and the value."""
    return [
        Case(f"{prefix}-{suffix}", call(value), ValueError, rf"{names} must be a finite number > 0.*got {got}")
        for suffix, value, got in BAD_SCALES
    ]


CASES = [
    # ---- GradScaler
    *bad_scales("scaler-init_scale", lambda v: scaler(init_scale=v), "init_scale"),
    Case(
        "scaler-init_scale-str",
        scaler(init_scale="big"),
        TypeError,
        r"init_scale",
    ),
    Case("scaler-growth_factor", scaler(growth_factor=1.0), ValueError, r"growth_factor must be > 1\.0"),
    Case("scaler-backoff_factor", scaler(backoff_factor=1.5), ValueError, r"backoff_factor must be in \(0, 1\)"),
    Case("scaler-growth_interval", scaler(growth_interval=0), ValueError, r"growth_interval must be >= 1"),
    Case("scaler-hysteresis", scaler(hysteresis=0), ValueError, r"hysteresis must be an int"),
    Case(
        "scaler-device",
        lambda w: memsave.amp.GradScaler("tpu"),
        ValueError,
        r"device",
    ),
    Case("scaler-scale-int", lambda w: w.scaler.scale([1]), ValueError, r"outputs must be a Tensor .* got int"),
    Case(
        "scaler-step-before-scale",
        lambda w: w.scaler.step(w.optimizer),
        RuntimeError,
        r"step\(\) was called before scale\(\)",
    ),
    Case(
        "scaler-load_state_dict-partial",
        lambda w: w.scaler.load_state_dict({"scale": -1.0}),
        KeyError,
        r"state_dict lacks .*growth_factor",
    ),
    Case(
        "scaler-load_state_dict-int",
        lambda w: w.scaler.load_state_dict(3),
        TypeError,
        r"state_dict",
    ),
    # ---- GradScaler setters, update(new_scale=) and load_state_dict: checked as the constructor checks
    Case(
        "scaler-set_growth_factor-0.5",
        lambda w: w.scaler.set_growth_factor(0.5),
        ValueError,
        r"growth_factor must be > 1\.0 and finite, got 0\.5",
    ),
    Case(
        "scaler-set_growth_factor-str",
        lambda w: w.scaler.set_growth_factor("2"),
        TypeError,
        r"growth_factor must be a number .*got str",
    ),
    Case(
        "scaler-set_backoff_factor-2",
        lambda w: w.scaler.set_backoff_factor(2.0),
        ValueError,
        r"backoff_factor must be in \(0, 1\), got 2\.0",
    ),
    Case(
        "scaler-set_backoff_factor-0",
        lambda w: w.scaler.set_backoff_factor(0.0),
        ValueError,
        r"backoff_factor must be in \(0, 1\), got 0\.0",
    ),
    Case(
        "scaler-set_growth_interval-0",
        lambda w: w.scaler.set_growth_interval(0),
        ValueError,
        r"growth_interval must be >= 1 .*got 0",
    ),
    Case(
        "scaler-set_growth_interval-2.5",  # refused, not truncated to 2
        lambda w: w.scaler.set_growth_interval(2.5),
        ValueError,
        r"growth_interval must be >= 1 \(an int.*got 2\.5",
    ),
    Case(
        "scaler-set_growth_interval-str",
        lambda w: w.scaler.set_growth_interval("10"),
        TypeError,
        r"growth_interval must be an int, got str",
    ),
    Case(
        "scaler-set_hysteresis-0",
        lambda w: w.scaler.set_hysteresis(0),
        ValueError,
        r"hysteresis must be an int in \[1, 2\*\*31 - 1\], got 0",
    ),
    *bad_scales("scaler-update-new_scale", new_scale, "new_scale"),
    Case(
        "scaler-update-new_scale-tensor-0",
        new_scale(torch.zeros(())),
        ValueError,
        r"new_scale must be a finite number > 0.*got 0\.0",
    ),
    Case(
        "scaler-update-new_scale-tensor-float32-overflow",
        new_scale(torch.full((), 1e39, dtype=torch.float64)),
        ValueError,
        r"new_scale must be a finite number > 0.*got 1e\+39 \(inf in float32\)",
    ),
    Case("scaler-update-new_scale-str", new_scale("big"), TypeError, r"new_scale must be a number .*got str"),
    *bad_scales("scaler-load-scale", lambda v: load(scale=v), r"state_dict\['scale'\]"),
    Case(
        "scaler-load-growth_factor-0.5",
        load(growth_factor=0.5),
        ValueError,
        r"state_dict\['growth_factor'\] must be > 1\.0",
    ),
    Case(
        "scaler-load-backoff_factor-2",
        load(backoff_factor=2.0),
        ValueError,
        r"state_dict\['backoff_factor'\] must be in \(0, 1\)",
    ),
    Case(
        "scaler-load-growth_interval-0",
        load(growth_interval=0),
        ValueError,
        r"state_dict\['growth_interval'\] must be >= 1",
    ),
    Case(
        "scaler-load-growth_interval-2.5",
        load(growth_interval=2.5),
        ValueError,
        r"state_dict\['growth_interval'\] must be >= 1 .*got 2\.5",
    ),
    Case(
        "scaler-load-hysteresis-0",  # checked after the valid entries: none of them may be assigned
        load(hysteresis=0),
        ValueError,
        r"state_dict\['hysteresis'\] must be an int in \[1",
    ),
    Case(
        "scaler-load-growth_tracker-negative",
        load(_growth_tracker=-1),
        ValueError,
        r"state_dict\['_growth_tracker'\] must be an int in \[0",
    ),
    Case(
        "scaler-load-hysteresis_tracker-str",
        load(_hysteresis_tracker="1"),
        TypeError,
        r"state_dict\['_hysteresis_tracker'\] must be an int, got str",
    ),
    # ---- accumulate
    Case("accumulate-steps-0", acc(0), ValueError, r"steps must be an int >= 1 .*got 0"),
    Case(
        "accumulate-other-models-optimizer",
        lambda w: memsave.accumulate(w.model, torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1), 2),
        ValueError,
        r"optimizer holds none of the parameters of the model given .* belongs to another model",
    ),
    Case("accumulate-steps-str", acc("4"), ValueError, r"steps must be an int >= 1 .*'4'"),
    Case("accumulate-steps-float", acc(2.5), ValueError, r"steps must be an int >= 1 .*2\.5"),
    Case("accumulate-optimizer-str", lambda w: memsave.accumulate(w.model, "sgd", 2), TypeError, r"optimizer must"),
    Case("accumulate-clip-negative", acc(2, clip_grad_norm=-1.0), ValueError, r"clip_grad_norm must be a positive"),
    Case(
        "accumulate-clip-str",
        acc(2, clip_grad_norm="1"),
        TypeError,
        r"clip_grad_norm",
    ),
    Case(
        "accumulate-model-str",
        lambda w: memsave.accumulate("m", w.optimizer, 2),
        TypeError,
        r"model",
    ),
    Case(
        "accumulate-scaler-int",
        acc(2, scaler=3),
        TypeError,
        r"scaler",
    ),
    # ---- convert
    Case("convert-model-str", lambda w: memsave.convert("m"), TypeError, r"convert expects an nn\.Module, got str"),
    Case("convert-mlp_chunks-0", lambda w: memsave.convert(w.model, mlp_chunks=0), ValueError, r"mlp_chunks: chunks"),
    Case(
        "convert-mlp_chunks-str",
        lambda w: memsave.convert(w.model, mlp_chunks="many"),
        ValueError,
        r"mlp_chunks: chunks must be an int >= 1 or 'auto', got 'many'",
    ),
    Case(
        "convert-include-unknown",
        lambda w: memsave.convert(w.model, include=["bogus"]),
        ValueError,
        r"include pattern 'bogus' matches no module",
    ),
    Case(
        "convert-include-class-name",  # a class written as a string is a name pattern, and matches nothing here
        lambda w: memsave.convert(w.model, include="ReLU"),
        ValueError,
        r"include pattern 'ReLU' matches no module.*pass the class itself",
    ),
    # ---- chunked
    Case("chunked-module-str", lambda w: memsave.chunked("m", 2), TypeError, r"module must be an nn\.Module"),
    Case("chunked-chunks-0", lambda w: memsave.chunked(w.model, 0), ValueError, r"chunks must be >= 1, got 0"),
    Case("chunked-chunks-negative", lambda w: memsave.chunked(w.model, -3), ValueError, r"chunks must be >= 1"),
    Case("chunked-chunks-str", lambda w: memsave.chunked(w.model, "lots"), ValueError, r"chunks must be .* 'lots'"),
    Case("chunked-chunks-float", lambda w: memsave.chunked(w.model, 2.5), TypeError, r"chunks must be .*float"),
    Case("chunked-dim-str", lambda w: memsave.chunked(w.model, 2, dim="1"), TypeError, r"dim must be an int"),
    # ---- chunked: a module with batch statistics is refused (slices would change outputs and running statistics)
    Case(
        "chunked-BatchNorm1d",
        lambda w: memsave.chunked(w.model, 2),
        ValueError,
        r"chunked: Sequential holds 0\.1 \(BatchNorm1d\), .*normalizes with statistics over the whole batch.*running "
        r"statistics once per slice.*memsave\.wrap",
    ),
    Case(
        "chunked-BatchNorm2d-itself",
        bn_module(lambda: nn.BatchNorm2d(4)),
        ValueError,
        r"holds \(the module itself\) \(BatchNorm2d\)",
    ),
    Case(
        "chunked-SyncBatchNorm",
        bn_module(lambda: nn.Sequential(nn.Conv2d(3, 4, 1), nn.SyncBatchNorm(4))),
        ValueError,
        r"holds 1 \(SyncBatchNorm\)",
    ),
    Case(
        "chunked-LazyBatchNorm1d",
        bn_module(lambda: nn.Sequential(nn.Linear(8, 8), nn.LazyBatchNorm1d())),
        ValueError,
        r"holds 1 \(LazyBatchNorm1d\)",
    ),
    Case(
        "chunked-BatchNorm-deep",
        bn_module(lambda: nn.Sequential(nn.Linear(8, 8), nn.Sequential(nn.ReLU(), nn.BatchNorm1d(8)))),
        ValueError,
        r"holds 1\.1 \(BatchNorm1d\)",
    ),
    Case(
        "chunked-BatchNormAct2d",
        bn_module(lambda: nn.Sequential(nn.Conv2d(3, 4, 1), memsave.nn.BatchNormAct2d(4))),
        ValueError,
        r"holds 1 \(BatchNormAct2d\)",
    ),
    Case(
        "chunked-InPlaceABN2d",
        bn_module(lambda: memsave.nn.InPlaceABN2d(4)),
        ValueError,
        r"holds \(the module itself\) \(InPlaceABN2d\)",
    ),
    Case(
        "chunked-BatchNormActConv2d",
        bn_module(lambda: memsave.nn.BatchNormActConv2d(3, 4, 1)),
        ValueError,
        r"holds \(the module itself\) \(BatchNormActConv2d\)",
    ),
    Case(
        "chunked-converted-batch-norm",
        lambda w: memsave.chunked(w.model, "auto"),
        ValueError,
        r"BatchNorm",
        model=lambda: memsave.convert(tiny_model()),
    ),
    # ---- measure / compare / estimate: a loss that is not a scalar (plan's check, shared)
    Case(
        "measure-loss_fn-not-scalar",
        lambda w: memsave.measure(w.model, w.x, loss_fn=nonscalar, steps=1, warmup=0),
        TypeError,
        r"measure: loss_fn must return a scalar tensor, got a tensor of shape \(4, 2\); reduce it",
    ),
    Case(
        "measure-loss_fn-returns-None",
        lambda w: memsave.measure(w.model, w.x, loss_fn=lambda out: None, steps=1, warmup=0),
        TypeError,
        r"measure: loss_fn must return a scalar tensor, got NoneType",
    ),
    Case(
        "measure-loss_fn-without-grad",
        lambda w: memsave.measure(w.model, w.x, loss_fn=lambda out: out.detach().sum(), steps=1, warmup=0),
        TypeError,
        r"measure: the loss does not require grad",
    ),
    Case(
        "compare-loss_fn-not-scalar",
        lambda w: memsave.compare(w.model, w.x, strategies=["eager"], loss_fn=nonscalar, steps=1, progress=False),
        TypeError,
        r"compare: loss_fn must return a scalar tensor, got a tensor of shape \(4, 2\)",
    ),
    Case(
        "estimate-loss_fn-not-scalar",
        est(loss_fn=nonscalar),
        TypeError,
        r"estimate: loss_fn must return a scalar tensor, got a tensor of shape \(4, 2\)",
    ),
    Case(
        "compare-strategies-int",
        lambda w: memsave.compare(w.model, w.x, strategies=3),
        TypeError,
        r"compare: strategies must be a list of strategy names .* or a dict .*got int",
    ),
    Case("max_batch_size-model-str", lambda w: memsave.max_batch_size("m", batch, device="cpu"), TypeError, r"max_bat"),
    # ---- register_strategy: wrong types refused before anything is registered
    Case(
        "register_strategy-name-int",
        lambda w: memsave.register_strategy(3, "three"),
        TypeError,
        r"register_strategy: name must be a string, got int",
    ),
    Case(
        "register_strategy-function-as-description",
        lambda w: memsave.register_strategy("mine", lambda model, arg, ctx: model),
        TypeError,
        r"description must be a string .*pass the function as apply=",
    ),
    Case(
        "register_strategy-apply-int",
        lambda w: memsave.register_strategy("mine", "my strategy", apply=3),
        TypeError,
        r"register_strategy: apply must be a function or None, got int",
    ),
    Case(
        "register_strategy-nothing-to-do",
        lambda w: memsave.register_strategy("mine", "my strategy"),
        ValueError,
        r"strategy 'mine' needs apply=\(model, arg, ctx\) -> model or context=",
    ),
    # ---- MemoryMonitor
    Case(
        "MemoryMonitor-device-unknown",
        lambda w: memsave.MemoryMonitor("tpu"),
        ValueError,
        r"MemoryMonitor: device must be 'cpu', 'cuda' or 'cuda:N' .*got str 'tpu'",
    ),
    Case(
        "MemoryMonitor-model-as-device",
        lambda w: memsave.MemoryMonitor(w.model),
        ValueError,
        r"MemoryMonitor: device must be .*\(pass the model as model=\.\.\.\)",
    ),
    Case("MemoryMonitor-device-meta", lambda w: memsave.MemoryMonitor("meta"), ValueError, r"device must be 'cpu' or"),
    Case(
        "MemoryMonitor-log_every-0", lambda w: memsave.MemoryMonitor("cpu", log_every=0), ValueError, r"log_every must"
    ),
    # ---- accumulate(...).backward: a loss it cannot accumulate, refused before the micro-step is counted
    Case(
        "accumulate-backward-not-scalar",
        _acc_backward(lambda w: w.model[-1].weight * 2.0),  # no forward: the BatchNorm statistics stay
        ValueError,
        r"backward expects a scalar loss .*got a tensor of shape \(2, 8\)",
    ),
    Case(
        "accumulate-backward-no-grad",
        _acc_backward(torch.tensor(1.0)),
        ValueError,
        r"the loss does not require grad",
    ),
    Case("accumulate-backward-str", _acc_backward("loss"), TypeError, r"backward expects the loss tensor, got str"),
    # ---- GradScaler: wrong types refused before any state is kept
    Case("scaler-enabled-str", scaler(enabled="yes"), TypeError, r"enabled must be True or False, got 'yes'"),
    Case(
        "scaler-scale-str",
        lambda w: w.scaler.scale("loss"),
        ValueError,
        r"outputs must be a Tensor or an iterable .*str",
    ),
    Case(
        "scaler-unscale_-str",
        lambda w: w.scaler.unscale_("adam"),
        TypeError,
        r"GradScaler\.unscale_: optimizer must be a torch\.optim\.Optimizer .*got str",
    ),
    Case(
        "scaler-step-model",
        lambda w: w.scaler.step(w.model),
        TypeError,
        r"GradScaler\.step: optimizer must be a torch\.optim\.Optimizer .*got Sequential",
    ),
    # ---- Plan.apply_to
    Case("apply_to-str", lambda w: _plan(w).apply_to("m"), TypeError, r"apply_to: model must be"),
    Case(
        "apply_to-other-model",
        lambda w: _plan(w).apply_to(w.model),
        memsave.PlanMismatchError,
        r"lacks: 3\.0|does not know: 4",
        model=lambda: nn.Sequential(*tiny_model(blocks=4)[:3], nn.Sequential(nn.Linear(8, 8)), nn.Linear(8, 2)),
    ),
    # ---- measure
    Case("measure-model-str", lambda w: memsave.measure("m", w.x), TypeError, r"model must be a callable nn\.Modu"),
    Case("measure-steps-0", lambda w: memsave.measure(w.model, w.x, steps=0), ValueError, r"steps must be an int >= 1"),
    Case("measure-warmup", lambda w: memsave.measure(w.model, w.x, warmup=-1), ValueError, r"warmup must be an int"),
    Case("measure-loss_fn-int", lambda w: memsave.measure(w.model, w.x, loss_fn=3), TypeError, r"loss_fn must be"),
    Case("measure-device", lambda w: memsave.measure(w.model, w.x, device="tpu"), ValueError, r"device must be"),
    # ---- compare
    Case(
        "compare-strategy",
        lambda w: memsave.compare(w.model, w.x, strategies=["bogus"]),
        ValueError,
        r"unknown strategy 'bogus'",
    ),
    Case(
        "compare-on_error",
        lambda w: memsave.compare(w.model, w.x, on_error="ignore"),
        ValueError,
        r"on_error must be 'raise' or 'row'",
    ),
    Case("compare-steps-0", lambda w: memsave.compare(w.model, w.x, steps=0), ValueError, r"steps must be an int >= 1"),
    # ---- estimate
    Case("estimate-device-tpu", est(device="tpu"), ValueError, r"device must be 'cpu' or 'cuda'.*'tpu'"),
    Case("estimate-strategy", est(strategy="bogus"), ValueError, r"unknown strategy 'bogus'"),
    Case("estimate-dtype-str", est(dtype="half"), ValueError, r"dtype must be a floating-point torch\.dtype"),
    Case("estimate-dtype-int", est(dtype=torch.int32), ValueError, r"dtype must be a floating-point"),
    Case("estimate-optimizer", est(optimizer="lion9"), ValueError, r"unknown optimizer 'lion9'"),
    Case("estimate-model-str", lambda w: memsave.estimate("m", w.x, device="cpu"), TypeError, r"model must be an"),
    Case(
        "estimate-reads-values",
        lambda w: memsave.estimate(w.model, w.x, device="cpu"),
        NoFakeKernelError,
        r"reads tensor values \(operator aten\._local_scalar_dense.*\.item\(\)",
        model=ReadsValues,
    ),
    # ---- max_batch_size
    Case("max_batch_size-memory-text", mbs(memory="lots"), ValueError, r"memory: cannot parse 'lots'"),
    Case("max_batch_size-memory-negative", mbs(memory=-5), ValueError, r"memory: must be > 0 bytes"),
    Case(
        "max_batch_size-make_inputs",
        lambda w: memsave.max_batch_size(w.model, 3, device="cpu"),
        TypeError,
        r"make_inputs must be a function",
    ),
    Case("max_batch_size-headroom", mbs(headroom=1.5), ValueError, r"headroom must be a fraction in \[0, 1\)"),
    Case("max_batch_size-max-below-min", mbs(min_batch=8, max_batch=4), ValueError, r"max_batch must be an int >="),
    Case("max_batch_size-min-0", mbs(min_batch=0), ValueError, r"min_batch must be an int >= 1"),
    Case("max_batch_size-device", mbs(device="tpu"), ValueError, r"device must be 'cpu' or 'cuda'"),
]


@pytest.mark.parametrize("case", params(CASES))
def test_bad_training_call(case: Case) -> None:
    check(case)
