#!/usr/bin/env python3
"""The commit-msg hook (.pre-commit-config.yaml): a commit message is a subject of at most 72 characters, then,
if there is more, a blank line and a body that says why (CONTRIBUTING.md, "Commit messages").

    python3 tools/check_commit_msg.py .git/COMMIT_EDITMSG    # what the hook runs; exit status 1 names each problem

Lines git drops are ignored as git drops them: comment lines (``#``) and everything below the scissors line of
``git commit -v``. Only the subject's length and the blank line are checked: the body's lines may be as long as a
table or a URL needs.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List

MAX_SUBJECT = 72
SCISSORS = "# ------------------------ >8 ------------------------"


def message_lines(text: str) -> List[str]:
    """The lines of a commit message as git keeps them: no comment lines, nothing below the scissors line, no
    trailing blank lines."""
    lines: List[str] = []
    for line in text.splitlines():
        if line.startswith(SCISSORS):
            break
        if not line.startswith("#"):
            lines.append(line.rstrip())
    while lines and not lines[-1]:
        lines.pop()
    while lines and not lines[0]:
        lines.pop(0)
    return lines


def problems(text: str) -> List[str]:
    """What is wrong with a commit message (an empty list when nothing is).

    Examples:
        >>> problems("fix: one line\\nbody without a blank line")
        ['line 2 must be blank: a blank line separates the subject from the body']
    """
    lines = message_lines(text)
    if not lines:
        return ["the message is empty"]
    out = []
    subject = lines[0]
    if len(subject) > MAX_SUBJECT:
        out.append(
            f"the subject has {len(subject)} characters, more than {MAX_SUBJECT}: say what changed in {MAX_SUBJECT} "
            "and move the rest to the body"
        )
    if len(lines) > 1 and lines[1]:
        out.append("line 2 must be blank: a blank line separates the subject from the body")
    return out


def main(argv: List[str]) -> int:
    if len(argv) != 1:
        print("usage: python3 tools/check_commit_msg.py COMMIT_MESSAGE_FILE", file=sys.stderr)
        return 2
    found = problems(Path(argv[0]).read_text(encoding="utf-8", errors="replace"))
    for problem in found:
        print(f"commit message: {problem}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
