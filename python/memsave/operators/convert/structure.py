"""``memsave.convert(model, fuse=True)`` recognises structures by what they compute, in any model, not by class name.

What it looks for (each candidate is checked by the probe of :mod:`.probe` before it is swapped: equal to the
original within float tolerance on a random input, with random parameters, and keeping fewer bytes for backward):

==================  ===================================================  =============================================
structure           recognised by                                        replaced by
==================  ===================================================  =============================================
RMS-style norm      a module whose only parameter is a 1-D ``weight``,   :class:`memsave.nn.RMSNorm` (``weight_offset``
                    with an ``eps`` / ``variance_epsilon`` / ``epsilon`` 1.0 for ``1 + weight``), or fused into the
                    attribute, computing ``x * rsqrt(mean(x^2) + eps) *  Linears that alone read its output
                    weight`` (or ``* (1 + weight)``, Gemma's) over the   (:class:`memsave.nn.RMSNormLinear`); a norm
                    last dimension                                       over a head dimension (Qwen3's q_norm) too
LayerNorm           ``nn.LayerNorm`` and subclasses over one dimension,  fused into the Linears that alone read its
                    computing ``F.layer_norm``                           output (:class:`memsave.nn.LayerNormLinear`);
                                                                         alone it is left as torch's (which keeps
                                                                         only its input and per-row statistics)
gated MLP           a module whose parameters are those of a down        :class:`memsave.nn.GatedMLP` (its own child
                    ``nn.Linear`` and either two projections to its      names kept) / :class:`PackedGatedMLP`; the
                    width (gate, up) or one to twice its width (packed   expert MLPs of a mixture-of-experts layer
                    gate_up), computing ``down(act(gate(x)) * up(x))``   where they are such modules
activation ->       a parameter-free module computing gelu, gelu_tanh,   ``Identity`` and
Linear              silu, relu, elu or leaky_relu whose output only one  :class:`memsave.nn.ActLinear`
                    Linear (or a Conv1D-style ``x @ weight + bias``)
                    reads
causal-LM head      see :mod:`.causal_lm`                                :class:`.causal_lm.CausalLMHead`
==================  ===================================================  =============================================

Who reads a norm's or an activation's output is the trace of :mod:`.dataflow` (one probe forward of the model); a
model that declares no probe input gets no norm or activation fusion (its norms are still swapped one for one, its
gated MLPs replaced). A candidate that fails its probe, keeps as many bytes as the original, or whose output is read
by something else is left as it is, with the reason in the report.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterator, List, Optional, Tuple, Union, cast

import torch
from torch import nn

from ..functional import GATED_ACTIVATIONS
from ..nn import (
    ActLinear,
    DeferredLayerNorm,
    DeferredRMSNorm,
    GatedMLP,
    LayerNormLinear,
    PackedGatedMLP,
    RMSNorm,
    RMSNormLinear,
    activation_spec,
)
from . import causal_lm
from .dataflow import Dataflow, probe_call, trace
from .probe import FLOAT32_RTOL, Check, check, probe_input
from .registry import Note, Target, Unit

Tensor = torch.Tensor

__all__ = ["Analysis", "analyse", "fused_activation", "is_gated_mlp"]

# The activations the probe tells apart, as (name, param, torch function).
_ACTIVATIONS: Tuple[Tuple[str, Optional[float], Callable[[Tensor], Tensor]], ...] = (
    ("gelu", None, nn.functional.gelu),
    ("gelu_tanh", None, lambda x: nn.functional.gelu(x, approximate="tanh")),
    ("silu", None, nn.functional.silu),
    ("relu", None, nn.functional.relu),
    ("elu", 1.0, nn.functional.elu),
    ("leaky_relu", 0.01, nn.functional.leaky_relu),
)
_GATED = tuple(a for a in GATED_ACTIVATIONS if a != "identity")
_EPS_NAMES = ("variance_epsilon", "eps", "epsilon")
# A norm is probed at two input scales: where eps is negligible, and where it is not (how it enters shows).
_NORM_SCALES = (1.0, 1e-3)
_NORM_DETAIL = "keeps its input and one float per row instead of also the normalized tensor"
_GATED_DETAIL = (
    "keeps x, gate and up (2 tensors of the MLP width) instead of gate, act(gate), up and act(gate) * up (4); the "
    "product is recomputed for the down projection's backward"
)
_ACT_DETAIL = "keeps the activation's input only instead of its input and output; the activation is recomputed"
_UNPROFITABLE = "convert(..., unprofitable=True) makes it anyway"


def _is_memsave(module: nn.Module) -> bool:
    return type(module).__module__.startswith("memsave.")


def _probe_activation(act: nn.Module) -> Optional[Tuple[str, Optional[float]]]:
    x = probe_input(16, torch.empty(0)) * 3
    try:
        with torch.no_grad():
            out = act(x)
    except Exception:  # not an elementwise activation of one tensor
        return None
    if not isinstance(out, Tensor) or out.shape != x.shape:
        return None
    for name, param, fn in _ACTIVATIONS:
        ref = fn(x)
        if (out - ref).abs().max().item() <= FLOAT32_RTOL * ref.abs().max().item():
            return name, param
    return None


def fused_activation(act: object) -> Union[Tuple[str, Optional[float]], str]:
    """The fused operators' activation that ``act`` computes, or the reason there is none.

    torch's activation modules are read (:func:`memsave.nn.activation_spec`); any other parameter-free module is
    run on a probe and compared with gelu, gelu_tanh, silu, relu, elu and leaky_relu (so transformers' and timm's
    activation classes are recognised by what they compute).

    Args:
        act: an activation module (or anything else, which gets a reason).

    Returns:
        ``(name, param)`` for :func:`memsave.functional.act_linear` / ``gated_act``, or a one-line reason.

    Examples:
        >>> fused_activation(transformers.activations.NewGELUActivation())
        ('gelu_tanh', None)
    """
    if not isinstance(act, nn.Module):
        return f"the activation is a {type(act).__name__}, not a module"
    spec = activation_spec(act)
    if spec is not None:
        return spec[0], spec[1]
    if any(True for _ in act.parameters()):
        return f"activation {type(act).__name__} has parameters: no fused memsave kernel"
    found = _probe_activation(act)
    if found is None:
        names = ", ".join(n for n, _, _ in _ACTIVATIONS)
        return f"activation {type(act).__name__} computes none of the fused kernels' ({names}) on a probe"
    return found


# ---- norms --------------------------------------------------------------------------------------------------------


@dataclass
class _Norm:
    path: str
    module: nn.Module
    kind: str  # "rms" or "layer"
    offset: float = 0.0
    alone: Optional[Check] = None  # the standalone RMSNorm's check


def _rms_candidate(m: nn.Module) -> bool:
    """The shape of an RMS norm: one 1-D floating weight, an eps attribute, nothing else."""
    if _is_memsave(m) or isinstance(m, nn.LayerNorm) or any(True for _ in m.buffers()):
        return False
    params = list(m.parameters())
    weight = getattr(m, "weight", None)
    if len(params) != 1 or params[0] is not weight or weight.dim() != 1 or not weight.is_floating_point():
        return False
    return any(isinstance(getattr(m, n, None), float) for n in _EPS_NAMES)


def _eps(m: nn.Module) -> float:
    return next(float(getattr(m, n)) for n in _EPS_NAMES if isinstance(getattr(m, n, None), float))


def _recognise_rms(path: str, m: nn.Module) -> Union[_Norm, Note]:
    weight = cast(Tensor, m.weight)
    reasons = []
    for offset in (0.0, 1.0):
        new = RMSNorm.from_module(_EpsView(m), weight_offset=offset)
        got = check(m, new, [m], weight.shape[0], weight, scales=_NORM_SCALES)
        if got.equal:
            return _Norm(path, m, "rms", offset, got)
        reasons.append(got.reason)
    return Note(
        path,
        m,
        f"rms_norm: not an RMS norm: x * rsqrt(mean(x^2) + eps) * weight {reasons[0]}; with 1 + weight {reasons[1]}",
    )


class _EpsView(nn.Module):
    """A norm's weight and eps under the names memsave's RMSNorm reads (``epsilon`` included)."""

    def __init__(self, norm: nn.Module) -> None:
        super().__init__()
        self.weight = norm.weight
        self.variance_epsilon = _eps(norm)


def _recognise_layer_norm(path: str, m: nn.LayerNorm) -> Union[_Norm, Note, None]:
    if _is_memsave(m) or len(tuple(m.normalized_shape)) != 1:
        return None
    shape = tuple(m.normalized_shape)
    like = m.weight if m.weight is not None else torch.empty(0)

    def reference(x: Tensor) -> Tensor:
        return nn.functional.layer_norm(x, shape, m.weight, m.bias, m.eps)

    got = check(m, reference, [m], shape[0], like, scales=_NORM_SCALES)
    if not got.equal:
        return Note(path, m, f"layer_norm_linear: {type(m).__name__} does not compute F.layer_norm: {got.reason}")
    return _Norm(path, m, "layer")


# ---- gated MLPs ---------------------------------------------------------------------------------------------------


@dataclass
class _Gated:
    path: str
    module: nn.Module
    names: Tuple[str, ...]  # (gate, up, down) or (gate_up, down)
    act: str
    gate_first: bool
    check: Check


def _dims(m: nn.Module) -> Optional[Tuple[int, int]]:
    """(in, out) of a Linear-like module (nn.Linear, a LoRA-wrapped one), or None."""
    i, o = getattr(m, "in_features", None), getattr(m, "out_features", None)
    return (i, o) if isinstance(i, int) and isinstance(o, int) else None


def _plain_linear(m: object) -> bool:
    return isinstance(m, nn.Linear) and not _is_memsave(m) and type(m).forward is nn.Linear.forward


def _layouts(m: nn.Module) -> List[Tuple[Tuple[str, ...], bool]]:
    """The (names, gate_first) role assignments the children's shapes allow: down is a plain nn.Linear (I -> H),
    gate and up map H -> I (both orders) or one packed projection maps H -> 2I (both halves first)."""
    kids = {n: c for n, c in m.named_children() if _dims(c) is not None}
    out: List[Tuple[Tuple[str, ...], bool]] = []
    for d, down in kids.items():
        if not _plain_linear(down):
            continue
        hidden, width = cast(nn.Linear, down).out_features, cast(nn.Linear, down).in_features
        proj = [n for n, c in kids.items() if n != d and _dims(c) == (hidden, width)]
        packed = [n for n, c in kids.items() if n != d and _dims(c) == (hidden, 2 * width)]
        if len(proj) == 2 and not packed:
            out += [((proj[0], proj[1], d), True), ((proj[1], proj[0], d), True)]
        elif len(packed) == 1 and not proj:
            out += [((packed[0], d), True), ((packed[0], d), False)]
    return out


def _owns_all_parameters(m: nn.Module, names: Tuple[str, ...]) -> bool:
    owned = {id(p) for n in names for p in getattr(m, n).parameters()}
    return all(id(p) in owned for p in m.parameters()) and not any(True for _ in m.buffers())


def _gated_acts(m: nn.Module, names: Tuple[str, ...]) -> Union[List[str], str]:
    """The activations to try: the one child that computes one (or all the gated kernels' if there is none)."""
    acts = [
        c for n, c in m.named_children()
        if n not in names and not isinstance(c, (nn.Dropout, nn.Identity)) and not any(True for _ in c.parameters())
    ]  # fmt: skip
    if len(acts) != 1:
        return list(_GATED)
    spec = fused_activation(acts[0])
    if isinstance(spec, str):
        return spec
    if spec[0] not in _GATED or (spec[1] is not None and spec[0] != "relu"):
        return f"activation {spec[0]} is not one of the gated kernels' {_GATED}"
    return [spec[0]]


def _build_gated(
    m: nn.Module, names: Tuple[str, ...], act: str, gate_first: bool, parts: Dict[str, nn.Module]
) -> nn.Module:
    down = cast(nn.Linear, parts[names[-1]])
    new: nn.Module
    if len(names) == 3:
        new = GatedMLP.from_modules(parts[names[0]], parts[names[1]], down, act=act, names=names)
    else:
        new = PackedGatedMLP.from_modules(parts[names[0]], down, act=act, gate_first=gate_first, names=names)
    order = [n for n, _ in m.named_children() if n in new._modules]
    new._modules = {n: new._modules[n] for n in order}  # the original's order: its state_dict keys, in order
    return new


def _takes_one_tensor(m: nn.Module) -> bool:
    """Its forward can be called with one tensor (every other parameter has a default)."""
    try:
        params = list(inspect.signature(m.forward).parameters.values())
    except (TypeError, ValueError):
        return False
    plain = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    return bool(plain) and all(p.default is not p.empty for p in plain[1:]) and plain[0].kind != plain[0].KEYWORD_ONLY


def _recognise_gated(path: str, m: nn.Module) -> Union[_Gated, Note, None]:
    if _is_memsave(m) or not _takes_one_tensor(m):
        return None
    layouts = [(names, first) for names, first in _layouts(m) if _owns_all_parameters(m, names)]
    if not layouts:
        return None
    acts = _gated_acts(m, layouts[0][0])
    if isinstance(acts, str):
        return Note(path, m, f"gated_mlp: {acts}")
    down = getattr(m, layouts[0][0][-1])
    last = ""
    for names, gate_first in layouts:
        parts = {n: getattr(m, n) for n in names}
        for act in acts:
            new = _build_gated(m, names, act, gate_first, parts)
            got = check(m, new, [m], down.out_features, down.weight)
            if got.equal:
                return _Gated(path, m, names, act, gate_first, got)
            last = got.reason
    shapes = " / ".join(", ".join(names) for names, _ in layouts[:2])
    return Note(
        path,
        m,
        f"gated_mlp: has the shapes of a gated MLP ({shapes}) but not down(act(gate(x)) * up(x)) "
        f"with act in {acts}: {last}",
    )


def is_gated_mlp(module: nn.Module) -> bool:
    """Whether ``module`` computes ``down(act(gate(x)) * up(x))`` (checked on a probe; see the module docstring).

    Args:
        module: any module (its parameters are put back after the probe).

    Returns:
        True for a gated MLP that memsave's GatedMLP / PackedGatedMLP computes.

    Examples:
        >>> is_gated_mlp(llama.model.layers[0].mlp)
        True
    """
    return isinstance(_recognise_gated("", module), _Gated)


def _experts_note(path: str, m: nn.Module) -> Optional[Note]:
    # Stacked experts hold two or more [experts, in, out] tensors (gate/up and down); a convolution's one weight
    # (3-D in Conv1d, more elsewhere) is not that.
    stacked = [n for n, p in m.named_parameters(recurse=False) if p.dim() == 3]
    if len(stacked) < 2:
        return None
    return Note(
        path,
        m,
        f"experts: {', '.join(stacked)} are stacked [experts, ...] parameters that its forward "
        "indexes per expert, not per-expert modules: no gated MLP module to swap",
    )


# ---- the analysis: candidates, dataflow, and the units planned from them ------------------------------------------


def _watched(model: nn.Module, norms: List[_Norm]) -> List[nn.Module]:
    """The modules whose readers the trace records: the norms and every parameter-free leaf (activations)."""
    leaves = [
        m for m in model.modules()
        if not any(True for _ in m.children()) and not any(True for _ in m.parameters())
        and not isinstance(m, (nn.Dropout, nn.Identity)) and not _is_memsave(m)
    ]  # fmt: skip
    return [n.module for n in norms] + leaves


@dataclass
class Analysis:
    """What :func:`analyse` found in a model; :meth:`units` plans from it.

    Attributes:
        names: ``id(module) -> qualified name``.
        flow: the trace (None when the model declares no probe input, or its forward failed: ``flow_why``).
        next_of: ``id(module) -> the one module that reads its output`` (the mask swaps' consumer).

    Examples:
        >>> a = analyse(model)
        >>> for item in a.units(done): ...                    # plan each before taking the next
    """

    model: nn.Module
    unprofitable: bool
    names: Dict[int, str]
    heads: List[Union[Unit, Note]] = field(default_factory=list)
    norms: List[_Norm] = field(default_factory=list)
    mlps: List[_Gated] = field(default_factory=list)
    notes: List[Note] = field(default_factory=list)
    flow: Optional[Dataflow] = None
    flow_why: str = ""
    next_of: Dict[int, nn.Module] = field(default_factory=dict)

    def units(self, done: Dict[int, Optional[nn.Module]]) -> Iterator[Union[Unit, Note]]:
        """The units to plan, in order (the head, the norms, the gated MLPs, activation -> Linear) and the notes.
        Lazy: a gated MLP is built from what ``done`` says its projections became (fused with a norm or not), so
        plan each unit before taking the next."""
        yield from self.heads
        for norm in self.norms:
            yield from self._norm_units(norm, done)
        for mlp in self.mlps:
            yield self._mlp_unit(mlp, done)
        for item in self._act_units(done):
            yield item
        yield from self.notes

    # ---- norms ----

    def _readers_text(self, module: nn.Module) -> str:
        if self.flow is None:
            return f"not fused with the Linears that read it: {self.flow_why}"
        return f"not fused: its output is read by {self.flow.describe(module, self.names)}"

    def _fusable(self, reader: nn.Module, width: int, done: Dict[int, Optional[nn.Module]]) -> bool:
        if not isinstance(reader, nn.Linear) or _is_memsave(reader) or id(reader) in done:
            return False
        if reader.in_features != width or reader.weight.dim() != 2:
            return False
        if type(reader).forward is nn.Linear.forward:
            return True

        def plain(x: Tensor) -> Tensor:
            return nn.functional.linear(x, reader.weight, reader.bias)

        return check(reader, plain, [reader], width, reader.weight).equal  # a subclass computing F.linear

    def _norm_units(self, norm: _Norm, done: Dict[int, Optional[nn.Module]]) -> Iterator[Union[Unit, Note]]:
        m = norm.module
        weight = getattr(m, "weight", None)
        width = int(weight.shape[0]) if isinstance(weight, Tensor) else int(cast(nn.LayerNorm, m).normalized_shape[0])
        readers = self.flow.only_readers(m) if self.flow is not None else None
        why = self._readers_text(m)
        if readers and all(self._fusable(r, width, done) for r in readers):
            fused = self._fused_norm_unit(norm, readers, width)
            if isinstance(fused, Unit):
                yield fused
                return
            why = fused.detail
        if norm.kind == "layer":
            if self.flow is not None:
                yield Note(
                    norm.path,
                    m,
                    f"layer_norm_linear: left as torch's LayerNorm (it keeps its input and "
                    f"per-row statistics only); {why}",
                )
            return
        alone = norm.alone
        assert alone is not None
        if not (alone.saves or self.unprofitable):
            yield Note(norm.path, m, f"rms_norm: {alone.bytes_text()}: no saving; {why}; {_UNPROFITABLE}")
            return
        new = RMSNorm.from_module(_EpsView(m), weight_offset=norm.offset)
        offset = " (1 + weight)" if norm.offset else ""
        yield Unit("rms_norm", (Target(norm.path, new, f"{_NORM_DETAIL}{offset}; {alone.bytes_text()}; {why}"),))

    def _fused_norm_unit(self, norm: _Norm, readers: List[nn.Module], width: int) -> Union[Unit, Note]:
        m = norm.module
        linears = [cast(nn.Linear, r) for r in readers]
        fused: List[nn.Module]
        if norm.kind == "rms":
            deferred: nn.Module = DeferredRMSNorm(_EpsView(m), norm.offset)
            fused = [RMSNormLinear.from_modules(deferred, r, register_norm=False) for r in linears]
        else:
            deferred = DeferredLayerNorm(cast(nn.LayerNorm, m))
            fused = [
                LayerNormLinear.from_modules(cast(nn.LayerNorm, deferred), r, register_norm=False) for r in linears
            ]

        def original(x: Tensor) -> Tuple[Tensor, ...]:
            y = m(x)  # once, read by every Linear, as in the model
            return tuple(r(y) for r in readers)

        got = check(original, lambda x: tuple(f(x) for f in fused), [m, *readers], width, linears[0].weight)
        rule = "rms_norm_linear" if norm.kind == "rms" else "layer_norm_linear"
        if not got.equal:
            return Note(norm.path, m, f"{rule}: the fused Linears differ from norm -> Linear: {got.reason}")
        if not (got.saves or self.unprofitable):
            return Note(norm.path, m, f"{rule}: {got.bytes_text()}: no saving; {_UNPROFITABLE}")
        paths = [self.names[id(r)] for r in readers]
        kind = type(fused[0]).__name__
        targets = [Target(norm.path, deferred, f"holds the norm's parameters; {', '.join(paths)} apply the norm")]
        shared = f" (one tensor for the {len(readers)} Linears that read the norm)" if len(readers) > 1 else ""
        detail = f"{kind}: keeps the norm's input{shared} instead of the norm's output; {got.bytes_text()}"
        targets += [Target(p, f, detail) for p, f in zip(paths, fused)]
        return Unit(rule, tuple(targets))

    # ---- gated MLPs and activations ----

    def _mlp_unit(self, g: _Gated, done: Dict[int, Optional[nn.Module]]) -> Union[Unit, Note]:
        if not (g.check.saves or self.unprofitable):
            return Note(g.path, g.module, f"gated_mlp: {g.check.bytes_text()}: no saving; {_UNPROFITABLE}")
        parts: Dict[str, nn.Module] = {}
        for n in g.names:
            old = getattr(g.module, n)
            new = done.get(id(old))
            parts[n] = new if new is not None else old
        fused = [n for n in g.names if parts[n] is not getattr(g.module, n)]
        new_mlp = _build_gated(g.module, g.names, g.act, g.gate_first, parts)
        extra = f"; {', '.join(fused)} apply the norm before it (they keep the norm's input)" if fused else ""
        detail = f"act {g.act}: {_GATED_DETAIL}; {g.check.bytes_text()}{extra}"
        return Unit("gated_mlp", (Target(g.path, new_mlp, detail),))

    def _act_unit(
        self, path: str, act: nn.Module, linear: nn.Module, spec: Tuple[str, Optional[float]]
    ) -> Union[Unit, Note, None]:
        weight = getattr(linear, "weight", None)
        if not isinstance(weight, Tensor) or weight.dim() != 2 or _is_memsave(linear):
            return None
        try:
            # an nn.Linear subclass too (the probe says whether it computes F.linear); else x @ weight + bias
            new = (
                ActLinear.from_linear(linear, *spec)
                if isinstance(linear, nn.Linear)
                else ActLinear.from_conv1d(linear, *spec)
            )
        except TypeError:
            return None
        width = new.in_features
        got = check(lambda x: linear(act(x)), new, [act, linear], width, weight)
        lpath = self.names[id(linear)]
        if not got.equal:
            return Note(path, act, f"act_linear: {lpath} is not a Linear of the activation's output: {got.reason}")
        if not (got.saves or self.unprofitable):
            return Note(
                path,
                act,
                f"act_linear: {spec[0]} -> {lpath}: ActLinear {got.bytes_text()}: no saving "
                f"({lpath} already keeps the activation's output, all its backward needs); {_UNPROFITABLE}",
            )
        return Unit("act_linear", (
            Target(path, nn.Identity(), f"{type(act).__name__} ({spec[0]}) is applied by {lpath}"),
            Target(lpath, new, f"ActLinear: {_ACT_DETAIL}; {got.bytes_text()}"),
        ))  # fmt: skip

    def _act_units(self, done: Dict[int, Optional[nn.Module]]) -> Iterator[Union[Unit, Note]]:
        if self.flow is None:
            return
        for act in _watched(self.model, []):
            readers = self.flow.only_readers(act)
            if readers is None or len(readers) != 1 or id(act) in done or id(readers[0]) in done:
                continue
            self.next_of[id(act)] = readers[0]
            spec = fused_activation(act)
            if id(act) not in self.names or (not isinstance(spec, str) and spec[0] == "identity"):
                continue
            if isinstance(spec, str):  # read by a Linear, but no fused kernel computes it
                if isinstance(getattr(readers[0], "weight", None), Tensor) and "activation" in spec:
                    yield Note(self.names[id(act)], act, f"act_linear: {spec}")
                continue
            unit = self._act_unit(self.names[id(act)], act, readers[0], spec)
            if unit is not None:
                yield unit


def _trace(a: Analysis) -> None:
    module, kwargs, why = probe_call(a.model)
    if module is None:
        a.flow_why = why
        return
    try:
        a.flow = trace(a.model, lambda: module(**kwargs), _watched(a.model, a.norms))
    except Exception as exc:  # a model the probe input does not suit: no fusion that needs a trace
        a.flow_why = f"the probe forward raised {type(exc).__name__}: {exc}"[:200]


def analyse(model: nn.Module, unprofitable: bool = False) -> Analysis:
    """Find the structures of ``model`` that ``convert(fuse=True)`` rewrites, each checked by its probe, and trace
    who reads the norms' and activations' outputs. Nothing in the model changes.

    Args:
        model: the model.
        unprofitable: also plan the swaps that keep as many bytes as the original on the probe.

    Returns:
        The :class:`Analysis`; :meth:`Analysis.units` gives what to plan.

    Examples:
        >>> a = analyse(llama)
        >>> [u.rule for u in a.units({}) if isinstance(u, Unit)][:2]
        ['causal_lm_loss', 'rms_norm_linear']
    """
    a = Analysis(model, unprofitable, {id(m): n for n, m in model.named_modules()})
    a.heads = causal_lm.head_units(model)
    for path, m in model.named_modules():
        found: Union[_Norm, _Gated, Note, None] = None
        if _rms_candidate(m):
            found = _recognise_rms(path, m)
        elif isinstance(m, nn.LayerNorm):
            found = _recognise_layer_norm(path, m)
        elif not _is_memsave(m):
            found = _recognise_gated(path, m) or _experts_note(path, m)
        if isinstance(found, _Norm):
            a.norms.append(found)
        elif isinstance(found, _Gated):
            a.mlps.append(found)
        elif isinstance(found, Note):
            a.notes.append(found)
    _trace(a)
    return a
