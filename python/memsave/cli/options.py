"""What every subcommand of ``python -m memsave`` shares: the options (spelled, defaulted and checked the same way
everywhere), the model a command runs (:class:`Case`), and printing.

* ``--device``: ``cpu`` or ``cuda`` (``cuda:N``); default ``cuda`` when a GPU is visible, else ``cpu``.
* ``--size``: ``tiny`` | ``cpu`` | ``full`` for the built-in models and the demo; default ``full`` on CUDA, else
  ``cpu``.
* ``--no-progress``: no progress bar.
* ``--strategies``: checked against the registry before anything is built or run.
* memory sizes (``--memory``): a number with a unit, ``B``, ``KB``/``MB``/``GB`` (powers of 1000) or
  ``KiB``/``MiB``/``GiB`` (powers of 1024); a bare number is refused.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import textwrap
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn

from .. import models
from ..extension import build_info
from ..measurement.measuring import default_loss
from ..measurement.strategies import parse_strategy, strategy_definitions
from ..measurement.units import parse_bytes
from .hf_model import build_hf_model, default_hf_inputs, describe, hf_config, is_hf_model
from .usage import ArgumentParser, CommandError, UsageError, add_traceback_flag, one_line, parse_device
from .user_model import InputSpec, build_user_model, is_user_model, make_inputs, parse_input, parse_model_kwargs

__all__ = [
    "SIZES",
    "UNITS",
    "Case",
    "add_common_args",
    "add_model_args",
    "build_case",
    "check_model_args",
    "default_device",
    "default_size",
    "environment",
    "parse_memory",
    "parse_strategies",
    "parser",
    "print_strategies",
    "print_table",
    "resolve_device",
    "script_arguments",
    "write_json",
]

#: The size names of the built-in models and of the demo, in every subcommand.
SIZES: Tuple[str, ...] = ("tiny", "cpu", "full")

UNITS = (
    "Units: memory sizes are bytes with a unit, B, KB/MB/GB (powers of 1000) or KiB/MiB/GiB (powers of 1024); "
    "tables print binary units (KiB, MiB, GiB). Step times are the median over interleaved timing rounds (each "
    "round's fastest of a few short windows), with the inter-quartile range (IQR) in parentheses; 'time x' is "
    "the median of the per-round ratios to eager's step."
)

_MODEL_HELP = (
    f"the model: a built-in one ({' | '.join(models.MODELS)}; with --size, --batch) or your own as "
    "MODULE:CALLABLE (e.g. torchvision.models:resnet18, mypkg.models:make_model, ./models.py:make_model; "
    "called with no arguments or --model-kwargs, it must return an nn.Module; give its --input shapes), or a "
    "transformers model built locally with random weights: hf:<model type> (e.g. hf:llama, hf:qwen2, hf:vit; "
    "transformers' default config scaled by --size) or hf:<directory with a config.json>; nothing is downloaded"
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
  {prog} --model hf:llama --size tiny --batch 4
"""
_LOSS_NOTE = (
    "The loss of a MODULE:CALLABLE model is memsave's default loss (memsave.measurement.default_loss): the "
    "output's .loss when it has one, else its .logits, else its first floating-point tensor that requires grad, "
    "summed. The built-in models use their own cross-entropy. A strategy that fails on the model gets an error "
    "in its own row. Failures of the command are one line on stderr (exit code 2: wrong command line, 1: the run "
    "failed); --traceback shows the traceback."
)


def default_device() -> str:
    """``"cuda"`` when a GPU is visible, else ``"cpu"``: every subcommand's ``--device`` default."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def default_size(device: torch.device) -> str:
    """``"full"`` on CUDA, ``"cpu"`` otherwise: every subcommand's ``--size`` default."""
    return "full" if device.type == "cuda" else "cpu"


def parser(prog: str, description: str, models_epilog: bool = True) -> ArgumentParser:
    """A subcommand's parser; its ``--help`` ends with the examples, the loss rule and the units."""
    parts = [_EXAMPLES.format(prog=prog), textwrap.fill(_LOSS_NOTE, 79)] if models_epilog else []
    epilog = "\n".join(parts + [textwrap.fill(UNITS, 79)])
    return ArgumentParser(
        prog=prog, description=description, epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter
    )


def add_common_args(p: argparse.ArgumentParser) -> None:
    """``--device``, ``--size``, ``--no-progress``, ``--seed``, ``--traceback``: the same on every subcommand."""
    p.add_argument(
        "--device", default=default_device(), help="cpu | cuda | cuda:N (default: cuda when a GPU is visible, else cpu)"
    )
    p.add_argument(
        "--size", choices=SIZES, default=None, help="model size: tiny | cpu | full (default: full on CUDA, else cpu)"
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--seed", type=int, default=0, help="seed of weights and data (default: %(default)s)")
    add_traceback_flag(p)


def add_model_args(p: argparse.ArgumentParser) -> None:
    """``--model``, ``--input``, ``--model-kwargs``, ``--batch``, ``--strategies``, ``--json``,
    ``--list-strategies`` (``bench`` and ``estimate``)."""
    p.add_argument("--model", metavar="NAME|MODULE:CALLABLE", help=_MODEL_HELP + " (required)")
    p.add_argument("--input", action="append", default=None, metavar="SHAPE|tokens:SHAPE:VOCAB", help=_INPUT_HELP)
    p.add_argument(
        "--model-kwargs",
        metavar="JSON",
        default=None,
        help="keyword arguments of a MODULE:CALLABLE model, a JSON object (e.g. '{\"num_classes\": 10}')",
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
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    p.add_argument("--list-strategies", action="store_true", help="print the strategy names and exit")


def resolve_device(text: str, needs_gpu: bool = True) -> torch.device:
    """``--device``, checked: a CUDA device without a GPU is refused when the command runs steps for real.

    Raises:
        UsageError: not cpu/cuda, or cuda without a GPU when ``needs_gpu``.
    """
    dev = parse_device(text)
    if needs_gpu and dev.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(
            "--device cuda but CUDA is not available here; use --device cpu, or "
            "`python -m memsave estimate --device cuda` to predict CUDA memory without a GPU"
        )
    return dev


def script_arguments(
    description: str,
    sizes: Sequence[str],
    steps: int,
    argv: Optional[Sequence[str]] = None,
    default: Optional[str] = None,
    extra: Optional[Callable[[argparse.ArgumentParser], None]] = None,
) -> Tuple[argparse.Namespace, torch.device, str]:
    """The command line of a script built on memsave (the examples): ``--size``, ``--device`` and ``--steps``,
    spelled and defaulted as in the subcommands.

    Args:
        description: the ``--help`` description.
        sizes: the names ``--size`` accepts.
        steps: ``--steps``'s default.
        argv: the arguments; None reads ``sys.argv``.
        default: ``--size``'s default; None: :func:`default_size` of the device (full on CUDA, else cpu).
        extra: adds the script's own options (after ``--device``, before ``--steps``).

    Returns:
        ``(args, device, size)``: the parsed arguments, the checked ``--device`` and the size.

    Raises:
        SystemExit: argparse's usage message and exit code 2 for a wrong command line, ``--device cuda`` without a
            GPU included.

    Examples:
        >>> args, device, size = script_arguments("UNet", ("tiny", "cpu", "full"), steps=3, argv=["--size", "tiny"])
        >>> size
        'tiny'
    """
    p = argparse.ArgumentParser(description=description)
    size_help = f"default: {default}" if default else "default: full on CUDA, cpu otherwise"
    p.add_argument("--size", choices=tuple(sizes), default=None, help=size_help)
    p.add_argument(
        "--device", default=default_device(), help="cpu | cuda | cuda:N (default: cuda when a GPU is visible)"
    )
    if extra is not None:
        extra(p)
    p.add_argument("--steps", type=int, default=steps, help="timed or trained steps (default: %(default)s)")
    args = p.parse_args(argv)
    try:
        device = resolve_device(args.device)
    except UsageError as e:
        p.error(str(e))
    return args, device, args.size or default or default_size(device)


def parse_memory(text: str, flag: str = "--memory") -> int:
    """A memory size given on the command line: it must carry a unit.

    Args:
        text: e.g. ``"24GiB"``, ``"80GB"``, ``"512MiB"``.
        flag: the option, for the message.

    Returns:
        the bytes.

    Raises:
        UsageError: a bare number (``64`` would be 64 bytes), or a size that does not parse.

    Examples:
        >>> parse_memory("24GiB")
        25769803776
    """
    how = f"B, KB, MB, GB (powers of 1000) or KiB, MiB, GiB (powers of 1024), e.g. {flag} 24GiB"
    if re.fullmatch(r"\s*[0-9.eE+_]+\s*", text or ""):
        raise UsageError(f"{flag} {text!r} has no unit; write it with one: {how}")
    if (text or "").strip().startswith("-"):
        raise UsageError(f"{flag} {text!r}: a memory size must be positive; write one with a unit: {how}")
    try:
        return parse_bytes(text, what=flag)
    except ValueError as e:
        # parse_bytes explains the Python API's spellings (an int of bytes); the command line takes a unit only.
        message, python_how, _ = str(e).partition("; write bytes as an int")
        raise UsageError(f"{message}; write a size with a unit: {how}" if python_how else message) from None


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


def parse_strategies(text: str) -> List[str]:
    """``--strategies``, every name checked against the registry (before anything is built or run).

    Raises:
        UsageError: empty, or a name the registry does not know (the message lists the valid ones).
    """
    names = _split_strategies(text)
    if not names:
        raise UsageError("--strategies is empty; e.g. --strategies eager,checkpoint:blocks (see --list-strategies)")
    for name in names:
        try:
            parse_strategy(name)
        except ValueError as e:
            raise UsageError(f"--strategies: {e}") from None
    return names


def print_strategies() -> None:
    """``--list-strategies``."""
    for spec in strategy_definitions():
        print(f"  {', '.join(spec.usage()):<32} {spec.description}")
    print("  combine with '+', e.g. convert+checkpoint:blocks")


def print_table(header: Sequence[str], body: Sequence[Sequence[str]]) -> None:
    """An aligned text table: the first column left-aligned, the others right-aligned."""
    widths = [max(len(row[i]) for row in [header, *body]) for i in range(len(header))]
    for cells in [list(header), ["-" * w for w in widths], *body]:
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))))


def environment(dev: torch.device) -> Dict[str, Any]:
    """Versions, machine and threads, for the JSON record."""
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


def write_json(path: Optional[str], data: Dict[str, Any]) -> None:
    """Write ``data`` to ``path`` (when given) and say so."""
    if path:
        with open(path, "w") as f:
            json.dump(data, f, indent=2)
            f.write("\n")
        print(f"wrote {path}")


# ------------------------------------------------------------------------------------------------------ the model
@dataclass
class Case:
    """The model a command runs: a built-in benchmark case or the user's ``MODULE:CALLABLE`` with its inputs."""

    title: str  # "resnet50 (tiny, batch 2)", "m:f (input 8x3x64x64 float32)"
    model: nn.Module
    inputs: Tuple[Any, ...]
    loss_fn: Callable[[Any], torch.Tensor]
    batch: int
    inputs_at: Callable[[int], Tuple[torch.Tensor, ...]]  # batch -> meta inputs (estimate's max batch search)
    record: Dict[str, Any] = field(default_factory=dict)  # what the JSON says about the model
    note: str = ""  # a line printed under the title (which model a built-in name means)


def check_model_args(args: argparse.Namespace) -> None:
    """``--model`` with its ``--input`` / ``--size`` / ``--batch``, checked before anything is built.

    Raises:
        UsageError: a missing or unknown model, a form that does not fit the model.
    """
    if not args.model:
        raise UsageError(
            f"--model is required: {' | '.join(models.MODELS)}, or MODULE:CALLABLE with --input "
            "(e.g. --model torchvision.models:resnet18 --input 8,3,224,224)"
        )
    if args.batch is not None and args.batch < 1:
        raise UsageError(f"--batch must be >= 1, got {args.batch}")
    if is_hf_model(args.model):
        hf_config(args.model, args.size or "full")  # an unknown type or a Hub id fails here, before anything runs
        for text in args.input or []:
            parse_input(text)
        if args.model_kwargs is not None:
            raise UsageError(f"--model {args.model}: --model-kwargs is for MODULE:CALLABLE models; choose --size")
        return
    if is_user_model(args.model):
        if args.size is not None:
            raise UsageError("--size is for the built-in models; a MODULE:CALLABLE model takes its --input shapes")
        if not args.input:
            raise UsageError(
                f"--model {args.model}: give the shape of each input of its forward, e.g. --input "
                "8,3,224,224 (float32) or --input tokens:2,128:50257 (token ids)"
            )
        for text in args.input:
            parse_input(text)
        parse_model_kwargs(args.model_kwargs)
        return
    if args.model not in models.SIZES:
        raise UsageError(
            f"unknown model {args.model!r}: use a built-in one ({', '.join(models.MODELS)}) or your own "
            "as MODULE:CALLABLE with --input shapes (e.g. --model torchvision.models:resnet18 --input 8,3,224,224)"
        )
    if args.input or args.model_kwargs is not None:
        raise UsageError(
            f"--input and --model-kwargs are for MODULE:CALLABLE models; the built-in {args.model} makes "
            "its own inputs (choose --size and --batch)"
        )


def _moved(model: nn.Module, args: argparse.Namespace, device: torch.device) -> nn.Module:
    """``--model``'s model on ``device``, or CommandError saying that moving it failed."""
    try:
        return model.to(device)
    except Exception as e:
        raise CommandError(f"--model {args.model}: moving it to {device} failed: {one_line(e)}") from e


def _spellings(inputs: Sequence[torch.Tensor], specs: Sequence[InputSpec]) -> List[str]:
    """The ``--input`` spelling of each input made from ``specs`` (its batch as made)."""
    return [InputSpec(tuple(t.shape), s.vocab).spelling() for t, s in zip(inputs, specs)]


def _input_case(
    args: argparse.Namespace,
    title: str,
    model: nn.Module,
    specs: Sequence[InputSpec],
    inputs: Tuple[torch.Tensor, ...],
    size: Optional[str],
    config: Dict[str, Any],
) -> Case:
    """The Case of a model whose ``inputs`` were made from ``specs`` (MODULE:CALLABLE and hf: models): memsave's
    default loss, the batch of ``inputs``, meta inputs of any batch made from the same specs."""
    batch = int(inputs[0].shape[0])
    return Case(
        title=title,
        model=model,
        inputs=inputs,
        loss_fn=default_loss,
        batch=batch,
        inputs_at=lambda b: make_inputs(specs, torch.device("meta"), args.seed, b),
        record={"model": args.model, "size": size, "batch": batch, "config": config},
    )


def _user_case(args: argparse.Namespace, model_device: torch.device, input_device: torch.device) -> Case:
    specs: List[InputSpec] = [parse_input(text) for text in args.input]
    kwargs = parse_model_kwargs(args.model_kwargs)
    model = _moved(build_user_model(args.model, kwargs, seed=args.seed), args, model_device)
    inputs = make_inputs(specs, input_device, args.seed, args.batch)
    shown = ", ".join(str(InputSpec(tuple(t.shape), s.vocab)) for t, s in zip(inputs, specs))
    title = f"{args.model} (input{'s' if len(specs) > 1 else ''} {shown})"
    config = {"inputs": _spellings(inputs, specs), "model_kwargs": kwargs}
    return _input_case(args, title, model, specs, inputs, None, config)


def _hf_case(args: argparse.Namespace, size: str, model_device: torch.device, input_device: torch.device) -> Case:
    model = _moved(build_hf_model(args.model, size, seed=args.seed), args, model_device)
    specs = [parse_input(text) for text in args.input] if args.input else default_hf_inputs(model, size)
    inputs = make_inputs(specs, input_device, args.seed, args.batch)
    what, config = describe(model)
    title = f"{args.model}: {what}, {size}, input {' '.join(_spellings(inputs, specs))}"
    return _input_case(args, title, model, specs, inputs, size, config)


#: Built-in model names that a library also uses: (the library, the --model value that gives the library's model).
_LIBRARY_NAMESAKES = {
    "gpt2": ("transformers'", "hf:gpt2"),
    "resnet50": ("torchvision's", "torchvision.models:resnet50 --input 2,3,224,224"),
    "vgg16": ("torchvision's", "torchvision.models:vgg16 --input 2,3,224,224"),
}


def builtin_note(name: str) -> str:
    """The line under a built-in model's header when a library has a model of that name: which one runs, and how
    to run the library's instead ("" for the other names).

    Examples:
        >>> builtin_note("gpt2")
        "(memsave's built-in gpt2, not transformers' one: that is --model hf:gpt2)"
    """
    if name not in _LIBRARY_NAMESAKES:
        return ""
    library, value = _LIBRARY_NAMESAKES[name]
    return f"(memsave's built-in {name}, not {library} one: that is --model {value})"


def _builtin_case(args: argparse.Namespace, size: str, device: torch.device, shaped_loss: bool) -> Case:
    case = models.build(args.model, size, device=str(device), seed=args.seed, batch=args.batch)
    template = case.inputs[0]
    batch = case.config["batch"]
    return Case(
        title=f"{args.model} ({size}, batch {batch})",
        note=builtin_note(args.model),
        model=case.model,
        inputs=case.inputs,
        # estimate varies the batch: a cross-entropy whose targets are shaped from the output works at any batch.
        loss_fn=models.ShapeCrossEntropy() if shaped_loss else case.loss_fn,
        batch=batch,
        inputs_at=lambda b: (torch.empty((b, *tuple(template.shape[1:])), dtype=template.dtype, device="meta"),),
        record={"model": args.model, "size": size, "batch": batch, "config": case.config},
    )


def build_case(args: argparse.Namespace, device: torch.device, for_estimate: bool = False) -> Case:
    """The model and inputs of ``args``: real on ``device`` (bench), or parameters on the CPU and inputs on the meta
    device (estimate: it reads shapes only; moving the model to meta would untie GPT's tied embedding)."""
    size = args.size or default_size(device)
    if is_hf_model(args.model):
        return _hf_case(
            args,
            size,
            torch.device("cpu") if for_estimate else device,
            torch.device("meta") if for_estimate else device,
        )
    if is_user_model(args.model):
        if for_estimate:
            return _user_case(args, torch.device("cpu"), torch.device("meta"))
        return _user_case(args, device, device)
    return _builtin_case(args, size, torch.device("cpu") if for_estimate else device, shaped_loss=for_estimate)
