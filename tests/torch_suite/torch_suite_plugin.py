"""pytest plugin for PyTorch's own tests run from a checkout of its ``test/`` folder (the torch suite harnesses:
tests/recompute/test_torch_checkpoint_suite.py and tests/amp/test_torch_grad_scaler_suite.py).

Loaded with ``-p torch_suite_plugin`` in the harness's subprocess, never by this repository's own pytest; it acts in
``pytest_configure``, before the test modules are imported, so their ``from torch... import checkpoint`` binds what
is installed here. ``MEMSAVE_TORCH_SUITE`` names what it installs:

* ``checkpoint-baseline`` / ``checkpoint-memsave``: ``torch.utils.checkpoint.checkpoint`` and ``checkpoint_sequential``
  become thin shims. Every call with ``use_reentrant=False`` is counted; in the memsave run it goes to
  :func:`memsave.checkpoint` / :func:`memsave.checkpoint_sequential`. Every other call (reentrant, or no
  ``use_reentrant``, which torch reads as reentrant) goes to torch's own function in both runs.
* ``grad_scaler-baseline`` / ``grad_scaler-memsave``: each scaler built from ``torch.amp.GradScaler`` itself is
  counted; in the memsave run ``torch.GradScaler`` and ``torch.amp.GradScaler`` are :class:`memsave.amp.GradScaler`,
  and each memsave scaler built is counted. torch's deprecated aliases (``torch.cpu.amp.GradScaler``) stay torch's.

Each test's outcome (a failed subtest fails its test), the first line of its error (``suite_outcomes.py``), and its
counts go to the JSON file ``MEMSAVE_TORCH_SUITE_RESULTS`` names.
"""

from __future__ import annotations

import collections
import os
from typing import Any, Callable, Dict, Optional

import pytest
from suite_outcomes import Outcomes

_results = Outcomes()
_counts: Dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
_current: Dict[str, Optional[str]] = {"test": None}


def _count(what: str) -> None:
    _counts[_current["test"] or "<collection>"][what] += 1


def _non_reentrant(torch_fn: Callable[..., Any], memsave_fn: Optional[Callable[..., Any]]) -> Callable[..., Any]:
    """A shim for a torch checkpoint function: ``use_reentrant=False`` calls are counted and go to ``memsave_fn``
    (torch's own function when None), every other call to torch's function."""

    def shim(*args: Any, use_reentrant: Optional[bool] = None, **kwargs: Any) -> Any:
        if use_reentrant is False:
            _count(f"{torch_fn.__name__}:non_reentrant")
            target = memsave_fn or torch_fn
            return target(*args, use_reentrant=False, **kwargs)
        _count(f"{torch_fn.__name__}:torch")
        return torch_fn(*args, use_reentrant=use_reentrant, **kwargs)

    shim.__name__ = shim.__qualname__ = torch_fn.__name__
    shim.__doc__ = torch_fn.__doc__
    return shim


def _patch_checkpoint(use_memsave: bool) -> None:
    import torch.utils.checkpoint as tc

    import memsave

    tc.checkpoint = _non_reentrant(tc.checkpoint, memsave.checkpoint if use_memsave else None)
    tc.checkpoint_sequential = _non_reentrant(
        tc.checkpoint_sequential, memsave.checkpoint_sequential if use_memsave else None
    )


def _counting_init(cls: type, what: str, exact: bool) -> None:
    init = cls.__init__

    def counted(self: Any, *args: Any, **kwargs: Any) -> None:
        if not exact or type(self) is cls:
            _count(what)
        init(self, *args, **kwargs)

    cls.__init__ = counted  # type: ignore[misc]


def _patch_grad_scaler(use_memsave: bool) -> None:
    import torch
    import torch.amp

    import memsave.amp

    _counting_init(torch.amp.GradScaler, "torch_scaler", exact=True)
    if use_memsave:
        _counting_init(memsave.amp.GradScaler, "memsave_scaler", exact=False)
        torch.GradScaler = memsave.amp.GradScaler  # type: ignore[misc,assignment]
        torch.amp.GradScaler = memsave.amp.GradScaler  # type: ignore[misc,assignment]


def pytest_configure(config: pytest.Config) -> None:
    mode = os.environ.get("MEMSAVE_TORCH_SUITE", "")
    patches = {"checkpoint": _patch_checkpoint, "grad_scaler": _patch_grad_scaler}
    what, _, run = mode.partition("-")
    if what not in patches or run not in ("baseline", "memsave"):
        raise pytest.UsageError(
            f"MEMSAVE_TORCH_SUITE must be one of checkpoint-baseline, checkpoint-memsave, grad_scaler-baseline, "
            f"grad_scaler-memsave; got {mode!r}"
        )
    patches[what](run == "memsave")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    _current["test"] = item.nodeid
    try:
        return (yield)
    finally:
        _current["test"] = None


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _results.record(report)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _results.write("MEMSAVE_TORCH_SUITE_RESULTS", counts={test: dict(c) for test, c in _counts.items()})
