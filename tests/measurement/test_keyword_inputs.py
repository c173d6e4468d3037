"""Keyword inputs (``labels=``) in measure, compare, estimate and max_batch_size; compare with a user function;
the public ``memsave.register_strategy``; the spread that every timed comparison reports."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import memsave
from memsave.measurement.timing import Timing, spread_warning


class LabelledLM(nn.Module):
    """A tiny LM that returns its loss only when given ``labels=``, like a Hugging Face causal LM."""

    def __init__(self, vocab: int = 32, d: int = 16) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(d, d), nn.GELU()) for _ in range(2))
        self.head = nn.Linear(d, vocab)

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> dict:
        x = self.emb(ids)
        for b in self.blocks:
            x = x + b(x)
        logits = self.head(x)
        return {"loss": nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten()), "logits": logits}


def _lm():
    torch.manual_seed(0)
    return LabelledLM(), torch.randint(0, 32, (2, 8), generator=torch.Generator().manual_seed(1))


@pytest.mark.slow
def test_measure_estimate_and_max_batch_size_take_labels():
    model, ids = _lm()
    m = memsave.measure(model, ids, labels=ids, steps=1)
    assert m.peak_bytes > 0 and 1 <= m.steps <= 4
    e = memsave.estimate(model, ids, labels=ids, device="cpu")
    assert e.peak_bytes > 0
    b = memsave.max_batch_size(
        model,
        lambda n: {"ids": torch.zeros(n, 8, dtype=torch.long), "labels": torch.zeros(n, 8, dtype=torch.long)},
        "4MiB",
        device="cpu",
        max_batch=64,
    )
    assert 1 <= b <= 64
    with pytest.raises(TypeError):
        memsave.measure(model, ids, steps=1)  # without labels this forward cannot run: the keyword did reach it


@pytest.mark.slow
def test_compare_takes_labels_a_user_function_and_eager_against_itself():
    model, ids = _lm()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the spread warning, on a loaded machine
        r = memsave.compare(
            model,
            ids,
            labels=ids,
            steps=3,
            strategies={"eager": "eager", "eager_again": lambda m: m, "wrap": "checkpoint:blocks"},
        )
    # A mapping's row shows under the name given ("wrap"), not the strategy's ("checkpoint:blocks").
    assert [row.strategy for row in r.rows] == ["eager", "eager_again", "wrap"]
    assert r["wrap"].max_grad_diff == 0.0
    again = r["eager_again"]
    assert again.max_grad_diff == 0.0 and again.peak_bytes == r.eager.peak_bytes
    # Every timed row says how spread its times were and over how many rounds (no claim on the ratio: timing).
    assert again.step_iqr_seconds >= 0 and again.time_ratio_iqr >= 0 and 3 <= r.steps <= 12
    assert "IQR" in str(r) and f"{r.steps} interleaved rounds" in str(r)
    with pytest.raises(ValueError, match="registered strategy's name"):
        memsave.compare(model, ids, labels=ids, strategies={"convert": lambda m: m})


def test_register_strategy_is_public():
    assert memsave.register_strategy is memsave.measurement.strategies.register_strategy
    assert "register_strategy" in memsave.__all__


def test_a_spread_over_ten_percent_is_warned_with_the_number_of_rounds():
    calm = Timing("eager", 1.0, 0.05, 7, 1, (1.0,) * 7)
    noisy = Timing("wrap", 1.0, 0.2, 7, 1, (1.0,) * 7)
    assert spread_warning([calm], "compare") is None
    message = spread_warning([calm, noisy], "compare")
    assert message is not None and "wrap 20%" in message and "7 rounds" in message and "eager" not in message
