"""The user's own model on the command line: ``--model MODULE:CALLABLE``, ``--input`` shapes, and the loss.

``--model`` (``bench`` and ``estimate``):

====================================  ==============================================================================
``torchvision.models:resnet18``       ``MODULE:CALLABLE``: import ``MODULE`` (the current directory is searched
``mypkg.models:make_model``           first), take ``CALLABLE`` (a dotted path such as ``Net.small`` works), call it
                                      with no arguments, or with ``--model-kwargs '{"depth": 4}'`` as keyword
                                      arguments; it must return a ``torch.nn.Module``
``path/to/models.py:make_model``      the same, the module loaded from a file
``vgg16``, ``unet``, ``resnet50``,    the built-in models (:mod:`memsave.models`), with ``--size`` and
``gpt2``                              ``--batch``
====================================  ==============================================================================

``--input`` (once per positional argument of the model's ``forward``, in order; required with ``MODULE:CALLABLE``):

==========================  ========================================================================================
``8,3,64,64``               a float32 tensor of that shape, standard normal values (seeded by ``--seed``)
``tokens:2,128:50257``      an int64 tensor of shape 2x128 holding token ids in ``[0, 50257)``, for language models
==========================  ========================================================================================

``--batch N`` replaces the first dimension of every input. ``estimate`` makes the inputs on the meta device (nothing
is allocated); ``bench`` makes real ones on ``--device``.

The loss is memsave's default loss (:func:`memsave.measurement.default_loss`): the output's ``.loss``, else its
``.logits``, else its first floating-point tensor that requires grad, summed.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import json
import os
import re
import sys
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn

from .usage import CommandError, UsageError, one_line

__all__ = [
    "InputSpec",
    "build_user_model",
    "is_user_model",
    "load_callable",
    "make_inputs",
    "parse_input",
    "parse_model_kwargs",
]

# Signed, so that a negative size gets its own message ("every dimension must be >= 1"), not "not a shape".
_DIMS = re.compile(r"^\s*-?\d+(\s*,\s*-?\d+)*\s*$")


def is_user_model(name: str) -> bool:
    """Whether ``--model`` names the user's own model (``MODULE:CALLABLE``) rather than a built-in one.

    Args:
        name: the ``--model`` value.

    Returns:
        True when it has the ``MODULE:CALLABLE`` form.

    Examples:
        >>> is_user_model("torchvision.models:resnet18"), is_user_model("resnet50")
        (True, False)
    """
    return ":" in name


# ------------------------------------------------------------------------------------------------------------ inputs
@dataclass(frozen=True)
class InputSpec:
    """One ``--input``: a float tensor of ``shape``, or token ids below ``vocab`` when ``vocab`` is set.

    Attributes:
        shape: the tensor's shape (the first dimension is the batch).
        vocab: for token inputs, the number of token ids (values are drawn from ``[0, vocab)``); None for floats.
    """

    shape: Tuple[int, ...]
    vocab: Optional[int] = None

    def __str__(self) -> str:
        dims = "x".join(map(str, self.shape))
        return f"{dims} float32" if self.vocab is None else f"{dims} token ids < {self.vocab}"

    def spelling(self) -> str:
        """The ``--input`` spelling of this input (``"8,3,64,64"``, ``"tokens:2,128:50257"``)."""
        dims = ",".join(map(str, self.shape))
        return dims if self.vocab is None else f"tokens:{dims}:{self.vocab}"

    def make(
        self, device: torch.device, generator: Optional[torch.Generator] = None, batch: Optional[int] = None
    ) -> torch.Tensor:
        """The tensor: on ``device`` (``meta``: nothing allocated), values from ``generator``.

        Args:
            device: where it goes.
            generator: a CPU generator for the values (ignored on the meta device).
            batch: replaces the first dimension.

        Returns:
            a float32 (standard normal) or int64 (uniform token ids) tensor.

        Examples:
            >>> InputSpec((2, 3)).make(torch.device("meta"), batch=5).shape
            torch.Size([5, 3])
        """
        shape = self.shape if batch is None else (batch,) + self.shape[1:]
        dtype = torch.float32 if self.vocab is None else torch.int64
        if device.type == "meta":
            return torch.empty(shape, dtype=dtype, device=device)
        if self.vocab is None:
            return torch.randn(shape, generator=generator).to(device)
        return torch.randint(0, self.vocab, shape, generator=generator).to(device)


def parse_input(text: str) -> InputSpec:
    """Parse one ``--input``: ``8,3,64,64`` (float32) or ``tokens:2,128:50257`` (int64 ids below 50257).

    Args:
        text: the spelling.

    Returns:
        the :class:`InputSpec`.

    Raises:
        UsageError: anything else (the message shows both forms).

    Examples:
        >>> parse_input("tokens:2,128:50257")
        InputSpec(shape=(2, 128), vocab=50257)
    """
    forms = (
        "write SHAPE for a float tensor (e.g. 8,3,224,224) or tokens:SHAPE:VOCAB for token ids "
        "(e.g. tokens:2,128:50257)"
    )
    kind, vocab_text = "float", None
    body = text.strip()
    if body.startswith("tokens:"):
        kind = "tokens"
        body, sep, vocab_text = body[len("tokens:") :].rpartition(":")
        if not sep:
            raise UsageError(f"--input {text!r}: token inputs need a vocabulary size; {forms}")
    if not _DIMS.match(body):
        raise UsageError(f"--input {text!r}: not a shape; {forms}")
    shape = tuple(int(d) for d in body.split(","))
    bad = [d for d in shape if d < 1]
    if bad:
        raise UsageError(f"--input {text!r}: every dimension must be >= 1 (sizes are positive), got {bad[0]}")
    if kind == "float":
        return InputSpec(shape)
    if vocab_text is None or not vocab_text.strip().isdigit() or int(vocab_text) < 1:
        raise UsageError(f"--input {text!r}: the vocabulary size must be an integer >= 1; {forms}")
    return InputSpec(shape, int(vocab_text))


def make_inputs(
    specs: Sequence[InputSpec], device: torch.device, seed: int, batch: Optional[int] = None
) -> Tuple[torch.Tensor, ...]:
    """The model's positional inputs from ``specs``: values from a generator seeded with ``seed + 1``.

    Args:
        specs: one per positional argument.
        device: where they go (``meta``: nothing is allocated).
        seed: ``--seed``; the inputs use ``seed + 1`` as the built-in models' data do.
        batch: replaces the first dimension of every input.

    Returns:
        the tensors, in order.

    Examples:
        >>> [t.shape for t in make_inputs([parse_input("2,3")], torch.device("cpu"), 0, batch=4)]
        [torch.Size([4, 3])]
    """
    g = torch.Generator().manual_seed(seed + 1)
    return tuple(s.make(device, g, batch) for s in specs)


# ------------------------------------------------------------------------------------------------------------ model
def parse_model_kwargs(text: Optional[str]) -> Dict[str, Any]:
    """``--model-kwargs``: a JSON object of keyword arguments for the model's callable.

    Args:
        text: the JSON text, or None.

    Returns:
        the keyword arguments (empty for None).

    Raises:
        UsageError: not JSON, or not an object.

    Examples:
        >>> parse_model_kwargs('{"num_classes": 10}')
        {'num_classes': 10}
    """
    if text is None:
        return {}
    try:
        kwargs = json.loads(text)
    except ValueError as e:
        raise UsageError(f"--model-kwargs is not valid JSON ({e}): {text!r}") from None
    if not isinstance(kwargs, dict):
        raise UsageError(f"--model-kwargs must be a JSON object such as '{{\"num_classes\": 10}}', got {text!r}")
    return kwargs


def _import_module(module_name: str, spec: str) -> Any:
    if module_name.endswith(".py") or "/" in module_name or os.sep in module_name:
        path = os.path.abspath(module_name)
        if not os.path.isfile(path):
            raise UsageError(f"--model {spec!r}: no such file {module_name!r}")
        name = "memsave_cli_model_" + re.sub(r"\W", "_", os.path.splitext(os.path.basename(path))[0])
        loader_spec = importlib.util.spec_from_file_location(name, path)
        if loader_spec is None or loader_spec.loader is None:
            raise UsageError(f"--model {spec!r}: cannot load {module_name!r} as a Python module")
        module = importlib.util.module_from_spec(loader_spec)
        sys.modules[name] = module
        try:
            loader_spec.loader.exec_module(module)
        except Exception as e:
            del sys.modules[name]
            raise CommandError(f"--model {spec!r}: running {module_name} failed: {one_line(e)}") from e
        return module
    # `python -m memsave` searches the current directory; the `memsave` console script should too.
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and (module_name == e.name or module_name.startswith(e.name + ".")):
            raise UsageError(
                f"--model {spec!r}: no module named {e.name!r} (is it installed, or in the current "
                "directory or on PYTHONPATH?)"
            ) from None
        raise CommandError(f"--model {spec!r}: importing {module_name} failed: {one_line(e)}") from e
    except Exception as e:
        raise CommandError(f"--model {spec!r}: importing {module_name} failed: {one_line(e)}") from e


def load_callable(spec: str) -> Callable[..., Any]:
    """Import the callable ``--model MODULE:CALLABLE`` names (``MODULE`` may be a ``.py`` file's path).

    Args:
        spec: ``"torchvision.models:resnet18"``, ``"mypkg.models:Net.small"``, ``"./models.py:make_model"``.

    Returns:
        the callable.

    Raises:
        UsageError: a malformed spec, a module that does not exist, a missing attribute (close names are suggested),
            or an attribute that is not callable.
        CommandError: the module exists but importing it raised.

    Examples:
        >>> load_callable("torch.nn:Linear") is torch.nn.Linear
        True
    """
    module_name, _, attr = spec.rpartition(":")
    if not module_name or not attr or not all(p.isidentifier() for p in attr.split(".")):
        raise UsageError(
            f"--model {spec!r}: write MODULE:CALLABLE, e.g. torchvision.models:resnet18, or one of the built-in models"
        )
    obj = _import_module(module_name, spec)
    done: List[str] = []
    for part in attr.split("."):
        if not hasattr(obj, part):
            owner = module_name if not done else f"{module_name}:{'.'.join(done)}"
            close = difflib.get_close_matches(part, [n for n in dir(obj) if not n.startswith("_")], n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise UsageError(f"--model {spec!r}: {owner} has no attribute {part!r}{hint}")
        obj = getattr(obj, part)
        done.append(part)
    if not callable(obj):
        raise UsageError(
            f"--model {spec!r}: {attr} is not callable (it is of type {type(obj).__name__}); "
            "name a function or class that returns an nn.Module"
        )
    return obj


def build_user_model(spec: str, kwargs: Optional[Dict[str, Any]] = None, seed: int = 0) -> nn.Module:
    """Import and call ``--model MODULE:CALLABLE`` with ``kwargs`` after ``torch.manual_seed(seed)``.

    Args:
        spec: as for :func:`load_callable`.
        kwargs: keyword arguments of the call (``--model-kwargs``).
        seed: seeds the weights.

    Returns:
        the model, in training mode (on the device the callable put it on).

    Raises:
        UsageError: as :func:`load_callable`, or the callable returned something that is not an ``nn.Module``.
        CommandError: importing the module or calling the callable raised.

    Examples:
        >>> build_user_model("torch.nn:Linear", {"in_features": 4, "out_features": 2})
        Linear(in_features=4, out_features=2, bias=True)
    """
    fn = load_callable(spec)
    torch.manual_seed(seed)
    try:
        model = fn(**(kwargs or {}))
    except Exception as e:
        raise CommandError(
            f"--model {spec!r}: calling it{' with --model-kwargs' if kwargs else ''} failed: {one_line(e)}"
        ) from e
    if not isinstance(model, nn.Module):
        raise UsageError(f"--model {spec!r} returned an object of type {type(model).__name__}, not a torch.nn.Module")
    return model.train()
