"""Predict the memory of a training step without running it: :func:`estimate` and :func:`max_batch_size`.

The step is run on *fake tensors* (:class:`torch._subclasses.fake_tensor.FakeTensorMode`): every operator computes
the shapes, dtypes and devices of its outputs and nothing else, so a GPT-2 at batch 64 "runs" on a laptop in seconds
and allocates no activation memory. The parameters are fake copies of the model's (``FakeTensorMode.from_tensor``
then ``.to(device, dtype)``), put into a ``copy.deepcopy`` of the module tree whose memo maps every parameter and
buffer to its fake copy, so the model's own tensors are never copied and can even live on the meta device. The
live-tensor tracker (:mod:`memsave.measurement.tracker`) follows every storage the operators create and free; the
largest sum
it sees between the start of the step (gradients None) and the end of backward is the predicted peak, the sum at the
end of forward the activation bytes.

What is modelled:

* every tensor an operator returns, in forward and backward: outputs, tensors saved for backward, recomputation
  inside checkpointed regions, gradients (including their accumulation), the loss. ``Estimate.tensor_peak_bytes``
  is this alone and matches the live-tensor tracker on a real step;
* on CPU with oneDNN, the buffers a convolution holds while it runs (blocked-layout buffers, reordered weights and
  gradients), calibrated on the CPU the estimate runs on (:class:`CpuConvWorkspace`: one real call per distinct
  convolution, since oneDNN's blocking depends on the instruction set): ``Estimate.peak_bytes`` adds them at each
  convolution, which is what the allocator-level CPU measurement
  (:func:`memsave.measurement.allocator.cpu_peak_bytes`) sees;
* on CUDA, the caching allocator's rounding: each allocation takes a block whose size is the request rounded up to a
  multiple of 512 bytes (``kMinBlockSize``; a 4-byte scalar takes 512 bytes). That is what
  ``torch.cuda.max_memory_allocated`` counts.

What is not modelled (allow for it with ``headroom`` in :func:`max_batch_size`):

* other workspaces an operator allocates and frees inside one call: cuDNN convolution and cuBLAS workspaces on
  CUDA (they depend on the algorithm chosen at run time), and on CPU those of operators other than convolutions;
* on CUDA, a cached block that is reused without being split (the allocator does not split a block of the large pool
  when less than 1 MiB would remain), ``expandable_segments``, ``roundup_power2_divisions``, fragmentation and
  therefore ``memory_reserved``, and the CUDA context (hundreds of MiB, never in ``max_memory_allocated``);
* optimizer state unless ``optimizer=`` says which optimizer (see :func:`estimate`).

Without a visible GPU, ``device="cuda"`` is *emulated*: the fake step runs on CPU fake tensors with the CUDA rounding,
and ``F.scaled_dot_product_attention`` is sent to the kernels CUDA would choose (flash attention for 16-bit inputs
without a mask, memory-efficient attention otherwise; CPU's own choice with dropout keeps the whole attention
matrix). Other operators keep CPU's choices, which save the same tensors for the common layers (linear, convolution,
normalisation, activations). ``Estimate.emulated`` says so.
"""

from __future__ import annotations

import contextlib
import copy
import html
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn

# FakeTensorMode is public in spirit (torch.compile, torch.export and the memory tools build on it) but lives in a
# private module; these are the only names memsave takes from it.
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensor,
    FakeTensorMode,
    UnsupportedOperatorException,
)
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_flatten, tree_map_only

from ..common.compat import quiet_raised_error_logs
from ..common.rng import RngState
from ..errors import NoFakeKernelError
from .allocator import cpu_memory_stats
from .measuring import LossFn, check_loss, resolve_loss_fn
from .strategies import Strategy, StrategyContext, parse_strategy, strip_runner_prefix
from .tracker import LiveTensorTracker, storage_of
from .units import format_bytes, parse_bytes

__all__ = [
    "CpuConvWorkspace",
    "Estimate",
    "NoFakeKernelError",
    "estimate",
    "max_batch_size",
    "cuda_block_bytes",
    "OPTIMIZER_STATES",
]

#: The CUDA caching allocator's block granularity (``kMinBlockSize`` in c10/cuda/CUDACachingAllocator.cpp).
CUDA_BLOCK = 512

#: Optimizer state kept per trainable parameter, in parameter-sized tensors (Adam: exp_avg and exp_avg_sq).
OPTIMIZER_STATES: Dict[str, int] = {"sgd": 0, "momentum": 1, "adagrad": 1, "rmsprop": 1, "adam": 2, "adamw": 2}


def cuda_block_bytes(nbytes: int) -> int:
    """Bytes the CUDA caching allocator accounts for an allocation of ``nbytes``: rounded up to 512, 0 stays 0.

    Examples:
        >>> cuda_block_bytes(4), cuda_block_bytes(512), cuda_block_bytes(513)
        (512, 512, 1024)
    """
    if nbytes <= 0:
        return 0
    return CUDA_BLOCK * ((nbytes + CUDA_BLOCK - 1) // CUDA_BLOCK)


def _nbytes(t: Any) -> int:
    return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0


class CpuConvWorkspace:
    """Bytes a CPU convolution holds *inside* its call, beyond its inputs and outputs, measured on this machine.

    oneDNN computes a CPU convolution in blocked layouts: the forward may compute into a blocked buffer and reorder the
    weight, the backward reorders the incoming gradient and the weight and computes the input gradient in a blocked
    buffer. Which of these it does, and their sizes, depend on the instruction set oneDNN runs with (the channel block
    is 16 floats with AVX-512 and 8 with AVX2, ``ONEDNN_MAX_CPU_ISA`` caps it), on the shapes and on the dtype, so no
    fixed formula holds on every CPU. This model therefore calibrates itself: the first time an estimate meets a
    convolution configuration (call, shapes, strides, dtypes, stride/padding/dilation/groups), it runs that one call
    for real on uninitialised CPU tensors of those shapes (after one warm-up call, as a training step after its first
    one), reads the call's allocator-level peak with :func:`memsave.measurement.allocator.cpu_memory_stats`, and keeps
    ``peak - outputs`` for the rest of the process. The probe allocates one layer's input, weight and output for a
    moment; nothing of the model itself is allocated.

    Examples:
        >>> ws = CpuConvWorkspace()
        >>> ws(torch.ops.aten.convolution.default, (x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1), out)
        131072
    """

    def __init__(self) -> None:
        self._cache: Dict[Tuple[Any, ...], int] = {}

    @staticmethod
    def _key(func: Any, args: Any) -> Tuple[Any, ...]:
        def part(a: Any) -> Any:
            if isinstance(a, torch.Tensor):
                return ("T", tuple(a.shape), tuple(a.stride()), a.dtype)
            if isinstance(a, (list, tuple)):
                return tuple(part(x) for x in a)
            return a

        return (func, part(tuple(args)))

    @staticmethod
    def _real(a: Any) -> Any:
        if isinstance(a, torch.Tensor):
            return torch.empty_strided(tuple(a.shape), tuple(a.stride()), dtype=a.dtype, device="cpu").normal_()
        if isinstance(a, list):
            return [CpuConvWorkspace._real(x) for x in a]
        return a

    def __call__(self, func: Any, args: Any, out: Any) -> int:
        aten = torch.ops.aten
        if func not in (aten.convolution.default, aten.convolution_backward.default):
            return 0
        key = self._key(func, args)
        hit = self._cache.get(key)
        if hit is None:
            hit = self._cache[key] = self._probe(func, args)
        return hit

    def _probe(self, func: Any, args: Any) -> int:
        # Outside every mode (the fake mode, the estimate's tracker): real tensors, a real oneDNN call.
        with _disable_current_modes(), torch.no_grad():
            real = [self._real(a) for a in args]
            func(*real)  # warm-up: oneDNN creates its primitive (and caches) on the first call of a configuration
            stats = cpu_memory_stats(lambda: func(*real))
            outputs = sum(_nbytes(t) for t in tree_flatten(stats.result)[0])
            return max(0, stats.peak_bytes - outputs)


_CPU_CONV_WORKSPACE = CpuConvWorkspace()


class _EstimateTracker(LiveTensorTracker):
    """The live-tensor tracker plus the allocator's view: each storage's bytes pass through ``round_fn`` (the
    allocator's block size), and ``workspace_fn(func, args, out)`` adds the bytes an operator holds only while it
    runs. ``peak_bytes`` stays the tensor-level peak; ``allocator_peak_bytes`` includes the workspaces."""

    def __init__(
        self,
        root: Optional[nn.Module],
        round_fn: Callable[[int], int],
        workspace_fn: Optional[Callable[[Any, Any, Any], int]] = None,
    ) -> None:
        super().__init__(root=root)
        self._round_fn = round_fn
        self._workspace_fn = workspace_fn
        self.allocator_peak_bytes = 0

    def track_storage(self, storage: torch.UntypedStorage, nbytes: int) -> None:
        super().track_storage(storage, self._round_fn(nbytes))
        self.allocator_peak_bytes = max(self.allocator_peak_bytes, self.live_bytes)

    def resize_storage(self, key: int, nbytes: int) -> None:
        super().resize_storage(key, self._round_fn(nbytes))
        self.allocator_peak_bytes = max(self.allocator_peak_bytes, self.live_bytes)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = super().__torch_dispatch__(func, types, args, kwargs)
        if self._workspace_fn is not None:
            extra = self._workspace_fn(func, args, out)
            if extra:
                # The workspace lives while the call runs, its outputs already allocated.
                self.allocator_peak_bytes = max(self.allocator_peak_bytes, self.live_bytes + self._round_fn(extra))
        return out


class _RealToFake(TorchDispatchMode):
    """Turns real tensors that reach an operator (a loss target, a mask kept as a plain attribute) into fake ones
    on the estimated device, so closures written for the real device work under the fake step."""

    def __init__(self, fake_mode: Any, fake_cls: type, device: torch.device) -> None:
        super().__init__()
        self._fake_mode, self._fake_cls, self._device = fake_mode, fake_cls, device
        self._cache: Dict[int, Tuple[torch.Tensor, torch.Tensor]] = {}

    def _convert(self, t: torch.Tensor) -> torch.Tensor:
        if isinstance(t, self._fake_cls):
            return t
        hit = self._cache.get(id(t))
        if hit is not None and hit[0] is t:
            return hit[1]
        f = self._fake_mode.from_tensor(t)
        if f.device != self._device and not (t.dim() == 0 and t.device.type == "cpu"):
            f = f.to(self._device)
        self._cache[id(t)] = (t, f)  # keeps t alive, so its id is not reused during the step
        return f

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        args, kwargs = tree_map_only(torch.Tensor, self._convert, (args, kwargs or {}))
        return func(*args, **kwargs)


@contextlib.contextmanager
def _cuda_attention_emulation() -> Iterator[None]:
    """When a CUDA estimate runs on CPU fake tensors, send ``F.scaled_dot_product_attention`` to the kernels CUDA
    would pick: flash attention for float16/bfloat16 without a mask, memory-efficient attention otherwise. Both save
    the output and a log-sum-exp; CPU's choice with dropout (the math path) would save the whole attention matrix.

    ``torch.nn.functional.scaled_dot_product_attention`` is replaced for the duration (a function mode would be
    popped inside ``backward`` and miss the recompute of checkpointed attention); code that imported the function
    by name before keeps CPU's choice.
    """
    original = F.scaled_dot_product_attention

    def sdpa(
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attn_mask: Optional[torch.Tensor] = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: Optional[float] = None,
        enable_gqa: bool = False,
    ) -> torch.Tensor:
        if enable_gqa or query.dim() != 4 or query.shape[1] != key.shape[1] or (is_causal and attn_mask is not None):
            return original(
                query,
                key,
                value,
                attn_mask=attn_mask,
                dropout_p=dropout_p,
                is_causal=is_causal,
                scale=scale,
                enable_gqa=enable_gqa,
            )
        q, k, v = query, key, value
        if torch.is_autocast_enabled("cpu"):  # attention is on autocast's lower-precision list
            dt = torch.get_autocast_dtype("cpu")
            q, k, v = (t.to(dt) for t in (q, k, v))
        if q.dtype in (torch.float16, torch.bfloat16) and attn_mask is None:
            return torch.ops.aten._scaled_dot_product_flash_attention(
                q, k, v, float(dropout_p), bool(is_causal), False, scale=scale
            )[0]
        need_lse = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
        return torch.ops.aten._scaled_dot_product_efficient_attention(
            q, k, v, attn_mask, need_lse, float(dropout_p), bool(is_causal), scale=scale
        )[0]

    F.scaled_dot_product_attention = sdpa
    try:
        yield
    finally:
        F.scaled_dot_product_attention = original


@dataclass(frozen=True)
class Estimate:
    """The result of :func:`estimate`.

    Attributes:
        peak_bytes: predicted allocator-level peak of a training step above what was allocated before it
            (comparable with :attr:`memsave.Measurement.peak_bytes`): activations, recomputation, gradients, and
            the operator workspaces that are modelled (oneDNN convolutions on CPU).
        tensor_peak_bytes: the peak of live tensors alone (what the live-tensor tracker measures on a real step).
        activation_bytes: bytes created in forward and alive at its end.
        grad_bytes: bytes of the parameter gradients after the step (part of ``peak_bytes``).
        param_bytes, buffer_bytes, input_bytes: what exists before the step (allocator-rounded on CUDA).
        optimizer_bytes: optimizer state, when ``optimizer=`` was given (else 0).
        device: the device estimated for; strategy: canonical strategy name; dtype: the cast applied, if any.
        allocator: how allocation sizes were modelled.
        emulated: True when a CUDA estimate ran with CPU operator choices (no GPU visible).
        by_module: activation bytes per module at the end of forward, largest first.

    Examples:
        >>> est = memsave.estimate(model, torch.empty(32, 3, 224, 224, device="meta"), device="cuda", optimizer="adamw")
        >>> print(est)                       # step peak, activations, gradients, parameters, optimizer state, total
        >>> est.total_bytes < torch.cuda.get_device_properties(0).total_memory
    """

    peak_bytes: int
    tensor_peak_bytes: int
    activation_bytes: int
    grad_bytes: int
    param_bytes: int
    buffer_bytes: int
    input_bytes: int
    optimizer_bytes: int
    device: str
    strategy: str
    dtype: Optional[str]
    allocator: str
    emulated: bool = False
    by_module: Dict[str, int] = field(default_factory=dict)

    @property
    def total_bytes(self) -> int:
        """Everything a training step needs at its peak: parameters, buffers, inputs, optimizer state and the step."""
        return self.param_bytes + self.buffer_bytes + self.input_bytes + self.optimizer_bytes + self.peak_bytes

    def to_dict(self) -> Dict[str, Any]:
        """Plain data, with ``total_bytes``."""
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["total_bytes"] = self.total_bytes
        return d

    def _lines(self) -> List[Tuple[str, str]]:
        rows = [
            ("step peak", format_bytes(self.peak_bytes)),
            ("tensors at peak", format_bytes(self.tensor_peak_bytes)),
            ("activations", format_bytes(self.activation_bytes)),
            ("gradients", format_bytes(self.grad_bytes)),
            ("parameters", format_bytes(self.param_bytes)),
            ("buffers", format_bytes(self.buffer_bytes)),
            ("inputs", format_bytes(self.input_bytes)),
        ]
        if self.optimizer_bytes:
            rows.append(("optimizer state", format_bytes(self.optimizer_bytes)))
        rows.append(("total", format_bytes(self.total_bytes)))
        return rows

    def _title(self) -> str:
        extra = f", {self.dtype}" if self.dtype else ""
        emu = ", emulated without a GPU" if self.emulated else ""
        return f"memsave.estimate: {self.strategy} on {self.device}{extra}{emu} ({self.allocator})"

    def __str__(self) -> str:
        lines = [self._title()] + [f"  {k:<16} {v:>12}" for k, v in self._lines()]
        top = list(self.by_module.items())[:8]
        if top:
            w = max(len(n or "(root)") for n, _ in top)
            lines.append("  activations by module:")
            lines += [f"    {(n or '(root)'):<{w}}  {format_bytes(b):>11}" for n, b in top]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        body = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>" for k, v in self._lines())
        return f"<table><caption>{html.escape(self._title())}</caption>{body}</table>"


def _as_device(device: Union[str, torch.device]) -> torch.device:
    if not isinstance(device, (str, torch.device)):
        raise TypeError(
            f"estimate: device must be a str or torch.device ('cpu' or 'cuda'), got {type(device).__name__}"
        )
    try:
        dev = torch.device(device)
    except RuntimeError as e:  # torch's message for an unknown device type
        raise ValueError(
            f"estimate: device must be 'cpu' or 'cuda' (the device the step would run on), got {device!r}"
        ) from e
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device() if torch.cuda.is_available() else 0)
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"estimate: device must be 'cpu' or 'cuda' (the device the step would run on), got {device!r}")
    return dev


def _storage_bytes(tensors: Sequence[torch.Tensor], round_fn: Callable[[int], int]) -> int:
    seen, total = set(), 0
    for t in tensors:
        s = storage_of(t)
        if s is None or s._cdata in seen:
            continue
        seen.add(s._cdata)
        total += round_fn(int(s.nbytes()))
    return total


def _to_fake(t: torch.Tensor, fake_mode: Any, device: torch.device, dtype: Optional[torch.dtype]) -> torch.Tensor:
    f = fake_mode.from_tensor(t.detach())
    with fake_mode:
        f = f.to(device=device, dtype=dtype if (dtype is not None and t.is_floating_point()) else None)
    return f


def _fake_inputs(inputs: Any, fake_mode: Any, device: torch.device, dtype: Optional[torch.dtype]) -> Any:
    """The step's inputs (positional and keyword, nested) as fake tensors on ``device``."""

    def fake(x: torch.Tensor) -> torch.Tensor:
        grad = x.requires_grad and (x.is_floating_point() or x.is_complex())
        return _to_fake(x, fake_mode, device, dtype).requires_grad_(grad)

    return tree_map_only(torch.Tensor, fake, inputs)


class _Step(NamedTuple):
    """The training step to run on fake tensors: ``loss_fn(strat.prepare(model)(*inputs, **kwargs))``."""

    model: nn.Module
    inputs: Tuple[Any, ...]
    kwargs: Dict[str, Any]
    strat: Strategy
    loss_fn: LossFn


class _FakeStepBytes(NamedTuple):
    """What one training step on fake tensors held (:func:`_run_fake_step`), in bytes (rounded as the allocator
    rounds), and the module that ran it."""

    peak: int  # allocator-level peak above the step's start
    tensor_peak: int  # peak of live tensor bytes
    activation: int  # live after forward: what backward will read
    by_module: Dict[str, int]
    grad: int
    param: int
    buffer: int
    input: int
    optimizer: int  # the optimizer's state for the trainable parameters
    runner: nn.Module  # strat.prepare's module (names in by_module are relative to it)


def _run_fake_step(
    step: _Step,
    device: torch.device,
    dtype: Optional[torch.dtype],
    round_fn: Callable[[int], int],
    workspace_fn: Optional[Callable[[Any, Any, Any], int]],
    optimizer_states: int,
    emulate_cuda: bool = False,
) -> _FakeStepBytes:
    model, inputs, kwargs, strat, loss_fn = step
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    memo: Dict[int, Any] = {}
    params: List[torch.Tensor] = []
    buffers: List[torch.Tensor] = []
    for p in model.parameters():
        if id(p) not in memo:
            fp = nn.Parameter(_to_fake(p, fake_mode, device, dtype), requires_grad=p.requires_grad)
            memo[id(p)] = fp
            params.append(fp)
    for b in model.buffers():
        if id(b) not in memo:
            fb = _to_fake(b, fake_mode, device, dtype)
            memo[id(b)] = fb
            buffers.append(fb)
    fake_model = copy.deepcopy(model, memo)
    fake_inputs, fake_kwargs = _fake_inputs((tuple(inputs), dict(kwargs)), fake_mode, device, dtype)
    ctx = StrategyContext(fake_inputs, loss_fn, device, fake=True, kwargs=fake_kwargs)
    emulation = _cuda_attention_emulation() if emulate_cuda else contextlib.nullcontext()
    # A meta kernel that fails (a wrong input shape) is raised and reported once, not also logged by fake tensors.
    with quiet_raised_error_logs(), fake_mode, _RealToFake(fake_mode, FakeTensor, device), emulation:
        try:
            runner = strat.prepare(fake_model, ctx)
        except (NotImplementedError, RuntimeError) as e:
            raise RuntimeError(
                f"estimate: strategy {strat.name!r} could not be applied to a model with fake tensors ({e}); "
                "measure it with memsave.measure / memsave.compare instead"
            ) from e
        tracker = _EstimateTracker(root=runner, round_fn=round_fn, workspace_fn=workspace_fn)
        with tracker:
            try:
                out = runner(*fake_inputs, **fake_kwargs)
                activation = tracker.live_bytes
                by_module = tracker.live_by_module()
                loss = loss_fn(out)
                check_loss(out, loss, "estimate")
                del out
                loss.backward()
                del loss
            except (DataDependentOutputException, DynamicOutputShapeException) as e:
                raise NoFakeKernelError(
                    f"estimate: the model reads tensor values (operator {e.func}: .item(), .tolist(), int(tensor), "
                    "or an output whose shape depends on values, such as nonzero or boolean masking), which fake "
                    "tensors do not have, so the step cannot be predicted; compute such values from shapes or pass "
                    f"them as arguments, or measure the model with memsave.measure (strategy {strat.name!r})"
                ) from e
            except UnsupportedOperatorException as e:
                raise NoFakeKernelError(
                    f"estimate: operator {e.func} has no fake-tensor (meta) implementation, so the step cannot run "
                    "without allocating; register one with torch.library.register_fake, or measure the model with "
                    f"memsave.measure (strategy {strat.name!r})"
                ) from e
            peak = tracker.allocator_peak_bytes
            tensor_peak = tracker.peak_bytes
    trainable = [p for p in params if p.requires_grad]
    grads = [p.grad for p in trainable if p.grad is not None]
    return _FakeStepBytes(
        peak=peak,
        tensor_peak=tensor_peak,
        activation=activation,
        by_module=by_module,
        grad=_storage_bytes(grads, round_fn),
        param=_storage_bytes(params, round_fn),
        buffer=_storage_bytes(buffers, round_fn),
        input=_storage_bytes(
            [x for x in tree_flatten((fake_inputs, fake_kwargs))[0] if isinstance(x, torch.Tensor)], round_fn
        ),
        optimizer=optimizer_states * sum(round_fn(p.numel() * p.element_size()) for p in trainable),
        runner=runner,
    )


def _fake_step_or_emulated(
    step: _Step, dev: torch.device, dtype: Optional[torch.dtype], states: int
) -> Tuple[_FakeStepBytes, bool, bool]:
    """Run the fake step for ``dev``; returns ``(result, emulated, cpu_onednn)``. A CUDA step whose fake CUDA
    tensors fail (some torch builds need a CUDA runtime for them) falls back to CPU emulation, with a warning."""
    emulated = dev.type == "cuda" and not torch.cuda.is_available()
    run_dev = torch.device("cpu") if emulated else dev
    round_fn: Callable[[int], int] = cuda_block_bytes if dev.type == "cuda" else (lambda n: n)
    # oneDNN's convolution workspaces are modelled for real CPU steps only (cuDNN's depend on the algorithm chosen).
    cpu_onednn = dev.type == "cpu" and torch.backends.mkldnn.is_available() and bool(torch.backends.mkldnn.enabled)
    workspace_fn = _CPU_CONV_WORKSPACE if cpu_onednn else None
    try:
        r = _run_fake_step(step, run_dev, dtype, round_fn, workspace_fn, states, emulate_cuda=emulated)
    except RuntimeError as e:
        if dev.type != "cuda" or emulated or isinstance(e, NoFakeKernelError) or "could not be applied" in str(e):
            raise
        warnings.warn(
            f"estimate: fake CUDA step failed ({e}); estimating with CPU operator choices", RuntimeWarning, stacklevel=3
        )
        emulated = True
        r = _run_fake_step(step, torch.device("cpu"), dtype, round_fn, None, states, emulate_cuda=True)
    return r, emulated, cpu_onednn


def estimate(
    model: nn.Module,
    *example_inputs: Any,
    device: Union[str, torch.device] = "cuda",
    strategy: Union[str, Strategy] = "eager",
    dtype: Optional[torch.dtype] = None,
    loss_fn: Optional[LossFn] = None,
    optimizer: Optional[str] = None,
    **model_kwargs: Any,
) -> Estimate:
    """Predict the peak and activation memory of a training step of ``model`` on ``device``, allocating nothing.

    The step (forward, ``loss_fn``, backward; gradients start as None) runs on fake tensors; see the module
    docstring for what is and is not modelled. The model's parameters may be real (any device) or on the meta
    device; it is not modified, and the RNG state is left as it was.

    Args:
        model: the model (not modified).
        *example_inputs: positional arguments of ``model``: tensors on any device (meta included) or other values.
        device: the device to predict for, ``"cuda"`` (the caching allocator's 512-byte rounding is applied) or
            ``"cpu"`` (exact sizes).
        strategy: a strategy name as for :func:`memsave.compare` (``"checkpoint:blocks"``, ``"convert"``,
            ``"amp:bf16"``, combinations with ``+``).
        dtype: cast floating-point parameters, buffers and inputs to this dtype first (pure half-precision training).
        loss_fn: output -> scalar loss, called on fake tensors; tensors it creates should take their shape and
            device from the output (``torch.zeros(out.shape[0], dtype=torch.long, device=out.device)``); real
            tensors it closes over are moved to ``device`` as fakes. Default :func:`memsave.measurement.default_loss`.
        optimizer: add optimizer state to ``total_bytes``: one of ``OPTIMIZER_STATES`` (``"adam"``: two
            parameter-sized tensors per trainable parameter).
        **model_kwargs: keyword arguments of ``model`` (``labels=ids``), tensors on any device, made fake too.

    Returns:
        an :class:`Estimate`; ``peak_bytes`` compares with :func:`memsave.measure`, ``total_bytes`` with the memory
        of a GPU.

    Raises:
        ValueError: an unknown strategy, device or optimizer; a strategy that cannot run on fake tensors (plan).
        NoFakeKernelError: an operator of the model has no fake-tensor implementation.

    Examples:
        >>> est = memsave.estimate(model, torch.empty(64, 3, 224, 224, device="meta"), device="cuda",
        ...                        strategy="checkpoint:blocks")
        >>> memsave.estimate(lm, ids, labels=ids, device="cuda").peak_bytes     # keyword inputs as the model takes
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"estimate: model must be an nn.Module, got {type(model).__name__}")
    dev = _as_device(device)
    strat = parse_strategy(strategy)
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise ValueError(f"estimate: dtype must be a floating-point torch.dtype (e.g. torch.bfloat16), got {dtype!r}")
    if optimizer is not None and optimizer not in OPTIMIZER_STATES:
        raise ValueError(f"estimate: unknown optimizer {optimizer!r}; choose from {', '.join(OPTIMIZER_STATES)}")
    loss_fn = resolve_loss_fn(loss_fn, "estimate")
    states = OPTIMIZER_STATES.get(optimizer or "sgd", 0)
    rng = RngState()
    try:
        step = _Step(model, tuple(example_inputs), dict(model_kwargs), strat, loss_fn)
        r, emulated, cpu_onednn = _fake_step_or_emulated(step, dev, dtype, states)
    finally:
        rng.restore()
    if dev.type == "cuda":
        allocator = "CUDA caching allocator, 512-byte blocks"
    else:
        allocator = "exact sizes + oneDNN convolution workspaces" if cpu_onednn else "exact sizes"
    return Estimate(
        peak_bytes=r.peak,
        tensor_peak_bytes=r.tensor_peak,
        activation_bytes=r.activation,
        grad_bytes=r.grad,
        param_bytes=r.param,
        buffer_bytes=r.buffer,
        input_bytes=r.input,
        optimizer_bytes=r.optimizer,
        device=str(dev),
        strategy=strat.name,
        dtype=str(dtype).replace("torch.", "") if dtype is not None else None,
        allocator=allocator,
        emulated=emulated,
        by_module=strip_runner_prefix(r.by_module, r.runner),
    )


def _inputs_of(made: Any) -> Tuple[Tuple[Any, ...], Dict[str, Any]]:
    """``make_inputs(b)``'s result as (positional, keyword) inputs: a dict is keyword inputs, a tuple or list
    positional ones, anything else one positional input."""
    if isinstance(made, dict):
        return (), dict(made)
    return (tuple(made) if isinstance(made, (tuple, list)) else (made,)), {}


def max_batch_size(
    model: nn.Module,
    make_inputs: Callable[[int], Any],
    memory: Union[int, str] = "24GiB",
    strategy: Union[str, Strategy] = "eager",
    *,
    device: Union[str, torch.device] = "cuda",
    dtype: Optional[torch.dtype] = None,
    loss_fn: Optional[LossFn] = None,
    optimizer: Optional[str] = None,
    headroom: float = 0.05,
    min_batch: int = 1,
    max_batch: int = 1 << 20,
) -> int:
    """The largest batch whose estimated training step fits in ``memory``, found on the estimator alone.

    Batch sizes ``min_batch``, twice that, four times, ... are estimated until one does not fit, then a binary search
    between the last that fits and the first that does not. A batch fits when ``estimate(...).total_bytes <= memory *
    (1 - headroom)``;
    ``headroom`` covers what the estimator does not model (kernel workspaces, fragmentation; see the module
    docstring). Each probe takes about as long as one fake step (no memory is allocated).

    Args:
        model: the model (not modified; may live on the meta device).
        make_inputs: batch size -> the model's inputs: a tensor or a tuple (positional), or a dict (keyword inputs,
            ``lambda b: {"input_ids": ids[:b], "labels": ids[:b]}``); meta tensors avoid allocating real data
            (``lambda b: torch.empty(b, 3, 224, 224, device="meta")``).
        memory: the memory available: bytes or a string like ``"24GiB"`` / ``"80GB"``.
        strategy, device, dtype, loss_fn, optimizer: as for :func:`estimate`. A ``loss_fn`` must work for every
            batch size: build targets from the output's shape.
        headroom: fraction of ``memory`` kept free, in [0, 1).
        min_batch: the smallest batch to try (2 for a model with BatchNorm over 1x1 maps, which cannot train on 1).
        max_batch: stop searching above this batch size.

    Returns:
        the largest fitting batch size, or 0 when not even ``min_batch`` fits.

    Raises:
        ValueError: ``memory`` does not parse, ``headroom`` is outside [0, 1), ``min_batch`` < 1 or
            ``max_batch`` < ``min_batch``.
        TypeError: ``model`` is not an nn.Module, or ``make_inputs`` is not callable.

    Examples:
        >>> memsave.max_batch_size(model, lambda b: torch.empty(b, 3, 224, 224, device="meta"), "24GiB",
        ...                        strategy="checkpoint:blocks")
        212
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"max_batch_size: model must be an nn.Module, got {type(model).__name__}")
    limit = parse_bytes(memory, what="max_batch_size: memory")
    if not (isinstance(headroom, (int, float)) and 0.0 <= headroom < 1.0):
        raise ValueError(f"max_batch_size: headroom must be a fraction in [0, 1), got {headroom!r}")
    if not isinstance(min_batch, int) or min_batch < 1:
        raise ValueError(f"max_batch_size: min_batch must be an int >= 1, got {min_batch!r}")
    if not isinstance(max_batch, int) or max_batch < min_batch:
        raise ValueError(f"max_batch_size: max_batch must be an int >= min_batch ({min_batch}), got {max_batch!r}")
    if not callable(make_inputs):
        raise TypeError("max_batch_size: make_inputs must be a function batch_size -> inputs")
    budget = limit * (1.0 - headroom)
    strat = parse_strategy(strategy)

    def fits(b: int) -> bool:
        args, kwargs = _inputs_of(make_inputs(b))
        est = estimate(
            model,
            *args,
            device=device,
            strategy=strat,
            dtype=dtype,
            loss_fn=loss_fn,
            optimizer=optimizer,
            **kwargs,
        )
        return est.total_bytes <= budget

    if not fits(min_batch):
        return 0
    good, bad = min_batch, None
    while bad is None:
        nxt = min(good * 2, max_batch)
        if nxt == good:
            return good
        if fits(nxt):
            good = nxt
        else:
            bad = nxt
    while bad - good > 1:
        mid = (good + bad) // 2
        if fits(mid):
            good = mid
        else:
            bad = mid
    return good
