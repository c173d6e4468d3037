"""Running PyTorch's own tests, unchanged, against memsave (the torch suite harnesses).

torch publishes no sdist, so the tests cannot be fetched at test time: they are read from a checkout of pytorch's
``test/`` folder that ``MEMSAVE_TORCH_TESTS`` names (the installed torch's release, or one close to it). Each harness
runs the chosen tests twice in a subprocess with ``tests/torch_suite/torch_suite_plugin.py``: once as torch has
them (baseline), once with memsave in place of torch's function or class; the plugin reports each test's outcome and
what ran (see its docstring).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Sequence, Set

import pytest

ENV = "MEMSAVE_TORCH_TESTS"
PLUGIN_DIR = Path(__file__).resolve().parents[1] / "torch_suite"

HOW = (
    f"set {ENV} to the test/ folder of a pytorch source checkout for the installed torch (tag v<torch version>, or "
    f"a release close to it), e.g. {ENV}=~/src/pytorch/test; see docs/compatibility.md"
)


def torch_tests_dir(files: Sequence[str]) -> Path:
    """The folder ``MEMSAVE_TORCH_TESTS`` names; the calling test is skipped (saying how to provide it) when the
    variable is unset or the folder lacks one of ``files``."""
    value = os.environ.get(ENV, "")
    if not value:
        pytest.skip(f"torch's own tests are not available: {HOW}")
    folder = Path(value).expanduser()
    missing = [f for f in files if not (folder / f).is_file()]
    if missing:
        pytest.skip(f"{ENV}={value} lacks {missing}: {HOW}")
    return folder


def run_suite(folder: Path, files: Iterable[str], keyword: str, mode: str, work: Path) -> Dict[str, Any]:
    """Run the tests of ``files`` (in ``folder``) that ``keyword`` selects under the plugin in ``mode``.

    Returns:
        the plugin's results: ``outcomes`` and ``errors`` by test id, ``counts`` (what ran, by test id).
    """
    results = work / f"{mode}.json"
    ini = work / "pytest.ini"
    ini.write_text("[pytest]\n")
    path = os.pathsep.join(p for p in (str(PLUGIN_DIR), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, PYTHONPATH=path, MEMSAVE_TORCH_SUITE=mode, MEMSAVE_TORCH_SUITE_RESULTS=str(results))
    cmd = [sys.executable, "-m", "pytest", *(str(folder / f) for f in files), "-p", "torch_suite_plugin"]
    # torch's own conftest.py (CI plumbing) is not loaded; test ids are relative to the folder (file::class::test).
    cmd += ["--noconftest", "-p", "no:cacheprovider", "-q", "--rootdir", str(folder), "-c", str(ini)]
    cmd += ["-k", keyword, "-W", "ignore::pytest.PytestUnknownMarkWarning"]
    proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=1800)
    assert results.is_file(), f"{mode} run wrote no results:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return json.loads(results.read_text())


def with_outcome(run: Dict[str, Any], outcome: str) -> Set[str]:
    """The ids of the tests of ``run`` with ``outcome`` ("passed", "failed", "skipped")."""
    return {test for test, o in run["outcomes"].items() if o == outcome}


def ran(run: Dict[str, Any], what: str) -> Set[str]:
    """The ids of the tests of ``run`` in which the plugin counted ``what`` at least once."""
    return {test for test, counts in run["counts"].items() if counts.get(what, 0) > 0}


def summary(name: str, baseline: Dict[str, Any], memsave: Dict[str, Any]) -> str:
    """One line per run: passed / failed / skipped."""
    lines = [f"{name}:"]
    for label, run in (("baseline", baseline), ("memsave", memsave)):
        n = {o: len(with_outcome(run, o)) for o in ("passed", "failed", "skipped")}
        lines.append(f"  {label:8} {n['passed']} passed, {n['failed']} failed, {n['skipped']} skipped")
    return "\n".join(lines)


def lost(baseline: Dict[str, Any], memsave: Dict[str, Any], known: Mapping[str, str]) -> List[str]:
    """The tests that pass on the baseline and not with memsave, other than the ``known`` differences (test id:
    why), each with the memsave run's error."""
    gone = sorted(with_outcome(baseline, "passed") - with_outcome(memsave, "passed") - set(known))
    return [f"{t}: {memsave['outcomes'].get(t, 'not run')}: {memsave['errors'].get(t, '')}" for t in gone]


def stale(baseline: Dict[str, Any], memsave: Dict[str, Any], known: Mapping[str, str]) -> List[str]:
    """The ``known`` differences that are none: the test passes with memsave too (take it off the list)."""
    return sorted(set(known) & with_outcome(baseline, "passed") & with_outcome(memsave, "passed"))
