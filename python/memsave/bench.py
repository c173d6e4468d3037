"""Command line: ``python -m memsave bench`` (measure strategies) and ``python -m memsave estimate`` (predict them).

Both use the benchmark models of the source tree (``benchmarks/models.py``: vgg16, unet, resnet50, gpt2, each at
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
import contextlib
import importlib.util
import json
import os
import platform
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Dict, Iterator, List, Optional, Sequence

import torch
import torch.nn.functional as F

__all__ = ["main", "estimate_main", "load_models"]

_MODELS_MODULE = "memsave_benchmark_models"


def load_models() -> ModuleType:
    """Import ``benchmarks/models.py`` of the memsave source tree.

    Looked for under ``$MEMSAVE_BENCHMARKS``, next to the package (an editable install or a checkout), then in the
    current directory.

    Raises:
        FileNotFoundError: no ``benchmarks/models.py`` was found (an installed wheel does not ship it).
    """
    if _MODELS_MODULE in sys.modules:
        return sys.modules[_MODELS_MODULE]
    here = Path(__file__).resolve()
    candidates = []
    if os.environ.get("MEMSAVE_BENCHMARKS"):
        candidates.append(Path(os.environ["MEMSAVE_BENCHMARKS"]) / "models.py")
    candidates += [here.parents[2] / "benchmarks" / "models.py", Path.cwd() / "benchmarks" / "models.py"]
    for path in candidates:
        if path.is_file():
            spec = importlib.util.spec_from_file_location(_MODELS_MODULE, path)
            assert spec is not None and spec.loader is not None
            mod = importlib.util.module_from_spec(spec)
            sys.modules[_MODELS_MODULE] = mod
            spec.loader.exec_module(mod)
            return mod
    raise FileNotFoundError(
        "the benchmark models (benchmarks/models.py) were not found; run from a memsave source checkout or set "
        f"MEMSAVE_BENCHMARKS to its benchmarks/ directory (looked in: {', '.join(str(c) for c in candidates)})"
    )


@contextlib.contextmanager
def _batch_override(models: ModuleType, name: str, size: str, batch: Optional[int]) -> Iterator[None]:
    """Build the case at ``batch`` by overriding the size table of our private import of models.py."""
    if batch is None:
        yield
        return
    saved = models.SIZES[name][size]
    models.SIZES[name][size] = dict(saved, batch=batch)
    try:
        yield
    finally:
        models.SIZES[name][size] = saved


class ShapeCrossEntropy:
    """Cross-entropy against all-zero targets shaped from the output: works at any batch size and on fake tensors.

    (B, C) -> targets (B,); (B, C, H, W) -> (B, H, W); (B, T, V) -> flattened to (B*T, V) against (B*T,).
    Memory does not depend on the target values.
    """

    def __call__(self, out: torch.Tensor) -> torch.Tensor:
        if out.dim() == 3:
            out = out.flatten(0, 1)
        target = torch.zeros(out.shape[:1] + out.shape[2:], dtype=torch.long, device=out.device)
        return F.cross_entropy(out.float(), target)


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


def _models_for(name: Optional[str]) -> ModuleType:
    models = load_models()
    if name not in models.SIZES:
        raise SystemExit(f"--model must be one of {', '.join(models.SIZES)}, got {name!r}")
    return models


def _split_strategies(text: str) -> List[str]:
    # Commas separate strategies; a comma inside a checkpoint policy list ("checkpoint:h.0,h.1") belongs to it when
    # the next piece is not a known strategy name.
    from .compare import _REGISTRY

    out: List[str] = []
    for piece in (p.strip() for p in text.split(",")):
        if not piece:
            continue
        head = piece.split("+")[0].split(":")[0]
        if out and head not in _REGISTRY:
            out[-1] += "," + piece
        else:
            out.append(piece)
    return out


def _print_strategies() -> None:
    from .compare import _REGISTRY

    for spec in _REGISTRY.values():
        print(f"  {', '.join(spec.usage()):<32} {spec.description}")
    print("  combine with '+', e.g. convert+checkpoint:blocks")


def _device(text: str) -> torch.device:
    dev = torch.device(text)
    if dev.type not in ("cpu", "cuda"):
        raise SystemExit(f"--device must be cpu or cuda, got {text!r}")
    return dev


def _environment(dev: torch.device) -> Dict[str, Any]:
    import memsave

    env: Dict[str, Any] = {"torch": torch.__version__, "memsave": memsave.__version__, "python": platform.python_version(),
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
    from .compare import compare

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
    models = _models_for(args.model)
    with _batch_override(models, args.model, size, args.batch):
        case = models.build(args.model, size, device=str(dev), seed=args.seed)
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
    from .estimate import OPTIMIZER_STATES, estimate, max_batch_size
    from .measure import format_bytes

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
    models = _models_for(args.model)
    # Built on the CPU (the estimate reads shapes only and allocates nothing more); moving the model to the meta device
    # would untie GPT's tied embedding and count it twice.
    with _batch_override(models, args.model, size, args.batch):
        case = models.build(args.model, size, device="cpu", seed=args.seed)
    batch = case.config["batch"]
    strategies = _split_strategies(args.strategies)
    loss = ShapeCrossEntropy()
    template = case.inputs[0]
    # Training BatchNorm needs more than one value per channel: ResNet's last maps are 1x1 at small sizes.
    min_batch = 2 if any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in case.model.modules()) else 1

    def make_inputs(b: int) -> torch.Tensor:
        return torch.empty((b,) + tuple(template.shape[1:]), dtype=template.dtype, device="meta")

    rows: List[Dict[str, Any]] = []
    progress = _tqdm(len(strategies) * (2 if args.memory else 1), "memsave.estimate")
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


def _tqdm(total: int, desc: str) -> Any:
    if total <= 1 or not sys.stderr.isatty():
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc=desc, leave=False)
