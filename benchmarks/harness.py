"""What every benchmark script shares: the machine and run record, device sync, gradient errors and the writers.

One implementation of each, so that every results file under ``benchmarks/results/`` records its run the same way:
the command, the device (CPU model or GPU name), threads, torch / model-library / memsave versions, the commit (and the
package sources that differed from it), and the load average at the start and the end (this machine is shared: read
the time ratios with it).

Example::

    from benchmarks.harness import RunClock, run_record, write_results

    clock = RunClock()
    rows = [...]                                      # the script's measurements
    meta = run_record("my_bench", "cpu", argv, clock, repeats=9)
    write_results("benchmarks/results/my_bench_cpu.json", meta, {"rows": rows}, markdown_text)
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import torch

import memsave
from memsave.recompute.planning.cache import cpu_name

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"

__all__ = [
    "commit_text",
    "RESULTS",
    "RunClock",
    "cpu_model",
    "default_out",
    "cuda_missing",
    "early_exit",
    "environment",
    "git",
    "interleaved_times",
    "library_versions",
    "load_average",
    "load_text",
    "max_grad_diff",
    "output_arguments",
    "rel_diff",
    "rewrite_markdown",
    "run_record",
    "sync",
    "write_results",
]


def cpu_model() -> str:
    """The CPU's model name (Linux /proc/cpuinfo), else platform's processor or machine: as the plan cache keys it."""
    return cpu_name()


def git(*args: str) -> Optional[str]:
    """``git ARGS`` at the root of this checkout (pathspecs are the repository's paths): its stripped output, or
    None when git fails or is missing."""
    try:
        out = subprocess.run(["git", *args], cwd=HERE.parent, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def load_average() -> Optional[Sequence[float]]:
    """The 1 / 5 / 15 minute load average, or None where the platform has none."""
    return os.getloadavg() if hasattr(os, "getloadavg") else None


def load_text(avg: Optional[Sequence[float]]) -> str:
    """A load average triple as ``"1.00 / 0.50 / 0.25"`` (``n/a`` where the platform has none)."""
    return "n/a" if avg is None else " / ".join(f"{v:.2f}" for v in avg)


def commit_text(meta: Mapping[str, Any]) -> str:
    """``commit abc1234``, and the package sources modified in the working tree when there were (a run of code
    that no commit holds), from :func:`run_record`'s fields."""
    dirty = meta.get("git_dirty") or []
    return f"commit {meta.get('git_commit')}" + (f", package sources modified: {', '.join(dirty)}" if dirty else "")


def library_versions() -> Dict[str, Optional[str]]:
    """The versions of transformers, timm and torchvision (None where one is not installed)."""
    out: Dict[str, Optional[str]] = {}
    for mod in ("transformers", "timm", "torchvision"):
        try:
            out[mod] = __import__(mod).__version__
        except ImportError:
            out[mod] = None
    return out


class RunClock:
    """The start of a run: its wall clock and load average, read again by :func:`run_record` at the end."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.load_start = load_average()

    def minutes(self) -> float:
        """Minutes since the run started."""
        return (time.perf_counter() - self.start) / 60


def run_record(
    script: str, device: str, argv: Optional[Sequence[str]], clock: RunClock, **extra: Any
) -> Dict[str, Any]:
    """What a results file records of its run.

    Args:
        script: the benchmark's file name without ``.py`` (it names the command).
        device: ``"cpu"`` or ``"cuda"``.
        argv: the script's arguments (None: ``sys.argv[1:]``).
        clock: the :class:`RunClock` made when the run started.
        **extra: further fields (repeats, sizes, ...), recorded before the command.

    Returns:
        A JSON-ready dict: device, versions, memsave's build, commit and modified package sources, CPU and threads,
        load at start and end, minutes, date, the extra fields and the command; a GPU run adds the GPU's name.
    """
    dirty = git("status", "--porcelain", "--", "python", "csrc")
    meta: Dict[str, Any] = dict(
        device=device,
        torch=torch.__version__,
        **library_versions(),
        memsave_version=memsave.__version__,
        memsave=memsave.build_info(),
        git_commit=git("rev-parse", "--short", "HEAD"),
        git_dirty=[line.split(maxsplit=1)[1] for line in dirty.splitlines()] if dirty else [],  # git() strips
        threads=torch.get_num_threads(),
        cpu=cpu_model(),
        cpu_count=os.cpu_count(),
        load_average_start=clock.load_start,
        load_average_end=load_average(),
        minutes=clock.minutes(),
        date=time.strftime("%Y-%m-%d %H:%M:%S"),
        **extra,
        command=" ".join([f"python3 benchmarks/{script}.py", *(argv if argv is not None else sys.argv[1:])]),
    )
    if device == "cuda":
        meta["gpu"] = torch.cuda.get_device_name()
        meta["cuda"] = torch.version.cuda
    return meta


def environment(device: torch.device) -> Dict[str, Any]:
    """The machine facts of the strategy-table runs (``run.py``, ``plan_benefit.py``, ``amp_unscale_speed.py``).

    Args:
        device: where the run happens.

    Returns:
        Device name, torch / CUDA / cuDNN / Python versions, threads, load average, UTC date, commit and memsave's
        build.
    """
    avg = load_average()
    return {
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_model(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_threads": torch.get_num_threads(),
        "load_average": [round(v, 2) for v in avg] if avg is not None else None,
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
        "git_commit": git("rev-parse", "--short", "HEAD"),
        "memsave": memsave.build_info(),
    }


def sync(device: Any) -> None:
    """Wait for the device's queued kernels (a no-op on CPU), so that a wall-clock time covers them."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def interleaved_times(steps: Mapping[str, Callable[[], Any]], repeats: int, device: Any) -> Dict[str, List[float]]:
    """Call every step ``repeats`` times, interleaved: A B C ... then ... C B A, so that load changing during the run
    hits all alike; the device is synced around each call. Returns each step's wall-clock seconds."""
    order = list(steps)
    times: Dict[str, List[float]] = {name: [] for name in order}
    for i in range(repeats):
        for name in order if i % 2 == 0 else order[::-1]:
            sync(device)
            t0 = time.perf_counter()
            steps[name]()
            sync(device)
            times[name].append(time.perf_counter() - t0)
    return times


def cuda_missing(script: str, device: str) -> bool:
    """Whether a ``--device cuda`` run has no CUDA GPU here (then said on stderr; the script's ``main`` returns 2)."""
    if device == "cuda" and not torch.cuda.is_available():
        print(f"{script}: no CUDA GPU here; run the CPU benchmark or on a GPU machine", file=sys.stderr)
        return True
    return False


def output_arguments(p: argparse.ArgumentParser, script: str, rewritten: Optional[str] = "the .md") -> None:
    """Add the output options the benchmarks share: ``--out`` (default ``benchmarks/results/<script>_<device>.json``),
    ``--no-save`` and, unless ``rewritten`` is None, ``--markdown-from`` (only write ``rewritten`` again)."""
    p.add_argument("--out", default=None, help=f"JSON path (default benchmarks/results/{script}_<device>.json)")
    p.add_argument("--no-save", action="store_true")
    if rewritten is not None:
        p.add_argument("--markdown-from", default=None, help=f"only write {rewritten} of this results JSON again")


def rewrite_markdown(path: str, markdown_of: Callable[[Any, Any], str], key: str = "results") -> None:
    """``--markdown-from``: write the markdown page of the results JSON at ``path`` again (beside it, ``.md``), from
    its ``meta`` and its ``key`` entry."""
    with open(path) as f:
        data = json.load(f)
    with open(os.path.splitext(path)[0] + ".md", "w") as f:
        f.write(markdown_of(data["meta"], data[key]))


def early_exit(
    script: str, args: argparse.Namespace, markdown_of: Optional[Callable[[Any, Any], str]] = None, key: str = "results"
) -> Optional[int]:
    """What a benchmark's ``main`` does before running, as an exit status: 0 after ``--markdown-from`` wrote its page
    again (:func:`rewrite_markdown` with ``markdown_of`` and ``key``), 2 for ``--device cuda`` without a GPU
    (:func:`cuda_missing`), None to run."""
    if markdown_of is not None and args.markdown_from:
        rewrite_markdown(args.markdown_from, markdown_of, key)
        return 0
    return 2 if cuda_missing(script, args.device) else None


def rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b| in float64 (0 = bitwise equal; b all zero: the absolute difference)."""
    scale = b.detach().double().abs().max().item()
    return (a.detach().double() - b.detach().double()).abs().max().item() / (scale or 1.0)


def max_grad_diff(grads: Mapping[str, torch.Tensor], ref: Mapping[str, torch.Tensor]) -> float:
    """The largest absolute difference between two gradient dicts keyed by parameter name.

    Raises:
        RuntimeError: when a parameter of ``ref`` has no gradient in ``grads`` (a silently missing gradient is a
            result, not a zero).
    """
    if set(grads) != set(ref):
        missing = sorted(set(ref) - set(grads))
        raise RuntimeError(f"parameters without a gradient compared with eager: {missing[:5]}")
    return max((float((grads[n].double() - ref[n].double()).abs().max()) for n in ref), default=0.0)


def variant_rows(
    results: Sequence[Mapping[str, Any]],
    label: Callable[[Any], str],
    cells: Callable[[str, Any], Sequence[str]],
    skipped: Sequence[str] = (),
    note: Optional[Callable[[str, Any], str]] = None,
) -> List[str]:
    """The rows of a results page's markdown table: one per model and variant (in the results' order),
    ``| label | variant | cells... | note |``.

    Args:
        results: one dict per model, with its ``variants`` (variant name -> row).
        label: the model's first cell.
        cells: a measured row's cells, from (variant, row).
        skipped: a row with a ``skipped`` entry gets these cells instead.
        note: the last cell, from (variant, row); None: no note column.

    Returns:
        The markdown lines.

    Raises:
        KeyError: a model has no ``variants``.

    Examples:
        >>> variant_rows([{"model": "m", "variants": {"eager": {"t": 1.0}}}], lambda res: res["model"],
        ...              lambda v, r: [f"{r['t']:.2f}"])
        ['| m | eager | 1.00 |']
    """
    lines = []
    for res in results:
        for v, r, row in _variant_cells(res, cells, skipped):
            last = [] if note is None else [note(v, r)]
            lines.append("| " + " | ".join([label(res), v, *row, *last]) + " |")
    return lines


def text_rows(
    res: Mapping[str, Any],
    cells: Callable[[str, Any], Sequence[str]],
    widths: Sequence[int],
    skipped: Sequence[str] = (),
    note: Optional[Callable[[str, Any], str]] = None,
) -> List[str]:
    """The printed table's lines for one model: one per variant, laid out by :func:`text_row`.

    Args:
        res: the model's results, with ``model`` and its ``variants`` (variant name -> row).
        cells: a measured row's cells, from (variant, row).
        widths: the columns' widths, the model's and the variant's first.
        skipped: a row with a ``skipped`` entry gets these cells instead.
        note: what follows the cells, from (variant, row); None: nothing.

    Returns:
        The lines.

    Raises:
        KeyError: ``res`` has no ``model`` or ``variants``.
        ValueError: a row's cells do not fill ``widths``.

    Examples:
        >>> text_rows({"model": "m", "variants": {"eager": {"t": 1.0}}}, lambda v, r: [f"{r['t']:.2f}"], [3, 6, 5])
        ['m   eager   1.00']
    """
    return [
        text_row([res["model"], v, *row], widths, "" if note is None else note(v, r))
        for v, r, row in _variant_cells(res, cells, skipped)
    ]


def text_row(cells: Sequence[str], widths: Sequence[int], note: str = "") -> str:
    """One line of a printed table: the first two cells (model, variant) left-aligned, the others right-aligned, each
    to its column's width, one space apart; then ``note``, two spaces after (a header passes the column titles).

    Args:
        cells: the cells.
        widths: the columns' widths (a longer cell widens its column on this line).
        note: free text after the columns ("" for none).

    Returns:
        The line.

    Raises:
        ValueError: ``cells`` and ``widths`` differ in length.

    Examples:
        >>> text_row(["model", "variant", "peak"], [6, 8, 9], "note")
        'model  variant       peak  note'
    """
    if len(cells) != len(widths):
        raise ValueError(f"text_row: {len(cells)} cells for {len(widths)} column widths; give one width per cell")
    line = " ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))
    return f"{line}  {note}" if note else line


def _variant_cells(
    res: Mapping[str, Any], cells: Callable[[str, Any], Sequence[str]], skipped: Sequence[str]
) -> Iterator[Tuple[str, Any, Sequence[str]]]:
    """(variant, row, its cells) for each variant of one model, in order; a skipped row's cells are ``skipped``."""
    for v, r in res["variants"].items():
        yield v, r, skipped if "skipped" in r else cells(v, r)


def default_out(script: str, device: str) -> str:
    """``benchmarks/results/<script>_<device>.json``."""
    return str(RESULTS / f"{script}_{device}.json")


def write_results(
    out: str,
    meta: Mapping[str, Any],
    payload: Mapping[str, Any],
    markdown_text: Optional[str],
    extra: Optional[Callable[[str], None]] = None,
) -> None:
    """Write a run's JSON (``{"meta": ..., **payload}``) and its markdown page beside it (same name, ``.md``).

    Args:
        out: the JSON path; its folder is made if missing.
        meta: the run record (:func:`run_record` or :func:`environment`).
        payload: the results, merged into the JSON's top level.
        markdown_text: the page (None: no page).
        extra: called with ``out`` after both are written (a plot, say).
    """
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump(dict(meta=meta, **payload), f, indent=2)
    if markdown_text is not None:
        with open(os.path.splitext(out)[0] + ".md", "w") as f:
            f.write(markdown_text)
    if extra is not None:
        extra(out)


def finish_run(
    script: str,
    args: Any,
    argv: Optional[Sequence[str]],
    clock: RunClock,
    payload: Mapping[str, Any],
    markdown_of: Optional[Callable[[Dict[str, Any]], str]] = None,
    save: Optional[bool] = None,
    **extra: Any,
) -> Optional[str]:
    """The end every benchmark's ``main`` shares: print the load, then write the results unless told not to.

    Args:
        script: the benchmark's file name without ``.py``.
        args: its parsed arguments (``device``, ``out``, ``no_save`` are read; ``device`` defaults to ``"cpu"``).
        argv: its command-line arguments (None: ``sys.argv[1:]``).
        clock: the :class:`RunClock` made when the run started.
        payload: the results, merged into the JSON's top level.
        markdown_of: makes the markdown page from the run record (None: JSON only).
        save: whether to write (None: unless ``args.no_save``).
        **extra: further run-record fields (repeats, sizes, ...).

    Returns:
        The JSON path written, or None.
    """
    print(f"load average at the start: {load_text(clock.load_start)}, at the end: {load_text(load_average())}")
    device = getattr(args, "device", "cpu")
    if not (save if save is not None else not getattr(args, "no_save", False)):
        return None
    out = getattr(args, "out", None) or default_out(script, device)
    meta = run_record(script, device, argv, clock, **extra)
    write_results(out, meta, payload, markdown_of(meta) if markdown_of is not None else None)
    print(f"wrote {out}" + (" and its .md" if markdown_of is not None else ""))
    return out
