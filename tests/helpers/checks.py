"""Assertions the operator tests share: a fused module against the eager one it replaces, and the refused double
backward."""

from __future__ import annotations

from typing import Callable, Tuple

import pytest
import torch

from .fused import FLOAT32_RTOL, rel_err

Tensor = torch.Tensor


def assert_module_matches(ours: torch.nn.Module, ref: torch.nn.Module, x: Tensor) -> Tuple[Tensor, Tensor]:
    """``ours(x)`` and ``ref`` on a copy of ``x`` agree within :data:`FLOAT32_RTOL`, and so do the gradients of the
    input and of every parameter (in order) for one random output gradient; returns both outputs."""
    x2 = x.detach().clone().requires_grad_()
    y, y2 = ours(x), ref(x2)
    assert rel_err(y, y2) <= FLOAT32_RTOL
    gy = torch.randn_like(y)
    for o, r in zip(
        torch.autograd.grad(y, [x, *ours.parameters()], gy), torch.autograd.grad(y2, [x2, *ref.parameters()], gy)
    ):
        assert rel_err(o, r) <= FLOAT32_RTOL
    return y, y2


def assert_no_double_backward(wrt: Tensor, *losses: Callable[[], Tensor]) -> None:
    """Each loss's gradient with respect to ``wrt`` (taken with ``create_graph=True``) refuses a second backward."""
    for loss in losses:
        (grad,) = torch.autograd.grad(loss(), wrt, create_graph=True)
        with pytest.raises(NotImplementedError, match="double backward"):
            grad.sum().backward()
