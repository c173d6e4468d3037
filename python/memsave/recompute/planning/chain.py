"""Step 2 of a plan: the chain of candidate stages and its cost model, as the C++ planner reads it.

The candidate *stages* are the module calls one level below the model, in execution order, with the code between
them (residual adds, concatenations, the loss) as *glue* stages that are never recomputed. Modules are opened up,
their calls replaced by their children's, when they are plain ``nn.Sequential`` containers, when they hold most of
the memory, and whenever they hold one of the model's blocks (:func:`memsave.find_blocks`): every block is a stage
of its own, so the minimum-memory plan can recompute each block as ``memsave.wrap(model)`` does, in an
encoder-decoder's second stack or a two-tower model's smaller tower too. A module working in place
(``ReLU(inplace=True)``) joins the stage before it. From the trace, each tensor of the forward is classified by
which stage made it and which stages used it: kept for backward inside its stage (``saved_bytes``), handed to the
next stage (a boundary; *passing* when it is freed once read), or read further on (a :class:`Skip`: counted for as
long as it lives). Parameter gradients are the backward's allocations that outlive the step. Working memory is
fitted so that the predicted timeline of the eager step is never below the allocator-level one measured in the
same step.

:class:`Stage`, :class:`Skip` and :class:`Chain` mirror ``planner::Stage``, ``planner::Skip`` and ``planner::Chain``
(``csrc/planner/chain.h``) field for field; :meth:`Chain.to_dict` is the form the pybind11 binding reads.
:class:`StageModules` says what each stage is in the model.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

import torch
from torch import nn

from ..._C import planner_simulate, planner_solve
from ..blocks import find_blocks
from .trace import Trace

__all__ = ["Chain", "Skip", "Stage", "StageModules", "build_chain", "pooled_medians", "split_into_stages"]


@dataclass
class Stage:
    """One stage of the chain, as the C++ planner models it (``planner::Stage``; bytes and seconds)."""

    name: str
    fwd_time: float
    bwd_time: float
    input_bytes: int
    output_bytes: int
    input_passing_bytes: int = 0
    output_passing_bytes: int = 0
    input_grad_bytes: int = 0
    output_grad_bytes: int = 0
    saved_bytes: int = 0
    fwd_transient_bytes: int = 0
    bwd_transient_bytes: int = 0
    param_grad_bytes: int = 0
    checkpoint_bytes: int = 0
    checkpoint_kept_bytes: int = 0
    recomputable: bool = True
    joins_previous: bool = True
    # Of fwd_time, the seconds after the last tensor the stage saves for backward: a recompute ending in this stage
    # stops before them (torch's early stop; planner::Stage::tail_time).
    tail_time: float = 0.0
    # Selective variants, one per Chain.operator_classes entry (or none): the forward time of the operators a
    # selective region keeping those classes recomputes, the bytes of the operator outputs it keeps from forward
    # until the recompute, and (or none) the variant's tail_time.
    selective_fwd_time: List[float] = field(default_factory=list)
    selective_kept_bytes: List[int] = field(default_factory=list)
    selective_tail_time: List[float] = field(default_factory=list)


@dataclass
class Skip:
    """A tensor made by stage ``producer`` and last read by stage ``consumer`` (> producer + 1): ``planner::Skip``."""

    producer: int
    consumer: int
    bytes: int
    grad_bytes: int


@dataclass
class Chain:
    """The whole cost model (``planner::Chain``): the stages, the skips, the constant terms and the operator classes
    a selective region may keep (each entry a ``"+"``-joined set such as ``"matmul+attention"``; see
    :mod:`.operators`). A selective segment names the entry it keeps by index (the binding's
    ``segment_kept_classes``).

    Examples:
        >>> chain.simulate([(0, len(chain.stages), False)])["peak_bytes"]   # eager's predicted peak
    """

    stages: List[Stage]
    skips: List[Skip] = field(default_factory=list)
    base_bytes: int = 0
    segment_bytes: int = 0
    recompute_bytes: int = 0
    operator_classes: List[str] = field(default_factory=list)  # per selective variant: "+"-joined classes kept

    def to_dict(self) -> Dict[str, Any]:
        """The plain form ``memsave._C.planner_solve`` / ``planner_simulate`` read, and a plan's JSON stores."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "Chain":
        """Inverse of :meth:`to_dict`. Plans written by memsave 0.3 and earlier store the operator classes under the
        key ``policies``; that key is read too.

        Raises:
            TypeError, KeyError: a missing or unknown field.
            ValueError: both ``operator_classes`` and the old ``policies`` are given, and they differ.
        """
        return cls(
            stages=[Stage(**s) for s in d["stages"]],
            skips=[Skip(**k) for k in d.get("skips", [])],
            base_bytes=d.get("base_bytes", 0),
            segment_bytes=d.get("segment_bytes", 0),
            recompute_bytes=d.get("recompute_bytes", 0),
            operator_classes=_operator_classes(d),
        )

    def solve(self, budget_bytes: Optional[int], solver: str, slots: int) -> Dict[str, Any]:
        """``memsave._C.planner_solve`` on this chain: the schedule of ``solver`` within ``budget_bytes``."""
        return planner_solve(self.to_dict(), budget_bytes, solver, slots)

    def simulate(self, segments: Sequence[Tuple[Any, ...]], timeline: bool = False) -> Dict[str, Any]:
        """``memsave._C.planner_simulate`` on this chain: the predicted peak (and timeline) of a schedule.

        ``segments``: ``(begin, end, recompute)`` or ``(begin, end, recompute, k)`` with ``k`` the index in
        :attr:`operator_classes` of the classes a selective segment keeps (or None)."""
        return planner_simulate(self.to_dict(), list(segments), timeline)

    def eager_seconds(self) -> float:
        """Forward plus backward time of all stages: one eager step's compute."""
        return sum(s.fwd_time + s.bwd_time for s in self.stages)

    def module_level(self) -> "Chain":
        """This chain without its operator classes and selective variants: the cost model of module-level plans."""
        stages = [
            replace(s, selective_fwd_time=[], selective_kept_bytes=[], selective_tail_time=[]) for s in self.stages
        ]
        return replace(self, stages=stages, operator_classes=[])


def _operator_classes(d: Dict[str, Any]) -> List[str]:
    """A chain dict's operator-class sets: ``operator_classes``, or ``policies`` as memsave 0.3 and earlier wrote it."""
    new, old = d.get("operator_classes"), d.get("policies")
    if new is not None and old is not None and list(new) != list(old):
        raise ValueError(
            f"the chain gives both operator_classes {list(new)!r} and its old name policies {list(old)!r}, and they "
            "differ; keep operator_classes only"
        )
    return [str(c) for c in (new if new is not None else old if old is not None else [])]


@dataclass
class StageModules:
    """What a stage is in the model: its kind (``module`` or ``glue``), the modules it runs, and the plain
    ``nn.Sequential`` they are children of (``parent``, their ``child_index`` there) when a region may group them."""

    kind: str
    modules: List[str]
    parent: Optional[str] = None
    child_index: List[int] = field(default_factory=list)
    recomputable: bool = False
    joins_previous: bool = False
    #: The first stage that computes what this one does (the same module types and parameter shapes, storages of the
    #: same sizes allocated in the same order: a transformer's blocks after the first name the first); None when no
    #: stage before it does. The time model pools the timings of such twins (:func:`pooled_medians`).
    twin: Optional[int] = None


def _is_plain_sequential(m: nn.Module) -> bool:
    return isinstance(m, nn.Sequential) and type(m).forward is nn.Sequential.forward


def _is_inplace(m: nn.Module) -> bool:
    return getattr(m, "inplace", False) is True


@dataclass
class _Span:
    """A stage's run of the forward's events: one frontier module call (with in-place followers) or the glue
    between two."""

    kind: str  # "module" or "glue"
    calls: List[int]
    lo: int  # event range [lo, hi)
    hi: int


def _held_by_call(tr: Trace) -> Dict[int, int]:
    """Bytes allocated inside each call (descendants included) still alive when forward ends."""
    alive: Set[int] = set()
    created_at: Dict[int, int] = {}
    for pos, ev in enumerate(tr.events[: tr.bwd_pos]):
        if ev[0] == "alloc":
            alive.add(ev[1])
            created_at[ev[1]] = pos
        elif ev[0] == "free":
            alive.discard(ev[1])
    held = {}
    for c in tr.calls:
        held[c.index] = sum(tr.nbytes[u] for u in alive if c.pos_call <= created_at[u] <= c.pos_ret)
    return held


def _frontier(tr: Trace, blocks: Sequence[str]) -> List[int]:
    """The candidate module calls: children of the model's call, with plain Sequentials, memory-dominant custom
    modules and every module holding one of ``blocks`` opened up."""
    if not tr.calls:
        return []
    root = tr.calls[0]
    held = _held_by_call(tr)
    total = max(1, sum(held[c] for c in root.children))
    holders = {b.rsplit(".", k)[0] for b in blocks for k in range(1, b.count(".") + 1)}  # strict ancestors
    front = list(root.children)
    changed = True
    while changed:
        changed = False
        nxt: List[int] = []
        for ci in front:
            c = tr.calls[ci]
            open_up = bool(c.children) and (
                _is_plain_sequential(c.module) or c.name in holders or (len(c.children) >= 2 and held[ci] * 2 > total)
            )
            if open_up:
                nxt.extend(c.children)
                changed = True
            else:
                nxt.append(ci)
        front = nxt
    return front


def _split_stages(tr: Trace, front: List[int]) -> Tuple[List[_Span], List[int]]:
    """Split the forward's events into stages. Returns the spans and, per forward event, its stage index."""
    spans: List[_Span] = []
    owner = [-1] * tr.bwd_pos

    def has_alloc(lo: int, hi: int) -> bool:
        return any(tr.events[p][0] == "alloc" for p in range(lo, hi))

    def assign(lo: int, hi: int, idx: int) -> None:
        for p in range(lo, hi):
            owner[p] = idx

    cursor = 0
    for ci in front:
        c = tr.calls[ci]
        if has_alloc(cursor, c.pos_call):
            spans.append(_Span("glue", [], cursor, c.pos_call))
            assign(cursor, c.pos_call, len(spans) - 1)
        elif spans:  # frees between stages belong to the stage before (its outputs die when the next returns)
            spans[-1].hi = c.pos_call
            assign(cursor, c.pos_call, len(spans) - 1)
        else:
            assign(cursor, c.pos_call, 0)
        if spans and _is_inplace(c.module):
            spans[-1].calls.append(ci)
            spans[-1].hi = c.pos_ret + 1
        else:
            spans.append(_Span("module", [ci], c.pos_call, c.pos_ret + 1))
        assign(c.pos_call, c.pos_ret + 1, len(spans) - 1)
        cursor = c.pos_ret + 1
    if has_alloc(cursor, tr.bwd_pos) or not spans:
        spans.append(_Span("glue", [], cursor, tr.bwd_pos))
    else:
        spans[-1].hi = tr.bwd_pos
    assign(cursor, tr.bwd_pos, len(spans) - 1)
    return spans, owner


@dataclass
class _Flow:
    """Where each tensor of the forward goes, per stage boundary and stage (see the module docstring)."""

    kept: List[int]  # per boundary: bytes handed to the next stage and kept for backward
    passing: List[int]  # per boundary: bytes freed once the next stage has read them
    grads: List[int]  # per boundary: their gradients' bytes
    saved: List[int]  # per stage: bytes kept for backward inside it
    skips: List[Skip]
    creator: Dict[int, int]  # storage uid -> the stage that made it


def _tensor_flow(tr: Trace, owner: List[int], n: int) -> _Flow:
    """Classify every storage made in forward by its creation, death and last use (by any operator, glue too)."""
    creator: Dict[int, int] = {}
    freed_in: Dict[int, int] = {}
    users: Dict[int, int] = {}
    for pos in range(tr.bwd_pos):
        ev = tr.events[pos]
        if ev[0] == "alloc":
            creator[ev[1]] = owner[pos]
        elif ev[0] == "free" and ev[1] in creator:
            freed_in[ev[1]] = owner[pos]
        elif ev[0] == "use" and ev[1] in creator and owner[pos] > creator[ev[1]]:
            users[ev[1]] = max(users.get(ev[1], -1), owner[pos])
    flow = _Flow([0] * (n + 1), [0] * (n + 1), [0] * (n + 1), [0] * n, [], creator)
    for uid, c in creator.items():
        if freed_in.get(uid) == c:
            continue  # made and freed inside its stage: working memory
        last = max(users.get(uid, -1), freed_in.get(uid, -1))
        b, g = tr.nbytes[uid], tr.grad_bytes.get(uid, 0)
        if last <= c:
            flow.saved[c] += b
        elif last == c + 1:
            if uid in freed_in:
                flow.passing[c + 1] += b
            else:
                flow.kept[c + 1] += b
            flow.grads[c + 1] += g
        else:
            flow.skips.append(Skip(producer=c, consumer=last, bytes=b, grad_bytes=g))
    flow.grads[0] = tr.input_grad_bytes
    return flow


def _backward_peaks(tr: Trace, creator: Dict[int, int], n: int) -> Tuple[List[int], List[int]]:
    """Per stage: the allocator-level peak of its backward, which starts when the gradient of one of its tensors is
    first ready and ends when the next stage's starts, and the bytes it allocates that outlive the step (parameter
    and input gradients)."""
    bwd_start: Dict[int, int] = {}
    for pos in range(tr.bwd_pos, tr.end_pos):
        ev = tr.events[pos]
        if ev[0] == "mark" and ev[1] in creator:
            bwd_start.setdefault(creator[ev[1]], pos)
    order = sorted(bwd_start.items(), key=lambda kv: kv[1])
    bwd_peak = [0] * n
    param_grad = [0] * n
    alive_after: Set[int] = set()
    for pos in range(tr.bwd_pos, tr.end_pos):
        ev = tr.events[pos]
        if ev[0] == "alloc":
            alive_after.add(ev[1])
        elif ev[0] == "free":
            alive_after.discard(ev[1])
    if order:
        bounds = [tr.bwd_pos] + [pos for _, pos in order[1:]] + [tr.end_pos + 1]
        for k, (p, _) in enumerate(order):
            lo, hi = bounds[k], bounds[k + 1]
            bwd_peak[p] = tr.allocator_peak(lo, hi)
            for pos in range(lo, min(hi, tr.end_pos)):
                ev = tr.events[pos]
                if ev[0] == "alloc" and ev[1] in alive_after:
                    param_grad[p] += ev[2]
    return bwd_peak, param_grad


def pooled_medians(samples: Sequence[Sequence[float]], stage_modules: Sequence[StageModules]) -> List[float]:
    """Per stage, the median of its own samples and those of its twins (:attr:`StageModules.twin`).

    Twins do the same work, so their timings are samples of one number: pooled, a stall of the machine during one
    stage of one timed step (tens of milliseconds on a shared CPU, several times a block's forward) moves the
    median of a dozen blocks' samples by nothing rather than that stage's by half the stall.

    Args:
        samples: per stage, its samples (one per timed step; empty: 0.0).
        stage_modules: the stages, in the same order.

    Returns:
        per stage, the median over its twin group's samples.

    Examples:
        >>> a, b = StageModules("module", ["h.0"]), StageModules("module", ["h.1"], twin=0)
        >>> pooled_medians([[1.0, 2.0], [9.0, 3.0]], [a, b])   # the stall (9.0) is one sample of four
        [2.5, 2.5]
    """
    keys = [i if sm.twin is None else sm.twin for i, sm in enumerate(stage_modules)]
    groups: Dict[int, List[float]] = {}
    for k, xs in zip(keys, samples):
        groups.setdefault(k, []).extend(xs)
    return [statistics.median(groups[k]) if groups[k] else 0.0 for k in keys]


def _stage_times(
    spans: List[_Span], timing: List[Dict[str, Any]], info: List[StageModules]
) -> Tuple[List[float], List[float]]:
    """Per stage: forward and backward seconds, medians over the timed steps and the stage's twins (the glue
    shares forward's remainder; backward is split in proportion to forward)."""
    n = len(spans)
    per_run: List[List[float]] = []
    bwd_total: List[float] = []
    glue = [i for i, sp in enumerate(spans) if sp.kind == "glue"]
    for run in timing:
        t_call, t_ret = run["t_call"], run["t_ret"]
        ts = [
            sum(t_ret.get(ci, t_call[ci]) - t_call[ci] for ci in sp.calls) if sp.kind == "module" else 0.0
            for sp in spans
        ]
        glue_total = max(0.0, (run["t2"] - run["t0"]) - sum(ts))
        for i in glue:
            ts[i] = glue_total / len(glue)
        per_run.append(ts)
        bwd_total.append(run["t3"] - run["t2"])
    fwd_time = pooled_medians([[r[i] for r in per_run] for i in range(n)], info)
    total_fwd = sum(fwd_time)
    bwd_sum = statistics.median(bwd_total) if bwd_total else 0.0
    bwd_time = [bwd_sum * (t / total_fwd) if total_fwd > 0 else 0.0 for t in fwd_time]
    return fwd_time, bwd_time


def _stage_modules(tr: Trace, spans: List[_Span]) -> List[StageModules]:
    """What each stage is in the model, which stages may be recomputed (a module called once per step, not in
    place; several modules only as consecutive children of a plain Sequential), and which may share a region with
    the stage before."""
    calls = tr.calls
    call_count: Dict[int, int] = {}  # a module called twice in a step cannot be planned per call
    for c in calls:
        call_count[id(c.module)] = call_count.get(id(c.module), 0) + 1
    info: List[StageModules] = []
    parent_calls: List[Optional[int]] = []
    for sp in spans:
        parents = {calls[ci].parent for ci in sp.calls}
        parent = next(iter(parents)) if len(parents) == 1 else None
        parent_mod = calls[parent].module if parent is not None else None
        seq_parent = parent_mod is not None and _is_plain_sequential(parent_mod)
        child_index: List[int] = []
        if seq_parent:
            ids = [id(k) for k in parent_mod]  # type: ignore[union-attr]
            child_index = [ids.index(id(calls[ci].module)) for ci in sp.calls]
        contiguous = seq_parent and child_index == list(range(child_index[0], child_index[-1] + 1))
        recomputable = (
            sp.kind == "module"
            and all(call_count[id(calls[ci].module)] == 1 for ci in sp.calls)
            and not _is_inplace(calls[sp.calls[0]].module)
            and (len(sp.calls) == 1 or contiguous)
        )
        name = calls[parent].name if seq_parent and parent is not None else None
        info.append(StageModules(sp.kind, [calls[ci].name for ci in sp.calls], name, child_index, bool(recomputable)))
        parent_calls.append(parent if seq_parent else None)
    for i, si in enumerate(info):
        prev = info[i - 1] if i > 0 else None
        si.joins_previous = bool(
            prev is not None
            and si.recomputable
            and prev.recomputable
            and parent_calls[i] is not None
            and parent_calls[i] == parent_calls[i - 1]
            and si.child_index[0] == prev.child_index[-1] + 1
        )
    _find_twins(tr, spans, info)
    return info


def _signature(tr: Trace, sp: _Span) -> Tuple[Any, ...]:
    """What a module stage computes, as far as its time goes: its modules' types and parameter shapes and dtypes,
    and the sizes of the storages it allocates, in order."""
    modules = tuple(
        (type(m).__name__, tuple((tuple(p.shape), p.dtype) for p in m.parameters(recurse=False)))
        for ci in sp.calls
        for m in tr.calls[ci].module.modules()
    )
    return modules, tuple(e[2] for e in tr.events[sp.lo : sp.hi] if e[0] == "alloc")


def _find_twins(tr: Trace, spans: List[_Span], info: List[StageModules]) -> None:
    """Set each module stage's :attr:`StageModules.twin` (glue stages have none: each is a remainder)."""
    first: Dict[Tuple[Any, ...], int] = {}
    for i, (sp, si) in enumerate(zip(spans, info)):
        if sp.kind == "module":
            twin = first.setdefault(_signature(tr, sp), i)
            si.twin = twin if twin != i else None


def _buffer_bytes(tr: Trace, spans: List[_Span]) -> List[int]:
    """Per stage: the bytes of its modules' buffers, which a checkpointed region snapshots at entry (the cost model
    counts them a second time during the recompute, when fresh copies are swapped in)."""
    out = [0] * len(spans)
    for i, sp in enumerate(spans):
        seen: Set[int] = set()
        for ci in sp.calls:
            for m in tr.calls[ci].module.modules():
                for b in m._buffers.values():
                    if b is not None and id(b) not in seen:
                        seen.add(id(b))
                        out[i] += b.numel() * b.element_size()
    return out


def _stage_spans(tr: Trace, model: nn.Module) -> Tuple[List[_Span], List[int]]:
    return _split_stages(tr, _frontier(tr, find_blocks(model)))


def split_into_stages(tr: Trace, model: nn.Module) -> List[StageModules]:
    """The stages :func:`build_chain` will make of the traced step, known before any step is timed (the planner's
    operator-class profile, recorded in the timing steps, attributes operators to them).

    Args:
        tr: the traced step (:func:`.trace.trace_step`).
        model: the traced model.

    Returns:
        per stage, its :class:`StageModules` (what :func:`build_chain` returns beside the chain).

    Examples:
        >>> [s.modules for s in split_into_stages(trace_step(model, (x,), loss_fn, device), model)]
    """
    spans, _ = _stage_spans(tr, model)
    return _stage_modules(tr, spans)


def build_chain(tr: Trace, model: nn.Module, timing: List[Dict[str, Any]]) -> Tuple[Chain, List[StageModules]]:
    """The cost model of the traced step: one :class:`Stage` per stage, the skips, and what each stage is.

    Args:
        tr: the traced step (:func:`.trace.trace_step`).
        model: the traced model; every module holding one of its blocks (:func:`memsave.find_blocks`) is opened.
        timing: the timed steps (:func:`.trace.time_steps`).

    Returns:
        The :class:`Chain` (working memory fitted to the trace's allocator-level peaks) and, per stage, its
        :class:`StageModules`.

    Examples:
        >>> chain, stages = build_chain(trace_step(model, (x,), loss_fn, device), model, timing)
        >>> [s.modules for s in stages if s.recomputable]
    """
    spans, owner = _stage_spans(tr, model)
    n = len(spans)
    flow = _tensor_flow(tr, owner, n)
    fwd_peak = [tr.allocator_peak(sp.lo, sp.hi) for sp in spans]
    bwd_peak, param_grad = _backward_peaks(tr, flow.creator, n)
    info = _stage_modules(tr, spans)
    fwd_time, bwd_time = _stage_times(spans, timing, info)
    buffers = _buffer_bytes(tr, spans)
    stages = [
        Stage(
            name="+".join(si.modules) if si.modules else f"<glue {i}>",
            fwd_time=fwd_time[i],
            bwd_time=bwd_time[i],
            input_bytes=flow.kept[i],
            output_bytes=flow.kept[i + 1],
            input_passing_bytes=flow.passing[i],
            output_passing_bytes=flow.passing[i + 1],
            input_grad_bytes=flow.grads[i],
            output_grad_bytes=flow.grads[i + 1],
            saved_bytes=flow.saved[i],
            param_grad_bytes=param_grad[i],
            checkpoint_bytes=buffers[i],
            recomputable=si.recomputable,
            joins_previous=si.joins_previous,
        )
        for i, si in enumerate(info)
    ]
    # Each region saves the RNG states at entry and forks them for its recompute; only the CPU generator's state is
    # a tensor in the measured memory (on CUDA the states are CPU tensors and do not count).
    rng_bytes = torch.get_rng_state().numel() if tr.device.type == "cpu" else 0
    chain = Chain(stages=stages, skips=flow.skips, segment_bytes=rng_bytes, recompute_bytes=rng_bytes)
    _fit_working_memory(chain, fwd_peak, bwd_peak)
    return chain, info


def _fit_working_memory(chain: Chain, fwd_peak: List[int], bwd_peak: List[int]) -> None:
    """Set each stage's transient bytes so that the predicted eager timeline is never below the measured one."""
    sim = chain.simulate([(0, len(chain.stages), False)], timeline=True)
    for phase, stage, predicted in sim["timeline"]:
        if phase == "forward":
            chain.stages[stage].fwd_transient_bytes = max(0, fwd_peak[stage] - predicted)
        elif phase == "backward":
            chain.stages[stage].bwd_transient_bytes = max(0, bwd_peak[stage] - predicted)
