"""Step 3 of a plan: the :class:`Plan` the solver chose, how it prints, saves and loads, and how it is applied.

A plan is applied in place: a region of one module is :func:`memsave.wrap`'s instance-level forward on that module;
a region of consecutive children of a plain ``nn.Sequential`` is :class:`_GroupedForward` on the Sequential (one
region per run of children). A selective region (:attr:`Plan.selective`) gets ``context_fn=memsave.selective(*its
classes)``. :func:`memsave.unwrap` removes both.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, ContextManager, Dict, List, Optional, Set, Tuple, cast

import torch
from torch import nn

from ...errors import PlanMismatchError
from ...measurement.units import format_bytes
from ..region import DEFAULT_OPTIONS, ModuleChain, RegionOptions, run_region
from ..selective import selective as selective_context
from ..wrapping import (
    CheckpointedForward,
    RegionPlan,
    WrappedRepr,
    _callable_key,
    install_once,
    is_wrapped,
    wrap_module,
)
from .chain import Chain, StageModules
from .partitioner import compile_at, partitioner_context
from .plan_json import PLAN_FORMAT, read_plan_fields

__all__ = ["Plan", "apply_plan", "apply_regions", "fingerprint"]


def fingerprint(model: nn.Module) -> str:
    """A short hash of the module names, classes and parameter shapes and dtypes: what a plan is tied to."""
    h = hashlib.sha256()
    for name, m in model.named_modules():
        h.update(f"m {name} {type(m).__name__}\n".encode())
    for name, p in model.named_parameters():
        h.update(f"p {name} {tuple(p.shape)} {p.dtype}\n".encode())
    return h.hexdigest()[:16]


@dataclass
class Plan(RegionPlan):
    """Which parts of a model to recompute in backward, and what that is predicted to cost and save.

    Made by :func:`plan`, applied with ``memsave.wrap(model, plan)``. A plan is tied to the model it was made for
    (module names, classes and parameter shapes); applying it to another raises :class:`PlanMismatchError`.

    Attributes:
        solver: the solver asked for (``optimal``, ``sqrt``, ``uniform:K``, ``none``, ``all``, ``min_memory``).
        budget_bytes: the budget in bytes (None when none was given).
        predicted_peak_bytes: the cost model's peak for one step with this plan.
        measured_peak_bytes: the peak measured with the plan applied (None when ``verify=False``).
        eager_peak_bytes: the measured peak of the plain model.
        min_feasible_bytes: the cost model's smallest peak over all plans.
        predicted_extra_seconds: predicted recompute time per step.
        eager_step_seconds: the sum of the profiled forward and backward time of one step.
        segments: ``(begin, end, recompute)`` over the stages (end exclusive).
        stage_modules: per stage: kind (module or glue), module names, the ``nn.Sequential`` parent when it has one.
        chain: the cost model the solver used (:class:`memsave.recompute.planning.chain.Chain`).
        selective: per segment, the operator classes (``"matmul"``, ``"conv"``, ``"attention"``) whose outputs the
            segment's region keeps, recomputing only the other operators (:func:`memsave.selective`); empty for a
            region recomputed whole and for a kept segment. An empty list (plans made with ``selective=False`` or
            before selective plans existed): every region is recomputed whole.
        compiled: made with ``compile=True``: the peaks (eager's included) are those of ``torch.compile`` running
            the model, and the budget is a promise for ``torch.compile(memsave.wrap(model, plan))``.
        activation_memory_budget: None, or the budget of torch's own recompute (the partitioner's
            ``torch._functorch.config.activation_memory_budget``) the compiled step was measured under: a
            ``compile=True`` plan may leave recompute to torch's partitioner where that is faster within the
            budget. Then the promise holds for :meth:`compile` (or for steps run under :meth:`compile_context`).
        planning_seconds: wall time :func:`memsave.plan` took to make the plan (for a plan from the plan cache:
            to find it there).
        cached: the plan came from the plan cache (:mod:`~memsave.recompute.planning.cache`), not from profiling
            this run; not part of the plan's JSON or of equality.

    Examples:
        >>> p = memsave.plan(model, x, budget=0.5)               # half of eager's peak
        >>> print(p.summary())
        >>> memsave.wrap(model, p)
        >>> text = p.to_json()                                   # plan once, reuse: memsave.Plan.from_json(text)
    """

    solver: str
    budget_bytes: Optional[int]
    predicted_peak_bytes: int
    measured_peak_bytes: Optional[int]
    eager_peak_bytes: int
    min_feasible_bytes: int
    predicted_extra_seconds: float
    eager_step_seconds: float
    segments: List[Tuple[int, int, bool]]
    stage_modules: List[StageModules]
    chain: Chain
    model_class: str
    fingerprint: str
    device: str = "cpu"
    selective: List[Tuple[str, ...]] = field(default_factory=list)
    compiled: bool = False
    planning_seconds: float = 0.0
    activation_memory_budget: Optional[float] = None
    cached: bool = field(default=False, compare=False)

    def keeps(self, k: int) -> Tuple[str, ...]:
        """The operator classes whose outputs segment ``k``'s region keeps (empty: recomputed whole, or kept).

        Examples:
            >>> [plan.keeps(k) for k in range(len(plan.segments))]
            [(), ('matmul', 'attention'), ()]
        """
        return tuple(self.selective[k]) if k < len(self.selective) else ()

    @property
    def strategy(self) -> str:
        """Deprecated old name of :attr:`solver` (DeprecationWarning)."""
        warnings.warn("Plan.strategy is deprecated; read Plan.solver (the same)", DeprecationWarning, stacklevel=2)
        return self.solver

    @property
    def predicted_overhead(self) -> float:
        """Predicted extra compute of a step as a fraction of the eager step's compute (0.2 = 20% more)."""
        return self.predicted_extra_seconds / self.eager_step_seconds if self.eager_step_seconds > 0 else 0.0

    def regions(self) -> List[List[str]]:
        """The checkpointed regions: each a list of the module names it runs, in order.

        Examples:
            >>> plan.regions()
            [['blocks.0'], ['features.0', 'features.1', 'features.2']]
        """
        out = []
        for b, e, rec in self.segments:
            if rec:
                out.append([m for i in range(b, e) for m in self.stage_modules[i].modules])
        return out

    def summary(self) -> str:
        """A table of the stages (module names, kept / recomputed / glue, bytes, time) and the totals.

        Examples:
            >>> print(plan.summary())
        """
        recomputed: Set[int] = set()
        for b, e, rec in self.segments:
            if rec:
                recomputed.update(range(b, e))
        region_of: Dict[int, int] = {}
        keeps: Dict[int, Tuple[str, ...]] = {}
        r = 0
        for k, (b, e, rec) in enumerate(self.segments):
            if rec:
                for i in range(b, e):
                    region_of[i] = r
                    keeps[i] = self.keeps(k)
                r += 1
        rows = []
        for i, (pc, st) in enumerate(zip(self.stage_modules, self.chain.stages)):
            if pc.kind == "glue":
                what = "glue"
            elif i in recomputed and keeps[i]:
                what = f"selective #{region_of[i]} (keeps {'+'.join(keeps[i])})"
            elif i in recomputed:
                what = f"recompute #{region_of[i]}"
            else:
                what = "kept"
            name = ", ".join(pc.modules) if pc.modules else "(code between modules)"
            held = st.saved_bytes + st.output_bytes
            rows.append(
                (
                    str(i),
                    name if len(name) <= 48 else name[:45] + "...",
                    what,
                    format_bytes(held),
                    f"{st.fwd_time * 1e3:.2f}",
                )
            )
        head = ("#", "modules", "plan", "held", "fwd ms")
        widths = [max(len(h), *(len(row[k]) for row in rows)) for k, h in enumerate(head)]
        fmt = "  ".join("{:<%d}" % w for w in widths)
        lines = [
            f"memsave plan for {self.model_class} ({self.solver}) on {self.device}: "
            f"{len(self.regions())} checkpointed region(s) ({sum(1 for c in self.selective if c)} selective) over "
            f"{len(self.stage_modules)} stages{' (from the plan cache)' if self.cached else ''}",
            f"  budget {format_bytes(self.budget_bytes)}, predicted peak {format_bytes(self.predicted_peak_bytes)}, "
            f"measured peak {format_bytes(self.measured_peak_bytes)}, eager peak "
            f"{format_bytes(self.eager_peak_bytes)}, smallest feasible {format_bytes(self.min_feasible_bytes)}",
            f"  predicted overhead {100 * self.predicted_overhead:.1f}% "
            f"({self.predicted_extra_seconds * 1e3:.2f} ms recompute per {self.eager_step_seconds * 1e3:.2f} ms step)",
        ]
        if self.activation_memory_budget is not None:
            lines.append(
                f"  torch's partitioner recomputes under activation_memory_budget {self.activation_memory_budget:g}: "
                "compile with plan.compile(model)"
            )
        lines += [
            fmt.format(*head),
        ]
        lines += [fmt.format(*row) for row in rows]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()

    def apply_to(self, model: nn.Module, *, preserve_rng_state: bool = True, strict: bool = False) -> nn.Module:
        """Checkpoint the plan's regions of ``model`` in place (what ``memsave.wrap(model, plan)`` calls); all or
        nothing: a plan that does not fit leaves the model as it was, applying it again is a no-op, and a model with
        other regions raises :class:`memsave.WrapConflictError` (as :func:`memsave.wrap` does)."""
        if not isinstance(model, nn.Module):
            raise TypeError(
                f"Plan.apply_to: model must be the nn.Module the plan was made for, got {type(model).__name__}"
            )
        options = RegionOptions.checked("Plan.apply_to", preserve_rng_state=preserve_rng_state, strict=strict)
        # As wrap: re-applying the plan is a no-op; other regions already in the model raise WrapConflictError.
        install_once(model, lambda: apply_plan(model, self, options), "memsave.wrap(model, plan)")
        return model

    def compile_context(self) -> ContextManager[Any]:
        """The configuration the plan's compiled step must be compiled under: torch's partitioner at
        :attr:`activation_memory_budget` when the plan sets one, else nothing.

        Examples:
            >>> step_model = torch.compile(memsave.wrap(model, plan))
            >>> with plan.compile_context():
            ...     loss_fn(step_model(x)).backward()     # the first call compiles
        """
        return partitioner_context(self.activation_memory_budget)

    def compile(self, model: nn.Module, **compile_kwargs: Any) -> nn.Module:
        """``torch.compile(memsave.wrap(model, plan), **compile_kwargs)``, with torch's partitioner at
        :attr:`activation_memory_budget` when the plan sets one: the compiled step the plan's budget is a promise
        for (``compile=True`` plans). The setting travels with the compiled module
        (:class:`~memsave.recompute.planning.partitioner.PartitionerBackend`), so its first call and any recompile
        use it wherever they run.

        Args:
            model: the model the plan was made for (not wrapped yet); its regions are applied in place.
            **compile_kwargs: passed to ``torch.compile`` (``mode=``, ``dynamic=``, ``backend=``, ...).

        Returns:
            the compiled module (``torch.compile``'s ``OptimizedModule``).

        Raises:
            PlanMismatchError, TypeError: as :meth:`apply_to`.
            ValueError: both ``mode=`` and ``options=`` (``torch.compile`` raises RuntimeError there for a plan
                without a partitioner budget); nothing is changed.

        Examples:
            >>> plan = memsave.plan(model, x, budget=0.5, compile=True)
            >>> step_model = plan.compile(model)
            >>> loss_fn(step_model(x)).backward()
        """
        # torch.compile only wraps (it compiles at the first call): bad arguments fail here, before the regions
        # change the model in place, and the compiled module sees them.
        if self.activation_memory_budget is None:
            compiled = cast(nn.Module, torch.compile(model, **compile_kwargs))
        else:
            compiled = compile_at(model, self.activation_memory_budget, **compile_kwargs)
        self.apply_to(model)
        return compiled

    def to_json(self) -> str:
        """Serialise the plan (a JSON string) so that :meth:`from_json` gives an equal plan.

        Examples:
            >>> s = plan.to_json(); memsave.Plan.from_json(s) == plan
            True
        """
        d = {
            "format": PLAN_FORMAT,
            "solver": self.solver,
            "budget_bytes": self.budget_bytes,
            "predicted_peak_bytes": self.predicted_peak_bytes,
            "measured_peak_bytes": self.measured_peak_bytes,
            "eager_peak_bytes": self.eager_peak_bytes,
            "min_feasible_bytes": self.min_feasible_bytes,
            "predicted_extra_seconds": self.predicted_extra_seconds,
            "eager_step_seconds": self.eager_step_seconds,
            "segments": [list(s) for s in self.segments],
            "stage_modules": [asdict(pc) for pc in self.stage_modules],
            "chain": self.chain.to_dict(),
            "model_class": self.model_class,
            "fingerprint": self.fingerprint,
            "device": self.device,
            "selective": [list(c) for c in self.selective],
            "compiled": self.compiled,
            "planning_seconds": self.planning_seconds,
            "activation_memory_budget": self.activation_memory_budget,
        }
        return json.dumps(d, indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, s: str) -> "Plan":
        """Read a plan written by :meth:`to_json`.

        Args:
            s: the JSON text.

        Returns:
            the :class:`Plan`.

        Raises:
            ValueError: the text is not JSON, or not a memsave plan of a known format; or a field is missing or
                has the wrong type or value (:class:`~memsave.recompute.planning.plan_json.PlanFieldError`, whose
                message names the field, e.g. ``segments[0][1] (end)``, and the type it must have).

        Examples:
            >>> plan = memsave.Plan.from_json(open("plan.json").read())
        """
        try:
            d = json.loads(s)
        except (TypeError, json.JSONDecodeError) as e:
            raise ValueError(f"memsave.Plan.from_json: not valid JSON ({e})") from e
        return cls(**read_plan_fields(d))


# --------------------------------------------------------------------------------------------- applying a plan
class _GroupedForward(CheckpointedForward):
    """Instance-level ``forward`` of a plain ``nn.Sequential`` some of whose runs of children are checkpointed
    regions (one region per run). A subclass of wrap's forward so that :func:`memsave.unwrap` removes it."""

    def __init__(
        self,
        module: nn.Sequential,
        name: str,
        groups: List[Tuple[int, int]],
        options: RegionOptions = DEFAULT_OPTIONS,
        context_fns: Optional[Dict[Tuple[int, int], Callable[[], Tuple[Any, Any]]]] = None,
    ) -> None:
        super().__init__(module, name, None, options)
        self.groups = sorted(groups)
        self.context_fns = dict(context_fns or {})  # group -> selective context_fn (none: recomputed whole)

    def signature(self) -> Tuple[Any, ...]:
        """As wrap's, plus the groups and what each keeps: two plans with other groups are other regions."""
        kept = tuple(sorted((g, _callable_key(fn)) for g, fn in self.context_fns.items()))
        return (*super().signature(), tuple(self.groups), kept)

    def runs_inside(self, module: nn.Module) -> bool:
        """Whether ``module`` runs inside one of the regions: it is (in) a child of a checkpointed group."""
        children = list(self.module.children())
        inside = [c for start, end in self.groups for c in children[start:end]]
        return any(m is module for child in inside for m in child.modules())

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        module = self.module
        if not torch.is_grad_enabled() or kwargs or len(args) != 1:
            return nn.Sequential.forward(module, *args, **kwargs)  # type: ignore[arg-type]
        children = list(module)  # type: ignore[call-overload]
        x = args[0]
        i = 0
        for start, end in self.groups:
            for child in children[i:start]:
                x = child(x)
            options = dataclasses.replace(self.options, context_fn=self.context_fns.get((start, end)))
            x = run_region(ModuleChain(children[start:end]), (x,), {}, options, name=f"{self.name}[{start}:{end}]")
            i = end
        for child in children[i:]:
            x = child(x)
        return x


class _GroupedRepr(WrappedRepr):
    def __init__(self, module: nn.Module, groups: List[Tuple[int, int]]) -> None:
        super().__init__(module, None)
        self.groups = sorted(groups)

    def __call__(self) -> str:
        base = type(self.module).extra_repr(self.module)
        tag = "[memsave.checkpoint " + ", ".join(f"{s}:{e}" for s, e in self.groups) + "]"
        return f"{base}, {tag}" if base else tag


def _check_plan_matches(model: nn.Module, p: Plan) -> None:
    """Raise :class:`PlanMismatchError` saying what differs, before anything is wrapped, unless ``p`` fits ``model``."""
    names = set(dict(model.named_modules()))
    wanted = {m for pc in p.stage_modules for m in pc.modules} | {
        pc.parent for pc in p.stage_modules if pc.parent is not None
    }
    missing = sorted(wanted - names)
    bad = [s for s in p.segments if not 0 <= s[0] < s[1] <= len(p.stage_modules)]
    fp = fingerprint(model)
    if fp == p.fingerprint and not missing and not bad:
        return
    if bad:
        raise PlanMismatchError(
            f"memsave: the plan's segments {bad[:3]} are outside its {len(p.stage_modules)} stages; the plan is "
            f"corrupt or was edited. Make a new one with memsave.plan(model, *example_inputs, budget=...)."
        )
    differences = []
    if missing:
        differences.append(f"modules it names that this model lacks: {', '.join(missing[:5])}")
    # Modules of this model the plan's stages neither name nor contain nor sit inside (a fourth block).
    covered = wanted | {n.rsplit(".", k)[0] for n in wanted for k in range(1, n.count(".") + 1)}
    extra = sorted(n for n in names - covered if n and not any(n.startswith(w + ".") for w in wanted if w))
    extra = [n for n in extra if not any(n.startswith(e + ".") for e in extra)]
    if extra:
        differences.append(f"modules of this model the plan does not know: {', '.join(extra[:5])}")
    if not differences:
        differences.append("the same module names, but module classes or parameter shapes or dtypes differ")
    raise PlanMismatchError(
        f"memsave: this plan was made for a {p.model_class} (fingerprint {p.fingerprint}) but the model is a "
        f"{type(model).__name__} (fingerprint {fp}): {'; '.join(differences)}. Make a plan for this model with "
        f"memsave.plan(model, *example_inputs, budget=...)."
    )


def apply_plan(model: nn.Module, p: Plan, options: RegionOptions = DEFAULT_OPTIONS) -> nn.Module:
    """Checkpoint, in place, the regions of plan ``p`` (what ``memsave.wrap(model, plan)`` does).

    Args:
        model: the model the plan was made for.
        p: the plan.
        options: the regions' options (``preserve_rng_state``, ``strict``; each region's ``context_fn`` is the
            plan's).

    Returns:
        ``model``.

    Raises:
        PlanMismatchError: the plan was made for another model.

    Examples:
        >>> memsave.wrap(model, memsave.plan(model, x, budget="2GiB"))
    """
    _check_plan_matches(model, p)
    apply_regions(model, p, options)
    return model


def apply_regions(model: nn.Module, p: Plan, options: RegionOptions = DEFAULT_OPTIONS) -> List[nn.Module]:
    """Install the plan's regions; returns the modules given an instance-level forward (to undo them)."""
    modules = dict(model.named_modules())
    groups: Dict[str, List[Tuple[int, int]]] = {}
    contexts: Dict[str, Dict[Tuple[int, int], Callable[[], Tuple[Any, Any]]]] = {}
    changed: List[nn.Module] = []
    for k, (b, e, rec) in enumerate(p.segments):
        if not rec:
            continue
        pcs = p.stage_modules[b:e]
        names = [m for pc in pcs for m in pc.modules]
        keeps = p.keeps(k)
        context_fn = selective_context(*keeps) if keeps else None
        if len(names) == 1:
            if wrap_module(modules[names[0]], names[0], dataclasses.replace(options, context_fn=context_fn)):
                changed.append(modules[names[0]])
            continue
        parent = pcs[0].parent
        idx = [k for pc in pcs for k in pc.child_index]
        if parent is None or any(pc.parent != parent for pc in pcs) or idx != list(range(idx[0], idx[-1] + 1)):
            raise PlanMismatchError(
                f"memsave: region {names} of the plan is not a run of consecutive children of one nn.Sequential; "
                f"the plan is corrupt or was edited"
            )
        groups.setdefault(parent, []).append((idx[0], idx[-1] + 1))
        if context_fn is not None:
            contexts.setdefault(parent, {})[(idx[0], idx[-1] + 1)] = context_fn
    for parent, gs in groups.items():
        mod = modules[parent]
        if is_wrapped(mod):
            continue
        mod.__dict__["forward"] = _GroupedForward(mod, parent or type(mod).__name__, gs, options, contexts.get(parent))
        mod.__dict__["extra_repr"] = _GroupedRepr(mod, gs)
        changed.append(mod)
    return changed
