"""The probe of ``memsave.convert(model, fuse=True)``: a structural candidate is swapped only if, on a small random
input, it computes what the modules it replaces compute, and keeps fewer bytes for backward.

A check runs the original modules and the replacement on the same probe input (seeded, in the modules' dtype and on
their device, the modules in training mode) with the parameters set to seeded random values for the duration of the
check -- so that a structure cannot pass by a coincidence of its current weights (Gemma's zero-initialised norm
weights, a zero-initialised output projection) -- then restores the parameters, the training flags and the RNG
state exactly. It requires:

* **equality within the operator's float tolerance**, the rules of the fused operators' tests: float32 outputs within
  ``1e-5`` of the original's largest value (float64: ``1e-12``); 16-bit outputs at most twice as far from a float64
  evaluation of the original (its parameters and the input cast to float64 for the call) as the original itself,
  plus half a unit in the last place of the output's scale;
* **fewer saved bytes**: the bytes autograd keeps for backward while the replacement runs (each storage once,
  parameters not counted) must be below the original's on the same input; a swap that keeps as many or more is not
  made unless ``convert(..., unprofitable=True)``.

The probe holds one extra copy of the checked modules' parameters while it runs (two for a 16-bit module, whose
float64 evaluation needs them in float64).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
from torch import nn

Tensor = torch.Tensor

__all__ = [
    "FLOAT32_RTOL",
    "PROBE_SEED",
    "Check",
    "check",
    "mismatch",
    "probe_input",
    "random_parameters",
    "saved_bytes",
    "seeded",
    "training",
]

#: float32 outputs must match the original to this relative error (of the original's largest value).
FLOAT32_RTOL = 1e-5
_FLOAT64_RTOL = 1e-12
#: The seed of every probe input, parameter draw and forward.
PROBE_SEED = 1729
_PROBE_ROWS = (2, 3)

Fn = Callable[[Tensor], Any]


@dataclass(frozen=True)
class Check:
    """The outcome of :func:`check`.

    Attributes:
        equal: the replacement's outputs equal the original's within tolerance.
        reason: why not (empty when equal).
        bytes_before: bytes the original keeps for backward on the probe.
        bytes_after: bytes the replacement keeps.

    Examples:
        >>> got = check(norm, memsave.nn.RMSNorm.from_module(norm), [norm], 64, norm.weight)
        >>> got.equal, got.saves
        (True, True)
    """

    equal: bool
    reason: str
    bytes_before: int
    bytes_after: int

    @property
    def saves(self) -> bool:
        """The replacement keeps fewer bytes than the original."""
        return self.bytes_after < self.bytes_before

    def bytes_text(self) -> str:
        """``"keeps 96 B instead of 192 B on a probe"``, for the report."""
        return f"keeps {_fmt(self.bytes_after)} instead of {_fmt(self.bytes_before)} on a probe"


def _fmt(n: int) -> str:
    return f"{n} B" if n < 1024 else f"{n / 1024:.2f} KiB"


def _device_indices(tensors: Sequence[Tensor]) -> List[int]:
    return sorted({t.device.index or 0 for t in tensors if t.device.type == "cuda"})


@contextlib.contextmanager
def seeded(tensors: Sequence[Tensor] = ()) -> Iterator[Callable[[], None]]:
    """Fork the RNG of the CPU and of the CUDA devices of ``tensors``; yields ``reseed()``, which seeds them all
    with :data:`PROBE_SEED` (call it before each run that must draw the same numbers). The state is restored.

    Args:
        tensors: tensors whose CUDA devices' generators are forked too.

    Returns:
        A context manager yielding ``reseed``.

    Examples:
        >>> with seeded([weight]) as reseed:
        ...     reseed(); a = module(x)
        ...     reseed(); b = replacement(x)                 # the same dropout masks
    """

    def reseed() -> None:
        torch.manual_seed(PROBE_SEED)

    with torch.random.fork_rng(devices=_device_indices(tensors)):
        yield reseed


def probe_input(width: int, like: Tensor, seed: int = PROBE_SEED, scale: float = 1.0) -> Tensor:
    """A seeded normal ``[2, 3, width]`` tensor of standard deviation ``scale`` in ``like``'s dtype, on its device
    (the global RNG is not used).

    Args:
        width: the last dimension.
        like: gives the dtype and device.
        seed: the generator's seed.
        scale: the standard deviation.

    Returns:
        The probe input.

    Examples:
        >>> probe_input(64, norm.weight).shape
        torch.Size([2, 3, 64])
    """
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn((*_PROBE_ROWS, width), generator=gen, dtype=torch.float64) * scale
    return x.to(dtype=like.dtype, device=like.device)


def _unique_parameters(modules: Sequence[nn.Module]) -> List[nn.Parameter]:
    seen: Dict[int, nn.Parameter] = {}
    for m in modules:
        for p in m.parameters():
            seen.setdefault(id(p), p)
    return list(seen.values())


@contextlib.contextmanager
def random_parameters(modules: Sequence[nn.Module], seed: int = PROBE_SEED) -> Iterator[None]:
    """Give the floating-point parameters of ``modules`` seeded random values (matrices ``N(0, 1/fan_in)``, vectors
    ``1 + N(0, 1/4)``) and restore the originals, bit for bit and in place, on exit.

    Args:
        modules: the modules whose parameters (each once, tied ones too) to randomize.
        seed: the generator's seed.

    Returns:
        A context manager.

    Examples:
        >>> with random_parameters([mlp]):
        ...     out = mlp(x)                                 # the weights are random here, restored after
    """
    params = [p for p in _unique_parameters(modules) if p.is_floating_point()]
    saved = [p.detach().clone() for p in params]
    gens: Dict[torch.device, torch.Generator] = {}  # drawn where the parameter lives, in its dtype: no big copies
    try:
        with torch.no_grad():
            for p in params:
                gen = gens.setdefault(p.device, torch.Generator(device=p.device).manual_seed(seed))
                p.normal_(generator=gen)
                if p.dim() >= 2:
                    p.mul_(1.0 / max(p.shape[-1], 1) ** 0.5)
                else:
                    p.mul_(0.25).add_(1.0)
        yield
    finally:
        with torch.no_grad():
            for p, s in zip(params, saved):
                p.copy_(s)


@contextlib.contextmanager
def _float64_parameters(modules: Sequence[nn.Module]) -> Iterator[None]:
    """The parameters of ``modules`` as float64 tensors for the duration (their storage is put back on exit)."""
    params = [p for p in _unique_parameters(modules) if p.is_floating_point()]
    saved = [p.data for p in params]
    try:
        for p in params:
            p.data = p.data.double()
        yield
    finally:
        for p, s in zip(params, saved):
            p.data = s


@contextlib.contextmanager
def training(modules: Sequence[nn.Module]) -> Iterator[None]:
    """Every module in ``modules`` (and below) in training mode; each module's own flag restored on exit.

    Args:
        modules: the top modules.

    Returns:
        A context manager.

    Examples:
        >>> with training([model]):
        ...     model(x)                                     # dropout on; eval() modules are eval() again after
    """
    flags = {id(m): (m, m.training) for top in modules for m in top.modules()}
    try:
        for top in modules:
            top.train(True)
        yield
    finally:
        for m, flag in flags.values():
            m.training = flag


def saved_bytes(fn: Callable[[], Any], exclude: Sequence[Tensor] = ()) -> Tuple[int, Any]:
    """Bytes autograd saves for backward while ``fn()`` runs, each storage once, those of ``exclude`` (parameters)
    not counted.

    Args:
        fn: runs the forward.
        exclude: tensors whose storages are not activations (the parameters).

    Returns:
        ``(bytes, fn())``.

    Examples:
        >>> kept, out = saved_bytes(lambda: mlp(x), list(mlp.parameters()))
    """
    excluded = {t.untyped_storage().data_ptr() for t in exclude if t is not None}
    storages: Dict[int, int] = {}

    def pack(t: Tensor) -> Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in excluded:
            storages[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return sum(storages.values()), out


def _tensors(out: Any) -> Optional[List[Tensor]]:
    if isinstance(out, Tensor):
        return [out]
    if isinstance(out, (tuple, list)) and out and all(isinstance(t, Tensor) for t in out):
        return list(out)
    return None


def mismatch(ours: Tensor, eager: Tensor, ref64: Optional[Tensor]) -> Optional[str]:
    """Why ``ours`` is not ``eager`` within the float tolerance (see the module docstring), or None.

    Args:
        ours: the replacement's output.
        eager: the original's output.
        ref64: the original evaluated in float64 (needed for 16-bit outputs only).

    Returns:
        None when equal within tolerance, else a one-line reason with the numbers.

    Examples:
        >>> mismatch(torch.ones(3), torch.ones(3), None) is None
        True
    """
    if ours.shape != eager.shape or ours.dtype != eager.dtype:
        return f"gives {ours.dtype} {tuple(ours.shape)} where the original gives {eager.dtype} {tuple(eager.shape)}"
    a, e = ours.detach().double(), eager.detach().double()
    if not bool(torch.isfinite(e).all()):
        return "the original's output on the probe is not finite"
    scale = e.abs().max().item() if e.numel() else 0.0
    err = (a - e).abs().max().item() if e.numel() else 0.0
    if eager.dtype in (torch.float32, torch.float64):
        rtol = FLOAT32_RTOL if eager.dtype == torch.float32 else _FLOAT64_RTOL
        if err <= rtol * scale:
            return None
        return f"differs from the original by {err / max(scale, 1e-300):.2g} of its scale (at most {rtol:g})"
    if ref64 is None:
        return f"no float64 reference to judge a {eager.dtype} output by"
    r = ref64.detach().double()
    floor = 0.5 * torch.finfo(eager.dtype).eps * r.abs().max().item()
    err_ours, err_eager = (a - r).abs().max().item(), (e - r).abs().max().item()
    if err_ours <= 2 * err_eager + floor:
        return None
    return (
        f"errs by {err_ours:.3g} against float64 where the original errs by {err_eager:.3g} (at most 2x + {floor:.2g})"
    )


def _compare(ours: Any, eager: Any, ref64: Any) -> Optional[str]:
    a, e = _tensors(ours), _tensors(eager)
    if e is None:
        return f"the original returns a {type(eager).__name__}, not tensors"
    if a is None or len(a) != len(e):
        return "the replacement returns other outputs than the original"
    refs = _tensors(ref64) if ref64 is not None else None
    for k, (x, y) in enumerate(zip(a, e)):
        why = mismatch(x, y, refs[k] if refs is not None and k < len(refs) else None)
        if why is not None:
            return why
    return None


def _run_both(original: Fn, replacement: Fn, x: Tensor, params: List[Tensor], reseed: Callable[[], None]) -> Any:
    """(bytes_before, out_before, bytes_after, out_after) of one seeded run of each on ``x``."""
    with torch.enable_grad():
        xo = x.detach().clone().requires_grad_(True)
        reseed()
        before, out_o = saved_bytes(lambda: original(xo), params)
        xr = x.detach().clone().requires_grad_(True)
        reseed()
        after, out_r = saved_bytes(lambda: replacement(xr), params)
    return before, out_o, after, out_r


def check(
    original: Fn,
    replacement: Fn,
    modules: Sequence[nn.Module],
    width: int,
    like: Tensor,
    *,
    seed: int = PROBE_SEED,
    scales: Sequence[float] = (1.0,),
) -> Check:
    """Run ``original`` and ``replacement`` on a probe input (one per scale) and compare outputs and saved bytes.

    Args:
        original: ``original(x)``, the model's modules as they are (e.g. ``lambda x: linear(norm(x))``).
        replacement: ``replacement(x)``, what convert would put in their place.
        modules: every module either runs (their parameters are randomized for the check, then restored; they run
            in training mode).
        width: the probe input's last dimension.
        like: a tensor giving the probe's dtype and device (the modules' first parameter).
        seed: the probe's seed.
        scales: the probe input's standard deviations, each checked (a norm's ``eps`` shows only on a small
            input); the bytes are those of the first.

    Returns:
        A :class:`Check`; a forward that raises is a mismatch with the exception as reason.

    Examples:
        >>> norm = torch.nn.LayerNorm(8)
        >>> check(norm, lambda x: torch.nn.functional.layer_norm(x, (8,), norm.weight, norm.bias), [norm], 8,
        ...       norm.weight).equal
        True
    """
    params: List[Tensor] = list(_unique_parameters(modules))
    kept: List[Tuple[int, int]] = []
    try:
        with seeded([like]) as reseed, random_parameters(modules, seed), training(modules):
            for scale in scales:
                x = probe_input(width, like, seed, scale)
                before, out_o, after, out_r = _run_both(original, replacement, x, params, reseed)
                ref64 = None
                if like.dtype not in (torch.float32, torch.float64):
                    with torch.no_grad(), _float64_parameters(modules):
                        reseed()
                        ref64 = original(x.double())
                why = _compare(out_r, out_o, ref64)
                if why is not None:
                    at = f" (on a probe of scale {scale:g})" if scale != 1.0 else ""
                    return Check(False, why + at, before, after)
                kept.append((before, after))
    except Exception as exc:  # any failure of a forward on the probe means "not this structure"
        return Check(False, f"a forward on the probe raised {type(exc).__name__}: {exc}"[:300], 0, 0)
    return Check(True, "", *kept[0])
