"""The benchmark rows, named by memsave's strategy registry (:mod:`memsave.measurement.strategies`).

The harness (``benchmarks/run.py``), :func:`memsave.compare`, ``python -m memsave bench`` and the demo all name and
build a strategy the same way: ``parse_strategy(name).prepare(model_copy, StrategyContext(inputs, loss_fn, device))``.
A benchmark row is a strategy name; adding a row kind is a ``register_strategy`` call, never an edit of the loop::

    from memsave.measurement.strategies import register_strategy

    register_strategy("channels_last", "NHWC memory format",
                      apply=lambda model, arg, ctx: model.to(memory_format=torch.channels_last))

``prepare`` receives a deep copy of the seeded model (in training mode); it may change the copy in place and returns
the module to call as ``runner(*inputs)``. The harness reads the gradients from the *copy's* parameters, so a
returned wrapper must share them. Modules that register more kinds are imported with ``--plugins``
(``benchmarks.strategies_convert``, ``_fused``, ``_plan``), each of which also names its rows in a tuple.
"""

from __future__ import annotations

from typing import List, Sequence, Tuple

from memsave.measurement.strategies import Strategy, parse_strategy

__all__ = ["DEFAULT_STRATEGIES", "get"]

#: The checkpointing rows, in table order: torch's checkpoint and memsave's, per block and in 2 sequential segments.
DEFAULT_STRATEGIES: Tuple[str, ...] = (
    "eager",
    "torch_checkpoint:blocks",
    "torch_checkpoint_sequential:2",
    "checkpoint:blocks",
    "checkpoint_sequential:2",
)


def get(names: Sequence[str]) -> List[Strategy]:
    """The parsed strategies called ``names``, in that order; "eager" is put first when missing (ratios need it).

    Raises:
        ValueError: an unknown name (the message lists the registered ones).

    Examples:
        >>> [s.name for s in get(["checkpoint:blocks"])]
        ['eager', 'checkpoint:blocks']
    """
    parsed = [parse_strategy(n) for n in names]
    if all(s.name != "eager" for s in parsed):
        parsed.insert(0, parse_strategy("eager"))
    return list({s.name: s for s in parsed}.values())
