"""Command line: ``python -m memsave bench`` (measure strategies) and ``python -m memsave estimate`` (predict them).

Both use the built-in benchmark models (:mod:`memsave.measurement.models`: vgg16, unet, resnet50, gpt2, each at
sizes ``tiny``, ``cpu`` and ``full``)::

    python -m memsave bench --model unet --size cpu --strategies eager,checkpoint:blocks,convert --json unet.json
    python -m memsave estimate --model gpt2 --size full --batch 8 --device cuda \\
        --strategies eager,checkpoint:blocks --memory 24GiB        # also: the largest batch that fits

``bench`` runs :func:`memsave.compare` (real steps, a progress bar over the strategies) and prints its table;
``estimate`` runs :func:`memsave.estimate` on fake tensors (nothing allocated, no GPU needed) and, with
``--memory``, :func:`memsave.max_batch_size` per strategy.
"""

from __future__ import annotations

import argparse
import json
import platform
from typing import Any, Dict, List, Optional, Sequence

import torch

from ..common.progress import progress_bar
from ..extension import build_info
from ..measurement.comparison import compare
from ..measurement.estimation import OPTIMIZER_STATES, estimate, max_batch_size
from ..measurement.strategies import strategy_definitions
from ..measurement import models
from ..measurement.models import ShapeCrossEntropy
from ..measurement.units import format_bytes

__all__ = ["main", "estimate_main"]

_MODELS_MODULE = "memsave_benchmark_models"


def _common_args(p: argparse.ArgumentParser, default_device: str) -> None:
    p.add_argument("--model", help="vgg16 | unet | resnet50 | gpt2 (required)")
    p.add_argument("--size", default=None, help="tiny | cpu | full (default: full on CUDA, cpu otherwise)")
    p.add_argument("--batch", type=int, default=None, help="batch size (default: the size's own)")
    p.add_argument("--strategies", default="eager,checkpoint:blocks",
                   help="comma-separated strategy names (see --list-strategies); default: %(default)s")
    p.add_argument("--device", default=default_device, help="cpu | cuda (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seed of weights and data (default: %(default)s)")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    p.add_argument("--list-strategies", action="store_true", help="print the strategy names and exit")


def _check_model(name: Optional[str]) -> None:
    if name not in models.SIZES:
        raise SystemExit(f"--model must be one of {', '.join(models.SIZES)}, got {name!r}")


def _split_strategies(text: str) -> List[str]:
    # Commas separate strategies; a comma inside a checkpoint policy list ("checkpoint:h.0,h.1") belongs to it when
    # the next piece is not a known strategy name.
    kinds = {d.name for d in strategy_definitions()}
    out: List[str] = []
    for piece in (p.strip() for p in text.split(",")):
        if not piece:
            continue
        head = piece.split("+")[0].split(":")[0]
        if out and head not in kinds:
            out[-1] += "," + piece
        else:
            out.append(piece)
    return out


def _print_strategies() -> None:
    for spec in strategy_definitions():
        print(f"  {', '.join(spec.usage()):<32} {spec.description}")
    print("  combine with '+', e.g. convert+checkpoint:blocks")


def _device(text: str) -> torch.device:
    dev = torch.device(text)
    if dev.type not in ("cpu", "cuda"):
        raise SystemExit(f"--device must be cpu or cuda, got {text!r}")
    return dev


def _environment(dev: torch.device) -> Dict[str, Any]:
    env: Dict[str, Any] = {"torch": torch.__version__, "memsave": build_info()["version"], "python": platform.python_version(),
                           "machine": platform.machine(), "threads": torch.get_num_threads()}
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


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m memsave bench``: measure a benchmark model under several strategies; print the table.

    Example:
        >>> main(["--model", "unet", "--size", "tiny", "--strategies", "eager,checkpoint:blocks"])
    """

    p = argparse.ArgumentParser(prog="python -m memsave bench",
                                description="Measure a benchmark model's training step under several strategies.")
    _common_args(p, "cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--steps", type=int, default=5, help="timed steps per strategy (default: %(default)s)")
    p.add_argument("--breakdown", type=int, default=0, metavar="N",
                   help="also print the N modules holding the most activation memory, per strategy")
    p.add_argument("--snapshot-dir", metavar="DIR", help="CUDA: write a memory snapshot per strategy (memory_viz)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = p.parse_args(list(argv) if argv is not None else None)
    if args.list_strategies:
        _print_strategies()
        return 0
    dev = _device(args.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda but CUDA is not available here; use --device cpu, or "
                         "`python -m memsave estimate` to predict CUDA memory without a GPU")
    size = args.size or ("full" if dev.type == "cuda" else "cpu")
    _check_model(args.model)
    case = models.build(args.model, size, device=str(dev), seed=args.seed, batch=args.batch)
    strategies = _split_strategies(args.strategies)
    result = compare(case.model, *case.inputs, strategies=strategies, loss_fn=case.loss_fn, steps=args.steps,
                     progress=not args.no_progress, snapshot_dir=args.snapshot_dir)
    print(f"{args.model} ({size}, batch {case.config['batch']})")
    print(result)
    for row in result.rows if args.breakdown else []:
        print()
        print(result.breakdown(row.strategy, top=args.breakdown))
    data = result.to_dict()
    data.update(model=args.model, size=size, batch=case.config["batch"], config=case.config,
                environment=_environment(dev))
    _write_json(args.json, data)
    return 0


def estimate_main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m memsave estimate``: predict a benchmark model's training-step memory on fake tensors.

    Example:
        >>> estimate_main(["--model", "gpt2", "--size", "full", "--batch", "8", "--memory", "24GiB"])
    """

    p = argparse.ArgumentParser(prog="python -m memsave estimate",
                                description="Predict a benchmark model's training-step memory (fake tensors: "
                                            "nothing is allocated, no GPU needed).")
    _common_args(p, "cuda")
    p.add_argument("--dtype", choices=("fp32", "bf16", "fp16"), default="fp32",
                   help="parameter and input dtype (pure low-precision training); default: %(default)s")
    p.add_argument("--optimizer", choices=sorted(OPTIMIZER_STATES), default=None,
                   help="count this optimizer's state in the total")
    p.add_argument("--memory", default=None, help="device memory, e.g. 24GiB: also report the largest batch that fits")
    p.add_argument("--headroom", type=float, default=0.05,
                   help="fraction of --memory kept free for what is not modelled (default: %(default)s)")
    args = p.parse_args(list(argv) if argv is not None else None)
    if args.list_strategies:
        _print_strategies()
        return 0
    dev = _device(args.device)
    size = args.size or ("full" if dev.type == "cuda" else "cpu")
    dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    _check_model(args.model)
    # Built on the CPU (the estimate reads shapes only and allocates nothing more); moving the model to the meta device
    # would untie GPT's tied embedding and count it twice.
    case = models.build(args.model, size, device="cpu", seed=args.seed, batch=args.batch)
    batch = case.config["batch"]
    strategies = _split_strategies(args.strategies)
    loss = ShapeCrossEntropy()
    template = case.inputs[0]
    # Training BatchNorm needs more than one value per channel: ResNet's last maps are 1x1 at small sizes.
    min_batch = 2 if any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in case.model.modules()) else 1

    def make_inputs(b: int) -> torch.Tensor:
        return torch.empty((b,) + tuple(template.shape[1:]), dtype=template.dtype, device="meta")

    rows: List[Dict[str, Any]] = []
    progress = progress_bar(len(strategies) * (2 if args.memory else 1), "memsave.estimate", unit="strategy")
    try:
        for name in strategies:
            est = estimate(case.model, *case.inputs, device=dev, strategy=name, dtype=dtype, loss_fn=loss,
                           optimizer=args.optimizer)
            row = est.to_dict()
            if progress is not None:
                progress.update(1)
            if args.memory:
                row["memory"] = args.memory
                row["max_batch"] = max_batch_size(case.model, make_inputs, args.memory, name, device=dev, dtype=dtype,
                                                  loss_fn=loss, optimizer=args.optimizer, headroom=args.headroom,
                                                  min_batch=min_batch)
                if progress is not None:
                    progress.update(1)
            rows.append(row)
    finally:
        if progress is not None:
            progress.close()

    emulated = any(r["emulated"] for r in rows)
    print(f"{args.model} ({size}, batch {batch}) on {dev}{', ' + args.dtype if dtype else ''}"
          f"{' (emulated: no GPU visible, CPU operator choices)' if emulated else ''}")
    header = ["strategy", "step peak", "activations", "gradients", "params", "total"]
    if args.optimizer:
        header.insert(5, "optimizer")
    if args.memory:
        header.append(f"max batch ({args.memory})")
    body = []
    for r in rows:
        cells = [r["strategy"], format_bytes(r["peak_bytes"]), format_bytes(r["activation_bytes"]),
                 format_bytes(r["grad_bytes"]), format_bytes(r["param_bytes"]), format_bytes(r["total_bytes"])]
        if args.optimizer:
            cells.insert(5, format_bytes(r["optimizer_bytes"]))
        if args.memory:
            cells.append(str(r["max_batch"]))
        body.append(cells)
    widths = [max(len(x[i]) for x in [header] + body) for i in range(len(header))]
    for cells in [header, ["-" * w for w in widths]] + body:
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))))
    _write_json(args.json, {"model": args.model, "size": size, "batch": batch, "config": case.config,
                            "device": str(dev), "rows": rows, "environment": _environment(dev)})
    return 0
