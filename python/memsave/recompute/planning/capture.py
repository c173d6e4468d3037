"""One dynamo capture of the step, compiled once per candidate: how ``plan(compile=True)`` measures candidates
without tracing the model again for each.

A plan's regions under ``torch.compile`` lower to torch's checkpoint, which dynamo traces into a tagged subgraph;
AOT autograd then marks each node the region ran with a *recompute tag* (``node.meta["recompute"]``, and
``"ac_graph_id"``, one per region call) and the min-cut partitioner recomputes the tagged nodes in backward. Tracing
the model with dynamo is most of a compile on the transformer models (10 of GPT-2's 12 s on a CPU), and the regions
change nothing dynamo sees but those tags. So :class:`CapturedStep`, a ``torch.compile`` backend, keeps the graphs
dynamo captured of the plain model once, and compiles them with inductor once per *program*: a plan's regions
written as recompute tags on the nodes their modules ran (found by ``nn_module_stack``), torch's partitioner at the
program's budget. The operators a selective region keeps (:func:`memsave.selective`) are marked ``MUST_SAVE`` on the
joint graph, by the ATen operator each node came from (``original_aten``), as torch's selective checkpoint marks
them while it traces. The compiled step then saves and recomputes what ``torch.compile(memsave.wrap(model, plan))``
does: the same peak, byte for byte, on GPT-2, ViT and ResNet-50 (tests/recompute/test_plan_capture.py).

A region none of whose modules ran inside a captured graph (a graph break around it) cannot be tagged:
:meth:`CapturedStep.covers` says so, and the planner compiles that candidate the old way.
"""

from __future__ import annotations

import copy
import re
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple, Union

import torch
from torch import fx, nn

from ...common import compat
from ..selective import ALTERNATE, operators_of
from .partitioner import PartitionerBackend
from .plan import Plan

__all__ = ["CapturedStep", "RegionTags", "module_path", "region_tags"]

#: A plan's regions as a program sees them: per region, the module names it runs and the operator classes it keeps.
RegionTags = Tuple[Tuple[Tuple[str, ...], Tuple[str, ...]], ...]

_INDEX = re.compile(r"\[(\d+)\]")
_MODULES_ITEM = re.compile(r"\._modules\[['\"]([^'\"]+)['\"]\]")
_GETATTR = re.compile(r"getattr\((.*), ['\"]([^'\"]+)['\"]\)")


def module_path(source: str) -> str:
    """The qualified module name (``model.named_modules()``'s) of a dynamo ``nn_module_stack`` source.

    Args:
        source: the first item of an ``nn_module_stack`` entry, as dynamo writes it.

    Returns:
        the dotted name, ``""`` for the model itself.

    Examples:
        >>> module_path("L['self'].transformer.h[0]")
        'transformer.h.0'
        >>> module_path("L['self']._modules['blocks']._modules['3'].attn")
        'blocks.3.attn'
    """
    path = source
    while _GETATTR.search(path):
        path = _GETATTR.sub(r"\1.\2", path)
    path = _MODULES_ITEM.sub(r".\1", path)
    path = _INDEX.sub(r".\1", path)
    path = re.sub(r"^L\[['\"]self['\"]\]", "", path)
    return path.lstrip(".")


def region_tags(plan: Optional[Plan]) -> RegionTags:
    """The regions of ``plan`` (None: none), each as the module names it runs and the operator classes it keeps.

    Examples:
        >>> region_tags(plan)
        ((('transformer.h.0',), ()), (('transformer.h.1',), ('matmul', 'attention')))
    """
    if plan is None:
        return ()
    return tuple(
        (tuple(m for i in range(b, e) for m in plan.stage_modules[i].modules), plan.keeps(k))
        for k, (b, e, rec) in enumerate(plan.segments)
        if rec
    )


def _node_modules(node: fx.Node, names: Dict[str, str]) -> List[str]:
    """The names of the modules whose call ran ``node``, outermost first: by the module's id, dynamo's key (a frame
    resumed after a graph break names its modules by local variables), else by the source dynamo wrote."""
    stack = node.meta.get("nn_module_stack") or {}
    return [names.get(str(key)) or module_path(str(v[0])) for key, v in stack.items()]


def _tag(
    gm: fx.GraphModule, tags: RegionTags, names: Dict[str, str]
) -> Tuple[fx.GraphModule, Dict[int, Tuple[str, ...]]]:
    """A copy of ``gm`` whose nodes run by a region's modules carry that region's recompute tag (its id: its
    position, from 1); returns it and the operator classes each region id keeps."""
    owner = {name: rid for rid, (names, _) in enumerate(tags, 1) for name in names}
    tagged = copy.deepcopy(gm)
    for node in tagged.graph.nodes:
        if node.op in ("placeholder", "output", "get_attr"):
            continue
        rid = next((owner[m] for m in _node_modules(node, names) if m in owner), None)
        if rid is not None:
            node.meta["recompute"] = compat.CheckpointPolicy.PREFER_RECOMPUTE
            node.meta["ac_graph_id"] = rid
    return tagged, {rid: keeps for rid, (_, keeps) in enumerate(tags, 1) if keeps}


def _names(operator_class: str) -> Set[str]:
    # By name: the joint graph's operator objects need not be the ones torch.ops hands out here.
    return {str(op) for op in operators_of(operator_class)}


class _KeptOperators(compat.CustomGraphPass):
    """Inductor's joint-graph pass marking what selective regions keep: a forward node of region ``rid`` from an
    operator of a kept class is ``MUST_SAVE``; of ``alternate_matmul``, every other such operator call, the first
    kept (:func:`memsave.selective`'s rule, counted per region in forward order)."""

    def __init__(self, keeps: Dict[int, Tuple[str, ...]]) -> None:
        self.keeps = keeps
        self.kept = {rid: set().union(*(_names(c) for c in cs if c != ALTERNATE)) for rid, cs in keeps.items()}
        self.alternating = _names(ALTERNATE)

    def uuid(self) -> Any:
        return repr(sorted(self.keeps.items()))

    def __call__(self, graph: fx.Graph) -> None:
        backward = _backward_nodes(graph)
        calls: Dict[int, Tuple[int, Any]] = {}  # region id -> (alternating calls so far, the last call's key)
        for node in graph.nodes:
            rid = node.meta.get("ac_graph_id")
            if rid not in self.keeps or node.op != "call_function" or node in backward:
                continue
            op = str(node.meta.get("original_aten") or node.target)
            keep = op in self.kept[rid]
            if op in self.alternating and ALTERNATE in self.keeps[rid]:
                count, last = calls.get(rid, (0, None))
                call = (op, node.meta.get("seq_nr"))  # the nodes one operator decomposed into share its call
                count += call != last
                calls[rid] = (count, call)
                keep = count % 2 == 1
            if keep:
                node.meta["recompute"] = compat.CheckpointPolicy.MUST_SAVE


def _backward_nodes(graph: fx.Graph) -> Set[fx.Node]:
    """The joint graph's nodes that depend on a tangent (the backward's)."""
    out: Set[fx.Node] = set()
    for node in graph.nodes:
        if (node.op == "placeholder" and "tangent" in node.name) or any(a in out for a in node.all_input_nodes):
            out.add(node)
    return out


class CapturedStep:
    """``torch.compile`` of ``model`` with a backend that keeps each graph dynamo captures and compiles it with
    inductor once per program (:meth:`program`): a plan's regions as recompute tags, torch's partitioner at a
    budget.

    Args:
        model: the module to capture (the planner's copy sharing the model's parameters).
        backend: what compiles each program's graphs, as ``torch.compile`` takes it (a name or a callable; the
            planner's: inductor). Another backend sees the same tagged graphs under the same partitioner budget.

    Examples:
        >>> capture = CapturedStep(model)
        >>> loss_fn(capture.program((), None)(x)).backward()     # dynamo captures here; the plain program
        >>> run = capture.program(region_tags(plan), None)
        >>> loss_fn(run(x)).backward()                            # plan's regions, compiled (once) here
        >>> loss_fn(capture.program((), 0.5)(x)).backward()       # no region, torch's partitioner at 0.5
    """

    def __init__(self, model: nn.Module, backend: Union[str, Callable[..., Any]] = "inductor") -> None:
        self.backend = backend
        self.names = {str(id(m)): name for name, m in model.named_modules()}
        self.compiled = torch.compile(model, backend=self)
        self.graphs: List[fx.GraphModule] = []
        self.contexts: List[Any] = []  # per graph, dynamo's tracing context, to compile it in later
        self.programs: Dict[Tuple[int, RegionTags, Optional[float]], Callable[..., Any]] = {}
        self.active: Tuple[RegionTags, Optional[float]] = ((), None)
        self.whole = False  # the capture ran without a graph break (:meth:`covers`)
        self.seen: Set[str] = set()  # the modules some captured node ran in (:meth:`covers`)

    def __call__(self, gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        index = len(self.graphs)
        self.graphs.append(gm)
        self.contexts.append(compat.tracing_context())
        self.seen.update(m for node in gm.graph.nodes for m in _node_modules(node, self.names))

        def run(*args: Any) -> Any:
            key = (index, *self.active)
            if key not in self.programs:
                self.programs[key] = self._compile(index, list(args))
            return self.programs[key](*args)

        return run

    def select(self, tags: RegionTags, partitioner: Optional[float]) -> None:
        """The program the next steps run: ``tags``' regions, torch's partitioner at ``partitioner``."""
        self.active = (tags, partitioner)

    def program(self, tags: RegionTags, partitioner: Optional[float]) -> Callable[..., Any]:
        """The compiled model running the program of ``tags`` and ``partitioner``, selected on each call, so that
        programs can be interleaved step by step."""

        def run(*args: Any, **kwargs: Any) -> Any:
            self.select(tags, partitioner)
            if self.graphs:
                return self.compiled(*args, **kwargs)
            breaks = compat.graph_breaks()  # the capture: did all of the model's code run inside graphs?
            out = self.compiled(*args, **kwargs)
            self.whole = compat.graph_breaks() == breaks
            return out

        return run

    def covers(self, tags: RegionTags) -> bool:
        """Every region of ``tags`` ran inside the captured graphs (False before the first step): the model was
        captured without a graph break (a module no node names ran no operator: ``Identity``, dropout at 0), or
        each region ran some node of the graphs."""
        if not self.graphs:
            return False
        return all(self.whole or any(m in self.seen for m in names) for names, _ in tags)

    def _compile(self, index: int, inputs: List[Any]) -> Callable[..., Any]:
        tags, partitioner = self.active
        gm, keeps = _tag(self.graphs[index], tags, self.names)
        kept = _KeptOperators(keeps) if keeps else None
        with compat.compiling_in(self.contexts[index]), compat.joint_graph_pass(kept):
            return PartitionerBackend(partitioner, self.backend)(gm, inputs)
