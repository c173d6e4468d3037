"""memsave.nn modules keep the input's memory format (contiguous, channels-last, transposed strides) in their outputs
and input gradients, as torch's modules do, with the same values bitwise; a converted channels-last ResNet-18 stays
channels-last from input to head."""

from __future__ import annotations

from typing import Callable, Dict

import pytest
import torch
from torch import nn

import memsave


def _layouts_4d() -> Dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    return {
        "contiguous": lambda x: x.contiguous(),
        "channels_last": lambda x: x.contiguous(memory_format=torch.channels_last),
        "transposed": lambda x: x.transpose(2, 3).contiguous().transpose(2, 3),
        "permuted": lambda x: x.permute(1, 0, 2, 3).contiguous().permute(1, 0, 2, 3),
        "strided_slice": lambda x: x.repeat_interleave(2, dim=3)[..., ::2],
    }


def _run(module: nn.Module, x: torch.Tensor) -> tuple:
    """Output and input gradient (as the op's backward returns it: autograd.grad applies no layout contract) for a
    contiguous upstream gradient."""
    x = x.detach().requires_grad_(True)
    out = module(x)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(5))
    (grad_in,) = torch.autograd.grad(out, x, grad)
    return out, grad_in


PAIRS = {
    "relu": (lambda: memsave.nn.ReLU(), lambda: nn.ReLU()),
    "leaky_relu": (lambda: memsave.nn.LeakyReLU(0.1), lambda: nn.LeakyReLU(0.1)),
    "max_pool2d": (lambda: memsave.nn.MaxPool2d(3, 2, 1), lambda: nn.MaxPool2d(3, 2, 1)),
    "max_pool2d_ceil": (lambda: memsave.nn.MaxPool2d(2, ceil_mode=True), lambda: nn.MaxPool2d(2, ceil_mode=True)),
}


@pytest.mark.parametrize("layout", sorted(_layouts_4d()))
@pytest.mark.parametrize("name", sorted(PAIRS))
def test_outputs_and_input_gradients_keep_the_layout_of_torch(name: str, layout: str) -> None:
    make_memsave, make_torch = PAIRS[name]
    torch.manual_seed(0)
    x = _layouts_4d()[layout](torch.randn(2, 3, 7, 6))
    torch.manual_seed(1)
    out, grad_in = _run(make_memsave(), x)
    torch.manual_seed(1)
    ref_out, ref_grad_in = _run(make_torch(), x)
    assert out.stride() == ref_out.stride(), (out.stride(), ref_out.stride())
    assert grad_in.stride() == ref_grad_in.stride(), (grad_in.stride(), ref_grad_in.stride())
    assert torch.equal(out, ref_out)
    assert torch.equal(grad_in, ref_grad_in)


@pytest.mark.parametrize("layout", sorted(_layouts_4d()))
@pytest.mark.parametrize("name", ["relu", "leaky_relu", "dropout"])
def test_inplace_forms_keep_the_layout(name: str, layout: str) -> None:
    module = {"relu": memsave.nn.ReLU, "leaky_relu": memsave.nn.LeakyReLU, "dropout": memsave.nn.Dropout}[name]
    reference = {"relu": nn.ReLU, "leaky_relu": nn.LeakyReLU, "dropout": None}[name]
    torch.manual_seed(0)
    base = _layouts_4d()[layout](torch.randn(2, 3, 7, 6))
    leaf = base.clone().requires_grad_(True)  # clone keeps the layout (dense ones exactly)
    x = leaf.clone()
    strides = x.stride()
    out = module(inplace=True)(x)
    assert out is x and out.stride() == strides
    grad = torch.randn(out.shape)  # contiguous: the backward restrides it to the mask's order
    (grad_in,) = torch.autograd.grad(out, leaf, grad)
    assert grad_in.stride() == strides
    if reference is not None:
        ref_leaf = base.clone().requires_grad_(True)
        ref = reference(inplace=True)(ref_leaf.clone())
        (ref_grad_in,) = torch.autograd.grad(ref, ref_leaf, grad)
        assert torch.equal(out, ref) and torch.equal(grad_in, ref_grad_in)
    else:  # dropout: a kept element passes grad * scale, a dropped one nothing
        assert torch.equal(grad_in, torch.where(out != 0, grad * 2.0, torch.zeros(())))


@pytest.mark.parametrize("layout", sorted(_layouts_4d()))
def test_dropout_keeps_the_layout_and_its_gradient_matches_its_mask(layout: str) -> None:
    x = _layouts_4d()[layout](torch.ones(2, 3, 7, 6)).requires_grad_(True)
    drop = memsave.nn.Dropout(0.5)
    out = drop(x)
    assert out.stride() == torch.empty_like(x).stride()
    grad = torch.randn(2, 3, 7, 6)  # contiguous, whatever the output's layout
    (grad_in,) = torch.autograd.grad(out, x, grad)
    assert grad_in.stride() == out.stride()
    kept = out != 0
    assert 0 < int(kept.sum()) < out.numel()
    assert torch.equal(out, kept.to(out.dtype) * 2.0)  # ones: a kept element is 1 / (1 - p)
    assert torch.equal(grad_in, torch.where(kept, grad * 2.0, torch.zeros(())))


RMS_LAYOUTS: Dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "contiguous": lambda x: x.contiguous(),
    "leading_transposed": lambda x: x.transpose(0, 1).contiguous().transpose(0, 1),
    "last_transposed": lambda x: x.transpose(1, 2).contiguous().transpose(1, 2),
    "strided_slice": lambda x: x.repeat_interleave(2, dim=0)[::2],  # the same values, every other row of memory
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", sorted(RMS_LAYOUTS))
def test_rms_norm_keeps_the_layout_with_the_contiguous_values(layout: str, dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    norm = memsave.nn.RMSNorm(8, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(8))
    base = torch.randn(3, 5, 8, dtype=dtype)
    grad = torch.randn(3, 5, 8, dtype=dtype)
    ref_x = base.clone().requires_grad_(True)
    ref = norm(ref_x)
    ref.backward(grad)
    x = RMS_LAYOUTS[layout](base).requires_grad_(True)
    out = norm(x)
    expected = torch.empty_like(x, dtype=out.dtype).stride()  # what torch's elementwise ops give this input
    assert out.stride() == expected
    (grad_in,) = torch.autograd.grad(out, x, grad)
    assert grad_in.stride() == torch.empty_like(x).stride()
    assert torch.equal(out, ref) and torch.equal(grad_in, ref_x.grad)


@pytest.mark.parametrize("fuse", [False, True])
def test_converted_channels_last_resnet18_stays_channels_last(fuse: bool) -> None:
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10).to(memory_format=torch.channels_last)
    reference = torchvision.models.resnet18(num_classes=10).to(memory_format=torch.channels_last)
    reference.load_state_dict(model.state_dict())
    memsave.convert(model, fuse=fuse)
    swapped = [(n, m) for n, m in model.named_modules() if type(m).__module__.startswith("memsave")]
    assert len(swapped) >= 10
    seen = []

    def check(name: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple, out: torch.Tensor) -> None:
            seen.append(name)
            if out.dim() == 4:
                assert out.is_contiguous(memory_format=torch.channels_last), f"{name} returned {out.stride()}"

        return hook

    for name, module in swapped:
        module.register_forward_hook(check(name))
    x = torch.randn(2, 3, 64, 64).to(memory_format=torch.channels_last).requires_grad_(True)
    ref_x = x.detach().clone().requires_grad_(True)
    out = model(x)
    out.sum().backward()
    assert len(set(seen)) == len(swapped)
    assert x.grad.is_contiguous(memory_format=torch.channels_last)
    ref = reference(ref_x)
    ref.sum().backward()
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    torch.testing.assert_close(x.grad, ref_x.grad, rtol=0, atol=0)
