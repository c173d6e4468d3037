"""Eager vs. every memory-saving strategy, in one table: :func:`compare` and :class:`Comparison`.

Strategies are named by strings (``"eager"``, ``"checkpoint:blocks"``, ``"plan:50%"``, ``"convert"``,
``"amp:bf16"``, combined with ``+``); see :mod:`memsave.measurement.strategies` for the list and how to add one.
How the numbers are taken is :func:`memsave.measure`'s business (DESIGN.md, "Measuring memory"); :func:`compare`
runs it on a fresh deep copy of the model per strategy and adds the gradient column.
"""

from __future__ import annotations

import copy
import html
import json
import os
import re
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import torch
from torch import nn

from ..common.progress import progress_bar
from ..common.rng import RngState
from .measuring import LossFn, Measurement, measure, resolve_device, resolve_loss_fn
from .strategies import Strategy, StrategyContext, parse_strategy, strip_runner_prefix
from .units import format_bytes

__all__ = ["Comparison", "ComparisonRow", "compare"]


@dataclass
class ComparisonRow:
    """One strategy's numbers in a :class:`Comparison`.

    Attributes:
        strategy: canonical strategy name.
        peak_bytes: peak memory of a training step above what was allocated before it (see :func:`memsave.measure`).
        activation_bytes: bytes created in forward and alive at its end.
        step_seconds: median step time.
        time_ratio: ``step_seconds`` / eager's.
        max_grad_diff: max |grad - eager grad| over all parameters (0.0 means bitwise equal).
        lossless: the strategy promises bitwise-equal gradients.
        reserved_bytes: CUDA only: ``max_memory_reserved()`` during the measured step.
        by_module: activation bytes per module at the end of forward, largest first.
        snapshot: path of the CUDA memory snapshot written for this strategy, if any.
    """

    strategy: str
    peak_bytes: int
    activation_bytes: int
    step_seconds: float
    time_ratio: float
    max_grad_diff: float
    lossless: bool
    reserved_bytes: Optional[int] = None
    by_module: Dict[str, int] = field(default_factory=dict)
    snapshot: Optional[str] = None


_COLUMNS = ("strategy", "peak", "vs eager", "activations", "step", "time x", "max |dgrad|", "reserved")


class Comparison:
    """The result of :func:`compare`: one :class:`ComparisonRow` per strategy, eager first.

    Shows itself as an HTML table in notebooks, as an aligned text table with ``str()``; ``plot()`` draws peak
    memory and time ratio per strategy; ``to_json()``/``from_json()`` round-trip; ``to_dataframe()`` needs pandas.

    Attributes:
        rows: the rows, eager first.
        device: where the steps ran.
        steps: timed steps per median.
        info: free-form facts (torch version, CUDA device name, model class, input shapes).
    """

    def __init__(
        self, rows: Sequence[ComparisonRow], device: str, steps: int, info: Optional[Dict[str, Any]] = None
    ) -> None:
        self.rows: List[ComparisonRow] = list(rows)
        self.device = device
        self.steps = steps
        self.info: Dict[str, Any] = dict(info or {})

    # --------------------------------------------------------------------------- access
    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[ComparisonRow]:
        return iter(self.rows)

    def __getitem__(self, key: Union[int, str]) -> ComparisonRow:
        if isinstance(key, int):
            return self.rows[key]
        for r in self.rows:
            if r.strategy == key:
                return r
        try:  # another spelling of a row's strategy ("eager+amp:bf16", spaces)
            name = parse_strategy(key).name
        except ValueError:
            name = None
        for r in self.rows:
            if r.strategy == name:
                return r
        raise KeyError(f"no row for strategy {key!r}; rows: {', '.join(r.strategy for r in self.rows)}")

    @property
    def eager(self) -> ComparisonRow:
        """The eager row."""
        return self["eager"]

    @property
    def has_reserved(self) -> bool:
        return any(r.reserved_bytes is not None for r in self.rows)

    # --------------------------------------------------------------------------- text
    def _cells(self, r: ComparisonRow) -> List[str]:
        eager_peak = self.eager.peak_bytes
        rel = "-" if r.strategy == "eager" or not eager_peak else f"{100.0 * (r.peak_bytes / eager_peak - 1):+.1f}%"
        grad = "0" if r.max_grad_diff == 0 else f"{r.max_grad_diff:.2e}"
        cells = [
            r.strategy,
            format_bytes(r.peak_bytes),
            rel,
            format_bytes(r.activation_bytes),
            f"{r.step_seconds * 1e3:.1f} ms",
            f"{r.time_ratio:.2f}",
            grad,
        ]
        if self.has_reserved:
            cells.append(format_bytes(r.reserved_bytes))
        return cells

    def _header(self) -> List[str]:
        return list(_COLUMNS if self.has_reserved else _COLUMNS[:-1])

    def __str__(self) -> str:
        header = self._header()
        body = [self._cells(r) for r in self.rows]
        widths = [max(len(row[i]) for row in [header] + body) for i in range(len(header))]

        def line(cells: List[str]) -> str:
            return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

        title = f"memsave.compare on {self.device}: median of {self.steps} steps"
        return "\n".join([title, line(header), "  ".join("-" * w for w in widths)] + [line(b) for b in body])

    def __repr__(self) -> str:
        return f"<Comparison on {self.device}: {', '.join(r.strategy for r in self.rows)}>"

    def _repr_html_(self) -> str:
        header = "".join(f"<th>{html.escape(h)}</th>" for h in self._header())
        body = ""
        for r in self.rows:
            cells = self._cells(r)
            body += (
                "<tr>"
                + f"<td style='text-align:left'><code>{html.escape(cells[0])}</code></td>"
                + "".join(f"<td>{html.escape(c)}</td>" for c in cells[1:])
                + "</tr>"
            )
        caption = html.escape(f"memsave.compare on {self.device}: median of {self.steps} steps")
        return f"<table><caption>{caption}</caption><tr>{header}</tr>{body}</table>"

    def breakdown(self, strategy: str = "eager", top: int = 10) -> str:
        """Text table of a row's activation bytes per module at the end of forward (the largest ``top``).

        Example:
            >>> print(result.breakdown("eager", top=5))
        """
        row = self[strategy]
        items = list(row.by_module.items())
        shown = items[:top]
        width = max([len(n or "(root)") for n, _ in shown] + [6])
        lines = [f"activations by module, {row.strategy} (total {format_bytes(row.activation_bytes)}):"]
        lines += [f"  {(n or '(root)'):<{width}}  {format_bytes(b):>11}" for n, b in shown]
        if len(items) > len(shown):
            rest = sum(b for _, b in items[top:])
            lines.append(f"  {'... ' + str(len(items) - top) + ' more':<{width}}  {format_bytes(rest):>11}")
        return "\n".join(lines)

    # --------------------------------------------------------------------------- data
    def to_dict(self) -> Dict[str, Any]:
        """Plain-data form: ``{"device", "steps", "info", "rows": [...]}``."""
        return {"device": self.device, "steps": self.steps, "info": self.info, "rows": [asdict(r) for r in self.rows]}

    def to_json(self, path: Optional[str] = None, indent: int = 2) -> str:
        """The comparison as JSON (written to ``path`` too when given).

        Example:
            >>> Comparison.from_json(result.to_json()).rows == result.rows
            True
        """
        text = json.dumps(self.to_dict(), indent=indent)
        if path is not None:
            with open(path, "w") as f:
                f.write(text + "\n")
        return text

    @classmethod
    def from_json(cls, text: str) -> "Comparison":
        """Rebuild a :class:`Comparison` from :meth:`to_json` output."""
        data = json.loads(text)
        rows = [ComparisonRow(**r) for r in data["rows"]]
        return cls(rows, data["device"], data["steps"], data.get("info"))

    def to_dataframe(self) -> Any:
        """A pandas DataFrame, one row per strategy (indexed by name); needs pandas.

        Raises:
            ImportError: pandas is not installed.
        """
        try:
            import pandas as pd
        except ImportError as e:
            raise ImportError("Comparison.to_dataframe needs pandas: pip install pandas") from e
        records = []
        for r in self.rows:
            d = asdict(r)
            d.pop("by_module")
            d["peak_ratio"] = r.peak_bytes / self.eager.peak_bytes if self.eager.peak_bytes else float("nan")
            records.append(d)
        return pd.DataFrame.from_records(records).set_index("strategy")

    def plot(self, figsize: Tuple[float, float] = (9.0, 3.6)) -> Any:
        """One matplotlib figure: peak memory (MiB) and step-time ratio to eager, one bar per strategy.

        Returns:
            the ``matplotlib.figure.Figure`` (notebooks display it; save it with ``fig.savefig("x.png")``).

        Raises:
            ImportError: matplotlib is not installed.
        """
        try:
            from matplotlib.figure import Figure
        except ImportError as e:
            raise ImportError("Comparison.plot needs matplotlib: pip install matplotlib") from e
        names = [r.strategy for r in self.rows]
        fig = Figure(figsize=figsize, layout="constrained")
        ax_mem, ax_time = fig.subplots(1, 2)
        ys = list(range(len(names)))[::-1]
        mib = [r.peak_bytes / 2**20 for r in self.rows]
        colors = [
            "#7f7f7f" if n == "eager" else ("#1f77b4" if r.lossless else "#ff7f0e") for n, r in zip(names, self.rows)
        ]
        ax_mem.barh(ys, mib, color=colors)
        ax_mem.set_yticks(ys, names)
        ax_mem.set_xlabel("peak memory of a step (MiB)")
        ax_mem.axvline(mib[0], color="#7f7f7f", lw=0.8, ls="--")
        for y, v in zip(ys, mib):
            ax_mem.text(v, y, f" {v:.0f}", va="center", fontsize=8)
        ratios = [r.time_ratio for r in self.rows]
        ax_time.barh(ys, ratios, color=colors)
        ax_time.set_yticks(ys, [""] * len(ys))
        ax_time.set_xlabel("step time / eager")
        ax_time.axvline(1.0, color="#7f7f7f", lw=0.8, ls="--")
        for y, v in zip(ys, ratios):
            ax_time.text(v, y, f" {v:.2f}x", va="center", fontsize=8)
        ax_mem.set_xlim(0, max(mib) * 1.2 if max(mib) > 0 else 1)
        ax_time.set_xlim(0, max(ratios) * 1.25 if ratios and max(ratios) > 0 else 1)
        fig.suptitle(f"memsave.compare on {self.device} (orange: lossy)", fontsize=10)
        return fig


# ----------------------------------------------------------------------------------------------------------- compare
def _param_grads(model: nn.Module) -> Dict[str, Optional[torch.Tensor]]:
    """Gradients by state_dict key (stable under wrap and convert), detached."""
    out: Dict[str, Optional[torch.Tensor]] = {}
    for key, v in model.state_dict(keep_vars=True).items():
        if isinstance(v, nn.Parameter) and v.requires_grad:
            out[key] = None if v.grad is None else v.grad.detach().clone()
    return out


def _max_grad_diff(ref: Dict[str, Optional[torch.Tensor]], got: Dict[str, Optional[torch.Tensor]], name: str) -> float:
    if set(ref) != set(got):
        missing = sorted(set(ref) ^ set(got))
        raise RuntimeError(
            f"compare: strategy {name!r} changed the model's parameter names ({', '.join(missing[:5])}); "
            "strategies must keep the state_dict keys"
        )
    worst = 0.0
    for key, g_ref in ref.items():
        g = got[key]
        if g_ref is None and g is None:
            continue
        if g_ref is None or g is None:
            return float("inf")
        if g.shape != g_ref.shape:
            return float("inf")
        if torch.equal(g, g_ref):
            continue
        worst = max(worst, float((g.double() - g_ref.to(g.device).double()).abs().max()))
    return worst


def compare(
    model: nn.Module,
    *inputs: Any,
    strategies: Sequence[Union[str, Strategy]] = ("eager", "checkpoint:blocks"),
    loss_fn: Optional[LossFn] = None,
    steps: int = 5,
    warmup: int = 1,
    progress: bool = False,
    snapshot_dir: Optional[str] = None,
) -> Comparison:
    """Measure a training step of ``model`` under each strategy and compare it with eager.

    Every strategy runs on a fresh ``copy.deepcopy`` of ``model``; ``model`` itself, its gradients, its buffers and
    the RNG states (CPU and initialised CUDA devices) are as they were when this returns. Eager is always measured
    (first row), since times are ratios to eager from the same run. For each strategy: one step from the RNG state
    at the call gives the gradients compared with eager's (so dropout draws the same masks), then
    :func:`memsave.measure` (``warmup`` + ``steps`` timed steps, one step for the peak, one under the tracker).

    Args:
        model: the model; its parameters, buffers and tensor inputs must be on one device.
        *inputs: positional arguments of ``model``.
        strategies: names (see the module docstring) or parsed :class:`Strategy` objects.
        loss_fn: output -> scalar loss; default :func:`memsave.measurement.default_loss`.
        steps: timed steps per strategy (median).
        warmup: untimed steps per strategy before timing.
        progress: show a tqdm progress bar over the strategies.
        snapshot_dir: CUDA only: write a memory snapshot of one step per strategy there
            (``<dir>/<strategy>.pickle``, open it at https://pytorch.org/memory_viz).

    Returns:
        a :class:`Comparison`.

    Raises:
        ValueError: an unknown strategy (the message lists the valid ones), model and inputs on different devices,
            ``steps`` < 1, or ``snapshot_dir`` on a device other than CUDA.
        StrategyUnavailableError: a strategy needs a memsave module this build lacks (checked before any run).

    Example:
        >>> result = memsave.compare(model, x, strategies=["eager", "checkpoint:blocks", "convert"])
        >>> print(result)            # or just `result` as the last line of a notebook cell
        >>> fig = result.plot()
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"compare: model must be an nn.Module, got {type(model).__name__}")
    loss_fn = resolve_loss_fn(loss_fn, "compare")
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"compare: steps must be an int >= 1, got {steps!r}")
    if isinstance(strategies, (str, Strategy)):
        strategies = [strategies]
    parsed = [parse_strategy(s) for s in strategies]
    if not parsed or parsed[0].name != "eager":
        parsed = [parse_strategy("eager")] + [s for s in parsed if s.name != "eager"]
    parsed = list({s.name: s for s in parsed}.values())
    for s in parsed:
        s.check_available()
    try:
        dev = resolve_device(model, inputs, None)
    except ValueError as e:
        raise ValueError(str(e).replace("measure:", "compare:", 1)) from None
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(
            f"compare: the model is on {dev}; compare runs steps for real, on 'cpu' or 'cuda' "
            "(for a model on the meta device use memsave.estimate)"
        )
    if snapshot_dir is not None and dev.type != "cuda":
        raise ValueError(
            f"compare: snapshot_dir needs CUDA (memory snapshots are a CUDA allocator feature); the model is on {dev}"
        )

    rng = RngState()
    ctx = StrategyContext(tuple(inputs), loss_fn, dev)
    rows: List[ComparisonRow] = []
    ref_grads: Dict[str, Optional[torch.Tensor]] = {}
    eager_seconds = 1.0
    bar = progress_bar(len(parsed), "memsave.compare", unit="strategy") if progress else None
    try:
        for s in parsed:
            if bar is not None:
                bar.set_postfix_str(s.name)
            rng.restore()
            work = copy.deepcopy(model)
            for p in work.parameters():
                p.grad = None
            runner = s.prepare(work, ctx)
            # The gradient step starts from the caller's RNG state, as eager's did.
            rng.restore()
            loss_fn(runner(*inputs)).backward()
            grads = _param_grads(work)
            for p in runner.parameters():
                p.grad = None
            if s.name == "eager":
                ref_grads = grads
                diff = 0.0
            else:
                diff = _max_grad_diff(ref_grads, grads, s.name)
            del grads
            rng.restore()
            m: Measurement = measure(runner, *inputs, loss_fn=loss_fn, steps=steps, warmup=warmup, device=dev)
            snap = None
            if snapshot_dir is not None:
                from .monitor import cuda_memory_snapshot

                os.makedirs(snapshot_dir, exist_ok=True)
                snap = os.path.join(snapshot_dir, re.sub(r"[^A-Za-z0-9_.%+-]", "_", s.name) + ".pickle")
                with cuda_memory_snapshot(snap):
                    loss_fn(runner(*inputs)).backward()
                for p in runner.parameters():
                    p.grad = None
            if s.name == "eager":
                eager_seconds = m.step_seconds
            rows.append(
                ComparisonRow(
                    strategy=s.name,
                    peak_bytes=m.peak_bytes,
                    activation_bytes=m.activation_bytes,
                    step_seconds=m.step_seconds,
                    time_ratio=m.step_seconds / eager_seconds if eager_seconds > 0 else float("nan"),
                    max_grad_diff=diff,
                    lossless=s.lossless,
                    reserved_bytes=m.reserved_bytes,
                    by_module=strip_runner_prefix(m.by_module, runner),
                    snapshot=snap,
                )
            )
            del runner, work
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
        rng.restore()

    info: Dict[str, Any] = {
        "model": type(model).__name__,
        "inputs": [list(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__ for t in inputs],
        "torch": torch.__version__,
    }
    if dev.type == "cuda":
        info["cuda_device"] = torch.cuda.get_device_name(dev)
        info["cuda"] = torch.version.cuda
    for r in rows:
        if r.lossless and r.max_grad_diff != 0.0 and dev.type == "cpu":
            warnings.warn(
                f"compare: strategy {r.strategy!r} is declared lossless but its gradients differ from eager's by "
                f"up to {r.max_grad_diff:.3g}",
                RuntimeWarning,
                stacklevel=2,
            )
    return Comparison(rows, str(dev), steps, info)
