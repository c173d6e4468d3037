"""Every registered ``torch.ops.memsave`` operator checks the device, dtype and layout of every tensor argument.

The operators are enumerated from the dispatcher, so an operator added without an entry in ``SAMPLES`` fails
``test_every_operator_has_a_sample``. For each operator and each tensor argument (list elements included) in turn:

* moved to the meta device while the others stay on the CPU, the call raises a RuntimeError naming the argument
  (a meta tensor outranks the CPU in the dispatcher, so the operator's fake kernel runs and must refuse the mix,
  where it used to hand back uninitialised CPU memory);
* given a wrong dtype (an integer tensor for a floating-point argument, a float tensor for an integer one), the
  C++ kernel raises a RuntimeError / ValueError / TypeError naming the argument;
* given a sparse layout, the call raises;
* with every tensor on meta, the fake kernel still runs (torch.compile and opcheck depend on it).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterator, List, Tuple

import pytest
import torch

import memsave

ops = torch.ops.memsave


def _registered() -> List[str]:
    return sorted(n.split("::", 1)[1] for n in torch._C._dispatch_get_all_op_names() if n.startswith("memsave::"))


def _x(*shape: int) -> torch.Tensor:
    return torch.randn(*shape)


def _bn_args() -> tuple:
    return _x(2, 3, 4, 4), _x(3), _x(3), torch.zeros(3), torch.ones(3)


def _bn_stats() -> Tuple[torch.Tensor, torch.Tensor]:
    x, w, b, rm, rv = _bn_args()
    _, mean, invstd = ops.batch_norm_act(x, w, b, rm, rv, True, 0.1, 1e-5, "relu", 0.0)
    return mean, invstd


def _masked(name: str, *scalars: Any) -> tuple:
    _, mask = getattr(ops, name)(_x(3, 5), *scalars)
    return (_x(3, 5), mask, *scalars)


def _layer_norm_stats() -> tuple:
    x, lw, lb, w = _x(2, 3, 8), _x(8), _x(8), _x(5, 8)
    _, mean, rstd = ops.layer_norm_linear(x, [8], lw, lb, 1e-5, w, _x(5))
    return x, lw, lb, w, mean, rstd


def _layer_norm_linear_backward() -> tuple:
    x, lw, lb, w, mean, rstd = _layer_norm_stats()
    return (_x(2, 3, 5), x, [8], mean, rstd, lw, lb, w, True)


def _layer_norm_apply() -> tuple:
    x, lw, lb, _, mean, rstd = _layer_norm_stats()
    return (x, [8], mean, rstd, lw, lb, None)


def _rms_norm_backward() -> tuple:
    x, w = _x(2, 3, 8), _x(8)
    _, rstd = ops.rms_norm(x, w, 1e-6)
    return (_x(2, 3, 8), x, rstd, w, [True, True])


def _bn_backward() -> tuple:
    x, w, b, _, _ = _bn_args()
    mean, invstd = _bn_stats()
    return (_x(2, 3, 4, 4), x, w, b, mean, invstd, True, "relu", 0.0)


def _bn_apply() -> tuple:
    x, w, b, _, _ = _bn_args()
    mean, invstd = _bn_stats()
    return (x, mean, invstd, w, b, "relu", 0.0)


_CONV = ([1, 1], [1, 1], [1, 1], 1)


def _bn_conv2d_backward() -> tuple:
    x, w, b, _, _ = _bn_args()
    mean, invstd = _bn_stats()
    return (_x(2, 4, 4, 4), x, w, b, mean, invstd, True, "relu", 0.0, _x(4, 3, 3, 3), True, *_CONV)


def _inplace_abn_backward() -> tuple:
    x, w, b, rm, rv = _bn_args()
    _, invstd = ops.inplace_abn(x, w, b, rm, rv, True, 0.1, 1e-5, "leaky_relu", 0.01)
    return (_x(2, 3, 4, 4), x, w, b, invstd, True, "leaky_relu", 0.01)


def _lce_backward() -> tuple:
    h, w, t, b = _x(6, 8), _x(10, 8), torch.randint(0, 10, (6,)), _x(10)
    _, lse = ops.linear_cross_entropy(h, w, t, b, -100, 0.0, "mean", 0, 0)
    return (torch.ones(()), h, w, t, b, lse, -100, 0.0, "mean", [True, True, True], 0, 0)


def _tile_lse() -> tuple:
    state = torch.zeros(6, 3, dtype=torch.float64)
    return (_x(6, 10), torch.randint(0, 10, (6,)), state, 0, 10, -100, 0.0)


def _tile_grad() -> tuple:
    lse = torch.randn(6, dtype=torch.float64)
    return (_x(6, 10), torch.randint(0, 10, (6,)), lse, torch.ones(1), 0, 10, -100, 0.0)


def _max_pool2d_backward() -> tuple:
    _, argmax = ops.max_pool2d(_x(2, 3, 4, 4), [2, 2], [2, 2], [0, 0], [1, 1], False)
    return (_x(2, 3, 2, 2), argmax, [2, 3, 4, 4], [2, 2], [2, 2], [0, 0], [1, 1])


def _amp_update() -> tuple:
    i32 = torch.zeros(1, dtype=torch.int32)
    return (torch.ones(1), i32, i32.clone(), torch.zeros(1), 2.0, 0.5, 2000, 1)


# One valid call per operator (a builder, since in-place operators consume their arguments).
SAMPLES: Dict[str, Callable[[], tuple]] = {
    "relu": lambda: (_x(3, 5),),
    "relu_": lambda: (_x(3, 5),),
    "relu_backward": lambda: _masked("relu"),
    "leaky_relu": lambda: (_x(3, 5), 0.1),
    "leaky_relu_": lambda: (_x(3, 5), 0.1),
    "leaky_relu_backward": lambda: _masked("leaky_relu", 0.1),
    "dropout": lambda: (_x(3, 5), 0.5),
    "dropout_": lambda: (_x(3, 5), 0.5),
    "dropout_backward": lambda: _masked("dropout", 0.5),
    "max_pool2d": lambda: (_x(2, 3, 4, 4), [2, 2], [2, 2], [0, 0], [1, 1], False),
    "max_pool2d_backward": _max_pool2d_backward,
    "batch_norm_act": lambda: (*_bn_args(), True, 0.1, 1e-5, "relu", 0.0),
    "batch_norm_act_backward": _bn_backward,
    "batch_norm_act_apply": _bn_apply,
    "batch_norm_act_conv2d": lambda: (*_bn_args(), True, 0.1, 1e-5, "relu", 0.0, _x(4, 3, 3, 3), _x(4), *_CONV),
    "batch_norm_act_conv2d_backward": _bn_conv2d_backward,
    "inplace_abn": lambda: (*_bn_args(), True, 0.1, 1e-5, "leaky_relu", 0.01),
    "inplace_abn_backward": _inplace_abn_backward,
    "layer_norm_linear": lambda: (_x(2, 3, 8), [8], _x(8), _x(8), 1e-5, _x(5, 8), _x(5)),
    "layer_norm_linear_backward": _layer_norm_linear_backward,
    "layer_norm_apply": _layer_norm_apply,
    "act_linear": lambda: (_x(2, 3, 8), _x(5, 8), _x(5), "gelu", 0.0),
    "act_linear_backward": lambda: (_x(2, 3, 5), _x(2, 3, 8), _x(5, 8), True, "gelu", 0.0),
    "rms_norm": lambda: (_x(2, 3, 8), _x(8), 1e-6),
    "rms_norm_backward": _rms_norm_backward,
    "rms_norm_linear": lambda: (_x(2, 3, 8), _x(8), 1e-6, [_x(5, 8), _x(4, 8)], [_x(5), None]),
    "rms_norm_linear_backward": lambda: (
        [_x(2, 3, 5), _x(2, 3, 4)],
        _x(2, 3, 8),
        _x(8),
        1e-6,
        [_x(5, 8), _x(4, 8)],
        [True, False],
    ),
    "gated_act": lambda: (_x(2, 3, 8), _x(2, 3, 8), "silu"),
    "gated_act_backward": lambda: (_x(2, 3, 8), _x(2, 3, 8), _x(2, 3, 8), "silu"),
    "gated_act_linear": lambda: (_x(2, 3, 8), _x(2, 3, 8), _x(5, 8), _x(5), "silu"),
    "gated_act_linear_backward": lambda: (_x(2, 3, 5), _x(2, 3, 8), _x(2, 3, 8), _x(5, 8), True, "silu"),
    "linear_cross_entropy": lambda: (_x(6, 8), _x(10, 8), torch.randint(0, 10, (6,)), _x(10), -100, 0.0, "mean", 0, 0),
    "linear_cross_entropy_backward": _lce_backward,
    "cross_entropy_tile_lse_": _tile_lse,
    "cross_entropy_tile_grad_": _tile_grad,
    "unscale_and_check_": lambda: ([_x(3, 5), _x(4)], torch.zeros(1), torch.ones(1), torch.zeros(2)),
    "amp_update_scale_": _amp_update,
}


def _arg_names(name: str) -> List[str]:
    return [a.name for a in getattr(ops, name).default._schema.arguments]


def _tensor_slots(args: tuple) -> Iterator[Tuple[int, int]]:
    """(argument index, list index or -1) of every tensor in ``args``."""
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            yield i, -1
        elif isinstance(a, (list, tuple)):
            for j, t in enumerate(a):
                if isinstance(t, torch.Tensor):
                    yield i, j


def _replace(args: tuple, slot: Tuple[int, int], fn: Callable[[torch.Tensor], torch.Tensor]) -> tuple:
    i, j = slot
    out = list(args)
    if j < 0:
        out[i] = fn(args[i])
    else:
        items = list(args[i])
        items[j] = fn(items[j])
        out[i] = items
    return tuple(out)


def _wrong_dtype(t: torch.Tensor) -> torch.Tensor:
    dtype = torch.float32 if not t.dtype.is_floating_point else torch.int32
    return torch.zeros(t.shape, dtype=dtype)


def _cases(transform: str) -> List[Any]:
    cases = []
    for name in _registered():
        if name not in SAMPLES:
            continue
        for slot in _tensor_slots(SAMPLES[name]()):
            cases.append(
                pytest.param(name, slot, id=f"{name}-{_arg_names(name)[slot[0]]}{slot[1] if slot[1] >= 0 else ''}")
            )
    return cases


def _error(kind: Any, name: str, args: tuple) -> str:
    """The message of the error ``kind`` that calling operator ``name`` raises; it must name the operator."""
    with pytest.raises(kind) as info:
        getattr(ops, name)(*args)
    message = str(info.value)
    assert f"memsave.{name}" in message or f"memsave::{name}" in message, message
    return message


def test_every_operator_has_a_sample() -> None:
    missing = sorted(set(_registered()) - set(SAMPLES))
    assert not missing, f"add a valid call to SAMPLES for the new operators {missing}"
    assert len(_registered()) >= 37


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_valid_sample_runs(name: str) -> None:
    getattr(ops, name)(*SAMPLES[name]())  # so that every failure below is caused by the one changed argument


@pytest.mark.parametrize(("name", "slot"), _cases("meta"))
def test_meta_argument_among_real_ones_raises(name: str, slot: Tuple[int, int]) -> None:
    args = SAMPLES[name]()
    moved = _replace(args, slot, lambda t: t.to("meta"))
    if all(
        moved[i].device.type == "meta" if j < 0 else moved[i][j].device.type == "meta" for i, j in _tensor_slots(moved)
    ):
        getattr(ops, name)(*moved)  # the only tensor: an all-meta call, which the fake kernel serves
        return
    message = _error(RuntimeError, name, moved)
    assert _arg_names(name)[slot[0]] in message and "meta" in message, message


@pytest.mark.parametrize(("name", "slot"), _cases("dtype"))
def test_wrong_dtype_raises(name: str, slot: Tuple[int, int]) -> None:
    args = _replace(SAMPLES[name](), slot, _wrong_dtype)
    message = _error((RuntimeError, ValueError, TypeError), name, args)
    assert _arg_names(name)[slot[0]] in message, message


@pytest.mark.parametrize(("name", "slot"), _cases("layout"))
def test_sparse_argument_raises(name: str, slot: Tuple[int, int]) -> None:
    args = _replace(SAMPLES[name](), slot, lambda t: t.to_sparse())
    with pytest.raises((RuntimeError, ValueError, TypeError, NotImplementedError)):
        getattr(ops, name)(*args)


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_all_meta_call_runs_the_fake_kernel(name: str) -> None:
    args = SAMPLES[name]()
    for slot in list(_tensor_slots(args)):
        args = _replace(args, slot, lambda t: t.to("meta"))
    getattr(ops, name)(*args)


def test_meta_weight_no_longer_returns_garbage() -> None:
    x, w = torch.randn(4, 8), torch.ones(8, device="meta")
    with pytest.raises(RuntimeError, match="weight is on meta"):
        memsave.functional.rms_norm(x, w)
