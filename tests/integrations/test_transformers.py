"""memsave inside Hugging Face's Trainer: wrap and plans stay in force when Trainer turns activation checkpointing
on, enable() routes the model's own switch to memsave, MemoryCallback logs, a converted causal LM evaluates and
predicts with eager's logits, and accelerate trains a wrapped model as the plain one."""

from __future__ import annotations

import copy
import functools
import warnings
from typing import Any, Dict, List, Optional

import pytest
import torch
from torch import nn

import memsave

transformers = pytest.importorskip("transformers")
from transformers import Trainer  # noqa: E402

import memsave.integrations.transformers as ms_hf  # noqa: E402
from helpers import hub  # noqa: E402
from helpers.hf_trainer import TokenIds, cpu_training_args, logged_losses, train  # noqa: E402
from memsave.integrations.transformers_switch import LayerCheckpoint  # noqa: E402
from memsave.recompute import is_wrapped  # noqa: E402

VOCAB, SEQ = 64, 16
_ids = functools.partial(TokenIds, seq=SEQ, vocab=VOCAB)


def _llama(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return hub.llama(3, 32, 64, heads=4, kv_heads=2, vocab=VOCAB, positions=2048, attention_dropout=0.0)


class _CountTorchCheckpoint:
    """Counts calls of torch.utils.checkpoint.checkpoint, also as transformers imported it by name."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import torch.utils.checkpoint as tc
        import transformers.modeling_utils as mu

        self.calls = 0
        original = tc.checkpoint

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return original(*args, **kwargs)

        monkeypatch.setattr(tc, "checkpoint", counted)
        monkeypatch.setattr(mu, "checkpoint", counted)


def _train(
    model: torch.nn.Module, tmp_path: Any, steps: int = 20, callbacks: Optional[List[Any]] = None, **kw: Any
) -> Trainer:
    return train(model, cpu_training_args(tmp_path, steps, **kw), _ids(48), callbacks)


@pytest.mark.slow
def test_wrap_stays_in_force_under_trainer_activation_checkpointing(tmp_path, monkeypatch):
    reference = logged_losses(_train(memsave.wrap(_llama()), tmp_path / "a"))
    counter = _CountTorchCheckpoint(monkeypatch)
    model = memsave.wrap(_llama())
    trainer = _train(model, tmp_path / "b", activation_checkpointing=True)
    assert counter.calls == 0
    assert logged_losses(trainer) == reference and len(reference) == 20
    assert [n for n, m in model.named_modules() if is_wrapped(m)] == [f"model.layers.{i}" for i in range(3)]
    assert model.is_activation_checkpointing  # reported as on, and memsave's regions (not nested ones) recompute


@pytest.mark.slow
def test_enable_makes_the_models_switch_use_memsave(tmp_path, monkeypatch):
    reference = logged_losses(_train(memsave.wrap(_llama()), tmp_path / "a"))
    counter = _CountTorchCheckpoint(monkeypatch)
    model = ms_hf.enable(_llama())
    assert not model.is_activation_checkpointing  # enable only routes the switch
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    assert model.is_activation_checkpointing and not any(is_wrapped(m) for m in model.modules())
    assert all(isinstance(layer._gradient_checkpointing_func, LayerCheckpoint) for layer in model.model.layers)
    trainer = _train(model, tmp_path / "b", activation_checkpointing=True)
    assert counter.calls == 0 and logged_losses(trainer) == reference


def test_switch_every_n_layers_disable_and_unknown_options():
    model = ms_hf.enable(_llama())
    model.activation_checkpointing_enable(every_n_layers=2)
    assert [layer.gradient_checkpointing for layer in model.model.layers] == [True, False, True]
    model.activation_checkpointing_disable()
    assert not model.is_activation_checkpointing
    with pytest.raises(TypeError, match="does not take 'offload_to'"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"offload_to": "cpu"})
    with pytest.raises(ValueError, match="offload"):
        model.activation_checkpointing_enable(offload=True)
    with pytest.raises(TypeError, match="unknown option"):
        ms_hf.enable(_llama(), use_reentrant=True)
    with pytest.raises(TypeError, match="no gradient_checkpointing_enable"):
        ms_hf.enable(torch.nn.Linear(2, 2))


def test_wrap_keeps_the_models_checkpointing_on_as_memsaves_and_unwrap_gives_the_switch_back(monkeypatch):
    model = _llama()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        model.gradient_checkpointing_enable()
    theirs = model.model.layers[0]._gradient_checkpointing_func
    memsave.wrap(model)
    assert model.is_activation_checkpointing  # still on: memsave's regions, not torch's checkpoint inside them
    assert isinstance(model.model.layers[0]._gradient_checkpointing_func, LayerCheckpoint)
    counter = _CountTorchCheckpoint(monkeypatch)
    ids = torch.randint(0, VOCAB, (2, SEQ))
    model(ids, labels=ids).loss.backward()
    assert counter.calls == 0
    memsave.unwrap(model)
    assert "activation_checkpointing_enable" not in vars(model)  # transformers' own switch again
    assert model.model.layers[0]._gradient_checkpointing_func is theirs and model.is_activation_checkpointing


@pytest.mark.slow
def test_a_plan_stays_in_force_when_the_switch_is_turned_on():
    model = _llama()
    ids = torch.randint(0, VOCAB, (2, SEQ))
    plan = memsave.plan(model, ids, labels=ids, solver="sqrt", selective=False, verify=False)
    memsave.wrap(model, plan)
    wrapped = [n for n, m in model.named_modules() if is_wrapped(m)]
    model.activation_checkpointing_enable()
    assert [n for n, m in model.named_modules() if is_wrapped(m)] == wrapped
    assert model.is_activation_checkpointing  # on, through the plan's regions (each layer runs inside them)


@pytest.mark.slow
def test_memory_callback_logs_peak_and_activation_bytes(tmp_path):
    model = memsave.wrap(_llama())
    trainer = _train(model, tmp_path, steps=4, logging_steps=2, callbacks=[ms_hf.MemoryCallback()])
    logged = [h for h in trainer.state.log_history if "loss" in h]
    assert [h["step"] for h in logged] == [2, 4]
    for h in logged:
        assert h["peak_bytes"] > h["activation_bytes"] > 0
    plain = _train(_llama(), tmp_path, steps=2, logging_steps=2, callbacks=[ms_hf.MemoryCallback()])
    eager_act = next(h for h in plain.state.log_history if "loss" in h)["activation_bytes"]
    assert eager_act > logged[0]["activation_bytes"]  # memsave's regions keep less than eager


def _accuracy(pred: Any) -> Dict[str, float]:
    logits, labels = pred.predictions, pred.label_ids
    if isinstance(logits, tuple):
        logits = logits[0]
    return {"accuracy": float((logits.argmax(-1)[:, :-1] == labels[:, 1:]).mean())}


@pytest.mark.slow
def test_converted_causal_lm_evaluates_and_predicts_with_eagers_logits(tmp_path):
    eager = _llama()
    fused = memsave.convert(copy.deepcopy(eager), fuse=True)
    results = {}
    for name, model in (("eager", eager), ("fused", fused)):
        trainer = Trainer(
            model=model,
            args=cpu_training_args(tmp_path / name, steps=2),
            train_dataset=_ids(48),
            eval_dataset=_ids(8),
            compute_metrics=_accuracy,
        )
        metrics = trainer.evaluate()
        predictions = trainer.predict(_ids(8))
        results[name] = (metrics, predictions)
    (m_e, p_e), (m_f, p_f) = results["eager"], results["fused"]
    logits_e = p_e.predictions[0] if isinstance(p_e.predictions, tuple) else p_e.predictions
    logits_f = p_f.predictions[0] if isinstance(p_f.predictions, tuple) else p_f.predictions
    assert logits_f.shape == logits_e.shape == (8, SEQ, VOCAB)
    # fuse=True also fuses the norms and the MLP (equal to float32 rounding, not bitwise)
    assert float(abs(logits_f - logits_e).max()) <= 1e-5 * float(abs(logits_e).max())
    assert m_f["eval_accuracy"] == m_e["eval_accuracy"]
    assert abs(m_f["eval_loss"] - m_e["eval_loss"]) <= 1e-5 * abs(m_e["eval_loss"])


def test_converted_causal_lm_skips_the_logits_only_in_a_training_forward_with_labels():
    model = memsave.convert(_llama(), fuse=True)
    ids = torch.randint(0, VOCAB, (2, SEQ))
    assert model.train()(ids, labels=ids).logits.shape[-1] == 0
    with torch.no_grad():
        assert model(ids, labels=ids).logits.shape[-1] == VOCAB
    assert model.eval()(ids, labels=ids).logits.shape[-1] == VOCAB
    out = model.generate(ids[:, :4], max_new_tokens=3, do_sample=False)
    assert out.shape == (2, 7)


def test_accelerate_trains_a_wrapped_model_bitwise_as_the_plain_one():
    accelerate = pytest.importorskip("accelerate")
    ids = torch.randint(0, VOCAB, (4, SEQ), generator=torch.Generator().manual_seed(3))
    losses = {}
    for name in ("plain", "wrapped"):
        model = _llama()
        if name == "wrapped":
            memsave.wrap(model)
        acc = accelerate.Accelerator(cpu=True)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        model, opt = acc.prepare(model, opt)
        torch.manual_seed(5)
        seen = []
        for _ in range(4):
            loss = model(ids, labels=ids).loss
            acc.backward(loss)
            opt.step()
            opt.zero_grad()
            seen.append(loss.item())
        losses[name] = (seen, [p.detach().clone() for p in model.parameters()])
    assert losses["plain"][0] == losses["wrapped"][0]
    assert all(torch.equal(a, b) for a, b in zip(losses["plain"][1], losses["wrapped"][1]))
