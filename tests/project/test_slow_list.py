"""tests/slow_tests.txt stays true: every id it lists names a test that exists (a renamed or deleted test would
otherwise drop out of the slow tier silently, or a stale id would linger), and tools/slow_tests.py makes it."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LIST = ROOT / "tests" / "slow_tests.txt"


def _listed() -> list:
    return [line.strip() for line in LIST.read_text().splitlines() if line.strip() and not line.startswith("#")]


def _collected(files: list) -> set:
    env = dict(os.environ, MEMSAVE_SLOW_LIST=os.devnull)
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *files],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    return {line.strip() for line in out.splitlines() if "::" in line}


@pytest.mark.slow  # collects every file the list names (about 20 s)
def test_every_listed_slow_test_exists():
    listed = _listed()
    assert len(listed) == len(set(listed)), "an id is listed twice"
    files = sorted({nodeid.split("::")[0] for nodeid in listed})
    missing = [f for f in files if not (ROOT / f).is_file()]
    assert missing == [], f"slow_tests.txt names files that do not exist: {missing}"
    stale = sorted(set(listed) - _collected(files))
    assert stale == [], f"slow_tests.txt names tests that no longer exist (python3 tools/slow_tests.py): {stale}"


def test_the_generator_keeps_the_ids_over_the_threshold():
    spec = importlib.util.spec_from_file_location("slow_tests", ROOT / "tools" / "slow_tests.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    times = {"tests/a.py::t[1]": 2.0, "tests/a.py::fast": 0.2, "tests/b.py::t": 1.5}
    assert tool.slow_ids(times, 1.5) == ["tests/a.py::t[1]", "tests/b.py::t"]
    assert tool.slow_ids(times, 5.0) == []
