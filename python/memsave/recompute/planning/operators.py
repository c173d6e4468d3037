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
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from ..region import checkpoint
from ..selective import OPERATOR_CLASSES, operators_of, selective
from .chain import Chain, StageModules

__all__ = [
    "ClassProfile",
    "OperatorClassProfiler",
    "OperatorProfile",
    "count_operators",
    "selective_overhead_per_operator",
    "selective_variants",
    "split_operator_classes",
]

# Per stage: operator class -> (bytes of the outputs its operators return, median seconds of those operators).
ClassProfile = List[Dict[str, Tuple[int, float]]]


@dataclass
class OperatorProfile:
    """What :class:`OperatorClassProfiler` measured: per stage, the classes' bytes and seconds (``classes``) and
    the number of operators the stage dispatches in one forward (``operators``)."""

    classes: ClassProfile
    operators: List[int]


class _ClassRecorder(TorchDispatchMode):
    """Times the operators of the given classes and sums the bytes of the storages they return, per stage."""

    def __init__(self, op_class: Dict[Any, str], sync: Callable[[], None]) -> None:
        super().__init__()
        self.op_class = op_class
        self.sync = sync
        self.stage: Optional[int] = None
        self.bytes: Dict[Tuple[int, str], int] = {}
        self.seconds: Dict[Tuple[int, str], float] = {}
        self.operators: Dict[int, int] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if self.stage is not None:
            self.operators[self.stage] = self.operators.get(self.stage, 0) + 1
        cls = self.op_class.get(func) if self.stage is not None else None
        if cls is None:
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
        key = (int(self.stage or 0), cls)
        self.bytes[key] = self.bytes.get(key, 0) + sum(storages.values())
        self.seconds[key] = self.seconds.get(key, 0.0) + dt
        return out


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
        self.rec = _ClassRecorder({op: c for c in classes for op in operators_of(c)}, sync)
        modules = dict(model.named_modules())
        self.stages = len(stage_modules)
        self.watched = [
            (i, modules[name])
            for i, pc in enumerate(stage_modules)
            if pc.kind == "module" and pc.recomputable
            for name in pc.modules
        ]
        self.runs: List[Dict[Tuple[int, str], float]] = []

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
            if stack:
                rec.stage = stack.pop()

        handles = []
        for i, module in self.watched:
            handles.append(module.register_forward_pre_hook(enter(i)))
            handles.append(module.register_forward_hook(leave, always_call=True))
        rec.bytes, rec.seconds, rec.operators, rec.stage = {}, {}, {}, None
        try:
            with rec:
                yield
            self.runs.append(rec.seconds)
        finally:
            for h in handles:
                h.remove()

    def result(self) -> OperatorProfile:
        """The profile: bytes of the last recorded run, seconds the median over runs.

        Raises:
            RuntimeError: no forward was recorded.
        """
        if not self.runs:
            raise RuntimeError("OperatorClassProfiler.result: no forward was recorded (run one under .forward())")
        rec = self.rec
        classes: ClassProfile = [{} for _ in range(self.stages)]
        for (i, c), b in rec.bytes.items():
            classes[i][c] = (b, statistics.median(r.get((i, c), 0.0) for r in self.runs))
        return OperatorProfile(classes=classes, operators=[rec.operators.get(i, 0) for i in range(self.stages)])


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
    class or only some. A stage's variant for a set keeps the bytes of its classes' outputs and costs its forward
    time less their time, plus ``overhead_per_operator`` for every operator the stage dispatches (the selective
    contexts' dispatch mode, in forward and recompute). Stages that cannot be recomputed get no variant. A chain
    without any such operator gets no set.

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
    class_sets = [combo for n in range(len(present), 0, -1) for combo in itertools.combinations(present, n)]
    chain.operator_classes = ["+".join(p) for p in class_sets]
    for st, pc, prof, n in zip(chain.stages, stage_modules, classes, profile.operators):
        if not (pc.kind == "module" and pc.recomputable) or not class_sets:
            st.selective_fwd_time, st.selective_kept_bytes = [], []
            continue
        overhead = n * overhead_per_operator
        st.selective_kept_bytes = [sum(prof.get(c, (0, 0.0))[0] for c in p) for p in class_sets]
        st.selective_fwd_time = [
            max(0.0, st.fwd_time - sum(prof.get(c, (0, 0.0))[1] for c in p)) + overhead for p in class_sets
        ]
