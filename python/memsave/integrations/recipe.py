"""What the one-line callbacks (``transformers.Memsave``, ``lightning.Memsave``) do to a model when training starts.

A :class:`Recipe` is their arguments, checked when the callback is constructed. Applied to the model the trainer
trains, in two calls (Lightning converts in ``setup`` and plans on its first batch; Trainer does both at once):

1. :func:`prepare`: checkpointing the model already has is taken off so that nothing runs ``torch.utils.checkpoint``
   and a plan is profiled on the plain model -- transformers' own (``TrainingArguments(activation_checkpointing=
   True)`` or ``model.activation_checkpointing_enable()``, turned off with the model's public ``*_disable()``) and
   memsave's regions (:func:`memsave.unwrap`; kept as they are when the recipe asks for nothing but checkpointing).
   Then :func:`memsave.convert`, when asked.
2. :func:`finish`: :func:`memsave.plan` for the budget on a sample batch, applied with ``memsave.wrap(model, plan)``;
   or ``memsave.wrap(model)`` (the model's blocks) when the recipe checkpoints without a budget, or when the model's
   own checkpointing was on (it then runs as memsave's regions instead of torch's checkpoint).

Whichever order the user's other switches were set in, the model ends with one set of memsave regions and no layer
calling torch's checkpoint: :func:`memsave.wrap` claims a Hugging Face model's switch, so turning it on later
(a second ``trainer.train()``) keeps the regions.
"""

from __future__ import annotations

import itertools
import logging
import random
import warnings
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

import torch
from torch import nn

from ..common.rng import RngState
from ..errors import MemsaveWarning
from ..measurement.units import Budget, format_bytes, is_fraction, parse_budget
from ..operators import convert as convert_model
from ..recompute import Plan, is_wrapped, plan, unwrap, wrap

__all__ = [
    "CONVERT_OPTIONS",
    "PLAN_OPTIONS",
    "KeepRng",
    "Prepared",
    "Recipe",
    "finish",
    "prepare",
    "sample_batch",
    "split_batch",
    "to_device",
]

logger = logging.getLogger(__name__)

#: :func:`memsave.convert`'s keyword options that ``convert={...}`` may carry.
CONVERT_OPTIONS = ("include", "exclude", "fuse", "dropout", "mlp_chunks")
#: :func:`memsave.plan`'s keyword options that ``plan_options={...}`` may carry (``compile=True`` plans need
#: ``plan.compile(model)``, which a trainer does not call).
PLAN_OPTIONS = ("loss_fn", "solver", "selective", "verify", "slots", "timing_steps")

_DISABLE = ("activation_checkpointing_disable", "gradient_checkpointing_disable")


def _check_budget(budget: Budget, what: str) -> None:
    """Raise when ``budget`` does not parse, is not positive, or is a fraction of eager's peak of 1 or more."""
    scale = 1 << 30
    parse_budget(budget, eager_peak_bytes=scale, what=what)  # type, syntax and sign, as memsave.plan reads it
    if is_fraction(budget) and parse_budget(budget, eager_peak_bytes=scale, what=what) >= scale:
        raise ValueError(
            f"{what}: {budget!r} is at least eager's whole peak, so there is nothing to save; give a fraction below 1 "
            "(0.6, '60%') or bytes ('20GiB'), or leave budget=None to wrap every block"
        )


def _check_options(options: Any, allowed: Tuple[str, ...], what: str) -> Dict[str, Any]:
    if not isinstance(options, Mapping):
        raise TypeError(f"{what} must be a dict of keyword options, got {type(options).__name__}")
    unknown = sorted(str(k) for k in options if k not in allowed)
    if unknown:
        raise TypeError(f"{what}: unknown option(s) {', '.join(unknown)}; the options are {', '.join(allowed)}")
    return dict(options)


@dataclass(frozen=True)
class Recipe:
    """What a one-line callback applies at the start of training (see the module docstring).

    Attributes:
        convert: :func:`memsave.convert`'s keyword options, or None for no conversion.
        budget: the plan's budget (bytes, ``"20GiB"``, or a fraction of eager's peak), or None for no plan.
        checkpoint: wrap the model's blocks when there is no budget.
        plan_options: :func:`memsave.plan`'s keyword options (``solver``, ``selective``, ``loss_fn``, ...).

    Examples:
        >>> Recipe.of("Memsave", convert=True, budget="20GiB", checkpoint=True).describe()
        'convert, then a plan for 20.00 GiB'
    """

    convert: Optional[Dict[str, Any]]
    budget: Optional[Budget]
    checkpoint: bool
    plan_options: Dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        where: str,
        convert: Union[bool, Mapping[str, Any]] = False,
        budget: Optional[Budget] = None,
        checkpoint: bool = True,
        plan_options: Optional[Mapping[str, Any]] = None,
    ) -> "Recipe":
        """Check a callback's arguments and make the recipe.

        Args:
            where: the callback's name, for the messages.
            convert: True (:func:`memsave.convert` with its defaults: bitwise eager), a dict of its options
                (``{"fuse": True}``), or False.
            budget: None, an int of bytes, a size string (``"20GiB"``) or a fraction of eager's peak below 1
                (``0.6``, ``"60%"``).
            checkpoint: wrap the model's blocks (``memsave.wrap(model)``) when there is no budget.
            plan_options: :data:`PLAN_OPTIONS` for the plan (only with a budget).

        Returns:
            the :class:`Recipe`.

        Raises:
            ValueError: the budget does not parse, is not positive or is eager's whole peak or more; a budget with
                ``checkpoint=False`` (a plan is checkpointing); nothing to do (no conversion, no budget,
                ``checkpoint=False``); ``plan_options`` without a budget.
            TypeError: an argument of the wrong type, or an unknown convert or plan option.

        Examples:
            >>> Recipe.of("Memsave", budget=0.6).budget
            0.6
        """
        if not isinstance(checkpoint, bool):
            raise TypeError(f"{where}: checkpoint must be True or False, got {checkpoint!r}")
        if isinstance(convert, bool):
            options: Optional[Dict[str, Any]] = {} if convert else None
        else:
            options = _check_options(convert, CONVERT_OPTIONS, f"{where}: convert")
            for key in ("fuse", "dropout"):
                if not isinstance(options.get(key, False), bool):
                    raise TypeError(f"{where}: convert[{key!r}] must be True or False, got {options[key]!r}")
        if budget is not None:
            _check_budget(budget, f"{where}: budget")
            if not checkpoint:
                raise ValueError(
                    f"{where}: budget={budget!r} with checkpoint=False: a plan for a budget is checkpointing; "
                    "drop checkpoint=False, or drop the budget to only convert"
                )
        if options is None and budget is None and not checkpoint:
            raise ValueError(
                f"{where}: convert=False, budget=None and checkpoint=False leave nothing to do; to only log memory "
                "use MemoryCallback"
            )
        plan_kw = _check_options(plan_options or {}, PLAN_OPTIONS, f"{where}: plan_options")
        if plan_kw and budget is None:
            raise ValueError(f"{where}: plan_options {sorted(plan_kw)} need a budget (without one there is no plan)")
        return cls(options, budget, checkpoint, plan_kw)

    def describe(self) -> str:
        """What the recipe does, in a few words (``"convert(fuse=True), then a plan for 20.00 GiB"``)."""
        steps = []
        if self.convert is not None:
            args = ", ".join(f"{k}={v!r}" for k, v in self.convert.items())
            steps.append(f"convert({args})" if args else "convert")
        if self.budget is not None:
            if is_fraction(self.budget):
                amount = f"{parse_budget(self.budget, eager_peak_bytes=10**4) / 10**4:.0%} of eager's peak"
            else:
                amount = format_bytes(parse_budget(self.budget))
            steps.append(f"a plan for {amount}")
        elif self.checkpoint:
            steps.append("wrap every block")
        return ", then ".join(steps)


@dataclass(frozen=True)
class Prepared:
    """What :func:`prepare` found on the model.

    Attributes:
        checkpointing_was_on: the model's own checkpointing (transformers' or memsave's switch) was on.
        kept_regions: the model's memsave regions were kept as they are (the recipe asked only to checkpoint).
    """

    checkpointing_was_on: bool
    kept_regions: bool


def _flagged(model: nn.Module) -> List[nn.Module]:
    """The modules of ``model`` whose switch has transformers' checkpointing on: the switch holders (a class with
    ``*_checkpointing_disable``) with a module under them whose ``gradient_checkpointing`` flag is set."""
    holders = [m for m in model.modules() if any(callable(getattr(type(m), n, None)) for n in _DISABLE)]
    return [h for h in holders if _checkpointing_on(h)]


def _checkpointing_on(model: nn.Module) -> bool:
    """Whether a layer of ``model`` has transformers' ``gradient_checkpointing`` flag set (what
    ``model.is_activation_checkpointing`` reports, read without its deprecation warning)."""
    return any(getattr(m, "gradient_checkpointing", False) is True for m in model.modules())


def prepare(model: nn.Module, recipe: Recipe, where: str) -> Prepared:
    """Take the model's checkpointing off (see the module docstring), then convert it when the recipe says so.

    Args:
        model: the model the trainer trains.
        recipe: the callback's recipe.
        where: the callback's name, for the messages.

    Returns:
        a :class:`Prepared` for :func:`finish`.

    Raises:
        TypeError, ValueError: from :func:`memsave.convert` (the model is then unconverted, without checkpointing).

    Warns:
        MemsaveWarning: memsave regions the user made (``memsave.wrap``) are removed, because the recipe converts or
            plans before it wraps.

    Examples:
        >>> prepared = prepare(model, Recipe.of("Memsave", convert=True), "Memsave")
    """
    regions = any(is_wrapped(m) for m in model.modules())
    flagged = _flagged(model)
    if regions and recipe.convert is None and recipe.budget is None:
        logger.info("%s: the model already has memsave regions; they stay as they are", where)
        return Prepared(True, kept_regions=True)
    if regions:
        warnings.warn(
            f"{where}: the model already had memsave regions (memsave.wrap); they are replaced by "
            f"{recipe.describe()}, which converts and plans on the plain model first. Drop the memsave.wrap call "
            "to silence this.",
            MemsaveWarning,
            stacklevel=3,
        )
        unwrap(model)
    for holder in _flagged(model):
        if not _checkpointing_on(holder):
            continue  # an outer holder's switch turned it off already (a PEFT model's base model)
        # the model's public switch: transformers' torch checkpoint (or memsave's per-layer regions) off, so that a
        # plan is profiled on the plain model; finish() puts memsave's regions in its place.
        off = getattr(holder, _DISABLE[0]) if hasattr(holder, _DISABLE[0]) else getattr(holder, _DISABLE[1])
        off()
    if recipe.convert is not None:
        convert_model(model, **recipe.convert)
    return Prepared(regions or bool(flagged), kept_regions=False)


def split_batch(batch: Any) -> Tuple[Tuple[Any, ...], Dict[str, Any]]:
    """A batch as the model's positional and keyword inputs: a mapping is keywords, a tuple or list positional.

    Examples:
        >>> split_batch({"input_ids": ids})
        ((), {'input_ids': ids})
    """
    if isinstance(batch, Mapping):
        return (), dict(batch)
    if isinstance(batch, (tuple, list)):
        return tuple(batch), {}
    return (batch,), {}


def to_device(batch: Any, device: Optional[torch.device]) -> Any:
    """``batch`` with every tensor in it (through mappings, lists and tuples) moved to ``device``.

    Examples:
        >>> to_device({"input_ids": ids}, torch.device("cuda"))["input_ids"].device.type
        'cuda'
    """
    if device is None:
        return batch
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, Mapping):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, list):
        return [to_device(v, device) for v in batch]
    if isinstance(batch, tuple):
        return tuple(to_device(v, device) for v in batch)
    return batch


class KeepRng:
    """A context manager putting back torch's (CPU and CUDA), Python's and numpy's RNG states on exit, so that
    drawing a sample batch or planning does not change the data order or the dropout masks of training.

    Examples:
        >>> with KeepRng():
        ...     batch = collate([dataset[i] for i in range(4)])
    """

    def __enter__(self) -> "KeepRng":
        self.torch_state = RngState()
        self.python_state = random.getstate()
        try:
            import numpy

            self.numpy_state: Any = numpy.random.get_state()
        except ImportError:  # numpy is optional for torch
            self.numpy_state = None
        return self

    def __exit__(self, *exc: Any) -> None:
        self.torch_state.restore()
        random.setstate(self.python_state)
        if self.numpy_state is not None:
            import numpy

            numpy.random.set_state(self.numpy_state)


def sample_batch(loader: Any, size: int, where: str) -> Any:
    """A batch of the training data for planning: the first ``size`` samples of ``loader``'s dataset, collated by its
    ``collate_fn``. The loader itself is not iterated (no sampler, no worker processes), and the RNG is put back
    (:class:`KeepRng`): a collator or a dataset that draws random numbers does not change training.

    Args:
        loader: the training ``DataLoader`` (or any object with ``dataset`` and ``collate_fn``).
        size: the batch size.
        where: the callback's name, for the messages.

    Returns:
        the collated batch, on the device the collator puts it (usually the CPU).

    Raises:
        ValueError: the loader has no ``dataset`` or ``collate_fn``, or the dataset is empty.

    Examples:
        >>> batch = sample_batch(trainer_train_dataloader, 8, "Memsave")
    """
    dataset, collate = getattr(loader, "dataset", None), getattr(loader, "collate_fn", None)
    if dataset is None or not callable(collate):
        raise ValueError(
            f"{where}: a budget needs a sample batch to plan on, but the train dataloader ({type(loader).__name__}) "
            "has no dataset and collate_fn; plan yourself (memsave.plan, then memsave.wrap(model, plan)) and use "
            "MemoryCallback"
        )
    with KeepRng():
        if isinstance(dataset, torch.utils.data.IterableDataset):
            samples = list(itertools.islice(iter(dataset), size))
        else:
            samples = [dataset[i] for i in range(min(size, len(dataset)))]
        if not samples:
            raise ValueError(f"{where}: the training dataset is empty: there is no batch to plan on")
        return collate(samples)


def finish(
    model: nn.Module,
    recipe: Recipe,
    prepared: Prepared,
    where: str,
    inputs: Optional[Tuple[Tuple[Any, ...], Dict[str, Any]]] = None,
) -> Optional[Plan]:
    """Plan for the budget on ``inputs`` and apply the plan, or wrap the model's blocks (see the module docstring).

    Args:
        model: the model :func:`prepare` was given.
        recipe: the callback's recipe.
        prepared: what :func:`prepare` returned.
        where: the callback's name, for the messages.
        inputs: the model's positional and keyword inputs for one training step, on its device (needed with a
            budget): :func:`split_batch` of a sample batch.

    Returns:
        the plan applied, or None without a budget.

    Raises:
        ValueError: a budget without ``inputs``; whatever :func:`memsave.plan` raises (``InfeasibleBudgetError``
            with the smallest budget that fits; the model is then left converted, without regions).

    Examples:
        >>> plan = finish(model, recipe, prepare(model, recipe, "Memsave"), "Memsave", split_batch(batch))
    """
    if prepared.kept_regions:
        return None
    if recipe.budget is None:
        if recipe.checkpoint or prepared.checkpointing_was_on:
            wrap(model)
        logger.info("%s: %s", where, recipe.describe())
        return None
    if inputs is None:
        raise ValueError(f"{where}: a budget needs a sample batch of the training data to plan on")
    args, kwargs = inputs
    was_training = model.training
    try:
        model.train()  # plan the training step (dropout on), whatever mode the trainer left the model in
        with KeepRng():
            chosen = plan(model, *args, budget=recipe.budget, example_kwargs=kwargs, **recipe.plan_options)
    finally:
        model.train(was_training)
    wrap(model, chosen)
    logger.info("%s: %s\n%s", where, recipe.describe(), chosen.summary())
    return chosen
