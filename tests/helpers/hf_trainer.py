"""Hugging Face Trainer scaffolding of the integration tests: a dataset of random token ids, the arguments of a short
CPU run, one training run with transformers' deprecation warnings silenced, and torch's checkpoint made to raise.
transformers is imported when a function needs it (the test modules skip themselves without it).
"""

from __future__ import annotations

import warnings
from typing import Any, Dict, List, Optional, Sequence

import pytest
import torch


class TokenIds(torch.utils.data.Dataset):
    """``n`` rows of ``seq`` random token ids below ``vocab`` (seeded), each row its own labels: a causal LM's data.

    Args:
        n: rows.
        seq: tokens per row.
        vocab: the vocabulary size (ids are drawn from ``[0, vocab)``).
        seed: the seed of the generator the ids are drawn from.

    Returns:
        The dataset; item ``i`` is ``{"input_ids": row, "labels": row}``.

    Raises:
        ValueError: ``n``, ``seq`` or ``vocab`` is not positive.

    Examples:
        >>> TokenIds(8, 16, 64)[0]["input_ids"].shape
        torch.Size([16])
    """

    def __init__(self, n: int, seq: int, vocab: int, seed: int = 1) -> None:
        if min(n, seq, vocab) < 1:
            raise ValueError(f"TokenIds needs n, seq and vocab >= 1, got n={n}, seq={seq}, vocab={vocab}")
        self.ids = torch.randint(0, vocab, (n, seq), generator=torch.Generator().manual_seed(seed))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> Dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def cpu_training_args(output_dir: Any, steps: int, **overrides: Any) -> Any:
    """``TrainingArguments`` of a short, seeded CPU run: batches of 4, learning rate 1e-3, a log every step, nothing
    saved or reported.

    Args:
        output_dir: Trainer's output folder (a path).
        steps: ``max_steps``.
        **overrides: further ``TrainingArguments`` fields, or other values for the ones above (``logging_steps=2``).

    Returns:
        The ``transformers.TrainingArguments``.

    Raises:
        ImportError: transformers is not installed.

    Examples:
        >>> cpu_training_args(tmp_path, 4, logging_steps=2).max_steps
        4
    """
    fields: Dict[str, Any] = dict(
        output_dir=str(output_dir),
        max_steps=steps,
        per_device_train_batch_size=4,
        per_device_eval_batch_size=4,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        seed=0,
        data_seed=0,
        disable_tqdm=True,
    )
    from transformers import TrainingArguments

    return TrainingArguments(**{**fields, **overrides})


def train(
    model: torch.nn.Module, args: Any, data: Any, callbacks: Optional[Sequence[Any]] = None, **trainer: Any
) -> Any:
    """A ``Trainer`` of ``model`` on ``data``, trained (transformers 5's FutureWarnings about the deprecated switch
    spellings silenced: the tests call them on purpose).

    Args:
        model: the model to train.
        args: its ``TrainingArguments`` (:func:`cpu_training_args`).
        data: the training dataset (:class:`TokenIds`).
        callbacks: Trainer callbacks, or None.
        **trainer: further ``Trainer`` arguments (``eval_dataset=...``).

    Returns:
        The ``transformers.Trainer``, after ``train()``.

    Raises:
        ImportError: transformers is not installed.

    Examples:
        >>> train(model, cpu_training_args(tmp_path, 2), TokenIds(8, 16, 64)).state.global_step
        2
    """
    from transformers import Trainer

    trained = Trainer(model=model, args=args, train_dataset=data, callbacks=list(callbacks or []), **trainer)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        trained.train()
    return trained


def logged_losses(trainer: Any) -> List[float]:
    """The training losses ``trainer`` logged, in order.

    Args:
        trainer: a ``transformers.Trainer`` after ``train()``.

    Returns:
        The ``loss`` of every entry of its log history that has one.

    Raises:
        AttributeError: ``trainer`` has no ``state.log_history`` (not a Trainer).

    Examples:
        >>> logged_losses(train(model, cpu_training_args(tmp_path, 2), TokenIds(8, 16, 64)))
        [4.17, 4.16]
    """
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


def refuse_torch_checkpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    """``torch.utils.checkpoint.checkpoint`` raises when called, also as transformers imported it by name (so a test
    sees that memsave's regions, not torch's checkpoint, recompute); undone when the test ends.

    Args:
        monkeypatch: the test's ``monkeypatch`` fixture.

    Returns:
        None.

    Raises:
        ImportError: transformers is not installed.

    Examples:
        >>> refuse_torch_checkpoint(monkeypatch)  # torch.utils.checkpoint.checkpoint(...) now raises AssertionError
    """
    import torch.utils.checkpoint as tc
    import transformers.modeling_utils as modeling_utils

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("torch.utils.checkpoint.checkpoint was called")

    monkeypatch.setattr(tc, "checkpoint", refuse)
    monkeypatch.setattr(modeling_utils, "checkpoint", refuse)
