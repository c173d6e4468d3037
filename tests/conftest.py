"""What every test folder shares: import paths, the ``device`` fixture and the ``cuda`` marker.

- ``tests/`` is put on ``sys.path``, so a test in any folder imports the shared helpers as ``from helpers import ...``,
  ``from helpers.models import ...``; the repository root too, for the tests of ``benchmarks/``.
- ``device``: a fixture over ``"cpu"`` and ``"cuda"``; a test that takes it runs once per device. The ``"cuda"``
  variant carries the ``cuda`` marker.
- ``@pytest.mark.cuda`` (declared in pyproject.toml): the test needs a CUDA GPU and is skipped without one.
- ``slow``: besides the tests marked in their files, the ones listed in ``tests/slow_tests.txt`` (measured durations)
  are marked here, so that ``pytest -m "not slow"`` stays a fast loop.
- ``HF_HUB_OFFLINE=1``: the tests build transformers, timm and peft models from configs with random weights; an
  accidental download (``from_pretrained``, ``pretrained=True``) fails loudly instead of reaching the network.
- ``MEMSAVE_PLAN_CACHE=0``: ``memsave.plan`` profiles in every test rather than returning a plan an earlier test or
  run cached (tests/recompute/test_plan_cache.py turns the cache on in a temporary directory).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

os.environ["HF_HUB_OFFLINE"] = "1"  # before any test imports huggingface_hub, which reads it once
# Every memsave.plan in a test profiles (subprocesses too), and none writes to ~/.cache: the plan cache's own tests
# turn it on with a directory under tmp_path.
os.environ["MEMSAVE_PLAN_CACHE"] = "0"

TESTS = Path(__file__).resolve().parent
for _path in (str(TESTS.parent), str(TESTS)):  # tests/ ends up first
    if _path not in sys.path:
        sys.path.insert(0, _path)


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def device(request: pytest.FixtureRequest) -> str:
    """Each device a test runs on: ``"cpu"``, and ``"cuda"`` (skipped without a GPU)."""
    return request.param


SLOW_TESTS = {
    line.strip()
    # MEMSAVE_SLOW_LIST: another list (tools/slow_tests.py sets /dev/null to time every test of the fast tier).
    for line in Path(os.environ.get("MEMSAVE_SLOW_LIST", TESTS / "slow_tests.txt")).read_text().splitlines()
    if line.strip() and not line.startswith("#")
}


def pytest_collection_modifyitems(config: pytest.Config, items: list) -> None:
    for item in items:
        if item.nodeid in SLOW_TESTS:
            item.add_marker(pytest.mark.slow)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if item.get_closest_marker("cuda") is not None:
            item.add_marker(skip)
