"""Output control (docs/output.md): one progress switch (argument, MEMSAVE_PROGRESS, --no-progress), memsave's
logger with a NullHandler, and no torch import noise from memsave's timer."""

from __future__ import annotations

import logging
import subprocess
import sys
from typing import Any, List, Optional

import pytest

import memsave
from memsave.common import progress as progress_module
from memsave.common.progress import PROGRESS_ENV, progress_bar, progress_enabled


def test_the_environment_turns_bars_off_and_an_argument_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PROGRESS_ENV, raising=False)
    assert progress_enabled() and progress_enabled(None)
    for off in ("0", "false", "OFF", " no "):
        monkeypatch.setenv(PROGRESS_ENV, off)
        assert not progress_enabled() and progress_bar(3, "x") is None
        bar = progress_bar(3, "x", progress=True)
        assert bar is not None
        bar.close()
    monkeypatch.setenv(PROGRESS_ENV, "1")
    assert progress_enabled() and progress_bar(3, "x", progress=False) is None
    with pytest.raises(TypeError, match="progress must be True, False or None"):
        progress_enabled("no")  # type: ignore[arg-type]


def _record_progress(monkeypatch: pytest.MonkeyPatch, module: Any) -> List[Optional[bool]]:
    seen: List[Optional[bool]] = []

    def recorder(*args: Any, progress: Optional[bool] = None, **kwargs: Any) -> None:
        seen.append(progress)
        return None

    monkeypatch.setattr(module, "progress_bar", recorder)
    return seen


def test_plan_and_compare_pass_their_switch_and_plans_inside_compare_draw_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch
    from torch import nn

    from memsave.measurement import comparison
    from memsave.recompute.planning import planner

    model = nn.Sequential(*[nn.Sequential(nn.Linear(8, 8), nn.Tanh()) for _ in range(3)])
    x = torch.randn(4, 8)
    compare_seen = _record_progress(monkeypatch, comparison)
    plan_seen = _record_progress(monkeypatch, planner)
    memsave.compare(model, x, strategies=["plan:sqrt"], steps=1, progress=False)
    assert compare_seen == [False] and plan_seen == [False]  # the plan inside compare draws no second bar
    memsave.plan(model, x, solver="sqrt", verify=False)
    memsave.plan(model, x, solver="sqrt", verify=False, progress=True)
    assert plan_seen[1:] == [None, True]


@pytest.mark.slow  # the demo's comparison: about a minute on two loaded cores
def test_cli_no_progress_reaches_compare(monkeypatch: pytest.MonkeyPatch) -> None:
    from memsave.cli import demo
    from memsave.measurement import comparison

    seen = _record_progress(monkeypatch, comparison)
    assert demo.main(["--size", "tiny", "--steps", "1", "--no-progress"]) == 0
    assert seen == [False]


def test_memsave_logger_has_a_null_handler_and_no_level() -> None:
    logger = logging.getLogger("memsave")
    assert any(isinstance(h, logging.NullHandler) for h in logger.handlers)
    assert logger.level == logging.NOTSET  # the application decides


def test_timing_on_a_cpu_machine_logs_no_torch_import_line() -> None:
    code = (
        "import memsave\n"
        "from memsave.measurement.timing import time_interleaved\n"
        "time_interleaved({'a': lambda: None}, rounds=1)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "No CUDA runtime is found" not in done.stderr and "cpp_extension" not in done.stderr


def test_progress_module_documents_its_switches() -> None:
    assert PROGRESS_ENV in (progress_module.__doc__ or "") and "--no-progress" in (progress_module.__doc__ or "")
