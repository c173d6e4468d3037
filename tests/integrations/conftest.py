"""What the integration tests share: the ``no_torch_checkpoint`` fixture."""

from __future__ import annotations

import pytest

from helpers.hf_trainer import refuse_torch_checkpoint


@pytest.fixture
def no_torch_checkpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.utils.checkpoint.checkpoint raises when called, also as transformers imported it by name."""
    refuse_torch_checkpoint(monkeypatch)
