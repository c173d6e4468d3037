"""``python -m memsave bench``: measure a model's training step under several strategies and print the table.

The model is a built-in one (:mod:`memsave.models`: vgg16, unet, resnet50, gpt2, each at sizes ``tiny``, ``cpu``
and ``full``) or the user's own, ``--model MODULE:CALLABLE`` with one ``--input`` per positional argument of its
forward (see :mod:`memsave.cli.user_model`)::

    python -m memsave bench --model unet --size cpu --strategies eager,checkpoint:blocks,convert --json unet.json
    python -m memsave bench --model torchvision.models:resnet18 --input 8,3,224,224 --device cpu

It runs :func:`memsave.compare` (real steps; times interleaved over rounds, median and IQR). Strategy names are
checked before the model is built; a strategy that fails on the model (``checkpoint:blocks`` on a model without
repeated blocks) gets an error in its own row while the others are measured, and the command exits 0 when eager ran.
"""

from __future__ import annotations

from typing import Optional, Sequence

from ..measurement.comparison import compare
from .options import (
    add_common_args,
    add_model_args,
    build_case,
    check_model_args,
    environment,
    parse_strategies,
    parser,
    print_strategies,
    resolve_device,
    write_json,
)
from .usage import CommandError, UsageError, one_line

__all__ = ["main"]


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m memsave bench``.

    Args:
        argv: the arguments after ``bench`` (``--help`` lists them); None reads ``sys.argv``.

    Returns:
        0 when eager ran (strategies that failed on the model are error rows).

    Raises:
        UsageError: a wrong command line (unknown model, module or strategy, bad ``--input``, ...).
        CommandError: the model could not be built, or its eager step failed on its inputs.
        (``python -m memsave`` turns each into one line on stderr and an exit code.)

    Examples:
        >>> main(["--model", "unet", "--size", "tiny", "--strategies", "eager,checkpoint:blocks"])
        0
    """
    p = parser(
        "python -m memsave bench",
        "Measure a model's training step (peak memory, activations, time, gradients vs eager) under several "
        "strategies.",
    )
    add_model_args(p)
    add_common_args(p)
    p.add_argument("--steps", type=int, default=5, help="interleaved timing rounds (default: %(default)s)")
    p.add_argument(
        "--breakdown",
        type=int,
        default=0,
        metavar="N",
        help="also print the N modules holding the most activation memory, per strategy",
    )
    p.add_argument("--snapshot-dir", metavar="DIR", help="CUDA: write a memory snapshot per strategy (memory_viz)")
    args = p.parse_args(list(argv) if argv is not None else None)
    if args.list_strategies:
        print_strategies()
        return 0
    check_model_args(args)
    if args.steps < 1:
        raise UsageError(f"--steps must be >= 1, got {args.steps}")
    if args.breakdown < 0:
        raise UsageError(f"--breakdown must be >= 0, got {args.breakdown}")
    strategies = parse_strategies(args.strategies)
    dev = resolve_device(args.device)
    if dev.type != "cuda" and args.snapshot_dir:
        raise UsageError("--snapshot-dir needs --device cuda (memory snapshots are a CUDA allocator feature)")
    case = build_case(args, dev)
    try:
        result = compare(
            case.model,
            *case.inputs,
            strategies=strategies,
            loss_fn=case.loss_fn,
            steps=args.steps,
            progress=False if args.no_progress else None,
            snapshot_dir=args.snapshot_dir,
            on_error="row",
        )
    except (UsageError, CommandError):
        raise
    except Exception as e:
        raise CommandError(f"bench: {case.title} failed: {one_line(e)}") from e
    print(case.title)
    if case.note:
        print(case.note)
    print(result)
    for row in result.rows if args.breakdown else []:
        if row.error is None:
            print()
            print(result.breakdown(row.strategy, top=args.breakdown))
    data = result.to_dict()
    data.update(case.record, environment=environment(dev))
    write_json(args.json, data)
    return 0
