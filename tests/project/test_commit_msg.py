"""tools/check_commit_msg.py, the commit-msg hook: a subject of at most 72 characters, a blank line before the body,
and the hook wired into .pre-commit-config.yaml."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "check_commit_msg.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_commit_msg", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


check = _load()
SUBJECT_72 = "operators: " + "x" * 61


@pytest.mark.parametrize(
    "message",
    [
        "docs: one line",
        "docs: one line\n",
        SUBJECT_72 + "\n\nThe why, in a body whose lines may be longer than the subject's limit: " + "y" * 80 + "\n",
        "fix: subject\n\nbody\n\nsecond paragraph\n",
        "\nfix: subject after a blank line git drops\n\nbody\n",
        "fix: subject\n# Please enter the commit message for your changes.\n\nbody\n",
        "fix: subject\n\nbody\n# ------------------------ >8 ------------------------\ndiff --git a/x b/x\n",
    ],
    ids=["one-line", "one-line-newline", "72-and-long-body", "paragraphs", "leading-blank", "comments", "scissors"],
)
def test_good_messages_pass(message: str) -> None:
    assert check.problems(message) == []


def test_a_subject_over_72_characters_fails() -> None:
    assert len(SUBJECT_72 + "z") == 73
    (problem,) = check.problems(SUBJECT_72 + "z\n\nbody\n")
    assert "73 characters, more than 72" in problem


def test_a_body_without_the_blank_line_fails() -> None:
    (problem,) = check.problems("fix: subject\nthe body starts at once\n")
    assert problem.startswith("line 2 must be blank")


def test_both_problems_and_an_empty_message_are_reported() -> None:
    assert len(check.problems(SUBJECT_72 + "zz\nbody\n")) == 2
    assert check.problems("# only a comment\n\n") == ["the message is empty"]


def test_the_script_exits_1_naming_the_problem_and_0_on_a_good_message(tmp_path: Path) -> None:
    bad, good = tmp_path / "bad", tmp_path / "good"
    bad.write_text("x" * 80 + "\n")
    good.write_text("docs: fine\n\nBecause.\n")
    run = [sys.executable, str(SCRIPT)]
    failed = subprocess.run([*run, str(bad)], capture_output=True, text=True)
    assert failed.returncode == 1 and "80 characters, more than 72" in failed.stderr
    assert subprocess.run([*run, str(good)], capture_output=True, text=True).returncode == 0
    assert subprocess.run(run, capture_output=True, text=True).returncode == 2


def test_the_hook_runs_at_the_commit_msg_stage() -> None:
    config = (ROOT / ".pre-commit-config.yaml").read_text()
    assert re.search(r"^default_install_hook_types: \[.*\bcommit-msg\b.*\]$", config, re.M)
    hook = config[config.index("- id: commit-message") :]
    assert "entry: python3 tools/check_commit_msg.py" in hook and "stages: [commit-msg]" in hook
