"""How the command line fails: one line on stderr, ``memsave: error: ...``, and an exit code.

* exit code 2, :class:`UsageError`: the command line is wrong (an unknown option, model, strategy or device, a bad
  ``--input``, a module that cannot be found, a callable that is not there);
* exit code 1, :class:`CommandError` or any other exception: the command was understood but failed while running
  (the model raised on the inputs, a strategy could not be applied, a file could not be written).

``--traceback`` anywhere on the command line, or the environment variable ``MEMSAVE_TRACEBACK=1``, lets the
exception propagate with its full traceback instead.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Callable, List, NoReturn, Sequence

import torch

__all__ = [
    "ArgumentParser",
    "CommandError",
    "UsageError",
    "add_traceback_flag",
    "one_line",
    "parse_device",
    "run_command",
]

#: Exit codes: a wrong command line, a command that failed while running.
EXIT_USAGE, EXIT_FAILURE = 2, 1

TRACEBACK_FLAG = "--traceback"
TRACEBACK_ENV = "MEMSAVE_TRACEBACK"


class UsageError(Exception):
    """The command line is wrong; printed as ``memsave: error: <message>``, exit code 2."""


class CommandError(Exception):
    """The command was understood but failed, with a message written for the user (no exception type is shown);
    exit code 1."""


class ArgumentParser(argparse.ArgumentParser):
    """An ``argparse.ArgumentParser`` whose errors are one :class:`UsageError` line, not a usage block.

    Example:
        >>> p = ArgumentParser(prog="python -m memsave bench")
        >>> p.parse_args(["--nope"])  # raises UsageError("unrecognized arguments: --nope (see ... --help)")
    """

    def error(self, message: str) -> NoReturn:  # argparse's hook for every parse error
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def add_traceback_flag(parser: argparse.ArgumentParser) -> None:
    """List ``--traceback`` in ``parser``'s help (:func:`run_command` acts on it before any parser runs).

    Args:
        parser: a subcommand's parser.

    Example:
        >>> add_traceback_flag(ArgumentParser(prog="python -m memsave demo"))
    """
    parser.add_argument(
        TRACEBACK_FLAG,
        action="store_true",
        help=f"on failure show the full traceback, not one line (or set {TRACEBACK_ENV}=1)",
    )


def parse_device(text: str) -> torch.device:
    """``--device``: a CPU or CUDA device.

    Args:
        text: ``"cpu"``, ``"cuda"``, ``"cuda:1"``.

    Returns:
        the ``torch.device``.

    Raises:
        UsageError: not a device torch knows, or neither CPU nor CUDA.

    Example:
        >>> parse_device("cuda:0")
        device(type='cuda', index=0)
    """
    try:
        dev = torch.device(text)
    except (RuntimeError, ValueError, TypeError):
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda"):
        raise UsageError(f"--device must be cpu or cuda (or cuda:N), got {text!r}")
    return dev


def one_line(exc: BaseException) -> str:
    """``exc`` as one line: its first non-empty message line, prefixed by its type unless it is one of ours.

    Args:
        exc: the exception.

    Returns:
        e.g. ``"RuntimeError: Given groups=1, weight of size [64, 3, 7, 7], expected input[8, 4, 64, 64] ..."``.

    Example:
        >>> one_line(ValueError("bad\\n  details"))
        'ValueError: bad'
    """
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = lines[0] if lines else "(no message)"
    return text if isinstance(exc, (UsageError, CommandError)) else f"{type(exc).__name__}: {text}"


def run_command(command: Callable[[List[str]], int], argv: Sequence[str]) -> int:
    """Run one subcommand; turn any failure into one line on stderr and :class:`SystemExit`.

    Args:
        command: argv -> exit status (0, or a result's own status such as the demo's 1 for gradients that differ).
        argv: the subcommand's arguments; ``--traceback`` among them is removed and turns the one-line errors off.

    Returns:
        what ``command`` returned.

    Raises:
        SystemExit: code 2 after a :class:`UsageError`, 1 after any other exception, 130 on Ctrl-C; argparse's own
            exits (``--help``) pass through. With ``--traceback`` or ``MEMSAVE_TRACEBACK=1`` the exception itself
            propagates instead.

    Example:
        >>> run_command(lambda argv: 0, ["--traceback"])
        0
    """
    argv = list(argv)
    show_traceback = TRACEBACK_FLAG in argv or os.environ.get(TRACEBACK_ENV, "") not in ("", "0")
    argv = [a for a in argv if a != TRACEBACK_FLAG]
    try:
        return int(command(argv) or 0)
    except SystemExit:
        raise
    except KeyboardInterrupt:
        if show_traceback:
            raise
        print("memsave: interrupted", file=sys.stderr)
        raise SystemExit(130) from None
    except UsageError as e:
        if show_traceback:
            raise
        print(f"memsave: error: {one_line(e)}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE) from None
    except Exception as e:
        if show_traceback:
            raise
        print(f"memsave: error: {one_line(e)} (rerun with {TRACEBACK_FLAG} for the full traceback)", file=sys.stderr)
        raise SystemExit(EXIT_FAILURE) from None
