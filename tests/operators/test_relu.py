"""memsave::relu / relu_ / relu_backward: opcheck, gradcheck, bitwise equality with torch, saved bytes, in-place
semantics and bad input."""

from __future__ import annotations

import math

import pytest
import torch

import memsave  # noqa: F401  (loads the operators)
import memsave.functional as MF
from helpers import DTYPES
from helpers.masks import assert_matches_torch, bits_equal, saved_bytes, special_values, strided_views

# ---- opcheck / gradcheck -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_opcheck(device, dtype):
    x = torch.randn(3, 5, 7, dtype=dtype, device=device)
    torch.library.opcheck(torch.ops.memsave.relu.default, (x.clone().requires_grad_(),))
    torch.library.opcheck(torch.ops.memsave.relu.default, (x.transpose(0, 2).requires_grad_(),))
    torch.library.opcheck(torch.ops.memsave.relu_.default, (x.clone(),))
    torch.library.opcheck(torch.ops.memsave.relu_.default, (x.clone().requires_grad_() * 1,))  # non-leaf
    _, mask = torch.ops.memsave.relu(x)
    torch.library.opcheck(torch.ops.memsave.relu_backward.default, (torch.randn_like(x).requires_grad_(), mask))


def test_gradcheck_float64(device):
    x = torch.randn(4, 9, dtype=torch.float64, device=device)
    x = torch.where(x.abs() < 1e-3, torch.full_like(x, 0.5), x).requires_grad_()  # keep away from the kink
    assert torch.autograd.gradcheck(MF.relu, (x,))
    assert torch.autograd.gradgradcheck(MF.relu, (x,))
    assert torch.autograd.gradcheck(lambda t: MF.relu(t * 1, inplace=True), (x,))


# ---- exactness ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(1,), (7,), (8,), (9,), (3, 17), (2, 3, 5, 11), (4, 64, 33)])
def test_bitwise_equal_to_torch_cpu_float32(shape):
    base = special_values(math.prod(shape), torch.float32, seed=len(shape) * 100 + shape[-1]).view(shape)
    for label, x in strided_views(base):
        g = special_values(x.numel(), torch.float32, seed=7).view(x.shape)
        assert_matches_torch(MF.relu, torch.relu, x, g, label)


@pytest.mark.parametrize("dtype", DTYPES)
def test_all_dtypes_match_torch(dtype):
    x = special_values(1000, dtype, seed=3).view(10, 100)
    assert_matches_torch(MF.relu, torch.relu, x, torch.randn(10, 100).to(dtype))


def test_large_tensor_parallel_path_matches_torch():
    x = torch.randn(300_001)  # several parallel chunks and a partial last mask byte
    a = x.clone().requires_grad_()
    b = x.clone().requires_grad_()
    MF.relu(a).sum().backward()
    torch.relu(b).sum().backward()
    assert torch.equal(a.grad, b.grad)
    assert torch.equal(MF.relu(x), torch.relu(x))


def test_mask_layout():
    x = torch.tensor([1.0, -1.0, 0.0, -0.0, math.nan, 2.0, -3.0, 4.0, 5.0])
    _, mask = torch.ops.memsave.relu(x)
    # bit i of byte i // 8 set where the gradient passes: !(x <= 0); trailing bits of the last byte are zero
    assert mask.tolist() == [0b10110001, 0b00000001]


@pytest.mark.parametrize("shape", [(0,), (0, 5), (3, 0, 2)])
def test_empty(shape):
    x = torch.empty(shape, requires_grad=True)
    y = MF.relu(x)
    assert y.shape == x.shape
    y.sum().backward()
    assert x.grad.shape == x.shape
    _out, mask = torch.ops.memsave.relu(x.detach())
    assert mask.numel() == 0
    assert torch.ops.memsave.relu_(x.detach().clone()).numel() == 0


# ---- in place ----------------------------------------------------------------------------------------------------


def test_inplace_matches_torch_and_returns_input():
    x = special_values(517, torch.float32, seed=11).view(11, 47)
    a = x.clone().requires_grad_()
    b = x.clone().requires_grad_()
    ha, hb = a * 1, b * 1
    out = MF.relu(ha, inplace=True)
    assert out is ha
    torch.relu_(hb)
    assert bits_equal(ha, hb)
    g = torch.randn(11, 47)
    ha.backward(g)
    hb.backward(g)
    assert bits_equal(a.grad, b.grad)


def test_inplace_on_non_contiguous_view_updates_base():
    base = torch.randn(6, 8, requires_grad=True)
    h = base * 1
    view = h[:, ::2]  # non-contiguous view of a non-leaf
    MF.relu(view, inplace=True)
    expected = base.detach().clone()
    expected[:, ::2] = torch.relu(expected[:, ::2])
    assert torch.equal(h.detach(), expected)
    h.sum().backward()
    ref = torch.ones(6, 8)
    ref[:, ::2] = (base.detach()[:, ::2] > 0).float()
    assert torch.equal(base.grad, ref)


def test_inplace_bumps_version_so_autograd_detects_overwritten_saved_tensor():
    x = torch.randn(10, requires_grad=True)
    y = torch.sigmoid(x)  # sigmoid keeps its output for backward
    v = y._version
    MF.relu(y, inplace=True)
    assert y._version > v
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


@pytest.mark.parametrize("mode", ["grad", "no_grad", "inference_mode"])
def test_inplace_bumps_version_once_in_every_mode(mode):
    x = torch.randn(10, requires_grad=True)
    y = torch.sigmoid(x)
    v = y._version
    ctx = {"grad": torch.enable_grad, "no_grad": torch.no_grad, "inference_mode": torch.inference_mode}[mode]
    with ctx():
        MF.relu(y, inplace=True)
    assert y._version == v + 1
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def test_inplace_refuses_leaf_requiring_grad():
    x = torch.randn(5, requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        MF.relu(x, inplace=True)


def test_inplace_without_grad_and_under_no_grad():
    x = torch.randn(20)
    ref = torch.relu(x)
    MF.relu(x, inplace=True)
    assert torch.equal(x, ref)
    with torch.no_grad():
        y = torch.randn(20)
        ref = torch.relu(y)
        MF.relu(y, inplace=True)
        assert torch.equal(y, ref)


# ---- saved bytes -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 8, 1000, 4099])
def test_saved_bytes_are_packed_mask(n):
    x = torch.randn(n, requires_grad=True)
    assert saved_bytes(lambda t: MF.relu(t), x) == math.ceil(n / 8)
    assert saved_bytes(lambda t: MF.relu(t * 1, inplace=True), x) == math.ceil(n / 8)
    assert saved_bytes(lambda t: torch.relu(t), x) == 4 * n  # torch keeps the float32 output


# ---- bad input ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8, torch.bool])
def test_integer_dtypes_rejected(dtype):
    x = torch.ones(4, dtype=dtype)
    with pytest.raises(TypeError, match="floating-point"):
        MF.relu(x)
    with pytest.raises(RuntimeError, match="floating-point"):
        torch.ops.memsave.relu(x)
    with pytest.raises(RuntimeError, match="floating-point"):
        torch.ops.memsave.relu_(x)


def test_inplace_on_overlapping_memory_refused():
    x = torch.randn(1).expand(4)  # four elements, one memory location
    with pytest.raises(RuntimeError, match="more than one element"):
        MF.relu(x, inplace=True)


def test_not_a_tensor():
    with pytest.raises(TypeError, match="torch.Tensor"):
        MF.relu([1.0, -1.0])


def test_backward_mask_mismatch():
    g = torch.randn(17)
    with pytest.raises(RuntimeError, match="needs 3"):
        torch.ops.memsave.relu_backward(g, torch.zeros(2, dtype=torch.uint8))
    with pytest.raises(RuntimeError, match="mask to be Byte"):
        torch.ops.memsave.relu_backward(g, torch.zeros(3, dtype=torch.int32))


def test_tensors_on_different_devices():
    g = torch.randn(16)
    with pytest.raises((RuntimeError, NotImplementedError)):
        torch.ops.memsave.relu_backward(g, torch.zeros(2, dtype=torch.uint8, device="meta"))


@pytest.mark.cuda
def test_cuda_matches_torch_and_device_mismatch():
    for dtype in DTYPES:
        x = special_values(10_001, dtype, "cuda", seed=5)
        assert_matches_torch(MF.relu, torch.relu, x, torch.ones_like(x), dtype)
        xc = x.clone()
        MF.relu(xc, inplace=True)
        assert bits_equal(xc, torch.relu(x))
    with pytest.raises(RuntimeError):
        torch.ops.memsave.relu_backward(torch.randn(16, device="cuda"), torch.zeros(2, dtype=torch.uint8))


@pytest.mark.cuda
def test_cuda_current_stream_and_device_guard():
    s = torch.cuda.Stream()
    x = torch.randn(1 << 20, device="cuda")
    with torch.cuda.stream(s):
        y = MF.relu(x)
    s.synchronize()
    assert torch.equal(y, torch.relu(x))
    if torch.cuda.device_count() > 1:
        x1 = torch.randn(1000, device="cuda:1")
        assert torch.equal(MF.relu(x1), torch.relu(x1))
