"""Eager vs. every memory-saving strategy, in one table: :func:`compare` and :class:`Comparison`.

Strategies are named by strings (``"eager"``, ``"checkpoint:blocks"``, ``"plan:50%"``, ``"convert"``,
``"amp:bf16"``, combined with ``+``); see :mod:`memsave.measurement.strategies` for the list and how to add one.
Memory is taken as :func:`memsave.measure` takes it, on a fresh deep copy of the model per strategy; the step times
of all strategies are taken together, interleaved over rounds (:mod:`memsave.measurement.timing`), and shown as
median and spread (IQR). The gradient and buffer columns compare one step from the same RNG state with eager's.
"""

from __future__ import annotations

import copy
import dataclasses
import html
import json
import os
import re
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import torch
from torch import nn

from ..common.progress import progress_bar
from ..common.rng import RngState
from ..errors import MemsaveWarning
from .measuring import LossFn, StepMemory, checked_loss_fn, measure_memory, resolve_device, resolve_loss_fn
from .strategies import Strategy, StrategyContext, parse_strategy, strategy_from_callable, strip_runner_prefix
from .timing import Timing, spread_warning, time_interleaved
from .units import format_bytes

__all__ = ["Comparison", "ComparisonRow", "compare", "parse_strategies"]


@dataclass
class ComparisonRow:
    """One strategy's numbers in a :class:`Comparison`.

    Attributes:
        strategy: canonical strategy name.
        peak_bytes: peak memory of a training step above what was allocated before it (see :func:`memsave.measure`).
        activation_bytes: bytes created in forward and alive at its end.
        step_seconds: median step time over the interleaved rounds.
        time_ratio: median over rounds of (this step time / eager's in the same round).
        max_grad_diff: max |grad - eager grad| over all parameters (0.0 means bitwise equal).
        lossless: the strategy promises bitwise-equal gradients.
        reserved_bytes: CUDA only: ``max_memory_reserved()`` during the measured step.
        by_module: activation bytes per module at the end of forward, largest first.
        snapshot: path of the CUDA memory snapshot written for this strategy, if any.
        step_iqr_seconds: inter-quartile range of the step time over the rounds.
        time_ratio_iqr: inter-quartile range of the per-round time ratios.
        buffers_equal: the buffers (BatchNorm statistics) after one step equal eager's; None when unknown.
        error: why the strategy could not run on the model (``compare(..., on_error="row")``); its numbers are then
            0 / NaN.
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
    step_iqr_seconds: float = 0.0
    time_ratio_iqr: float = 0.0
    buffers_equal: Optional[bool] = None
    error: Optional[str] = None


_COLUMNS = ("strategy", "peak", "vs eager", "activations", "step (IQR)", "time x (IQR)", "max |dgrad|", "reserved")


class Comparison:
    """The result of :func:`compare`: one :class:`ComparisonRow` per strategy, eager first.

    Shows itself as an HTML table in notebooks, as an aligned text table with ``str()``; ``plot()`` draws peak
    memory and time ratio per strategy; ``to_json()``/``from_json()`` round-trip; ``to_dataframe()`` needs pandas.

    Attributes:
        rows: the rows, eager first.
        device: where the steps ran.
        steps: interleaved timing rounds timed (each row's median and IQR are over them); ``compare`` times more
            than it was asked for while a ratio's median is uncertain.
        info: free-form facts (torch version, CUDA device name, model class, input shapes).

    Examples:
        >>> result = memsave.compare(model, x, strategies=["checkpoint:blocks", "plan:50%"])
        >>> print(result)                                         # one row per strategy, eager first
        >>> result["checkpoint:blocks"].peak_bytes / result["eager"].peak_bytes
        >>> fig = result.plot(); fig.savefig("compare.png")
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
        if r.error is not None:
            return [r.strategy, "error"] + [""] * (len(self._header()) - 2)
        eager_peak = self.eager.peak_bytes
        rel = "-" if r.strategy == "eager" or not eager_peak else f"{100.0 * (r.peak_bytes / eager_peak - 1):+.1f}%"
        grad = "0" if r.max_grad_diff == 0 else f"{r.max_grad_diff:.2e}"
        cells = [
            r.strategy,
            format_bytes(r.peak_bytes),
            rel,
            format_bytes(r.activation_bytes),
            f"{r.step_seconds * 1e3:.1f} ms ({r.step_iqr_seconds * 1e3:.1f})",
            f"{r.time_ratio:.2f} ({r.time_ratio_iqr:.2f})",
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

        lines = [self._title(), line(header), "  ".join("-" * w for w in widths)] + [line(b) for b in body]
        lines += [f"  {r.strategy}: {r.error}" for r in self.rows if r.error is not None]
        lines += [f"  {note}" for note in self.notes()]
        return "\n".join(lines)

    def notes(self) -> List[str]:
        """What the table shows that a reader may miss: each strategy whose peak is above eager's.

        Examples:
            >>> memsave.compare(cnn, x, strategies=["checkpoint:all"]).notes()
            ['checkpoint:all raises the peak above eager's (+21.0%): it costs memory on this model; ...']
        """
        eager_peak = self.eager.peak_bytes
        return [
            f"{r.strategy} raises the peak above eager's (+{100.0 * (r.peak_bytes / eager_peak - 1):.1f}%): it costs "
            "memory on this model (regions too small to pay for what recompute keeps); try checkpoint:blocks or a "
            "memsave.plan budget"
            for r in self.rows
            if r.error is None and r.strategy != "eager" and eager_peak and r.peak_bytes > eager_peak
        ]

    def _title(self) -> str:
        return (
            f"memsave.compare on {self.device}: step time median (IQR) over {self.steps} interleaved rounds; "
            "time x = median of per-round ratios to eager"
        )

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
        errors = "".join(
            f"<p><code>{html.escape(r.strategy)}</code>: {html.escape(r.error)}</p>" for r in self.rows if r.error
        )
        errors += "".join(f"<p>{html.escape(note)}</p>" for note in self.notes())
        return f"<table><caption>{html.escape(self._title())}</caption><tr>{header}</tr>{body}</table>{errors}"

    def breakdown(self, strategy: str = "eager", top: int = 10) -> str:
        """Text table of a row's activation bytes per module at the end of forward (the largest ``top``).

        Examples:
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

        Examples:
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

    def plot(self, figsize: Tuple[float, float] = (10.0, 3.8)) -> Any:
        """One matplotlib figure: peak and activation bytes per strategy (labelled in readable units), and the
        step-time ratio to eager with its IQR as an error bar; a legend names the bars. Rows with an error are left
        out.

        The figure is pyplot's current one, as if made by ``plt.figure()``: ``plt.savefig(path)`` or ``plt.show()``
        right after ``table.plot()`` see it. In a notebook (IPython's inline backend) the cell shows it once.

        Returns:
            the ``matplotlib.figure.Figure`` (notebooks display it; save it with ``fig.savefig("x.png")`` or
            ``plt.savefig("x.png")``).

        Raises:
            ImportError: matplotlib is not installed.

        Examples:
            >>> fig = memsave.compare(model, x).plot(); fig.savefig("compare.png")
            >>> table.plot(); plt.savefig("compare.png")     # the same figure, through pyplot
        """
        try:
            from matplotlib.patches import Patch
            from matplotlib.ticker import MaxNLocator
        except ImportError as e:
            raise ImportError("Comparison.plot needs matplotlib: pip install matplotlib") from e
        rows = [r for r in self.rows if r.error is None]
        names = [r.strategy for r in rows]
        fig = _pyplot_figure(figsize)
        ax_mem, ax_time = fig.subplots(1, 2)
        ys = list(range(len(names)))[::-1]
        h = 0.38
        colors = ["#7f7f7f" if r.strategy == "eager" else ("#1f77b4" if r.lossless else "#ff7f0e") for r in rows]
        peaks = [r.peak_bytes for r in rows]
        acts = [r.activation_bytes for r in rows]
        ax_mem.barh([y + h / 2 for y in ys], peaks, height=h, color=colors)
        ax_mem.barh([y - h / 2 for y in ys], acts, height=h, color=colors, alpha=0.45, hatch="//")
        for y, p, a in zip(ys, peaks, acts):
            ax_mem.text(p, y + h / 2, " " + format_bytes(p), va="center", fontsize=7)
            ax_mem.text(a, y - h / 2, " " + format_bytes(a), va="center", fontsize=7)
        ax_mem.set_yticks(ys, names)
        ax_mem.set_xlabel("bytes of one training step")
        ax_mem.xaxis.set_major_locator(MaxNLocator(3))
        ax_mem.xaxis.set_major_formatter(lambda v, _: format_bytes(int(v)) if v > 0 else "0")
        ax_mem.set_xlim(0, max(peaks + acts + [1]) * 1.35)
        ratios = [r.time_ratio for r in rows]
        ax_time.barh(ys, ratios, color=colors, xerr=[r.time_ratio_iqr / 2 for r in rows], capsize=3)
        ax_time.set_yticks(ys, [""] * len(ys))
        ax_time.set_xlabel(f"step time / eager (median of {self.steps} rounds, bar: IQR)")
        ax_time.axvline(1.0, color="#7f7f7f", lw=0.8, ls="--")
        for y, v in zip(ys, ratios):
            ax_time.text(v, y, f"  {v:.2f}x", va="center", fontsize=8)
        ax_time.set_xlim(0, max(ratios + [1.0]) * 1.3)
        legend = [
            Patch(color="#7f7f7f", label="peak bytes"),
            Patch(facecolor="#7f7f7f", alpha=0.45, hatch="//", label="activation bytes"),
            Patch(color="#7f7f7f", label="eager"),
            Patch(color="#1f77b4", label="lossless strategy"),
            Patch(color="#ff7f0e", label="lossy strategy"),
        ]
        ax_mem.legend(handles=legend[:2], loc="lower right", fontsize=7)
        ax_time.legend(handles=legend[2:], loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=3, fontsize=7)
        fig.suptitle(f"memsave.compare on {self.device}", fontsize=10)
        return fig


def _pyplot_figure(figsize: Tuple[float, float]) -> Any:
    """A new figure that pyplot manages and makes current (``plt.savefig`` / ``plt.show`` see it), for a plot method
    that returns it.

    Under IPython's inline backend the cell displays the returned figure, and pyplot would display it a second time
    when the cell ends: there it is made with interactive mode off (not queued for that display) and closed once the
    cell has run, as the inline backend closes its own figures.

    Returns the ``matplotlib.figure.Figure`` (``figsize`` in inches), pyplot's current figure.
    """
    import matplotlib
    import matplotlib.pyplot as plt

    if "inline" not in str(matplotlib.get_backend()):
        return plt.figure(figsize=figsize, layout="constrained")
    with plt.ioff():
        fig = plt.figure(figsize=figsize, layout="constrained")
    try:
        from IPython import get_ipython
    except ImportError:  # the inline backend outside IPython: nothing displays it twice
        return fig
    shell = get_ipython()
    if shell is not None:

        def close_after_the_cell() -> None:
            shell.events.unregister("post_execute", close_after_the_cell)
            plt.close(fig)

        shell.events.register("post_execute", close_after_the_cell)
    return fig


# ----------------------------------------------------------------------------------------------------------- compare
def _param_grads(model: nn.Module) -> Dict[str, Optional[torch.Tensor]]:
    """Gradients by state_dict key (stable under wrap and convert), detached."""
    out: Dict[str, Optional[torch.Tensor]] = {}
    for key, v in model.state_dict(keep_vars=True).items():
        if isinstance(v, nn.Parameter) and v.requires_grad:
            out[key] = None if v.grad is None else v.grad.detach().clone()
    return out


def _buffers(model: nn.Module) -> Dict[str, torch.Tensor]:
    """Buffers by state_dict key, copied (BatchNorm statistics after the gradient step)."""
    return {
        k: v.detach().clone()
        for k, v in model.state_dict(keep_vars=True).items()
        if isinstance(v, torch.Tensor) and not isinstance(v, nn.Parameter)
    }


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


def _buffers_equal(ref: Dict[str, torch.Tensor], got: Dict[str, torch.Tensor]) -> bool:
    return set(ref) == set(got) and all(
        got[k].shape == v.shape and torch.equal(got[k], v.to(got[k].device)) for k, v in ref.items()
    )


StrategySpec = Union[str, Strategy]
Strategies = Union[StrategySpec, Sequence[StrategySpec], Mapping[str, Union[StrategySpec, Callable[[nn.Module], Any]]]]


def parse_strategies(strategies: Strategies) -> List[Strategy]:
    """The strategies :func:`compare` runs, eager first and each once: names, parsed :class:`Strategy` objects, or a
    mapping ``{name: fn(model) -> model | strategy name}``.

    Raises:
        ValueError: an unknown strategy name (the message lists the valid ones), or a mapping's name that is a
            registered strategy's.
        TypeError: an entry that is neither a name, a :class:`Strategy` nor (in a mapping) a callable.

    Examples:
        >>> [s.name for s in parse_strategies({"hf": lambda m: m, "wrap": "checkpoint:blocks"})]
        ['eager', 'hf', 'checkpoint:blocks']
    """
    if isinstance(strategies, (str, Strategy)):
        strategies = [strategies]
    if not isinstance(strategies, Iterable):
        raise TypeError(
            f"compare: strategies must be a list of strategy names (e.g. ['eager', 'checkpoint:blocks']) or a dict "
            f"{{name: fn(model) -> model}}, got {type(strategies).__name__}"
        )
    parsed: List[Strategy] = []
    if isinstance(strategies, Mapping):
        for name, entry in strategies.items():
            if isinstance(entry, (str, Strategy)):
                parsed.append(_named(name, parse_strategy(entry)))
            else:
                parsed.append(strategy_from_callable(name, entry))
    else:
        parsed = [parse_strategy(s) for s in strategies]
    if not parsed or parsed[0].name != "eager":
        parsed = [parse_strategy("eager")] + [s for s in parsed if s.name != "eager"]
    parsed = list({s.name: s for s in parsed}.values())
    return parsed


def _named(name: str, strategy: Strategy) -> Strategy:
    """``strategy`` shown under the mapping's row name ``name`` (``{"per block": "checkpoint:blocks"}``)."""
    if name == strategy.name or strategy.is_eager:
        return strategy
    try:
        taken = parse_strategy(name)
    except ValueError:
        return dataclasses.replace(strategy, name=name)
    raise ValueError(
        f"compare: row name {name!r} is the registered strategy {taken.name!r}, but it maps to {strategy.name!r}; "
        f"name the row otherwise (e.g. {name + ' (' + strategy.name + ')'!r})"
    )


@dataclass
class _Variant:
    """One strategy's prepared runner, its gradient check, and its error if it failed."""

    strategy: Strategy
    runner: Optional[nn.Module] = None
    max_grad_diff: float = float("nan")
    buffers_equal: Optional[bool] = None
    error: Optional[str] = None


def _compare_device(model: nn.Module, inputs: Any, snapshot_dir: Optional[str]) -> torch.device:
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
    return dev


def _prepare(
    s: Strategy, model: nn.Module, ctx: StrategyContext, rng: RngState, ref: Optional[_Variant], refs: Dict[str, Any]
) -> _Variant:
    """A fresh copy of ``model`` under ``s``, stepped once from the caller's RNG state: gradients and buffers
    against eager's (``refs``, filled by the eager variant)."""
    rng.restore()
    work = copy.deepcopy(model)
    for p in work.parameters():
        p.grad = None
    runner = s.prepare(work, ctx)
    rng.restore()  # the gradient step starts from the caller's RNG state, as eager's did
    ctx.loss_fn(runner(*ctx.inputs, **ctx.kwargs)).backward()
    grads, buffers = _param_grads(work), _buffers(work)
    for p in runner.parameters():
        p.grad = None
    if ref is None:
        refs.update(grads=grads, buffers=buffers)
        return _Variant(s, runner, 0.0, True)
    return _Variant(s, runner, _max_grad_diff(refs["grads"], grads, s.name), _buffers_equal(refs["buffers"], buffers))


def _snapshot(snapshot_dir: str, v: _Variant, ctx: StrategyContext) -> str:
    from .monitor import cuda_memory_snapshot

    assert v.runner is not None
    os.makedirs(snapshot_dir, exist_ok=True)
    path = os.path.join(snapshot_dir, re.sub(r"[^A-Za-z0-9_.%+-]", "_", v.strategy.name) + ".pickle")
    with cuda_memory_snapshot(path):
        ctx.loss_fn(v.runner(*ctx.inputs, **ctx.kwargs)).backward()
    for p in v.runner.parameters():
        p.grad = None
    return path


def _step_fn(runner: nn.Module, ctx: StrategyContext) -> Callable[[], None]:
    params = list(runner.parameters())

    def step() -> None:
        for p in params:
            p.grad = None
        ctx.loss_fn(runner(*ctx.inputs, **ctx.kwargs)).backward()

    return step


def _error_row(v: _Variant) -> ComparisonRow:
    nan = float("nan")
    return ComparisonRow(v.strategy.name, 0, 0, nan, nan, nan, v.strategy.lossless, error=v.error)


def _rows(
    variants: List[_Variant], ctx: StrategyContext, steps: int, warmup: int, snapshot_dir: Optional[str], bar: Any
) -> Tuple[List[ComparisonRow], List[Timing]]:
    """Memory of each prepared variant, then their step times interleaved over ``steps`` rounds."""
    ok = [v for v in variants if v.error is None]
    memory: Dict[str, StepMemory] = {}
    snaps: Dict[str, str] = {}
    for v in ok:
        assert v.runner is not None
        if bar is not None:
            bar.set_postfix_str(f"memory: {v.strategy.name}")
        memory[v.strategy.name] = measure_memory(v.runner, ctx.inputs, ctx.kwargs, ctx.loss_fn, ctx.device)
        if snapshot_dir is not None:
            snaps[v.strategy.name] = _snapshot(snapshot_dir, v, ctx)
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.set_postfix_str(f"timing, {steps}+ interleaved rounds")
    timings = time_interleaved(
        {v.strategy.name: _step_fn(v.runner, ctx) for v in ok if v.runner is not None}, rounds=steps, warmup=warmup
    )
    rows: List[ComparisonRow] = []
    for v in variants:
        if v.error is not None:
            rows.append(_error_row(v))
            continue
        m, t, runner = memory[v.strategy.name], timings[v.strategy.name], v.runner
        assert runner is not None
        rows.append(
            ComparisonRow(
                strategy=v.strategy.name,
                peak_bytes=m.peak_bytes,
                activation_bytes=m.activation_bytes,
                step_seconds=t.median_seconds,
                time_ratio=t.ratio,
                max_grad_diff=v.max_grad_diff,
                lossless=v.strategy.lossless,
                reserved_bytes=m.reserved_bytes,
                by_module=strip_runner_prefix(m.by_module, runner),
                snapshot=snaps.get(v.strategy.name),
                step_iqr_seconds=t.iqr_seconds,
                time_ratio_iqr=t.ratio_iqr,
                buffers_equal=v.buffers_equal,
            )
        )
    return rows, list(timings.values())


def compare(
    model: nn.Module,
    *inputs: Any,
    strategies: Strategies = ("eager", "checkpoint:blocks"),
    loss_fn: Optional[LossFn] = None,
    steps: int = 5,
    warmup: int = 1,
    progress: Optional[bool] = None,
    snapshot_dir: Optional[str] = None,
    on_error: str = "raise",
    **model_kwargs: Any,
) -> Comparison:
    """Measure a training step of ``model`` under each strategy and compare it with eager.

    Every strategy runs on a fresh ``copy.deepcopy`` of ``model``; ``model`` itself, its gradients, its buffers and
    the RNG states (CPU and initialised CUDA devices) are as they were when this returns. Eager is always measured
    (first row), since times are ratios to eager from the same run. First every strategy is prepared and stepped once
    from the RNG state at the call (gradients and buffers compared with eager's, so dropout draws the same masks);
    then each one's peak and activation bytes (as :func:`memsave.measure`); then all of them are timed together,
    interleaved over ``steps`` rounds (:func:`memsave.measurement.timing.time_interleaved`): each row has the median
    step time and its IQR, and the ratio to eager is the median of the per-round ratios. All prepared copies are
    alive during the timing.

    Args:
        model: the model; its parameters, buffers and tensor inputs must be on one device.
        *inputs: positional arguments of ``model``.
        strategies: names (see the module docstring), parsed :class:`Strategy` objects, or a mapping ``{row name:
            fn(model copy) -> module to step}`` (strategy names are allowed as values too) to compare your own
            switches (timm's ``set_grad_checkpointing``, Hugging Face's ``activation_checkpointing_enable``).
        loss_fn: output -> scalar loss; default :func:`memsave.measurement.default_loss`.
        steps: the fewest interleaved timing rounds (median and IQR over them); while a ratio's median is still
            uncertain on a busy machine, up to ``4 * steps`` are timed (``Comparison.steps`` says how many).
        warmup: untimed steps per strategy before timing.
        progress: a progress bar (stderr, erased at the end) while the comparison takes over a second; None:
            unless the environment variable ``MEMSAVE_PROGRESS=0`` turns it off.
        snapshot_dir: CUDA only: write a memory snapshot of one step per strategy there
            (``<dir>/<strategy>.pickle``, open it at https://pytorch.org/memory_viz).
        on_error: ``"raise"`` (default): a strategy that fails on the model raises; ``"row"``: it gets a row with
            its error (``row.error``) and the others are measured. Eager failing always raises.
        **model_kwargs: keyword arguments of ``model`` (``labels=ids``).

    Returns:
        a :class:`Comparison`.

    Raises:
        ValueError: an unknown strategy (the message lists the valid ones), model and inputs on different devices,
            ``steps`` < 1, ``on_error`` not "raise" or "row", or ``snapshot_dir`` on a device other than CUDA.

    Warns:
        MemsaveWarning: the step times of a strategy spread over 10% of their median (the ratios are uncertain).
        RuntimeWarning: a strategy declared lossless gives gradients other than eager's (CPU).

    Examples:
        >>> result = memsave.compare(model, x, strategies=["eager", "checkpoint:blocks", "convert"])
        >>> print(result)            # or just `result` as the last line of a notebook cell
        >>> memsave.compare(lm, ids, labels=ids, strategies={"hf": lambda m: m.activation_checkpointing_enable() or m})
        >>> fig = result.plot()
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"compare: model must be an nn.Module, got {type(model).__name__}")
    loss_fn = checked_loss_fn(resolve_loss_fn(loss_fn, "compare"), "compare")
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"compare: steps must be an int >= 1, got {steps!r}")
    if on_error not in ("raise", "row"):
        raise ValueError(f"compare: on_error must be 'raise' or 'row', got {on_error!r}")
    parsed = parse_strategies(strategies)
    dev = _compare_device(model, (inputs, model_kwargs), snapshot_dir)
    rng = RngState()
    ctx = StrategyContext(tuple(inputs), loss_fn, dev, kwargs=dict(model_kwargs))
    bar = progress_bar(2 * len(parsed), "memsave.compare", unit="step", progress=progress)
    variants: List[_Variant] = []
    refs: Dict[str, Any] = {}
    try:
        for s in parsed:
            if bar is not None:
                bar.set_postfix_str(f"preparing {s.name}")
            try:
                variants.append(_prepare(s, model, ctx, rng, variants[0] if variants else None, refs))
            except Exception as e:
                if on_error == "raise" or s.is_eager:
                    raise
                variants.append(_Variant(s, error=f"{type(e).__name__}: {_first_line(e)}"))
            if bar is not None:
                bar.update(1)
        rng.restore()
        rows, timings = _rows(variants, ctx, steps, warmup, snapshot_dir, bar)
    finally:
        if bar is not None:
            bar.close()
        rng.restore()
    _warn(rows, timings, dev)
    rounds = max((t.rounds for t in timings), default=steps)
    return Comparison(rows, str(dev), rounds, _info(model, inputs, model_kwargs, dev))


def _first_line(e: BaseException) -> str:
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return lines[0] if lines else "(no message)"


def _info(model: nn.Module, inputs: Sequence[Any], kwargs: Dict[str, Any], dev: torch.device) -> Dict[str, Any]:
    def shape(t: Any) -> Any:
        return list(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__

    info: Dict[str, Any] = {
        "model": type(model).__name__,
        "inputs": [shape(t) for t in inputs],
        "torch": torch.__version__,
    }
    if kwargs:
        info["keyword_inputs"] = {k: shape(v) for k, v in kwargs.items()}
    if dev.type == "cuda":
        info["cuda_device"] = torch.cuda.get_device_name(dev)
        info["cuda"] = torch.version.cuda
    return info


def _warn(rows: List[ComparisonRow], timings: List[Timing], dev: torch.device) -> None:
    message = spread_warning(timings, "compare")
    if message:
        warnings.warn(message, MemsaveWarning, stacklevel=3)
    for r in rows[1:]:
        if r.error is None and rows[0].peak_bytes and r.peak_bytes > rows[0].peak_bytes:
            warnings.warn(
                f"compare: {r.strategy} raises the peak above eager's ({format_bytes(r.peak_bytes)} > "
                f"{format_bytes(rows[0].peak_bytes)}); see the table's note",
                MemsaveWarning,
                stacklevel=3,
            )
    for r in rows:
        if r.error is None and r.lossless and r.max_grad_diff != 0.0 and dev.type == "cpu":
            warnings.warn(
                f"compare: strategy {r.strategy!r} is declared lossless but its gradients differ from eager's by "
                f"up to {r.max_grad_diff:.3g}",
                RuntimeWarning,
                stacklevel=3,
            )
