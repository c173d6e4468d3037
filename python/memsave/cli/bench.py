"""Command line: ``python -m memsave bench`` (measure strategies) and ``python -m memsave estimate`` (predict them).

Both take a built-in benchmark model (:mod:`memsave.measurement.models`: vgg16, unet, resnet50, gpt2, each at sizes
``tiny``, ``cpu`` and ``full``) or the user's own, ``--model MODULE:CALLABLE`` with one ``--input`` per positional
argument of its forward (``8,3,224,224`` for a float tensor, ``tokens:2,128:50257`` for token ids below 50257; see
:mod:`memsave.cli.user_model` for the forms and for the loss used)::

    python -m memsave bench --model unet --size cpu --strategies eager,checkpoint:blocks,convert --json unet.json
    python -m memsave bench --model torchvision.models:resnet18 --input 8,3,224,224 --device cpu
    python -m memsave estimate --model gpt2 --size full --batch 8 --device cuda \\
        --strategies eager,checkpoint:blocks --memory 24GiB        # also: the largest batch that fits
    python -m memsave estimate --model mypkg.models:make_lm --input tokens:4,1024:50257 --memory 24GiB

``bench`` runs :func:`memsave.compare` (real steps, a progress bar over the strategies) and prints its table;
``estimate`` runs :func:`memsave.estimate` on fake tensors (nothing allocated, no GPU needed) and, with
``--memory``, :func:`memsave.max_batch_size` per strategy (``--input`` shapes with their first dimension varied).

Every failure is one line on stderr (``memsave: error: ...``; exit code 2 for a wrong command line, 1 for a failed
run); ``--traceback`` shows the full traceback instead (:mod:`memsave.cli.usage`).
"""

from __future__ import annotations

import argparse
import json
import platform
import textwrap
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn

from ..common.progress import progress_bar
from ..extension import build_info
from ..measurement import models
from ..measurement.comparison import compare
from ..measurement.estimation import OPTIMIZER_STATES, estimate, max_batch_size
from ..measurement.strategies import parse_strategy, strategy_definitions
from ..measurement.units import format_bytes, parse_bytes
from .usage import ArgumentParser, CommandError, UsageError, add_traceback_flag, one_line, parse_device
from .user_model import (
    InputSpec,
    OutputLoss,
    build_user_model,
    is_user_model,
    make_inputs,
    parse_input,
    parse_model_kwargs,
)

__all__ = ["main", "estimate_main"]

_MODEL_HELP = (
    f"the model: a built-in one ({' | '.join(models.MODELS)}; with --size, --batch) or your own as "
    "MODULE:CALLABLE (e.g. torchvision.models:resnet18, mypkg.models:make_model, ./models.py:make_model; "
    "called with no arguments or --model-kwargs, it must return an nn.Module; give its --input shapes)"
)
_INPUT_HELP = (
    "an input of a MODULE:CALLABLE model, once per positional argument of its forward: SHAPE for a "
    "float32 tensor (e.g. 8,3,224,224) or tokens:SHAPE:VOCAB for int64 token ids below VOCAB "
    "(e.g. tokens:2,128:50257); --batch replaces every first dimension"
)
_EXAMPLES = """\
examples:
  {prog} --model resnet50 --size cpu --batch 16
  {prog} --model torchvision.models:resnet18 --input 8,3,224,224
  {prog} --model mypkg.models:make_lm --model-kwargs '{{"layers": 4}}' --input tokens:2,128:50257
  {prog} --model ./models.py:TwoTower --input 8,128 --input 8,64 --strategies eager,checkpoint:all
"""
_LOSS_NOTE = (
    "The loss of a MODULE:CALLABLE model is cross-entropy of its output against all-zero class targets "
    "((B,C) vs (B,), (B,C,H,W) vs (B,H,W), (B,T,V) flattened vs (B*T,)); for an output that is not a "
    "tensor (a Hugging Face ModelOutput, a dict, a tuple) its .logits, or else its first floating-point "
    "tensor that requires grad; a 0-D or 1-D output is summed. Failures are one line on stderr (exit code "
    "2: wrong command line, 1: the run failed); --traceback shows the traceback."
)


def _parser(prog: str, description: str) -> ArgumentParser:
    epilog = _EXAMPLES.format(prog=prog) + "\n" + textwrap.fill(_LOSS_NOTE, 79, break_on_hyphens=False)
    return ArgumentParser(
        prog=prog, description=description, epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter
    )


def _common_args(p: argparse.ArgumentParser, default_device: str) -> None:
    p.add_argument("--model", metavar="NAME|MODULE:CALLABLE", help=_MODEL_HELP + " (required)")
    p.add_argument("--input", action="append", default=None, metavar="SHAPE|tokens:SHAPE:VOCAB", help=_INPUT_HELP)
    p.add_argument(
        "--model-kwargs",
        metavar="JSON",
        default=None,
        help="keyword arguments of a MODULE:CALLABLE model, a JSON object (e.g. '{\"num_classes\": 10}')",
    )
    p.add_argument(
        "--size", default=None, help="built-in models: tiny | cpu | full (default: full on CUDA, cpu otherwise)"
    )
    p.add_argument(
        "--batch",
        type=int,
        default=None,
        help="batch size (default: the built-in size's own, or the first dimension of each --input)",
    )
    p.add_argument(
        "--strategies",
        default="eager,checkpoint:blocks",
        help="comma-separated strategy names (see --list-strategies); default: %(default)s",
    )
    p.add_argument("--device", default=default_device, help="cpu | cuda (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seed of weights and data (default: %(default)s)")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    p.add_argument("--list-strategies", action="store_true", help="print the strategy names and exit")
    add_traceback_flag(p)


def _split_strategies(text: str) -> List[str]:
    # Commas separate strategies; a comma inside a checkpoint policy list ("checkpoint:h.0,h.1") belongs to it when
    # the next piece is not a known strategy name (after a strategy without an argument it is a new, unknown one).
    kinds = {d.name for d in strategy_definitions()}
    out: List[str] = []
    for piece in (p.strip() for p in text.split(",")):
        if not piece:
            continue
        head = piece.split("+")[0].split(":")[0]
        if out and head not in kinds and ":" in out[-1].split("+")[-1]:
            out[-1] += "," + piece
        else:
            out.append(piece)
    return out


def _parse_strategies(text: str) -> List[str]:
    names = _split_strategies(text)
    if not names:
        raise UsageError("--strategies is empty; e.g. --strategies eager,checkpoint:blocks (see --list-strategies)")
    for name in names:
        try:
            parse_strategy(name)
        except ValueError as e:
            raise UsageError(f"--strategies: {e}") from None
    return names


def _print_strategies() -> None:
    for spec in strategy_definitions():
        print(f"  {', '.join(spec.usage()):<32} {spec.description}")
    print("  combine with '+', e.g. convert+checkpoint:blocks")


def _environment(dev: torch.device) -> Dict[str, Any]:
    env: Dict[str, Any] = {
        "torch": torch.__version__,
        "memsave": build_info()["version"],
        "python": platform.python_version(),
        "machine": platform.machine(),
        "threads": torch.get_num_threads(),
    }
    if dev.type == "cuda" and torch.cuda.is_available():
        env["cuda"] = torch.version.cuda
        env["gpu"] = torch.cuda.get_device_name(dev)
    return env


def _write_json(path: Optional[str], data: Dict[str, Any]) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(data, f, indent=2)
            f.write("\n")
        print(f"wrote {path}")


# ------------------------------------------------------------------------------------------------------ the model
@dataclass
class _Case:
    """The model a command runs: a built-in benchmark case or the user's ``MODULE:CALLABLE`` with its inputs."""

    title: str  # "resnet50 (tiny, batch 2)", "m:f (input 8x3x64x64 float32)"
    model: nn.Module
    inputs: Tuple[Any, ...]
    loss_fn: Callable[[Any], torch.Tensor]
    batch: int
    inputs_at: Callable[[int], Tuple[torch.Tensor, ...]]  # batch -> meta inputs (estimate's max batch search)
    record: Dict[str, Any] = field(default_factory=dict)  # what the JSON says about the model


def _check_common(args: argparse.Namespace) -> None:
    if not args.model:
        raise UsageError(
            f"--model is required: {' | '.join(models.MODELS)}, or MODULE:CALLABLE with --input "
            "(e.g. --model torchvision.models:resnet18 --input 8,3,224,224)"
        )
    if args.batch is not None and args.batch < 1:
        raise UsageError(f"--batch must be >= 1, got {args.batch}")
    if is_user_model(args.model):
        if args.size is not None:
            raise UsageError("--size is for the built-in models; a MODULE:CALLABLE model takes its --input shapes")
        if not args.input:
            raise UsageError(
                f"--model {args.model}: give the shape of each input of its forward, e.g. --input "
                "8,3,224,224 (float32) or --input tokens:2,128:50257 (token ids)"
            )
        return
    if args.model not in models.SIZES:
        raise UsageError(
            f"unknown model {args.model!r}: use a built-in one ({', '.join(models.MODELS)}) or your own "
            "as MODULE:CALLABLE with --input shapes (e.g. --model torchvision.models:resnet18 --input "
            "8,3,224,224)"
        )
    if args.input or args.model_kwargs is not None:
        raise UsageError(
            f"--input and --model-kwargs are for MODULE:CALLABLE models; the built-in {args.model} makes "
            "its own inputs (choose --size and --batch)"
        )
    if args.size is not None and args.size not in models.SIZES[args.model]:
        raise UsageError(f"--size must be one of {', '.join(models.SIZES[args.model])}, got {args.size!r}")


def _user_case(args: argparse.Namespace, model_device: torch.device, input_device: torch.device) -> _Case:
    specs: List[InputSpec] = [parse_input(text) for text in args.input]
    kwargs = parse_model_kwargs(args.model_kwargs)
    model = build_user_model(args.model, kwargs, seed=args.seed)
    try:
        model = model.to(model_device)
    except Exception as e:
        raise CommandError(f"--model {args.model}: moving it to {model_device} failed: {one_line(e)}") from e
    inputs = make_inputs(specs, input_device, args.seed, args.batch)
    batch = int(inputs[0].shape[0])
    shown = ", ".join(str(InputSpec(tuple(t.shape), s.vocab)) for t, s in zip(inputs, specs))
    return _Case(
        title=f"{args.model} (input{'s' if len(specs) > 1 else ''} {shown})",
        model=model,
        inputs=inputs,
        loss_fn=OutputLoss(),
        batch=batch,
        inputs_at=lambda b: make_inputs(specs, torch.device("meta"), args.seed, b),
        record={
            "model": args.model,
            "size": None,
            "batch": batch,
            "config": {
                "inputs": [InputSpec(tuple(t.shape), s.vocab).spelling() for t, s in zip(inputs, specs)],
                "model_kwargs": kwargs,
            },
        },
    )


def _builtin_case(
    args: argparse.Namespace, size: str, device: torch.device, loss_fn: Optional[Callable] = None
) -> _Case:
    case = models.build(args.model, size, device=str(device), seed=args.seed, batch=args.batch)
    template = case.inputs[0]
    batch = case.config["batch"]
    return _Case(
        title=f"{args.model} ({size}, batch {batch})",
        model=case.model,
        inputs=case.inputs,
        loss_fn=loss_fn or case.loss_fn,
        batch=batch,
        inputs_at=lambda b: (torch.empty((b,) + tuple(template.shape[1:]), dtype=template.dtype, device="meta"),),
        record={"model": args.model, "size": size, "batch": batch, "config": case.config},
    )


def _run_failed(what: str, case: _Case, e: Exception) -> CommandError:
    return CommandError(f"{what}: {case.title} failed: {one_line(e)}")


# ------------------------------------------------------------------------------------------------------ bench
def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m memsave bench``: measure a model's training step under several strategies; print the table.

    Args:
        argv: the arguments after ``bench`` (``--help`` lists them); None reads ``sys.argv``.

    Returns:
        0.

    Raises:
        UsageError: a wrong command line (unknown model, module or strategy, bad ``--input``, ...).
        CommandError: the model could not be built or failed on its inputs.
        StrategyUnavailableError: a strategy needs a memsave module this build lacks.
        (``python -m memsave`` turns each into one line on stderr and an exit code.)

    Example:
        >>> main(["--model", "unet", "--size", "tiny", "--strategies", "eager,checkpoint:blocks"])
        >>> main(["--model", "torchvision.models:resnet18", "--input", "8,3,64,64", "--device", "cpu"])
    """
    p = _parser(
        "python -m memsave bench",
        "Measure a model's training step (peak memory, activations, time, "
        "gradients vs eager) under several strategies.",
    )
    _common_args(p, "cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--steps", type=int, default=5, help="timed steps per strategy (default: %(default)s)")
    p.add_argument(
        "--breakdown",
        type=int,
        default=0,
        metavar="N",
        help="also print the N modules holding the most activation memory, per strategy",
    )
    p.add_argument("--snapshot-dir", metavar="DIR", help="CUDA: write a memory snapshot per strategy (memory_viz)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = p.parse_args(list(argv) if argv is not None else None)
    if args.list_strategies:
        _print_strategies()
        return 0
    _check_common(args)
    if args.steps < 1:
        raise UsageError(f"--steps must be >= 1, got {args.steps}")
    if args.breakdown < 0:
        raise UsageError(f"--breakdown must be >= 0, got {args.breakdown}")
    strategies = _parse_strategies(args.strategies)
    dev = parse_device(args.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(
            "--device cuda but CUDA is not available here; use --device cpu, or "
            "`python -m memsave estimate` to predict CUDA memory without a GPU"
        )
    if dev.type != "cuda" and args.snapshot_dir:
        raise UsageError("--snapshot-dir needs --device cuda (memory snapshots are a CUDA allocator feature)")
    if is_user_model(args.model):
        size = None
        case = _user_case(args, dev, dev)
    else:
        size = args.size or ("full" if dev.type == "cuda" else "cpu")
        case = _builtin_case(args, size, dev)
    try:
        result = compare(
            case.model,
            *case.inputs,
            strategies=strategies,
            loss_fn=case.loss_fn,
            steps=args.steps,
            progress=not args.no_progress,
            snapshot_dir=args.snapshot_dir,
        )
    except (UsageError, CommandError):
        raise
    except Exception as e:
        raise _run_failed("bench", case, e) from e
    print(case.title)
    print(result)
    for row in result.rows if args.breakdown else []:
        print()
        print(result.breakdown(row.strategy, top=args.breakdown))
    data = result.to_dict()
    data.update(case.record, environment=_environment(dev))
    _write_json(args.json, data)
    return 0


# ------------------------------------------------------------------------------------------------------ estimate
def estimate_main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m memsave estimate``: predict a model's training-step memory on fake tensors (nothing allocated).

    Args:
        argv: the arguments after ``estimate`` (``--help`` lists them); None reads ``sys.argv``.

    Returns:
        0.

    Raises:
        UsageError: a wrong command line (unknown model, module or strategy, bad ``--input`` or ``--memory``, ...).
        CommandError: the model could not be built, or its step failed on fake tensors.
        (``python -m memsave`` turns each into one line on stderr and an exit code.)

    Example:
        >>> estimate_main(["--model", "gpt2", "--size", "full", "--batch", "8", "--memory", "24GiB"])
        >>> estimate_main(["--model", "torchvision.models:resnet18", "--input", "8,3,64,64", "--device", "cpu"])
    """
    p = _parser(
        "python -m memsave estimate",
        "Predict a model's training-step memory (fake tensors: nothing is "
        "allocated, no GPU needed); with --memory, also the largest batch "
        "that fits.",
    )
    _common_args(p, "cuda")
    p.add_argument(
        "--dtype",
        choices=("fp32", "bf16", "fp16"),
        default="fp32",
        help="parameter and input dtype (pure low-precision training); default: %(default)s",
    )
    p.add_argument(
        "--optimizer", choices=sorted(OPTIMIZER_STATES), default=None, help="count this optimizer's state in the total"
    )
    p.add_argument("--memory", default=None, help="device memory, e.g. 24GiB: also report the largest batch that fits")
    p.add_argument(
        "--headroom",
        type=float,
        default=0.05,
        help="fraction of --memory kept free for what is not modelled (default: %(default)s)",
    )
    args = p.parse_args(list(argv) if argv is not None else None)
    if args.list_strategies:
        _print_strategies()
        return 0
    _check_common(args)
    if args.memory is not None:
        try:
            parse_bytes(args.memory, what="--memory")
        except ValueError as e:
            raise UsageError(str(e)) from None
    if not 0.0 <= args.headroom < 1.0:
        raise UsageError(f"--headroom must be a fraction in [0, 1), got {args.headroom}")
    strategies = _parse_strategies(args.strategies)
    dev = parse_device(args.device)
    dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    # Built on the CPU (the estimate reads shapes only and allocates nothing more); moving the model to the meta device
    # would untie GPT's tied embedding and count it twice.
    loss = OutputLoss()
    if is_user_model(args.model):
        size = None
        case = _user_case(args, torch.device("cpu"), torch.device("meta"))
    else:
        size = args.size or ("full" if dev.type == "cuda" else "cpu")
        case = _builtin_case(args, size, torch.device("cpu"), loss_fn=loss)
    # Training BatchNorm needs more than one value per channel: ResNet's last maps are 1x1 at small sizes.
    min_batch = 2 if any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in case.model.modules()) else 1

    rows: List[Dict[str, Any]] = []
    progress = progress_bar(len(strategies) * (2 if args.memory else 1), "memsave.estimate", unit="strategy")
    try:
        for name in strategies:
            est = estimate(
                case.model,
                *case.inputs,
                device=dev,
                strategy=name,
                dtype=dtype,
                loss_fn=case.loss_fn,
                optimizer=args.optimizer,
            )
            row = est.to_dict()
            if progress is not None:
                progress.update(1)
            if args.memory:
                row["memory"] = args.memory
                row["max_batch"] = max_batch_size(
                    case.model,
                    case.inputs_at,
                    args.memory,
                    name,
                    device=dev,
                    dtype=dtype,
                    loss_fn=case.loss_fn,
                    optimizer=args.optimizer,
                    headroom=args.headroom,
                    min_batch=min_batch,
                )
                if progress is not None:
                    progress.update(1)
            rows.append(row)
    except (UsageError, CommandError):
        raise
    except Exception as e:
        raise _run_failed("estimate", case, e) from e
    finally:
        if progress is not None:
            progress.close()

    emulated = any(r["emulated"] for r in rows)
    print(
        f"{case.title} on {dev}{', ' + args.dtype if dtype else ''}"
        f"{' (emulated: no GPU visible, CPU operator choices)' if emulated else ''}"
    )
    header = ["strategy", "step peak", "activations", "gradients", "params", "total"]
    if args.optimizer:
        header.insert(5, "optimizer")
    if args.memory:
        header.append(f"max batch ({args.memory})")
    body = []
    for r in rows:
        cells = [
            r["strategy"],
            format_bytes(r["peak_bytes"]),
            format_bytes(r["activation_bytes"]),
            format_bytes(r["grad_bytes"]),
            format_bytes(r["param_bytes"]),
            format_bytes(r["total_bytes"]),
        ]
        if args.optimizer:
            cells.insert(5, format_bytes(r["optimizer_bytes"]))
        if args.memory:
            cells.append(str(r["max_batch"]))
        body.append(cells)
    widths = [max(len(x[i]) for x in [header] + body) for i in range(len(header))]
    for cells in [header, ["-" * w for w in widths]] + body:
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))))
    data: Dict[str, Any] = dict(case.record)
    data.update(device=str(dev), rows=rows, environment=_environment(dev))
    _write_json(args.json, data)
    return 0
