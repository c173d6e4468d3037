"""How the command line fails: one line on stderr, ``memsave: error: ...``, and an exit code.

* exit code 2, :class:`UsageError`: the command line is wrong (an unknown option, model, strategy or device, a bad
  ``--input``, a module that cannot be found, a callable that is not there);
* exit code 1, :class:`CommandError` or any other exception: the command was understood but failed while running
  (the model raised on the inputs, a strategy could not be applied, a file could not be written).

``--traceback`` anywhere on the command line, or the environment variable ``MEMSAVE_TRACEBACK=1``, lets the
exception propagate with its full traceback instead.

Warnings raised while a command runs are one line on stderr too, ``memsave: warning: ...``, without the file and
source line Python shows, and a hint written for the Python API (``steps=...``) names the command's flag instead
(``--steps N``); ``--traceback`` shows them as Python does. An option's value may start with a minus sign
(``--input -32,256`` reaches memsave's own check, "every dimension must be >= 1", not argparse's "expected one
argument").
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
import warnings
from typing import Callable, Dict, Iterator, List, NoReturn, Optional, Sequence, TextIO, Tuple, Type, Union

import torch

from ..common import compat
from ..errors import MemsaveWarning

__all__ = [
    "ArgumentParser",
    "CommandError",
    "UsageError",
    "add_traceback_flag",
    "cli_text",
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


#: A value that starts with a minus sign and a digit: a negative number, or a list of them (``-32,256``).
_NEGATIVE_VALUE = re.compile(r"^-\.?\d")

#: The flags of the command being run (``--steps`` -> its action), for :func:`cli_text`; set by the parser that
#: parsed the command line last (a subcommand's parser parses after the top-level dispatch).
_FLAGS: Dict[str, argparse.Action] = {}


class ArgumentParser(argparse.ArgumentParser):
    """An ``argparse.ArgumentParser`` whose errors are one :class:`UsageError` line, not a usage block, and whose
    options take values that start with a minus sign (``--input -32,256``: argparse alone reads ``-32,256`` as an
    option and fails with "expected one argument"; here the value reaches the option's own check).

    Examples:
        >>> p = ArgumentParser(prog="python -m memsave bench")
        >>> p.parse_args(["--nope"])  # raises UsageError("unrecognized arguments: --nope (see ... --help)")
    """

    def error(self, message: str) -> NoReturn:  # argparse's hook for every parse error
        raise UsageError(f"{message} (see `{self.prog} --help`)")

    def parse_known_args(  # type: ignore[override]
        self, args: Optional[Sequence[str]] = None, namespace: Optional[argparse.Namespace] = None
    ) -> Tuple[argparse.Namespace, List[str]]:
        _FLAGS.clear()
        _FLAGS.update(
            {flag: action for action in self._actions for flag in action.option_strings if flag.startswith("--")}
        )
        args = sys.argv[1:] if args is None else list(args)
        return super().parse_known_args(self._join_negative_values(args), namespace)

    def _takes_one_value(self, word: str) -> bool:
        if not word.startswith("-") or "=" in word:
            return False
        action = self._option_string_actions.get(word)
        if action is None and self.allow_abbrev and word.startswith("--"):  # --inp for --input, as argparse allows
            matches = {a for flag, a in self._option_string_actions.items() if flag.startswith(word)}
            action = matches.pop() if len(matches) == 1 else None
        return action is not None and action.nargs is None

    def _join_negative_values(self, args: List[str]) -> List[str]:
        """``--input -32,256`` -> ``--input=-32,256`` (up to a ``--``), for every option taking one value."""
        out: List[str] = []
        i = 0
        while i < len(args):
            word = args[i]
            if word == "--":
                return out + args[i:]
            if i + 1 < len(args) and _NEGATIVE_VALUE.match(args[i + 1]) and self._takes_one_value(word):
                out.append(f"{word}={args[i + 1]}")
                i += 2
                continue
            out.append(word)
            i += 1
        return out


def add_traceback_flag(parser: argparse.ArgumentParser) -> None:
    """List ``--traceback`` in ``parser``'s help (:func:`run_command` acts on it before any parser runs).

    Args:
        parser: a subcommand's parser.

    Examples:
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

    Examples:
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


def _flag_spelling(name: str) -> Optional[str]:
    # "steps" -> "--steps N" when the command has --steps; None when it has no such flag.
    action = _FLAGS.get("--" + name.replace("_", "-"))
    if action is None:
        return None
    if action.nargs == 0:  # a switch (store_true)
        return action.option_strings[-1]
    value = action.metavar if isinstance(action.metavar, str) else ("N" if action.type is int else action.dest.upper())
    return f"{action.option_strings[-1]} {value}"


def cli_text(text: str) -> str:
    """A message of memsave's Python API as the command line shows it: one line, and each hint ``name=...`` that
    names a flag of the command being run spelled as that flag.

    Args:
        text: the message (a warning's, an exception's).

    Returns:
        the message on one line; ``(steps=...)`` becomes ``(--steps N)`` in a command that has ``--steps``.

    Examples:
        >>> cli_text("close other programs, or time more rounds\\n(steps=...)")   # in bench or demo
        'close other programs, or time more rounds (--steps N)'
    """
    text = " ".join(line.strip() for line in text.splitlines() if line.strip())
    return re.sub(r"\b([A-Za-z_][A-Za-z0-9_]*)=\.\.\.", lambda m: _flag_spelling(m.group(1)) or m.group(0), text)


def _show_warning(
    message: Union[Warning, str],
    category: Type[Warning],
    filename: str,
    lineno: int,
    file: Optional[TextIO] = None,
    line: Optional[str] = None,
) -> None:
    # warnings.showwarning while a command runs: "memsave: warning: ..." on one line, no file path or source line;
    # a warning that is not a MemsaveWarning (torch's, a RuntimeWarning) keeps its category's name.
    text = cli_text(str(message))
    if not issubclass(category, MemsaveWarning):
        text = f"{category.__name__}: {text}"
    with contextlib.suppress(OSError):  # stderr closed, as warnings.showwarning tolerates
        print(f"memsave: warning: {text}", file=file if file is not None else sys.stderr)


@contextlib.contextmanager
def _cli_warnings(python_style: bool) -> Iterator[None]:
    """While a command runs: warnings as one line each (the filters, e.g. ``PYTHONWARNINGS=ignore``, still apply);
    with ``python_style`` (``--traceback``) Python's own display and torch's logs."""
    if python_style:
        yield
        return
    with warnings.catch_warnings(), compat.quiet_torch_import_logs():
        warnings.showwarning = _show_warning
        yield


def one_line(exc: BaseException) -> str:
    """``exc`` as one line: its first non-empty message line, prefixed by its type unless it is one of ours.

    Args:
        exc: the exception.

    Returns:
        e.g. ``"RuntimeError: Given groups=1, weight of size [64, 3, 7, 7], expected input[8, 4, 64, 64] ..."``.

    Examples:
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

    Warnings the command raises are printed as one line each, ``memsave: warning: ...`` (see :func:`cli_text`);
    with ``--traceback`` as Python prints them.

    Examples:
        >>> run_command(lambda argv: 0, ["--traceback"])
        0
    """
    argv = list(argv)
    show_traceback = TRACEBACK_FLAG in argv or os.environ.get(TRACEBACK_ENV, "") not in ("", "0")
    argv = [a for a in argv if a != TRACEBACK_FLAG]
    _FLAGS.clear()
    try:
        with _cli_warnings(python_style=show_traceback):
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
        message = cli_text(one_line(e))
        print(f"memsave: error: {message} (rerun with {TRACEBACK_FLAG} for the full traceback)", file=sys.stderr)
        raise SystemExit(EXIT_FAILURE) from None
