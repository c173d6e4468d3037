"""What the plugins of the upstream-suite harnesses share (``torch_suite_plugin.py`` here and
``tests/integrations/hf_suite/hf_memsave_plugin.py``): each test's outcome (a failed subtest fails its test) and the
first line of each failure, written as JSON to the file the harness names. Imported by those plugins in the harness's
subprocess (the harness puts this folder on its ``PYTHONPATH``), never by this repository's own pytest."""

from __future__ import annotations

import json
import os
from typing import Any, Dict

import pytest


class Outcomes:
    """The outcomes of one pytest run, by test id, fed from the plugin's ``pytest_runtest_logreport``.

    Args:
        none: it starts empty.

    Returns:
        The recorder; ``outcomes`` maps test ids to ``"passed"``, ``"failed"`` or ``"skipped"``, ``errors`` the
        failed ones to the first line of their error.

    Raises:
        OSError: from :meth:`write`, when the results file cannot be written.

    Examples:
        >>> results = Outcomes()
        >>> def pytest_runtest_logreport(report): results.record(report)
        >>> def pytest_sessionfinish(session, exitstatus): results.write("MY_RESULTS", counts=...)
    """

    def __init__(self) -> None:
        self.outcomes: Dict[str, str] = {}
        self.errors: Dict[str, str] = {}

    def record(self, report: pytest.TestReport) -> None:
        """Take in one phase's report: any failure fails the test (a subtest's too); a skip in setup or the call
        skips it; a call that passed passes it unless something already decided otherwise."""
        if report.failed:
            self.outcomes[report.nodeid] = "failed"
            self.errors.setdefault(report.nodeid, _first_line(report))
        elif report.skipped and report.when in ("setup", "call"):
            self.outcomes.setdefault(report.nodeid, "skipped")
        elif report.when == "call" and report.passed:
            self.outcomes.setdefault(report.nodeid, "passed")

    def write(self, variable: str, **extra: Any) -> None:
        """Write ``{"outcomes", "errors", **extra}`` as JSON to the file the environment ``variable`` names (nothing
        when it is unset)."""
        path = os.environ.get(variable)
        if path:
            with open(path, "w") as f:
                json.dump({"outcomes": self.outcomes, "errors": self.errors, **extra}, f, indent=1, sort_keys=True)


def _first_line(report: pytest.TestReport) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(report.longrepr)
    return (text.strip().splitlines() or [""])[0][:300]
