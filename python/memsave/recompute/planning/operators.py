"""Step 2b of a plan: what selective recompute would keep and skip in each stage, per operator class.

A selective region (:func:`memsave.selective`) keeps, in forward, the outputs of the operators of its classes
(``matmul``, ``conv``, ``attention``: :data:`memsave.recompute.selective.OPERATOR_CLASSES`) and recomputes only the
other operators in backward. To plan with it, each stage of the chain needs, per class, the bytes of those outputs
(held from the forward until the recompute reads them back) and the forward time of those operators (the recompute
time a selective region saves). :class:`OperatorClassProfiler` measures both in the forwards of the planner's timing
steps under a ``TorchDispatchMode`` that times every operator of a class and sums the storage bytes it returns,
attributed to the stage whose modules are running, and counts every operator each stage dispatches;
:func:`selective_variants` turns them into the chain's operator-class sets (``Chain.operator_classes``) and
per-stage variants (``planner::Stage::selective_fwd_time`` / ``selective_kept_bytes``).

A selective region also costs what the recompute saves nothing on: torch's selective-checkpoint contexts run every
operator of the region through a Python dispatch mode, in forward and again in the recompute, beside the region's
saved-tensor hooks (tens of microseconds an operator on a CPU, whatever the tensors' size: a GPT-2 block's selective
region keeping every operator's output costs about 4 ms a step more than eager on this project's CPU, at batch 1 and
4 alike). :func:`selective_overhead_per_operator` measures that cost on the plan's device on a toy block, and each
variant's time includes it for every operator of its stage, so that the planner does not choose a selective region
whose saving that overhead eats.
"""

from __future__ import annotations

import contextlib
import itertools
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from ..region import checkpoint
from ..selective import ALTERNATE, OPERATOR_CLASSES, operators_of, selective
from .chain import Chain, StageModules, pooled_medians

__all__ = [
    "ClassProfile",
    "OperatorClassProfiler",
    "OperatorProfile",
    "alternation_aligned",
    "count_operators",
    "selective_overhead_per_operator",
    "selective_variants",
    "split_operator_classes",
    "stage_tails",
]

# Per stage: operator class -> (bytes of the outputs its operators return, median seconds of those operators).
ClassProfile = List[Dict[str, Tuple[int, float]]]


@dataclass
class OperatorProfile:
    """What :class:`OperatorClassProfiler` measured: per stage, the classes' bytes and seconds (``classes``), the
    number of operators the stage dispatches in one forward (``operators``), of the operators :data:`ALTERNATE`
    counts (``alternating``; empty when that class was not profiled), and its tail (``tails``, ``class_tails``)."""

    classes: ClassProfile
    operators: List[int]
    alternating: List[int] = field(default_factory=list)
    #: Per stage: the seconds of its forward after the last tensor it saves for backward (0 when it saved none),
    #: and of them, each class's operators' seconds (medians over the recorded forwards).
    tails: List[float] = field(default_factory=list)
    class_tails: List[Dict[str, float]] = field(default_factory=list)


class _ClassRecorder(TorchDispatchMode):
    """Times the operators of the given classes and sums the bytes of the storages they return, per stage; the
    operators of :data:`ALTERNATE` are counted per stage and every other one (the 1st, 3rd, ...) recorded for it."""

    def __init__(self, op_class: Dict[Any, str], alternating: Sequence[Any], sync: Callable[[], None]) -> None:
        super().__init__()
        self.op_class = op_class
        self.alternating = frozenset(alternating)
        self.sync = sync
        self.stage: Optional[int] = None
        self.bytes: Dict[Tuple[int, str], int] = {}
        self.seconds: Dict[Tuple[int, str], float] = {}
        self.operators: Dict[int, int] = {}
        self.alternates: Dict[int, int] = {}
        # The tail: when each stage last saved a tensor for backward and last ended, and each class's seconds since.
        self.last_save: Dict[int, float] = {}
        self.ends: Dict[int, float] = {}
        self.since_save: Dict[int, Dict[str, float]] = {}  # per stage, per class

    def reset(self) -> None:
        """Start a forward: nothing recorded, no stage running."""
        self.bytes, self.seconds, self.operators, self.alternates, self.stage = {}, {}, {}, {}, None
        self.last_save, self.ends, self.since_save = {}, {}, {}

    def saved(self, t: torch.Tensor) -> torch.Tensor:
        """The pack hook of the recorded forward: the running stage saved ``t`` for backward (a recompute that ends
        in this stage runs at least up to here)."""
        if self.stage is not None:
            self.sync()
            self.last_save[self.stage] = time.perf_counter()
            self.since_save.pop(self.stage, None)
        return t

    def ended(self) -> None:
        """A module of the running stage returned."""
        if self.stage is not None:
            self.sync()
            self.ends[self.stage] = time.perf_counter()

    def tails(self, stages: int) -> Tuple[List[float], List[Dict[str, float]]]:
        """Per stage, this forward's tail and each class's seconds in it (a stage that saved nothing: none)."""
        saved = [i in self.last_save and i in self.ends for i in range(stages)]
        tails = [max(0.0, self.ends[i] - self.last_save[i]) if saved[i] else 0.0 for i in range(stages)]
        by_class: List[Dict[str, float]] = [{} for _ in range(stages)]
        for i, per_class in self.since_save.items():
            if saved[i]:
                by_class[i] = dict(per_class)
        return tails, by_class

    def _classes_of(self, func: Any) -> List[str]:
        """The classes this call of ``func`` counts for (advancing the stage's count of alternating operators)."""
        if self.stage is None:
            return []
        found = [self.op_class[func]] if func in self.op_class else []
        if func in self.alternating:
            self.alternates[self.stage] = self.alternates.get(self.stage, 0) + 1
            if self.alternates[self.stage] % 2 == 1:
                found.append(ALTERNATE)
        return found

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if self.stage is not None:
            self.operators[self.stage] = self.operators.get(self.stage, 0) + 1
        found = self._classes_of(func)
        if not found:
            return func(*args, **kwargs)
        self.sync()
        t0 = time.perf_counter()
        out = func(*args, **kwargs)
        self.sync()
        dt = time.perf_counter() - t0
        storages: Dict[Tuple[int, torch.device], int] = {}
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                s = t.untyped_storage()
                storages[(s.data_ptr(), t.device)] = s.nbytes()
        for cls in found:
            key = (int(self.stage or 0), cls)
            self.bytes[key] = self.bytes.get(key, 0) + sum(storages.values())
            self.seconds[key] = self.seconds.get(key, 0.0) + dt
            since = self.since_save.setdefault(key[0], {})
            since[cls] = since.get(cls, 0.0) + dt
        return out


def _unpacked(t: torch.Tensor) -> torch.Tensor:
    return t


class OperatorClassProfiler:
    """Records, during the forwards run under :meth:`forward`, the bytes returned and time taken by each operator
    class in each recomputable stage, and the operators each such stage dispatches.

    The planner runs its timing steps' forwards under it: the recorder's dispatch mode adds a few microseconds to
    every operator of those steps, eager's step and every stage alike, which moves the time model's ratios by far
    less than its tolerance, and saves the separate forwards the classes took before.

    Args:
        model: the model; ``stage_modules`` name its modules.
        stage_modules: the modules of the chain's stages (:func:`memsave.recompute.planning.chain.split_into_stages`);
            only recomputable module stages are profiled.
        classes: operator class names from :data:`OPERATOR_CLASSES`.
        sync: waits for the device (``torch.cuda.synchronize`` on CUDA, a no-op on CPU).

    Raises:
        ValueError: an unknown class.

    Examples:
        >>> profiler = OperatorClassProfiler(model, stage_modules, ["matmul"], lambda: None)
        >>> with profiler.forward():
        ...     model(x)
        >>> profiler.result().classes[3]["matmul"]   # (bytes of stage 3's matrix products' outputs, their seconds)
    """

    def __init__(
        self,
        model: nn.Module,
        stage_modules: Sequence[StageModules],
        classes: Sequence[str],
        sync: Callable[[], None],
    ) -> None:
        unknown = [c for c in classes if c not in OPERATOR_CLASSES]
        if unknown:
            raise ValueError(f"OperatorClassProfiler: unknown operator classes {unknown}; known: {OPERATOR_CLASSES}")
        op_class = {op: c for c in classes if c != ALTERNATE for op in operators_of(c)}
        self.rec = _ClassRecorder(op_class, operators_of(ALTERNATE) if ALTERNATE in classes else (), sync)
        modules = dict(model.named_modules())
        self.stage_modules = list(stage_modules)
        self.watched = [
            (i, modules[name])
            for i, pc in enumerate(stage_modules)
            if pc.kind == "module" and pc.recomputable
            for name in pc.modules
        ]
        self.runs: List[Dict[Tuple[int, str], float]] = []
        self.tail_runs: List[Tuple[List[float], List[Dict[str, float]]]] = []

    @contextlib.contextmanager
    def forward(self) -> Iterator[None]:
        """Record the forward run inside the block (one run; the profile keeps the median of the runs' times)."""
        rec, stack = self.rec, []

        def enter(i: int) -> Callable[..., None]:
            def hook(module: nn.Module, args: Any) -> None:
                stack.append(rec.stage)
                rec.stage = i

            return hook

        def leave(module: nn.Module, args: Any, output: Any) -> None:
            rec.ended()
            if stack:
                rec.stage = stack.pop()

        handles = []
        for i, module in self.watched:
            handles.append(module.register_forward_pre_hook(enter(i)))
            handles.append(module.register_forward_hook(leave, always_call=True))
        rec.reset()
        try:
            # The pack hook sees what autograd saves; it returns the tensor itself (nothing changes for backward).
            with rec, torch.autograd.graph.saved_tensors_hooks(rec.saved, _unpacked):
                yield
            self.runs.append(rec.seconds)
            self.tail_runs.append(rec.tails(len(self.stage_modules)))
        finally:
            for h in handles:
                h.remove()

    def _pooled(self, sample: Callable[[Any, int], Optional[float]], runs: Sequence[Any]) -> List[float]:
        """Per stage, the median of ``sample(run, stage)`` over the runs and the stage's twins (None: no sample)."""
        per_stage = [
            [x for x in (sample(run, i) for run in runs) if x is not None] for i in range(len(self.stage_modules))
        ]
        return pooled_medians(per_stage, self.stage_modules)

    def result(self) -> OperatorProfile:
        """The profile: bytes of the last recorded run, seconds and tails the medians over runs and twin stages
        (:func:`.chain.pooled_medians`).

        Raises:
            RuntimeError: no forward was recorded.
        """
        if not self.runs:
            raise RuntimeError("OperatorClassProfiler.result: no forward was recorded (run one under .forward())")
        rec, n = self.rec, len(self.stage_modules)
        classes: ClassProfile = [{} for _ in range(n)]
        class_tails: List[Dict[str, float]] = [{} for _ in range(n)]
        for c in sorted({c for _, c in rec.bytes}):
            seconds = self._pooled(lambda run, i: run.get((i, c), 0.0) if (i, c) in rec.bytes else None, self.runs)
            in_tail = self._pooled(
                lambda run, i: run[1][i].get(c, 0.0) if (i, c) in rec.bytes else None, self.tail_runs
            )
            for i in (i for i in range(n) if (i, c) in rec.bytes):
                classes[i][c] = (rec.bytes[(i, c)], seconds[i])
                class_tails[i][c] = in_tail[i]
        tails = self._pooled(lambda run, i: run[0][i], self.tail_runs)
        return OperatorProfile(
            classes=classes,
            operators=[rec.operators.get(i, 0) for i in range(n)],
            alternating=[rec.alternates.get(i, 0) for i in range(n)],
            tails=tails,
            class_tails=class_tails,
        )


class _ProbeBlock(nn.Module):
    """A pre-norm transformer block at toy width: the operator mix of the regions plans make (norms, matrix
    products, splits and views, attention, an activation, residual adds) at a size where the operators' own compute
    is negligible beside what a selective region adds to each."""

    def __init__(self, width: int = 8, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.qkv, self.proj = nn.LayerNorm(width), nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.norm2, self.up, self.down = nn.LayerNorm(width), nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (
            z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in self.qkv(self.norm1(x)).split(d, dim=-1)
        )
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm2(x))))


class _OperatorCounter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.count += 1
        return func(*args, **(kwargs or {}))


def count_operators(fn: Callable[[], Any]) -> int:
    """The aten operators one call of ``fn`` dispatches (views and in-place operators included).

    Args:
        fn: the call, e.g. a module's forward on its inputs.

    Returns:
        How many operators reached the dispatcher below autograd.

    Examples:
        >>> count_operators(lambda: torch.ones(2).add(1).relu())
        3
    """
    counter = _OperatorCounter()
    with counter:
        fn()
    return counter.count


def selective_overhead_per_operator(device: torch.device, sync: Callable[[], None], repeats: int = 15) -> float:
    """Seconds a selective region adds to each of its operators beyond running the operator again.

    What a selective region costs beyond recomputing the operators it does not keep: torch's selective contexts
    (a Python dispatch mode over every operator, in forward and again in the recompute), the region's saved-tensor
    hooks and the recompute's bookkeeping. A toy transformer block's training step is timed three ways, ``repeats``
    times interleaved after one warm-up round: plain, in a selective region keeping matrix products and attention
    (:func:`memsave.selective`), and its forward alone; the overhead is (selective - plain - forward) over the
    operators of one forward, from the medians. It does not grow with the tensors' size (tens of microseconds an
    operator on a server CPU: about 4x what the contexts alone cost on bare operators, which is what this measured
    before; a GPT-2 block's selective region cost about twice what that predicted).

    Args:
        device: where the plan's model runs.
        sync: waits for the device (``torch.cuda.synchronize`` on CUDA, a no-op on CPU).
        repeats: timed runs of each kind (median).

    Returns:
        Seconds per operator; never negative.

    Examples:
        >>> selective_overhead_per_operator(torch.device("cpu"), lambda: None)   # about 1e-04 on a server CPU
    """
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        block = _ProbeBlock().to(device)
        x = torch.randn(2, 4, 8, device=device, requires_grad=True)
    keep = selective("matmul", "attention")
    operators = count_operators(lambda: block(x))

    kinds: List[Tuple[str, Callable[[], Any]]] = [
        ("plain", lambda: block(x).sum().backward()),
        ("selective", lambda: checkpoint(block, x, use_reentrant=False, context_fn=keep).sum().backward()),
        ("forward", lambda: block(x)),
    ]
    times: Dict[str, List[float]] = {name: [] for name, _ in kinds}
    for i in range(repeats + 1):
        for name, fn in kinds if i % 2 else kinds[::-1]:
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            if i:  # the first round warms up
                times[name].append(time.perf_counter() - t0)
    median = {name: statistics.median(ts) for name, ts in times.items()}
    return max(0.0, (median["selective"] - median["plain"] - median["forward"]) / max(1, operators))


def split_operator_classes(entry: str) -> Tuple[str, ...]:
    """The operator classes one entry of ``Chain.operator_classes`` names, in order.

    Args:
        entry: a ``"+"``-joined operator-class set, as :func:`selective_variants` writes it.

    Returns:
        the classes (``"matmul+attention"`` -> ``("matmul", "attention")``).

    Examples:
        >>> split_operator_classes("matmul+attention")
        ('matmul', 'attention')
    """
    return tuple(entry.split("+"))


def selective_variants(
    chain: Chain, stage_modules: Sequence[StageModules], profile: OperatorProfile, overhead_per_operator: float = 0.0
) -> None:
    """Give ``chain`` its operator-class sets and each recomputable stage one variant per set, in place.

    The sets (``chain.operator_classes``) are the non-empty sets of the operator classes found in some recomputable
    stage, largest first (``"matmul+attention"``, ``"matmul"``, ``"attention"``): a selective region may keep every
    class or only some. ``matmul`` and :data:`ALTERNATE` are never in one set, and :data:`ALTERNATE` is left out
    unless :func:`alternation_aligned` (its per-stage numbers assume each stage starts an even count). A stage's
    variant for a set keeps the bytes of its classes' outputs and costs its forward time less their time, plus
    ``overhead_per_operator`` for every operator the stage dispatches (the selective contexts' dispatch mode, in
    forward and recompute); its tail is the stage's less the kept operators in it (:func:`stage_tails`). Stages
    that cannot be recomputed get no variant. A chain without any such operator gets no set.

    Args:
        chain: the chain.
        stage_modules: the modules of its stages (in the same order).
        profile: :meth:`OperatorClassProfiler.result` for these stages.
        overhead_per_operator: :func:`selective_overhead_per_operator` on the plan's device (seconds).

    Examples:
        >>> selective_variants(chain, stage_modules, profile, 2e-5); chain.operator_classes
        ['matmul+attention', 'matmul', 'attention']
    """
    classes = profile.classes
    present = [c for c in OPERATOR_CLASSES if any(c in p for p in classes)]
    if ALTERNATE in present and not alternation_aligned(stage_modules, profile.alternating):
        present.remove(ALTERNATE)
    class_sets = [
        combo
        for n in range(len(present), 0, -1)
        for combo in itertools.combinations(present, n)
        if not ("matmul" in combo and ALTERNATE in combo)
    ]
    chain.operator_classes = ["+".join(p) for p in class_sets]
    tails = profile.tails or [0.0] * len(classes)
    class_tails = profile.class_tails or [{} for _ in classes]
    per_stage = zip(chain.stages, stage_modules, classes, profile.operators, tails, class_tails)
    for st, pc, prof, n, tail, in_tail in per_stage:
        if not (pc.kind == "module" and pc.recomputable) or not class_sets:
            st.selective_fwd_time, st.selective_kept_bytes, st.selective_tail_time = [], [], []
            continue
        overhead = n * overhead_per_operator
        st.selective_kept_bytes = [sum(prof.get(c, (0, 0.0))[0] for c in p) for p in class_sets]
        st.selective_fwd_time = [
            max(0.0, st.fwd_time - sum(prof.get(c, (0, 0.0))[1] for c in p)) + overhead for p in class_sets
        ]
        # The variant's tail: the stage's, less the kept operators in it (those are not run again either way).
        st.selective_tail_time = [
            min(fwd, max(0.0, tail - sum(in_tail.get(c, 0.0) for c in p)))
            for p, fwd in zip(class_sets, st.selective_fwd_time)
        ]


def stage_tails(chain: Chain, stage_modules: Sequence[StageModules], profile: OperatorProfile) -> None:
    """Give each recomputable stage of ``chain`` its ``tail_time`` from ``profile``, in place.

    torch's checkpoint stops a recompute once it has rebuilt the last tensor its region saved for backward (early
    stop): the operators after it in the region's last stage (in a transformer block, the last projection and the
    residual sum; in a classifier, the head) are not run again. A segment's recompute costs its stages' forward
    time less its last stage's tail (``planner::Stage::tail_time``).

    Args:
        chain: the chain.
        stage_modules: the modules of its stages (in the same order).
        profile: :meth:`OperatorClassProfiler.result` for these stages (``tails``).

    Examples:
        >>> stage_tails(chain, stage_modules, profiler.result()); chain.stages[5].tail_time   # seconds
    """
    for st, pc, tail in zip(chain.stages, stage_modules, profile.tails):
        recomputable = pc.kind == "module" and pc.recomputable
        st.tail_time = min(st.fwd_time, tail) if recomputable else 0.0


def alternation_aligned(stage_modules: Sequence[StageModules], alternating: Sequence[int]) -> bool:
    """Whether a region keeping :data:`ALTERNATE` keeps, in every stage, the products the profile recorded for it.

    The profile counts each stage's matrix products from 1 and records the odd-numbered ones; a region counts from
    its own start. The two agree in every region the planner can form (a run of recomputable stages) unless a
    stage with an odd count is followed, in such a run, by a stage that runs any: its count would start odd there.
    (A Llama decoder layer runs 7 products, a GPT-2 or ViT block 4.)

    Args:
        stage_modules: the chain's stages.
        alternating: per stage, the products :data:`ALTERNATE` counts (:attr:`OperatorProfile.alternating`).

    Returns:
        True when every region's count starts even at each of its stages (or nothing was counted).

    Examples:
        >>> alternation_aligned(stages, [0, 4, 4, 4, 1])   # embeddings, three blocks, an output head
        True
    """
    odd_before = False
    for pc, n in zip(stage_modules, alternating):
        if not (pc.kind == "module" and pc.recomputable):
            odd_before = False  # no region spans a stage that cannot be recomputed
            continue
        if n and odd_before:
            return False
        odd_before = odd_before or n % 2 == 1
    return True
