"""transformers' own gradient-checkpointing tests, run from the sdist of the installed transformers, once as they are
and once with memsave enabled through :func:`memsave.integrations.transformers.enable` on every model they build:
every test that passes on the baseline passes with memsave, and with memsave ``torch.utils.checkpoint`` is never
called (it raises) while memsave's regions run.

The tests are not copied here: pip fetches the sdist at test time (skipped without network), and it is cached under
``~/.cache/memsave`` (``$XDG_CACHE_HOME/memsave``, or ``$MEMSAVE_CACHE_DIR``). The sdist ships
``tests/test_modeling_common.py`` but not the per-model test files, so ``hf_suite/families.py`` gives each family a
small model tester (a tiny config with random weights); ``hf_suite/hf_memsave_plugin.py`` does the rest.
"""

from __future__ import annotations

import collections
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any, Dict, Set, Tuple

import pytest

from helpers.torch_suite import PLUGIN_DIR

transformers = pytest.importorskip("transformers")
pytest.importorskip("parameterized")  # test_modeling_common.py imports it (tools/setup.sh --test installs it)

SUITE = Path(__file__).resolve().parent / "hf_suite"

#: transformers' gradient-checkpointing tests in tests/test_modeling_common.py (ModelTesterMixin).
TESTS = (
    "test_gradient_checkpointing_backward_compatibility",
    "test_gradient_checkpointing_enable_disable",
    "test_peft_gradient_checkpointing_enable_disable",
    "test_enable_input_require_grads_with_gradient_checkpointing",
    "test_training_gradient_checkpointing",
    "test_training_gradient_checkpointing_use_reentrant_false",
    "test_training_gradient_checkpointing_use_reentrant_true",
)
MIN_FAMILIES = 8


def _cache_dir() -> Path:
    if os.environ.get("MEMSAVE_CACHE_DIR"):
        return Path(os.environ["MEMSAVE_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "memsave"


def _download_sdist(version: str, into: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:"]
    cmd += ["--disable-pip-version-check", "-q", f"transformers=={version}", "-d", str(into)]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    except (OSError, subprocess.TimeoutExpired) as error:
        pytest.skip(f"pip could not fetch the transformers {version} sdist: {error}")
    sdist = next(into.glob("transformers-*.tar.gz"), None)
    if out.returncode != 0 or sdist is None:
        reason = (out.stderr.strip().splitlines() or ["no sdist"])[-1]
        pytest.skip(f"pip could not fetch the transformers {version} sdist (no network or no sdist?): {reason}")
    return sdist


def _hf_tests(version: str) -> Path:
    """A folder holding the sdist's top-level test modules as the package ``hf_tests`` (fetched once, cached)."""
    root = _cache_dir() / f"transformers-{version}-tests"
    package = root / "hf_tests"
    if (package / "test_modeling_common.py").is_file():
        return root
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        sdist = _download_sdist(version, Path(tmp))
        staging = Path(tmp) / "hf_tests"
        staging.mkdir()
        pattern = re.compile(r"[^/]+/tests/([A-Za-z0-9_]+\.py)")  # the top-level test modules, nothing else
        with tarfile.open(sdist) as tar:
            for member in tar.getmembers():
                match = pattern.fullmatch(member.name)
                source = tar.extractfile(member) if match and member.isfile() else None
                if match and source is not None:
                    (staging / match.group(1)).write_bytes(source.read())
        if not (staging / "test_modeling_common.py").is_file():
            pytest.fail(f"the transformers {version} sdist has no tests/test_modeling_common.py")
        (staging / "__init__.py").write_text("")
        os.replace(staging, package)  # whole or absent: a run cut short leaves nothing half-extracted
    return root


def _run(root: Path, mode: str, work: Path) -> Dict[str, Any]:
    results = work / f"{mode}.json"
    ini = work / "pytest.ini"
    ini.write_text("[pytest]\n")
    # PLUGIN_DIR: the outcome recorder the plugin shares with the torch suite harnesses' plugin.
    path = os.pathsep.join(p for p in (str(SUITE), str(PLUGIN_DIR), str(root), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, PYTHONPATH=path, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env.update(MEMSAVE_HF_SUITE=mode, MEMSAVE_HF_SUITE_RESULTS=str(results))
    cmd = [sys.executable, "-m", "pytest", str(SUITE / "families.py"), "-p", "hf_memsave_plugin", "--noconftest"]
    cmd += ["-p", "no:cacheprovider", "-q", "-o", "python_files=families.py", "--rootdir", str(work), "-c", str(ini)]
    cmd += ["-k", " or ".join(TESTS), "-W", "ignore::pytest.PytestUnknownMarkWarning"]
    proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=1800)
    assert results.is_file(), f"{mode} run wrote no results:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return json.loads(results.read_text())


def _family_and_test(nodeid: str) -> Tuple[str, str]:
    cls, test = nodeid.split("::")[-2:]
    return cls.replace("GradientCheckpointingTest", ""), test


def _passed(run: Dict[str, Any]) -> Set[str]:
    return {nodeid for nodeid, outcome in run["outcomes"].items() if outcome == "passed"}


@pytest.mark.slow  # fetches an sdist once, then runs about 70 of transformers' tests twice (a few minutes)
def test_transformers_own_checkpointing_tests_pass_with_memsave_enabled(tmp_path):
    root = _hf_tests(transformers.__version__)
    baseline = _run(root, "baseline", tmp_path)
    with_memsave = _run(root, "memsave", tmp_path)
    ran = collections.defaultdict(set)
    for nodeid in baseline["outcomes"]:
        family, test = _family_and_test(nodeid)
        ran[family].add(test)
    assert all(tests == set(TESTS) for tests in ran.values()), f"tests missing from transformers' suite: {dict(ran)}"
    counts = collections.Counter(_family_and_test(n)[0] for n in _passed(baseline))
    ours = collections.Counter(_family_and_test(n)[0] for n in _passed(with_memsave))
    table = "\n".join(f"  {f:10} baseline {counts[f]} / memsave {ours[f]} of {len(TESTS)}" for f in sorted(ran))
    print(f"\ntransformers {transformers.__version__}'s gradient-checkpointing tests, passed:\n{table}")
    assert len(counts) >= MIN_FAMILIES, f"fewer than {MIN_FAMILIES} families pass on the baseline:\n{table}"
    lost = sorted(_passed(baseline) - _passed(with_memsave))
    failed = {n: with_memsave["outcomes"].get(n, "not run") for n in lost}
    assert not lost, f"passed on the baseline, not with memsave: {failed}\n{table}"
    assert with_memsave["torch_checkpoint_calls"] == 0 and baseline["torch_checkpoint_calls"] == 0
    assert with_memsave["enabled"] > 0 and with_memsave["memsave_regions"] > 0  # memsave's regions did the work
    assert baseline["enabled"] == baseline["memsave_regions"] == 0
