"""memsave in Hugging Face's Trainer in one line: Memsave plans, converts or wraps the model Trainer trains, whatever
checkpointing switches were set before, with eager's losses and no torch checkpoint; MemoryCallback's keys reach the
callbacks registered before it (where Trainer puts its reporting integrations), on exactly the measured steps."""

from __future__ import annotations

import warnings
from typing import Any, Dict, List

import pytest
import torch
from torch import nn

import memsave
from memsave.errors import MemsaveWarning

transformers = pytest.importorskip("transformers")
from transformers import Trainer, TrainerCallback  # noqa: E402

import memsave.integrations.transformers as ms_hf  # noqa: E402
from helpers import hub  # noqa: E402
from helpers.hf_trainer import TokenIds, cpu_training_args, logged_losses, train  # noqa: E402
from memsave.recompute import is_wrapped  # noqa: E402

VOCAB, SEQ = 64, 64


def _llama(seed: int = 0, act: str = "silu") -> nn.Module:
    torch.manual_seed(seed)
    # attention dropout on: the RNG stream must be the same with memsave (regions replay it, planning puts it back)
    return hub.llama(2, 32, 64, heads=4, kv_heads=2, vocab=VOCAB, positions=2048, attention_dropout=0.1, hidden_act=act)


def _converted(model: nn.Module) -> bool:
    return any(isinstance(m, memsave.nn.ReLU) for m in model.modules())  # convert=True's bitwise swap of nn.ReLU


def _train(model: nn.Module, tmp_path: Any, callbacks: List[Any], steps: int = 4, **kw: Any) -> Trainer:
    return train(model, cpu_training_args(tmp_path, steps, **kw), TokenIds(32, SEQ, VOCAB), callbacks)


class _Recorder(TrainerCallback):
    """Stands where Trainer puts TensorBoard, W&B and MLflow: before the user's callbacks; records what it is shown."""

    def __init__(self) -> None:
        self.logs: List[Dict[str, Any]] = []

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
        self.logs.append({**logs, "step": state.global_step})


class _LogAlsoAt(TrainerCallback):
    """Makes Trainer log at extra steps, which MemoryCallback does not foresee (so does not measure)."""

    def __init__(self, *steps: int) -> None:
        self.steps = steps

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if state.global_step in self.steps:
            control.should_log = True


@pytest.mark.slow
def test_memsave_plans_in_trainer_with_eagers_losses_whatever_switch_was_on(tmp_path, no_torch_checkpoint):
    with pytest.raises(AssertionError, match="was called"):  # the guard works: transformers' own switch trips it
        _train(_llama(), tmp_path / "guard", [], steps=1, activation_checkpointing=True)
    eager = logged_losses(_train(_llama(), tmp_path / "eager", []))
    callback, recorder = ms_hf.Memsave(budget=0.6), _Recorder()
    model = _llama()
    trainer = _train(model, tmp_path / "planned", [recorder, callback], activation_checkpointing=True)
    assert logged_losses(trainer) == eager and len(eager) == 4  # bitwise, attention dropout included
    assert callback.plan is not None and callback.plan.measured_peak_bytes <= callback.plan.budget_bytes
    assert any(is_wrapped(m) for m in model.modules())
    logged = [log for log in recorder.logs if "loss" in log]
    assert [log["step"] for log in logged] == [1, 2, 3, 4]
    assert all(log["peak_bytes"] >= log["activation_bytes"] > 0 for log in logged)  # seen by the reporter


@pytest.mark.slow
def test_memsave_converts_and_wraps_after_enable_and_the_models_own_switch(tmp_path, no_torch_checkpoint):
    eager = logged_losses(_train(_llama(act="relu"), tmp_path / "eager", []))
    model = ms_hf.enable(_llama(act="relu"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        model.gradient_checkpointing_enable()  # memsave's per-layer regions, before Trainer
    trainer = _train(model, tmp_path / "memsave", [ms_hf.Memsave(convert=True)], activation_checkpointing=True)
    assert logged_losses(trainer) == eager and _converted(model)
    assert [n for n, m in model.named_modules() if is_wrapped(m)] == ["model.layers.0", "model.layers.1"]


@pytest.mark.slow
def test_memsave_replaces_a_users_wrap_with_a_warning_and_keeps_it_when_only_checkpointing(tmp_path):
    eager = logged_losses(_train(_llama(act="relu"), tmp_path / "eager", [], steps=2))
    model = memsave.wrap(_llama(act="relu"), lambda name, m: name == "model.layers.1")
    with pytest.warns(MemsaveWarning, match="replaced"):
        trainer = _train(model, tmp_path / "replaced", [ms_hf.Memsave(convert=True)], steps=2)
    assert logged_losses(trainer) == eager and _converted(model)
    assert [n for n, m in model.named_modules() if is_wrapped(m)] == ["model.layers.0", "model.layers.1"]
    kept = memsave.wrap(_llama(), lambda name, m: name == "model.layers.1")
    _train(kept, tmp_path / "kept", [ms_hf.Memsave()], steps=1)
    assert [n for n, m in kept.named_modules() if is_wrapped(m)] == ["model.layers.1"]


def test_memory_keys_reach_callbacks_registered_before_it_on_exactly_the_measured_steps(tmp_path):
    recorder = _Recorder()
    trainer = _train(_llama(), tmp_path, [recorder, _LogAlsoAt(3), ms_hf.MemoryCallback()], steps=4, logging_steps=2)
    seen = {log["step"]: log for log in recorder.logs if "loss" in log}
    assert sorted(seen) == [2, 3, 4]
    assert [s for s, log in seen.items() if "peak_bytes" in log] == [2, 4]  # step 3 was logged but not measured
    history = {h["step"]: h for h in trainer.state.log_history if "loss" in h}
    for step in (2, 4):
        assert seen[step]["peak_bytes"] == history[step]["peak_bytes"] > seen[step]["activation_bytes"] > 0
    assert "peak_bytes" not in history[3]


def test_memsave_bad_arguments_raise_at_construction():
    with pytest.raises(ValueError, match="cannot parse"):
        ms_hf.Memsave(budget="20 gigs")
    with pytest.raises(ValueError, match="> 0"):
        ms_hf.Memsave(budget=-1)
    with pytest.raises(ValueError, match="whole peak"):
        ms_hf.Memsave(budget=1.5)
    with pytest.raises(ValueError, match="checkpoint=False"):
        ms_hf.Memsave(budget="20GiB", checkpoint=False)
    with pytest.raises(ValueError, match="nothing to do"):
        ms_hf.Memsave(checkpoint=False)
    with pytest.raises(ValueError, match="need a budget"):
        ms_hf.Memsave(plan_options={"solver": "sqrt"})
    with pytest.raises(TypeError, match="unknown option"):
        ms_hf.Memsave(convert={"fused": True})
    with pytest.raises(TypeError, match="unknown option"):
        ms_hf.Memsave(budget=0.5, plan_options={"compile": True})
    with pytest.raises(TypeError, match="checkpoint"):
        ms_hf.Memsave(checkpoint="yes")


def test_the_loop_monitor_passed_to_trainer_says_which_class_to_use(tmp_path):
    with pytest.raises(TypeError, match=r"memsave\.integrations\.transformers\.MemoryCallback"):
        Trainer(
            model=_llama(),
            args=cpu_training_args(tmp_path, 1),
            train_dataset=TokenIds(32, SEQ, VOCAB),
            callbacks=[memsave.MemoryMonitor()],
        )
