"""Write one torch version's row into docs/compatibility.md's table (for tools/compat.sh).

The table sits between ``<!-- compat-table -->`` and ``<!-- /compat-table -->``; a row is keyed by torch version and
CUDA setting, so running a version again replaces its row and the others stay.

    python3 tools/compat_table.py docs/compatibility.md --torch 2.15.0+cu132 --python 3.11.7 --cuda AUTO \
        --build-rc 0 --test-rc 0 --summary "1700 passed, 70 skipped in 290.1s" --minutes 21
"""

from __future__ import annotations

import argparse
import datetime
import re
from pathlib import Path

BEGIN, END = "<!-- compat-table -->", "<!-- /compat-table -->"
HEADER = [
    '| torch | Python | CUDA kernels | build | fast tier (`pytest -m "not slow"`) | minutes | date |',
    "|---|---|---|---|---|---|---|",
]


def release_key(row: str) -> tuple:
    """Sort rows by torch release (numbers), then CUDA setting."""
    cells = [c.strip() for c in row.strip("|").split("|")]
    numbers = tuple(int(n) for n in re.findall(r"\d+", cells[0].split("+")[0]))
    return numbers, cells[2]


def make_row(args: argparse.Namespace) -> str:
    """The markdown row of one run."""
    build = "ok" if args.build_rc == 0 else f"failed (rc {args.build_rc})"
    tests = args.summary if args.build_rc == 0 else "not run"
    if args.build_rc == 0 and args.test_rc != 0 and "failed" not in tests:
        tests += f" (rc {args.test_rc})"
    date = datetime.date.today().isoformat()
    return f"| {args.torch} | {args.python} | {args.cuda} | {build} | {tests} | {args.minutes} | {date} |"


def merge(text: str, row: str) -> str:
    """``text`` with ``row`` in its table, replacing the row of the same torch version and CUDA setting."""
    if BEGIN not in text or END not in text:
        raise SystemExit(f"compat_table: the file has no {BEGIN} ... {END} block")
    head, rest = text.split(BEGIN, 1)
    body, tail = rest.split(END, 1)
    rows = [r for r in body.strip().splitlines() if r.startswith("|") and r not in HEADER]
    key = release_key(row)
    rows = [r for r in rows if release_key(r) != key] + [row]
    rows.sort(key=release_key)
    return head + BEGIN + "\n" + "\n".join(HEADER + rows) + "\n" + END + tail


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("path", type=Path)
    for name in ("--torch", "--python", "--cuda", "--summary"):
        p.add_argument(name, required=True)
    for name in ("--build-rc", "--test-rc", "--minutes"):
        p.add_argument(name, type=int, required=True)
    args = p.parse_args()
    args.path.write_text(merge(args.path.read_text(), make_row(args)))
    print(f"compat_table: {make_row(args)}")


if __name__ == "__main__":
    main()
