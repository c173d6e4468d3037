"""memsave.integrations.lightning.MemoryMonitor in a Lightning Trainer on CPU: peak and activation bytes logged per
probed step, a wrapped model's activations below eager's, and the same losses as without memsave."""

from __future__ import annotations

from typing import Any, Dict, List

import pytest
import torch
from torch import nn

import memsave

pl = pytest.importorskip("lightning.pytorch")
from memsave.integrations.lightning import MemoryMonitor  # noqa: E402


class _Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.net(x)


class _Module(pl.LightningModule):
    def __init__(self, wrap: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.model = nn.Sequential(*[_Block(32) for _ in range(4)], nn.Linear(32, 1))
        if wrap:
            memsave.wrap(self.model, _Block)
        self.losses: List[float] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.model(x), y)
        self.losses.append(loss.item())
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _fit(wrap: bool, every: int = 1) -> Dict[str, Any]:
    g = torch.Generator().manual_seed(1)
    data = torch.utils.data.TensorDataset(torch.randn(64, 32, generator=g), torch.randn(64, 1, generator=g))
    loader = torch.utils.data.DataLoader(data, batch_size=16)
    module, monitor = _Module(wrap), MemoryMonitor(every_n_steps=every)
    trainer = pl.Trainer(
        max_steps=4,
        accelerator="cpu",
        callbacks=[monitor],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, loader)
    return {"losses": module.losses, "history": monitor.history, "metrics": dict(trainer.callback_metrics)}


@pytest.mark.slow
def test_memory_monitor_logs_each_probed_step_and_memsave_keeps_less():
    eager, wrapped = _fit(False), _fit(True)
    assert wrapped["losses"] == eager["losses"] and len(eager["losses"]) == 4  # bitwise: a lossless strategy
    for run in (eager, wrapped):
        assert [h["step"] for h in run["history"]] == [1, 2, 3, 4]
        assert all(h["peak_bytes"] >= h["activation_bytes"] > 0 for h in run["history"])
        assert float(run["metrics"]["peak_bytes"]) == run["history"][-1]["peak_bytes"]
    assert wrapped["history"][-1]["activation_bytes"] < eager["history"][-1]["activation_bytes"]


def test_memory_monitor_every_n_steps_and_bad_arguments():
    run = _fit(False, every=2)
    assert [h["step"] for h in run["history"]] == [1, 3]
    with pytest.raises(ValueError, match="every_n_steps"):
        MemoryMonitor(every_n_steps=0)
