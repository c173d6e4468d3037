"""Command line: ``python -m memsave {info,demo,bench,estimate}``."""
from __future__ import annotations

import argparse
import sys
from typing import List, Optional


def _info(_args: argparse.Namespace) -> int:
    import torch

    from ..extension import build_info, dispatch_table

    info = build_info()
    print(f"memsave {info['version']}")
    print(f"  built against torch {info['torch_version']}, running torch {torch.__version__}")
    archs = info["cuda_archs"] or "-"
    print(f"  CUDA kernels: {'yes' if info['cuda'] else 'no'} (archs {archs}, runtime {info['cuda_runtime_version']})")
    print(f"  compiler: {info['compiler']}")
    print(f"  GPU visible: {torch.cuda.is_available()}"
          + (f" ({torch.cuda.get_device_name()})" if torch.cuda.is_available() else ""))
    print("operators (torch.ops.memsave) and the dispatch keys they have kernels for:")
    for name, keys in dispatch_table().items():
        print(f"  {name:<28} {', '.join(keys)}")
    return 0


def _demo(args: argparse.Namespace) -> int:
    from . import demo

    return demo.main(args.rest)


def _bench(args: argparse.Namespace) -> int:
    from . import bench

    return bench.main(args.rest)


def _estimate(args: argparse.Namespace) -> int:
    from . import bench

    return bench.estimate_main(args.rest)


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of ``python -m memsave`` and the ``memsave`` console script."""
    parser = argparse.ArgumentParser(prog="python -m memsave", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="build facts and the dispatch keys of every memsave operator").set_defaults(run=_info)
    demo = sub.add_parser("demo", help="eager vs checkpointing on a built-in model: the memory comparison table",
                          add_help=False)
    demo.add_argument("rest", nargs=argparse.REMAINDER)
    demo.set_defaults(run=_demo)
    bench = sub.add_parser("bench", help="benchmark a model across strategies (see --help)", add_help=False)
    bench.add_argument("rest", nargs=argparse.REMAINDER)
    bench.set_defaults(run=_bench)
    est = sub.add_parser("estimate", help="predict a model's training-step memory on fake tensors (see --help)", add_help=False)
    est.add_argument("rest", nargs=argparse.REMAINDER)
    est.set_defaults(run=_estimate)
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in ("demo", "bench", "estimate"):  # argparse.REMAINDER drops leading options: pass them through
        return int(sub.choices[argv[0]].get_default("run")(argparse.Namespace(rest=argv[1:])) or 0)
    args = parser.parse_args(argv)
    return int(args.run(args) or 0)

