"""Command line: python -m memsave {info,demo,bench,estimate} (also the memsave console script).

Every failure is one line on stderr, "memsave: error: ...", with exit code 2 for a wrong command line and 1 for a
run that failed; --traceback (or MEMSAVE_TRACEBACK=1) shows the full traceback instead.
"""

from __future__ import annotations

import sys
from typing import Dict, List, Optional

from .usage import ArgumentParser, add_traceback_flag, run_command

__all__ = ["main"]


def _info(argv: List[str]) -> int:
    from . import info

    return info.main(argv)


def _demo(argv: List[str]) -> int:
    from . import demo

    return demo.main(argv)


def _bench(argv: List[str]) -> int:
    from . import bench

    return bench.main(argv)


def _estimate(argv: List[str]) -> int:
    from . import estimate

    return estimate.main(argv)


_COMMANDS: Dict[str, tuple] = {
    "info": (_info, "build facts and the dispatch keys of every memsave operator"),
    "demo": (_demo, "eager vs checkpointing on a built-in model: the memory comparison table"),
    "bench": (
        _bench,
        "measure a model's training step across strategies: a built-in one, or yours as "
        "--model MODULE:CALLABLE --input SHAPE (see bench --help)",
    ),
    "estimate": (
        _estimate,
        "predict a model's training-step memory on fake tensors, and the largest batch that fits "
        "(same --model/--input forms; see estimate --help)",
    ),
}


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of ``python -m memsave`` and the ``memsave`` console script.

    Args:
        argv: the arguments after ``python -m memsave`` (a subcommand first); None reads ``sys.argv``.

    Returns:
        the subcommand's exit status (0 on success; the demo returns 1 when a lossless strategy's gradients differ).

    Raises:
        SystemExit: on any failure, after one line ``memsave: error: ...`` on stderr: code 2 for a wrong command line,
            1 for a run that failed (see :mod:`memsave.cli.usage`); code 0 after ``--help``.

    Examples:
        >>> main(["estimate", "--model", "torchvision.models:resnet18", "--input", "8,3,64,64", "--device", "cpu"])
        0
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    # The subcommand parses its own arguments (argparse.REMAINDER would drop leading options), so dispatch on the
    # first argument that is not --traceback.
    words = [a for a in argv if a != "--traceback"]
    if words and words[0] in _COMMANDS:
        rest = list(argv)
        rest.remove(words[0])
        return run_command(_COMMANDS[words[0]][0], rest)

    def top_level(args: List[str]) -> int:
        parser = ArgumentParser(
            prog="python -m memsave",
            description=__doc__.split("\n\n")[0],
            epilog=__doc__.split("\n\n")[1].replace("\n", " "),
        )
        sub = parser.add_subparsers(dest="command", metavar="{" + ",".join(_COMMANDS) + "}")
        for name, (_, help_text) in _COMMANDS.items():
            sub.add_parser(name, help=help_text, add_help=False)
        add_traceback_flag(parser)
        parser.parse_args(args)  # --help exits 0; an unknown subcommand is a UsageError
        parser.error("a subcommand is required")
        return 2  # not reached: error() raises

    return run_command(top_level, argv)
