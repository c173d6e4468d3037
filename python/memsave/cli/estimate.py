"""``python -m memsave estimate``: predict a model's training-step memory on fake tensors (nothing allocated, no GPU
needed) and, with ``--memory``, the largest batch that fits, per strategy::

    python -m memsave estimate --model gpt2 --size full --batch 8 --device cuda \\
        --strategies eager,checkpoint:blocks --memory 24GiB
    python -m memsave estimate --model mypkg.models:make_lm --input tokens:4,1024:50257 --memory 24GiB

It runs :func:`memsave.estimate` and :func:`memsave.max_batch_size` (``--input`` shapes with their first dimension
varied). A strategy that fails on the model gets an error in its own row; the command exits 0 when eager ran.
"""

from __future__ import annotations

import argparse
from typing import Any, Dict, List, Optional, Sequence

import torch
from torch import nn

from ..common.progress import progress_bar
from ..measurement.estimation import OPTIMIZER_STATES, estimate, max_batch_size
from ..measurement.units import format_bytes
from .options import (
    Case,
    add_common_args,
    add_model_args,
    build_case,
    check_model_args,
    environment,
    parse_memory,
    parse_strategies,
    parser,
    print_strategies,
    print_table,
    resolve_device,
    write_json,
)
from .usage import CommandError, UsageError, one_line

__all__ = ["main"]

_DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def _parse(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    p = parser(
        "python -m memsave estimate",
        "Predict a model's training-step memory (fake tensors: nothing is allocated, no GPU needed; --device cuda "
        "predicts a GPU from a CPU-only machine); with --memory, also the largest batch that fits.",
    )
    add_model_args(p)
    add_common_args(p)
    p.add_argument(
        "--dtype",
        choices=tuple(_DTYPES),
        default="fp32",
        help="parameter and input dtype (pure low-precision training); default: %(default)s",
    )
    p.add_argument(
        "--optimizer", choices=sorted(OPTIMIZER_STATES), default=None, help="count this optimizer's state in the total"
    )
    p.add_argument(
        "--memory",
        default=None,
        help="device memory with a unit (e.g. 24GiB, 80GB): also report the largest batch that fits",
    )
    p.add_argument(
        "--headroom",
        type=float,
        default=0.05,
        help="fraction of --memory kept free for what is not modelled (default: %(default)s)",
    )
    return p.parse_args(list(argv) if argv is not None else None)


def _row(case: Case, name: str, args: argparse.Namespace, dev: torch.device, min_batch: int) -> Dict[str, Any]:
    """One strategy's estimate (and max batch), or ``{"strategy", "error"}`` when it fails on the model."""
    dtype = _DTYPES[args.dtype]
    common = dict(device=dev, dtype=dtype, loss_fn=case.loss_fn, optimizer=args.optimizer)
    try:
        row = estimate(case.model, *case.inputs, strategy=name, **common).to_dict()
        if args.memory:
            row["memory"] = args.memory
            row["max_batch"] = max_batch_size(
                case.model,
                case.inputs_at,
                args.memory,
                name,
                headroom=args.headroom,
                min_batch=min_batch,
                **common,
            )
    except Exception as e:
        if name == "eager":
            raise
        return {"strategy": name, "error": one_line(e)}
    return row


def _print(case: Case, rows: List[Dict[str, Any]], args: argparse.Namespace, dev: torch.device) -> None:
    emulated = any(r.get("emulated") for r in rows)
    print(
        f"{case.title} on {dev}{', ' + args.dtype if _DTYPES[args.dtype] else ''}"
        f"{' (emulated: no GPU visible, CPU operator choices)' if emulated else ''}"
    )
    if case.note:
        print(case.note)
    header = ["strategy", "step peak", "activations", "gradients", "params", "total"]
    keys = ["peak_bytes", "activation_bytes", "grad_bytes", "param_bytes", "total_bytes"]
    if args.optimizer:
        header.insert(5, "optimizer")
        keys.insert(4, "optimizer_bytes")
    if args.memory:
        header.append(f"max batch ({args.memory})")
    body = []
    for r in rows:
        if "error" in r:
            body.append([r["strategy"], "error"] + [""] * (len(header) - 2))
            continue
        cells = [r["strategy"]] + [format_bytes(r[k]) for k in keys]
        body.append(cells + ([str(r["max_batch"])] if args.memory else []))
    print_table(header, body)
    for r in rows:
        if "error" in r:
            print(f"  {r['strategy']}: {r['error']}")


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m memsave estimate``.

    Args:
        argv: the arguments after ``estimate`` (``--help`` lists them); None reads ``sys.argv``.

    Returns:
        0 when eager's estimate ran (strategies that failed on the model are error rows).

    Raises:
        UsageError: a wrong command line (unknown model, module or strategy, bad ``--input``, a ``--memory``
            without a unit, ...).
        CommandError: the model could not be built, or its eager step failed on fake tensors.
        (``python -m memsave`` turns each into one line on stderr and an exit code.)

    Examples:
        >>> main(["--model", "gpt2", "--size", "full", "--batch", "8", "--device", "cuda", "--memory", "24GiB"])
        0
    """
    args = _parse(argv)
    if args.list_strategies:
        print_strategies()
        return 0
    check_model_args(args)
    if args.memory is not None:
        parse_memory(args.memory)
    if not 0.0 <= args.headroom < 1.0:
        raise UsageError(f"--headroom must be a fraction in [0, 1), got {args.headroom}")
    strategies = parse_strategies(args.strategies)
    if "eager" not in strategies:
        strategies = ["eager", *strategies]
    dev = resolve_device(args.device, needs_gpu=False)
    case = build_case(args, dev, for_estimate=True)
    # Training BatchNorm needs more than one value per channel: ResNet's last maps are 1x1 at small sizes.
    min_batch = 2 if any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in case.model.modules()) else 1
    rows: List[Dict[str, Any]] = []
    bar = progress_bar(
        len(strategies), "memsave.estimate", unit="strategy", progress=False if args.no_progress else None
    )
    try:
        for name in strategies:
            rows.append(_row(case, name, args, dev, min_batch))
            if bar is not None:
                bar.update(1)
    except (UsageError, CommandError):
        raise
    except Exception as e:
        raise CommandError(f"estimate: {case.title} failed: {one_line(e)}") from e
    finally:
        if bar is not None:
            bar.close()
    _print(case, rows, args, dev)
    data: Dict[str, Any] = dict(case.record)
    data.update(device=str(dev), rows=rows, environment=environment(dev))
    write_json(args.json, data)
    return 0
