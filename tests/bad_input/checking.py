"""What every bad-input case shares: a fresh tiny world, the failing call, and the checks after it.

A case is one wrong call of the public API (or of ``python -m memsave``, run in-process through ``memsave.cli.main``).
:func:`check` builds a fresh :class:`World` (a tiny model that has been trained one step, its optimizer with state, a
GradScaler), snapshots everything a failed call must leave alone, makes the call, and asserts:

* the exception has the documented type (for the CLI: ``SystemExit`` with the documented exit code);
* its message (for the CLI: the one line on stderr) matches the case's pattern, which names the argument;
* the model (``state_dict`` values, module tree, instance-level ``forward`` / ``extra_repr``, hooks, gradients,
  ``training`` flags), the optimizer's state, the CPU RNG state and the scaler's state are unchanged.
"""

from __future__ import annotations

import contextlib
import copy
import io
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Type

import pytest
import torch
from torch import nn

import memsave

_HOOK_DICTS = (
    "_forward_hooks",
    "_forward_pre_hooks",
    "_backward_hooks",
    "_backward_pre_hooks",
    "_state_dict_hooks",
    "_load_state_dict_pre_hooks",
)


def rand(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Random values from a generator of their own: a case's call must not draw from the global RNG it checks."""
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0), dtype=dtype)


def tiny_model(blocks: int = 3, width: int = 8) -> nn.Sequential:
    """Blocks of Linear + BatchNorm1d + ReLU and a linear head: repeated blocks (find_blocks), buffers, a plan."""
    torch.manual_seed(0)
    layers: List[nn.Module] = [
        nn.Sequential(nn.Linear(width, width), nn.BatchNorm1d(width), nn.ReLU()) for _ in range(blocks)
    ]
    return nn.Sequential(*layers, nn.Linear(width, 2))


class World:
    """What a case may touch: a model trained one step, its optimizer (with momentum state), a scaler, an input."""

    def __init__(self, model: Optional[nn.Module] = None) -> None:
        self.model = model if model is not None else tiny_model()
        first = next(self.model.parameters())  # the input follows the first layer's width and dtype
        self.x = torch.randn(4, first.shape[-1], generator=torch.Generator().manual_seed(1)).to(first.dtype)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1, momentum=0.9)
        if any(p.requires_grad for p in self.model.parameters()):
            self.model(self.x).float().sum().backward()
            self.optimizer.step()  # momentum buffers: state to keep
        self.scaler = memsave.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=3)
        torch.manual_seed(1234)


def _clone(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        return {k: _clone(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_clone(v) for v in value)
    return copy.copy(value)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and torch.equal(a, b)
        )
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return bool(a == b)


def snapshot(world: World) -> Dict[str, Any]:
    """Everything a failed call must leave as it was, in a form :func:`_same` compares."""
    model = world.model
    return {
        "state_dict": _clone(model.state_dict()),
        "tree": [(name, type(m), id(m), m.training) for name, m in model.named_modules()],
        "instance attributes": [
            (name, id(m.__dict__.get("forward")), id(m.__dict__.get("extra_repr"))) for name, m in model.named_modules()
        ],
        "hooks": [(name, [list(getattr(m, h).keys()) for h in _HOOK_DICTS]) for name, m in model.named_modules()],
        "parameters": [(name, id(p), p.requires_grad) for name, p in model.named_parameters()],
        "grads": [None if p.grad is None else p.grad.clone() for p in model.parameters()],
        "optimizer": _clone(world.optimizer.state_dict()),
        "rng": torch.get_rng_state(),
        "scaler": _clone(world.scaler.state_dict()),
    }


@dataclass
class Case:
    """One wrong call: ``call(world)`` must raise ``error`` with a message matching ``names`` (the argument)."""

    id: str
    call: Callable[[World], Any]
    error: Type[BaseException]
    names: str
    xfail: str = ""  # why it fails today (a fix that belongs to another part), or "" when it must pass
    model: Optional[Callable[[], nn.Module]] = field(default=None)


def params(cases: Sequence[Case]) -> List[Any]:
    """``cases`` as pytest parameters with their ids; a case with ``xfail`` is a strict expected failure."""
    ids = [c.id for c in cases]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    assert not duplicates, f"duplicate case ids {duplicates}"
    return [
        pytest.param(c, id=c.id, marks=[pytest.mark.xfail(strict=True, reason=c.xfail)] if c.xfail else [])
        for c in cases
    ]


def check(case: Case) -> BaseException:
    """Run ``case`` in a fresh world and assert its error, its message and that nothing changed; returns the error."""
    world = World(case.model() if case.model is not None else None)
    before = snapshot(world)
    with pytest.raises(case.error) as info:
        case.call(world)
    message = str(info.value)
    assert re.search(case.names, message, re.IGNORECASE | re.DOTALL), (
        f"the message does not name the argument ({case.names!r}): {message!r}"
    )
    after = snapshot(world)
    changed = [key for key in before if not _same(before[key], after[key])]
    assert not changed, f"the failed call changed {changed}"
    return info.value


class CliExit(Exception):
    """``python -m memsave`` ended: ``str(e)`` is ``"exit CODE: <what it wrote to stderr>"``."""

    def __init__(self, code: int, stderr: str) -> None:
        super().__init__(f"exit {code}: {stderr.strip()}")
        self.code = code


def cli(*argv: str) -> Callable[[World], Any]:
    """A case's call: ``python -m memsave *argv`` in-process (``memsave.cli.main``); always raises :class:`CliExit`."""

    def call(world: World) -> None:
        from memsave.cli import main

        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                code = main(list(argv))
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 1
        raise CliExit(int(code), err.getvalue())

    return call
