"""Every exception and warning memsave raises, in one place (each part imports what it raises from here).

Every error says what was wrong and what to do about it; a region's errors name the region (the ``name`` passed to
:func:`memsave.checkpoint`, the qualified name of a wrapped module, or the function's ``__qualname__``).
"""

from __future__ import annotations

from torch.utils import checkpoint as torch_checkpoint

__all__ = [
    "CheckpointError",
    "RecomputeMismatchError",
    "InplaceModificationError",
    "MemsaveWarning",
    "InfeasibleBudgetError",
    "PlanMismatchError",
    "WrapConflictError",
    "NoFakeKernelError",
    "UnsupportedTransformError",
]


class CheckpointError(torch_checkpoint.CheckpointError):
    """Base class of the errors raised by a checkpointed region (forward or recompute in backward).

    A subclass of ``torch.utils.checkpoint.CheckpointError`` (a ``RuntimeError``), so that code catching torch's
    checkpoint errors catches memsave's; the messages keep torch's key phrases after ``memsave:`` ("trying to save
    more tensors during recomputation than during the original forward pass", "Recomputed values for the following
    tensors have different metadata than during the forward pass", ...).

    Examples:
        >>> try:
        ...     loss.backward()
        ... except memsave.CheckpointError as e:                  # any failure of a region's recompute
        ...     print(e)
    """


class RecomputeMismatchError(CheckpointError):
    """The recompute of a region in backward did not reproduce what its forward saved.

    Raised when the recompute saves a different number of tensors, or tensors of another shape, dtype or
    device, than the original forward (and, with ``strict=True``, other values). The usual cause is a region
    whose behaviour depends on state that changed between forward and backward: a global counter, a
    data-dependent branch on non-deterministic values, or ``preserve_rng_state=False`` with random shapes.

    Examples:
        >>> y = memsave.checkpoint(lambda x: x[: random.randint(1, 4)], x)   # shape depends on a Python RNG
        >>> y.sum().backward()                                    # raises RecomputeMismatchError naming the tensor
    """


class InplaceModificationError(CheckpointError):
    """A tensor a region needs for its recompute was modified in place.

    Either the region modified one of its own arguments in place during forward (its recompute would start
    from the modified value), or an argument / a tensor the region saved was modified between forward and
    backward. Eager PyTorch reports the second case as "one of the variables needed for gradient computation
    has been modified by an inplace operation".

    Examples:
        >>> y = memsave.checkpoint(torch.sin, x)
        >>> x.add_(1)                                             # the region's input changed before backward
        >>> y.sum().backward()                                    # raises InplaceModificationError
    """


class MemsaveWarning(UserWarning):
    """A memsave call did something other than the user probably intended (e.g. a wrap policy matched nothing).

    Examples:
        >>> import warnings
        >>> warnings.simplefilter("error", memsave.MemsaveWarning)   # make memsave's surprises errors in a test
    """


class InfeasibleBudgetError(ValueError):
    """No checkpoint plan fits the budget given to :func:`memsave.plan`; ``min_bytes`` is the smallest that does.

    Examples:
        >>> try:
        ...     memsave.plan(model, x, budget="1MiB")
        ... except memsave.InfeasibleBudgetError as e:
        ...     print(e.min_bytes)                                # the smallest budget any plan fits
    """

    def __init__(self, message: str, min_bytes: int) -> None:
        super().__init__(message)
        self.min_bytes = int(min_bytes)


class NoFakeKernelError(RuntimeError):
    """:func:`estimate` cannot run the step on fake tensors: an operator of the model has no fake-tensor
    implementation, or the model reads tensor values (``.item()``, a shape that depends on values)."""


class PlanMismatchError(ValueError):
    """A :class:`memsave.Plan` was applied to a model it was not made for (other modules or parameter shapes).

    Raised before anything is wrapped; the message names the modules that differ (those the plan names and the model
    lacks, those of the model the plan does not know).

    Examples:
        >>> p = memsave.plan(model_a, x, budget=0.5)
        >>> memsave.wrap(model_b, p)               # raises PlanMismatchError naming the modules that differ
    """


class WrapConflictError(ValueError):
    """A change to a model would conflict with the memsave regions it already has, so nothing was changed.

    Raised by :func:`memsave.wrap` (and applying a :class:`memsave.Plan`) on a model that already has regions when
    the new policy or plan selects other ones (the regions would mix or nest: a nested region keeps its inner
    arguments alive), or on a module inside another model's region; and by :func:`memsave.convert` when a swap would
    replace a module that is a region (its region would be lost). Wrapping again with the same regions is a no-op,
    not an error. The message names the regions and says what to do: call :func:`memsave.unwrap` first, or convert
    before wrapping.

    Examples:
        >>> memsave.wrap(model, "blocks")
        >>> memsave.wrap(model, nn.Linear)          # raises WrapConflictError: the Linears are inside the blocks
        >>> memsave.wrap(memsave.unwrap(model), nn.Linear)   # unwrap first: the Linears alone are regions
    """


class UnsupportedTransformError(NotImplementedError):
    """A memsave operator or module was put through a torch mechanism it does not support: forward-mode AD
    (``torch.func.jvp``, ``torch.autograd.forward_ad``) through an operator without a jvp rule, a torch.func transform
    that differentiates (``torch.func.grad``, ``vjp``, ``jacrev``), or ``torch.jit.script``. The message names the
    operator or module and what to use instead (the torch modules it replaces, reverse mode with ``.backward()``,
    ``torch.compile``).
    """
