"""Step 2 of a plan: the chain of candidate pieces and its cost model, as the C++ planner reads it.

The candidate *pieces* are the module calls one level below the model (plain ``nn.Sequential`` containers, and
custom modules holding most of the memory, are opened up), in execution order, with the code between them (residual
adds, concatenations, the loss) as *glue* pieces that are never recomputed. A module working in place
(``ReLU(inplace=True)``) joins the piece before it. From the trace, each tensor of the forward is classified by which
piece made it and which pieces used it: kept for backward inside its piece (``saved_bytes``), handed to the next
piece (a boundary; *passing* when it is freed once read), or read further on (a :class:`Skip`: counted for as long as
it lives). Parameter gradients are the backward's allocations that outlive the step. Working memory is fitted so that
the predicted timeline of the eager step is never below the allocator-level one measured in the same step.

:class:`Stage`, :class:`Skip` and :class:`Chain` mirror ``planner::Stage``, ``planner::Skip`` and ``planner::Chain``
(``csrc/planner/chain.h``) field for field; :meth:`Chain.to_dict` is the form the pybind11 binding reads.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

import torch
from torch import nn

from ..._C import planner_simulate, planner_solve
from .trace import Trace

__all__ = ["Chain", "Piece", "Skip", "Stage", "build_chain"]


@dataclass
class Stage:
    """One piece of the chain, as the C++ planner models it (``planner::Stage``; bytes and seconds)."""

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
    # Selective variants, one per Chain.policies entry (or none): the forward time of the operators the policy
    # recomputes, and the bytes of the operator outputs it keeps from forward until the recompute.
    selective_fwd_time: List[float] = field(default_factory=list)
    selective_kept_bytes: List[int] = field(default_factory=list)


@dataclass
class Skip:
    """A tensor made by stage ``producer`` and last read by stage ``consumer`` (> producer + 1): ``planner::Skip``."""

    producer: int
    consumer: int
    bytes: int
    grad_bytes: int


@dataclass
class Chain:
    """The whole cost model (``planner::Chain``): the stages, the skips, the constant terms and the selective
    policies (each a set of operator classes whose outputs a selective region keeps; see :mod:`.operators`).

    Example:
        >>> chain.simulate([(0, len(chain.stages), False)])["peak_bytes"]   # eager's predicted peak
    """

    stages: List[Stage]
    skips: List[Skip] = field(default_factory=list)
    base_bytes: int = 0
    segment_bytes: int = 0
    recompute_bytes: int = 0
    policies: List[str] = field(default_factory=list)  # selective policies: "+"-joined operator classes kept

    def to_dict(self) -> Dict[str, Any]:
        """The plain form ``memsave._C.planner_solve`` / ``planner_simulate`` read, and a plan's JSON stores."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "Chain":
        """Inverse of :meth:`to_dict`.

        Raises:
            TypeError, KeyError: a missing or unknown field.
        """
        return cls(
            stages=[Stage(**s) for s in d["stages"]],
            skips=[Skip(**k) for k in d.get("skips", [])],
            base_bytes=d.get("base_bytes", 0),
            segment_bytes=d.get("segment_bytes", 0),
            recompute_bytes=d.get("recompute_bytes", 0),
            policies=list(d.get("policies", [])),
        )

    def solve(self, budget_bytes: Optional[int], strategy: str, slots: int) -> Dict[str, Any]:
        """``memsave._C.planner_solve`` on this chain: the schedule of ``strategy`` within ``budget_bytes``."""
        return planner_solve(self.to_dict(), budget_bytes, strategy, slots)

    def simulate(self, segments: Sequence[Tuple[Any, ...]], timeline: bool = False) -> Dict[str, Any]:
        """``memsave._C.planner_simulate`` on this chain: the predicted peak (and timeline) of a schedule.

        ``segments``: ``(begin, end, recompute)`` or ``(begin, end, recompute, policy)`` with ``policy`` the index
        of a selective policy in :attr:`policies` (or None)."""
        return planner_simulate(self.to_dict(), list(segments), timeline)

    def eager_seconds(self) -> float:
        """Forward plus backward time of all stages: one eager step's compute."""
        return sum(s.fwd_time + s.bwd_time for s in self.stages)

    def module_level(self) -> "Chain":
        """This chain without its selective policies and variants: the cost model of module-level plans only."""
        stages = [replace(s, selective_fwd_time=[], selective_kept_bytes=[]) for s in self.stages]
        return replace(self, stages=stages, policies=[])


@dataclass
class Piece:
    """What a stage is in the model: its kind (``module`` or ``glue``), the modules it runs, and the plain
    ``nn.Sequential`` they are children of (``parent``, their ``child_index`` there) when a region may group them."""

    kind: str
    modules: List[str]
    parent: Optional[str] = None
    child_index: List[int] = field(default_factory=list)
    recomputable: bool = False
    joins_previous: bool = False


def _is_plain_sequential(m: nn.Module) -> bool:
    return isinstance(m, nn.Sequential) and type(m).forward is nn.Sequential.forward


def _is_inplace(m: nn.Module) -> bool:
    return getattr(m, "inplace", False) is True


@dataclass
class _Piece:
    """A run of the forward's events: one frontier module call (with in-place followers) or the glue between."""

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


def _frontier(tr: Trace) -> List[int]:
    """The candidate module calls: children of the model's call, with plain Sequentials and memory-dominant custom
    modules opened up."""
    if not tr.calls:
        return []
    root = tr.calls[0]
    held = _held_by_call(tr)
    total = max(1, sum(held[c] for c in root.children))
    front = list(root.children)
    changed = True
    while changed:
        changed = False
        nxt: List[int] = []
        for ci in front:
            c = tr.calls[ci]
            open_up = bool(c.children) and (
                _is_plain_sequential(c.module) or (len(c.children) >= 2 and held[ci] * 2 > total)
            )
            if open_up:
                nxt.extend(c.children)
                changed = True
            else:
                nxt.append(ci)
        front = nxt
    return front


def _pieces(tr: Trace, front: List[int]) -> Tuple[List[_Piece], List[int]]:
    """Split the forward's events into pieces. Returns the pieces and, per forward event, its piece index."""
    pieces: List[_Piece] = []
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
            pieces.append(_Piece("glue", [], cursor, c.pos_call))
            assign(cursor, c.pos_call, len(pieces) - 1)
        elif pieces:  # frees between pieces belong to the piece before (its outputs die when the next returns)
            pieces[-1].hi = c.pos_call
            assign(cursor, c.pos_call, len(pieces) - 1)
        else:
            assign(cursor, c.pos_call, 0)
        if pieces and _is_inplace(c.module):
            pieces[-1].calls.append(ci)
            pieces[-1].hi = c.pos_ret + 1
        else:
            pieces.append(_Piece("module", [ci], c.pos_call, c.pos_ret + 1))
        assign(c.pos_call, c.pos_ret + 1, len(pieces) - 1)
        cursor = c.pos_ret + 1
    if has_alloc(cursor, tr.bwd_pos) or not pieces:
        pieces.append(_Piece("glue", [], cursor, tr.bwd_pos))
    else:
        pieces[-1].hi = tr.bwd_pos
    assign(cursor, tr.bwd_pos, len(pieces) - 1)
    return pieces, owner


def build_chain(tr: Trace, model: nn.Module, timing: List[Dict[str, Any]]) -> Tuple[Chain, List[Piece]]:
    """The cost model of the traced step: one :class:`Stage` per piece, the skips, and what each piece is."""
    front = _frontier(tr)
    pieces, owner = _pieces(tr, front)
    n = len(pieces)
    calls = tr.calls
    nbytes = tr.nbytes

    # How often each module was called in the step: a module called twice cannot be planned per call.
    call_count: Dict[int, int] = {}
    for c in calls:
        call_count[id(c.module)] = call_count.get(id(c.module), 0) + 1

    # Creation, death and last use (by any operator, glue included) of every storage made in forward.
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

    A = [0] * (n + 1)  # boundary bytes kept for backward
    T = [0] * (n + 1)  # boundary bytes freed once the next piece has read them ("passing")
    G = [0] * (n + 1)
    saved = [0] * n
    skips: List[Skip] = []
    for uid, c in creator.items():
        if freed_in.get(uid) == c:
            continue  # made and freed inside its piece: working memory
        last = max(users.get(uid, -1), freed_in.get(uid, -1))
        b, g = nbytes[uid], tr.grad_bytes.get(uid, 0)
        if last <= c:
            saved[c] += b
        elif last == c + 1:
            if uid in freed_in:
                T[c + 1] += b
            else:
                A[c + 1] += b
            G[c + 1] += g
        else:
            skips.append(Skip(producer=c, consumer=last, bytes=b, grad_bytes=g))
    G[0] = tr.input_grad_bytes

    # Allocator-level peaks: forward of each piece; backward of each piece, which starts when the gradient of one
    # of its tensors is first ready and ends when the next piece's starts.
    fwd_peak = [tr.allocator_peak(pc.lo, pc.hi) for pc in pieces]
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
                    param_grad[p] += ev[2]  # outlives the step: a parameter (or input) gradient

    # Times: median over the timed steps.
    fwd_time = [0.0] * n
    per_run: List[List[float]] = []
    bwd_total: List[float] = []
    for run in timing:
        t_call, t_ret = run["t_call"], run["t_ret"]
        ts = []
        for pc in pieces:
            if pc.kind == "module":
                ts.append(sum(t_ret.get(ci, t_call[ci]) - t_call[ci] for ci in pc.calls))
            else:
                ts.append(0.0)
        stage_total = sum(ts)
        glue = [i for i, pc in enumerate(pieces) if pc.kind == "glue"]
        glue_total = max(0.0, (run["t2"] - run["t0"]) - stage_total)
        for i in glue:
            ts[i] = glue_total / len(glue)
        per_run.append(ts)
        bwd_total.append(run["t3"] - run["t2"])
    for i in range(n):
        fwd_time[i] = statistics.median(r[i] for r in per_run) if per_run else 0.0
    total_fwd = sum(fwd_time)
    bwd_sum = statistics.median(bwd_total) if bwd_total else 0.0
    bwd_time = [bwd_sum * (t / total_fwd) if total_fwd > 0 else 0.0 for t in fwd_time]

    # Which pieces may be recomputed, and which may share a region with the piece before.
    info: List[Piece] = []
    parent_calls: List[Optional[int]] = []
    for pc in pieces:
        mods = [calls[ci].name for ci in pc.calls]
        parents = {calls[ci].parent for ci in pc.calls}
        parent = next(iter(parents)) if len(parents) == 1 else None
        parent_mod = calls[parent].module if parent is not None else None
        child_index: List[int] = []
        seq_parent = parent_mod is not None and _is_plain_sequential(parent_mod)
        if seq_parent:
            kids = list(parent_mod)  # type: ignore[arg-type]
            ids = [id(k) for k in kids]
            child_index = [ids.index(id(calls[ci].module)) for ci in pc.calls]
        contiguous = seq_parent and child_index == list(range(child_index[0], child_index[-1] + 1))
        recomputable = (
            pc.kind == "module"
            and all(call_count[id(calls[ci].module)] == 1 for ci in pc.calls)
            and not _is_inplace(calls[pc.calls[0]].module)
            and (len(pc.calls) == 1 or contiguous)
        )
        info.append(
            Piece(
                kind=pc.kind,
                modules=mods,
                parent=calls[parent].name if seq_parent else None,
                child_index=child_index,
                recomputable=bool(recomputable),
            )
        )
        parent_calls.append(parent if seq_parent else None)
    for i, pi in enumerate(info):
        prev = info[i - 1] if i > 0 else None
        pi.joins_previous = bool(
            prev is not None
            and pi.recomputable
            and prev.recomputable
            and parent_calls[i] is not None
            and parent_calls[i] == parent_calls[i - 1]
            and pi.child_index[0] == prev.child_index[-1] + 1
        )

    # What a checkpointed region holds besides activations: snapshots of its modules' buffers, taken at entry (the
    # cost model counts them a second time during the recompute, when fresh copies are swapped in).
    checkpoint_bytes = [0] * n
    for i, pc in enumerate(pieces):
        seen: Set[int] = set()
        for ci in pc.calls:
            for m in calls[ci].module.modules():
                for b in m._buffers.values():
                    if b is not None and id(b) not in seen:
                        seen.add(id(b))
                        checkpoint_bytes[i] += b.numel() * b.element_size()

    stages = []
    for i, pi in enumerate(info):
        stages.append(
            Stage(
                name="+".join(pi.modules) if pi.modules else f"<glue {i}>",
                fwd_time=fwd_time[i],
                bwd_time=bwd_time[i],
                input_bytes=A[i],
                output_bytes=A[i + 1],
                input_passing_bytes=T[i],
                output_passing_bytes=T[i + 1],
                input_grad_bytes=G[i],
                output_grad_bytes=G[i + 1],
                saved_bytes=saved[i],
                param_grad_bytes=param_grad[i],
                checkpoint_bytes=checkpoint_bytes[i],
                recomputable=pi.recomputable,
                joins_previous=pi.joins_previous,
            )
        )
    # Each region saves the RNG states at entry and forks them for its recompute; only the CPU generator's state is
    # a tensor in the measured memory (on CUDA the states are CPU tensors and do not count).
    rng_bytes = torch.get_rng_state().numel() if tr.device.type == "cpu" else 0
    chain = Chain(stages=stages, skips=skips, base_bytes=0, segment_bytes=rng_bytes, recompute_bytes=rng_bytes)

    # Fit working memory: the predicted eager timeline must not be below the measured one at any moment.
    sim = chain.simulate([(0, n, False)], timeline=True)
    for phase, stage, predicted in sim["timeline"]:
        if phase == "forward":
            stages[stage].fwd_transient_bytes = max(0, fwd_peak[stage] - predicted)
        elif phase == "backward":
            stages[stage].bwd_transient_bytes = max(0, bwd_peak[stage] - predicted)
    return chain, info
