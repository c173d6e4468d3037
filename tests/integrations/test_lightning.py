"""memsave.integrations.lightning in a Lightning Trainer on CPU: MemoryCallback logs peak and activation bytes on the
measured steps only, at the logger's step numbers; Memsave converts, wraps or plans the LightningModule in one line
with the same losses as without memsave; memsave.MemoryMonitor, the loop monitor, is refused with a pointer to the
callback."""

from __future__ import annotations

import csv
import warnings
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest
import torch
from torch import nn

import memsave
from memsave.errors import MemsaveWarning
from memsave.recompute import is_wrapped

pl = pytest.importorskip("lightning.pytorch")
from lightning.pytorch.loggers import CSVLogger  # noqa: E402

from memsave.integrations.lightning import MemoryCallback, Memsave  # noqa: E402

D = 32


class _Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d, 4 * d), nn.ReLU(), nn.Dropout(0.1), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.net(x)


class _Module(pl.LightningModule):
    def __init__(self, wrap: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.model = nn.Sequential(*[_Block(D) for _ in range(4)], nn.Linear(D, 1))
        if wrap:
            memsave.wrap(self.model, _Block)
        self.losses: List[float] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.model(x), y)
        self.log("train_loss", loss)
        return loss

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.losses.append(outputs["loss"].item())  # not in training_step: Memsave's planning runs that too

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _fit(
    module: pl.LightningModule,
    callbacks: List[Any],
    steps: int = 4,
    batch: int = 16,
    logger: Any = False,
) -> Dict[str, Any]:
    g = torch.Generator().manual_seed(1)
    data = torch.utils.data.TensorDataset(
        torch.randn(8 * batch, D, generator=g), torch.randn(8 * batch, 1, generator=g)
    )
    loader = torch.utils.data.DataLoader(
        data, batch_size=batch, shuffle=True, generator=torch.Generator().manual_seed(2)
    )
    trainer = pl.Trainer(
        max_steps=steps,
        accelerator="cpu",
        callbacks=callbacks,
        logger=logger,
        log_every_n_steps=1,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    torch.manual_seed(3)  # dropout masks: the same stream for every run
    trainer.fit(module, loader)
    return {"losses": module.losses, "metrics": dict(trainer.callback_metrics)}


def _csv_rows(logger: CSVLogger) -> List[Dict[str, str]]:
    with open(Path(logger.log_dir) / "metrics.csv", newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
def test_memory_callback_logs_each_probed_step_and_memsave_keeps_less():
    monitors = {"eager": MemoryCallback(), "wrapped": MemoryCallback()}
    eager = _fit(_Module(), [monitors["eager"]])
    wrapped = _fit(_Module(wrap=True), [monitors["wrapped"]])
    assert wrapped["losses"] == eager["losses"] and len(eager["losses"]) == 4  # bitwise: a lossless strategy
    for name, run in (("eager", eager), ("wrapped", wrapped)):
        history = monitors[name].history
        assert [h["step"] for h in history] == [0, 1, 2, 3]
        assert all(h["peak_bytes"] >= h["activation_bytes"] > 0 for h in history)
        assert float(run["metrics"]["peak_bytes"]) == history[-1]["peak_bytes"]
    assert monitors["wrapped"].history[-1]["activation_bytes"] < monitors["eager"].history[-1]["activation_bytes"]


def test_memory_callback_logs_only_measured_steps_at_the_loggers_step_numbers(tmp_path):
    logger = CSVLogger(str(tmp_path), name="run")
    monitor = MemoryCallback(every_n_steps=4)
    _fit(_Module(), [monitor], steps=8, logger=logger)
    rows = _csv_rows(logger)
    loss_steps = [int(r["step"]) for r in rows if r.get("train_loss")]
    memory_rows = [r for r in rows if r.get("peak_bytes")]
    assert loss_steps == list(range(8))  # Lightning's own metric, at the logger's step numbers
    assert [int(r["step"]) for r in memory_rows] == [0, 4] == [h["step"] for h in monitor.history]
    assert [float(r["peak_bytes"]) for r in memory_rows] == [h["peak_bytes"] for h in monitor.history]
    assert all(float(r["activation_bytes"]) > 0 for r in memory_rows)


def test_memory_callback_bad_arguments_and_the_deprecated_name():
    with pytest.raises(ValueError, match="every_n_steps"):
        MemoryCallback(every_n_steps=0)
    import memsave.integrations.lightning as ms_pl

    with pytest.warns(DeprecationWarning, match="MemoryCallback"):
        old = ms_pl.MemoryMonitor
    assert old is MemoryCallback


def test_the_loop_monitor_passed_to_lightning_says_which_class_to_use():
    with pytest.raises(TypeError, match=r"memsave\.integrations\.lightning\.MemoryCallback"):
        pl.Trainer(max_steps=1, accelerator="cpu", callbacks=[memsave.MemoryMonitor("cpu")], logger=False)
    monitor = memsave.MemoryMonitor("cpu")
    assert not hasattr(monitor, "no_such_attribute")  # other names still raise AttributeError


class _RaisingCheckpoint:
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("torch.utils.checkpoint.checkpoint was called")


def _memsave_fit(callback: Memsave, steps: int = 4, batch: int = 256, module: Optional[_Module] = None) -> Any:
    module = module or _Module()
    run = _fit(module, [callback], steps=steps, batch=batch)
    return module, run


@pytest.mark.slow
def test_memsave_plans_the_module_on_its_first_batch_with_eagers_losses(monkeypatch):
    eager = _fit(_Module(), [], steps=4, batch=256)
    import torch.utils.checkpoint as tc

    monkeypatch.setattr(tc, "checkpoint", _RaisingCheckpoint())
    callback = Memsave(budget=0.6)
    module, run = _memsave_fit(callback)
    assert run["losses"] == eager["losses"] and len(run["losses"]) == 4  # bitwise, dropout included
    assert callback.plan is not None and any(is_wrapped(m) for m in module.modules())
    assert callback.plan.measured_peak_bytes <= callback.plan.budget_bytes
    assert [h["step"] for h in callback.history] == [0, 1, 2, 3]  # it logs memory too


@pytest.mark.slow
def test_memsave_converts_and_wraps_when_fit_starts_replacing_a_users_wrap():
    eager = _fit(_Module(), [], steps=3)
    callback = Memsave(convert=True, every_n_steps=2)
    with pytest.warns(MemsaveWarning, match="replaced"):
        module, run = _memsave_fit(callback, steps=3, batch=16, module=_Module(wrap=True))
    assert run["losses"] == eager["losses"]
    assert any(isinstance(m, memsave.nn.ReLU) for m in module.modules())  # convert=True: bitwise eager
    wrapped = [n for n, m in module.named_modules() if is_wrapped(m)]
    assert wrapped == [f"model.{i}" for i in range(4)]  # memsave.find_blocks: the four blocks, once each
    assert [h["step"] for h in callback.history] == [0, 2]


def test_memsave_bad_arguments_raise_at_construction():
    with pytest.raises(ValueError, match="cannot parse"):
        Memsave(budget="20 gigs")
    with pytest.raises(ValueError, match="nothing to do"):
        Memsave(checkpoint=False)
    with pytest.raises(ValueError, match="checkpoint=False"):
        Memsave(budget="1GiB", checkpoint=False)
    with pytest.raises(ValueError, match="every_n_steps"):
        Memsave(every_n_steps=0)


def test_memsave_refuses_a_budget_under_manual_optimization():
    class Manual(_Module):
        def __init__(self) -> None:
            super().__init__()
            self.automatic_optimization = False

        def training_step(self, batch: Any, batch_idx: int) -> None:
            opt = self.optimizers()
            loss = nn.functional.mse_loss(self.model(batch[0]), batch[1])
            opt.zero_grad()
            self.manual_backward(loss)
            opt.step()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ValueError, match="automatic_optimization"):
            _fit(Manual(), [Memsave(budget="1MiB")], steps=1)
