"""Regenerate tests/slow_tests.txt from a timed run, so the fast loop (``pytest -m "not slow"``) stays fast.

Runs pytest over the fast tier (or the paths given) with the list switched off (``MEMSAVE_SLOW_LIST=/dev/null``,
so the listed tests are timed again) and a small plugin that records each test's duration (setup, call and
teardown together); every test that took ``--threshold`` seconds or more is written to the list, which
tests/conftest.py reads to mark them slow. The list's header says when and how it was made.
tests/project/test_slow_list.py fails when a listed id no longer names a test, so a renamed test cannot silently
drop out of the slow tier.

    python3 tools/slow_tests.py                      # time the whole suite's fast tier, rewrite tests/slow_tests.txt
    python3 tools/slow_tests.py --threshold 2 --dry-run tests/measurement   # print what a run of one folder lists

A timed run reflects the machine's load: run it on the 2-core CI machine, and read the diff before committing.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List

ROOT = Path(__file__).resolve().parents[1]
LIST = ROOT / "tests" / "slow_tests.txt"
HEADER = """\
# Tests the fast loop (pytest -m "not slow") leaves to .ci/run: each took {threshold} s or more in a timed run of the
# fast tier ({when}, {cores} cores). Made by `python3 tools/slow_tests.py`; one pytest node id per line;
# tests/conftest.py marks them slow, tests/project/test_slow_list.py checks that each still names a test. Tests
# that are slow by nature (compile, wheel in a venv, multi-process, benchmark runs) carry @pytest.mark.slow in their
# own file instead.
"""

PLUGIN = """
import json, os
_times = {}

def pytest_runtest_logreport(report):
    _times[report.nodeid] = _times.get(report.nodeid, 0.0) + report.duration

def pytest_sessionfinish(session):
    with open(os.environ["MEMSAVE_SLOW_TIMES"], "w") as f:
        json.dump(_times, f)
"""


def timed_run(paths: List[str]) -> Dict[str, float]:
    """Run the fast tier of ``paths`` (in-file slow markers deselected, the list off); return seconds per node id."""
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "memsave_slow_timer.py").write_text(PLUGIN)
        out = Path(tmp) / "times.json"
        env = dict(os.environ, MEMSAVE_SLOW_TIMES=str(out), MEMSAVE_SLOW_LIST=os.devnull)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (tmp, os.environ.get("PYTHONPATH", "")) if p)
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "memsave_slow_timer", "-p", "no:cacheprovider"]
        cmd += ["-m", "not slow and not cuda", *paths]
        subprocess.run(cmd, cwd=ROOT, env=env, check=False)
        return json.loads(out.read_text())


def slow_ids(times: Dict[str, float], threshold: float) -> List[str]:
    """The ids that took ``threshold`` seconds or more, sorted.

    Examples:
        >>> slow_ids({"a.py::t1": 3.0, "a.py::t2": 0.1}, 1.5)
        ['a.py::t1']
    """
    return sorted(nodeid for nodeid, t in times.items() if t >= threshold)


def main(argv: List[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="*", default=["tests"], help="what to time (default: tests)")
    p.add_argument("--threshold", type=float, default=1.5, help="seconds from which a test is slow (default 1.5)")
    p.add_argument("--dry-run", action="store_true", help="print the list instead of writing tests/slow_tests.txt")
    args = p.parse_args(argv)
    ids = slow_ids(timed_run(args.paths), args.threshold)
    header = HEADER.format(threshold=args.threshold, when=datetime.date.today().isoformat(), cores=os.cpu_count())
    text = header + "".join(f"{nodeid}\n" for nodeid in ids)
    if args.dry_run:
        print(text, end="")
    else:
        LIST.write_text(text)
        print(f"slow_tests: {len(ids)} ids written to {LIST.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
