"""``python -m memsave info``: build facts and the dispatch keys of every memsave operator."""

from __future__ import annotations

from typing import List

import torch

from ..common import compat
from ..extension import build_info, dispatch_table
from .usage import ArgumentParser, add_traceback_flag

__all__ = ["main"]


def main(argv: List[str]) -> int:
    """``python -m memsave info``.

    Args:
        argv: the arguments after ``info`` (only ``--help`` and ``--traceback``).

    Returns:
        0.

    Raises:
        UsageError: an unknown argument.

    Examples:
        >>> main([])
        0
    """
    p = ArgumentParser(
        prog="python -m memsave info", description="Build facts and the dispatch keys of every memsave operator."
    )
    add_traceback_flag(p)
    p.parse_args(argv)
    info = build_info()
    print(f"memsave {info['version']}")
    print(f"  built against torch {info['torch_version']}, running torch {torch.__version__}")
    print(f"  supported: {compat.SUPPORTED_TORCH}, {compat.SUPPORTED_PYTHON} (tested: docs/compatibility.md)")
    archs = info["cuda_archs"] or "-"
    print(f"  CUDA kernels: {'yes' if info['cuda'] else 'no'} (archs {archs}, runtime {info['cuda_runtime_version']})")
    print(f"  compiler: {info['compiler']}")
    gpu = f" ({torch.cuda.get_device_name()})" if torch.cuda.is_available() else ""
    print(f"  GPU visible: {torch.cuda.is_available()}{gpu}")
    print("operators (torch.ops.memsave) and the dispatch keys they have kernels for:")
    for name, keys in dispatch_table().items():
        print(f"  {name:<28} {', '.join(keys)}")
    return 0
