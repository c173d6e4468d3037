"""The plan cache: :func:`memsave.plan`'s answers kept on disk, so that a script that plans at start-up plans once.

An entry is found by a key of everything a plan depends on that is known before profiling (:func:`plan_key`):

- the model's structure: :func:`~.plan.fingerprint` (module names, classes, parameter shapes and dtypes), and its
  buffers' shapes and dtypes, which parameters require grad, where they live, each module's training flag and
  ``extra_repr`` (a Dropout's ``p``, an activation's ``inplace``), the code of each module class's ``forward``, a
  Hugging Face ``config`` and the versions of the packages the model's classes come from;
- the example inputs (positional and keyword) by their structure, and each tensor's shape, strides, dtype, device
  and ``requires_grad``; plain values (ints, floats, strings, None) by value;
- the loss: the default, or a function by its module, qualified name and code; a ``functools.partial`` of one by its
  arguments as for the inputs. A lambda, a closure, a bound method or another callable object cannot be keyed
  reliably (what it computes depends on state the key does not see): then the cache is not used, and the reason is
  logged at DEBUG level on the ``memsave`` logger;
- every argument of :func:`memsave.plan` that changes its result (budget, solver, verify, slots, timing steps,
  selective classes, compile), torch's and memsave's versions (and memsave's build), the planner's cost model
  (:data:`COST_MODEL`), Python's, the device (CUDA: its name and capability; CPU: its model name and torch's thread
  count) and the autocast state.

Tensor *values* are not keyed: a model whose memory depends on its inputs' values (data-dependent shapes) should plan
with ``cache=False``. An entry is one JSON file, ``<model class>-<hash of the key>.json``, holding the key and the
plan (:meth:`Plan.to_json`); it is written to a temporary file and moved into place (``os.replace``), so a reader
never sees half of one. An entry that cannot be read, or whose key or plan does not match, is ignored with a
:class:`~memsave.errors.MemsaveWarning` and replaced by the new plan.

Where: ``cache=<directory>``, else ``$MEMSAVE_CACHE_DIR/plans``, else ``$XDG_CACHE_HOME/memsave/plans``, else
``~/.cache/memsave/plans``. Off: ``cache=False``, or ``MEMSAVE_PLAN_CACHE=0`` in the environment (an explicit
``cache=True`` or directory wins over the environment). Delete the directory to empty the cache.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import sys
import tempfile
import types
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple, Union

import torch
from torch import nn
from torch.utils._pytree import tree_flatten

from ...errors import MemsaveWarning
from ...extension import build_info
from .plan import Plan, fingerprint
from .plan_json import read_plan_fields

__all__ = [
    "CACHE_DIR_ENV",
    "PLAN_CACHE_ENV",
    "NotKeyable",
    "cache_directory",
    "cpu_name",
    "entry_path",
    "load_plan",
    "plan_key",
    "store_plan",
]

#: The environment variable that turns the plan cache off (``0``, ``false``, ``off`` or ``no``).
PLAN_CACHE_ENV = "MEMSAVE_PLAN_CACHE"
#: The environment variable naming memsave's cache directory (plans go to its ``plans`` folder).
CACHE_DIR_ENV = "MEMSAVE_CACHE_DIR"
#: The layout of an entry (its ``"format"``); entries of another layout are ignored and replaced.
ENTRY_FORMAT = 1
#: The planner's cost model, part of the key: raised when a change would plan differently from the same profile
#: (2: operator class ``alternate_matmul`` and the stages' tails; 3: twin stages' timings pooled), so that plans of
#: the older model are not returned (their entries stay where they are, unread).
COST_MODEL = 3

CacheArg = Union[None, bool, str, "os.PathLike[str]"]


class NotKeyable(Exception):
    """What :func:`plan_key` could not key reliably (the message says what and why); :func:`memsave.plan` then
    plans without the cache.

    Examples:
        >>> try:
        ...     plan_key(model, (x,), {}, lambda out: out.sum(), {}, torch.device("cpu"))
        ... except NotKeyable as e:
        ...     print(e)
        loss_fn is a lambda; a module-level function (def) is keyed by its name and code
    """


# ------------------------------------------------------------------------------------------------------ location
def cache_directory(cache: CacheArg) -> Optional[Path]:
    """The directory plans are cached in, or None when the cache is off.

    Args:
        cache: :func:`memsave.plan`'s ``cache=``: None (on unless ``MEMSAVE_PLAN_CACHE=0``), True (on), False (off)
            or a directory.

    Returns:
        the directory (not created yet), or None.

    Raises:
        TypeError: ``cache`` is none of these.

    Examples:
        >>> cache_directory(False) is None
        True
        >>> cache_directory("/tmp/plans")
        PosixPath('/tmp/plans')
    """
    if cache is False:
        return None
    if isinstance(cache, (str, os.PathLike)):
        return Path(os.fspath(cache)).expanduser()
    if cache is None:
        if os.environ.get(PLAN_CACHE_ENV, "1").strip().lower() in ("0", "false", "off", "no"):
            return None
    elif cache is not True:
        raise TypeError(
            f"memsave.plan: cache must be True, False, None (the environment decides) or a directory, got {cache!r}"
        )
    root = os.environ.get(CACHE_DIR_ENV)
    if root:
        return Path(root).expanduser() / "plans"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "memsave" / "plans"


# ----------------------------------------------------------------------------------------------------------- key
def _code_digest(code: types.CodeType) -> str:
    """A hash of what a code object does: its bytecode, names and constants (nested code objects too); not its
    file or line numbers."""
    h = hashlib.sha256(code.co_code)
    h.update(repr(code.co_names).encode())
    for c in code.co_consts:
        h.update(_code_digest(c).encode() if isinstance(c, types.CodeType) else repr(c).encode())
    return h.hexdigest()[:16]


_CLASS_DIGESTS: Dict[type, str] = {}


def _class_digest(cls: type) -> str:
    """A module class by its qualified name and the code of its ``forward`` (an edited forward is another model)."""
    if cls not in _CLASS_DIGESTS:
        code = getattr(getattr(cls, "forward", None), "__code__", None)
        digest = _code_digest(code) if code is not None else "-"
        _CLASS_DIGESTS[cls] = f"{cls.__module__}.{cls.__qualname__}:{digest}"
    return _CLASS_DIGESTS[cls]


def _package_versions(classes: Iterable[type]) -> Dict[str, str]:
    """The versions of the packages the model's classes come from (transformers, timm, ...)."""
    out = {}
    for cls in classes:
        top = cls.__module__.split(".")[0]
        version = getattr(sys.modules.get(top), "__version__", None)
        if isinstance(version, str):
            out[top] = version
    return out


def _configs(model: nn.Module) -> List[str]:
    """Hashes of the (Hugging Face style) ``config`` objects the model's modules carry, its attention choice too."""
    seen, out = set(), []
    for m in model.modules():
        config = getattr(m, "config", None)
        to_dict = getattr(config, "to_dict", None)
        if config is None or id(config) in seen or not callable(to_dict):
            continue
        seen.add(id(config))
        text = json.dumps(to_dict(), sort_keys=True, default=repr)
        text += f"|{getattr(config, '_attn_implementation', None)}"
        out.append(hashlib.sha256(text.encode()).hexdigest()[:16])
    return out


def _extra_repr(m: nn.Module) -> str:
    try:
        return m.extra_repr()
    except Exception as e:  # a module whose repr fails: its class still keys it
        return f"<extra_repr failed: {type(e).__name__}>"


def model_digest(model: nn.Module) -> str:
    """A hash of the model's structure: :func:`fingerprint` and its buffers, ``requires_grad``, devices, training
    flags, ``extra_repr``, forward code, configs and package versions (see the module docstring).

    Args:
        model: the model.

    Returns:
        32 hex digits.

    Raises:
        Nothing of its own (a module whose ``extra_repr`` fails is keyed by its class).

    Examples:
        >>> model_digest(model) == model_digest(copy.deepcopy(model))
        True
    """
    h = hashlib.sha256(fingerprint(model).encode())
    for name, b in model.named_buffers():
        h.update(f"b {name} {tuple(b.shape)} {b.dtype} {b.device}\n".encode())
    for name, p in model.named_parameters():
        h.update(f"g {name} {p.requires_grad} {p.device}\n".encode())
    classes = []
    for name, m in model.named_modules():
        classes.append(type(m))
        h.update(f"m {name} {m.training} {_class_digest(type(m))} {_extra_repr(m)}\n".encode())
    h.update(json.dumps(_package_versions(dict.fromkeys(classes)), sort_keys=True).encode())
    h.update(json.dumps(_configs(model)).encode())
    return h.hexdigest()[:32]


def _leaf(x: Any, where: str) -> Any:
    """A JSON description of one input (or partial argument): tensors by shape, not values; plain values as they
    are."""
    if isinstance(x, torch.Tensor):
        return ["tensor", list(x.shape), list(x.stride()), str(x.dtype), str(x.device), x.requires_grad, str(x.layout)]
    if x is None or isinstance(x, (bool, int, float, str)):
        return [type(x).__name__, x]
    if isinstance(x, (torch.dtype, torch.device)):
        return [type(x).__name__, str(x)]
    raise NotKeyable(f"{where} is a {type(x).__name__}, which cannot be keyed (only tensors and plain values)")


def _tree(obj: Any, where: str) -> Dict[str, Any]:
    leaves, spec = tree_flatten(obj)
    return {"structure": str(spec), "leaves": [_leaf(x, f"{where} {i}") for i, x in enumerate(leaves)]}


def _loss_key(loss_fn: Optional[Callable[..., Any]]) -> Any:
    """The loss function's key, or :class:`NotKeyable` saying why it has none."""
    if loss_fn is None:
        return "default"
    if isinstance(loss_fn, functools.partial):
        return {"partial": _loss_key(loss_fn.func), "args": _tree((loss_fn.args, loss_fn.keywords), "loss_fn argument")}
    if isinstance(loss_fn, types.BuiltinFunctionType):
        return f"{loss_fn.__module__}.{loss_fn.__qualname__}"
    if not isinstance(loss_fn, types.FunctionType):
        raise NotKeyable(
            f"loss_fn is a {type(loss_fn).__name__}, whose result may depend on its state; only functions and "
            f"functools.partial of functions are keyed"
        )
    if loss_fn.__name__ == "<lambda>":
        raise NotKeyable("loss_fn is a lambda; a module-level function (def) is keyed by its name and code")
    if loss_fn.__closure__:
        raise NotKeyable(
            f"loss_fn {loss_fn.__qualname__} is a closure (it reads variables of the function that made it); pass "
            f"them with functools.partial(fn, ...) to have it keyed"
        )
    return f"{loss_fn.__module__}.{loss_fn.__qualname__}:{_code_digest(loss_fn.__code__)}"


def _device_key(device: torch.device) -> Dict[str, Any]:
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return {"type": "cuda", "name": props.name, "capability": [props.major, props.minor]}
    return {"type": device.type, "name": cpu_name(), "threads": torch.get_num_threads()}


@functools.lru_cache(maxsize=1)
def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def plan_key(
    model: nn.Module,
    inputs: Tuple[Any, ...],
    kwargs: Dict[str, Any],
    loss_fn: Optional[Callable[..., Any]],
    settings: Dict[str, Any],
    device: torch.device,
) -> Dict[str, Any]:
    """The cache key of a plan (a JSON-ready dict; see the module docstring for what it holds).

    Args:
        model: the model to plan for (not wrapped).
        inputs, kwargs: its example inputs, positional and keyword.
        loss_fn: the ``loss_fn`` given to :func:`memsave.plan` (None: the default loss).
        settings: the arguments of :func:`memsave.plan` that change its result, normalised (``budget``,
            ``solver``, ...): JSON values.
        device: the device the step runs on.

    Returns:
        the key.

    Raises:
        NotKeyable: something cannot be keyed reliably (a lambda or closure as ``loss_fn``, an input that is not a
            tensor or plain value); the message says what.

    Examples:
        >>> key = plan_key(model, (x,), {}, None, {"budget": ["fraction", 0.5]}, torch.device("cpu"))
    """
    key = {
        "format": ENTRY_FORMAT,
        "model_class": type(model).__name__,
        "model": model_digest(model),
        "inputs": _tree((tuple(inputs), dict(kwargs)), "example input"),
        "loss_fn": _loss_key(loss_fn),
        "settings": settings,
        "versions": {"torch": torch.__version__, "python": platform.python_version(), "memsave": build_info()},
        "cost_model": COST_MODEL,
        "device": _device_key(device),
        "autocast": [torch.is_autocast_enabled(device.type), str(torch.get_autocast_dtype(device.type))],
        "grad_enabled": torch.is_grad_enabled(),
    }
    try:
        return json.loads(json.dumps(key, sort_keys=True))  # tuples as lists: the key as it reads back from a file
    except (TypeError, ValueError) as e:  # an argument of plan() of an unusual type (slots=numpy.int64(...))
        raise NotKeyable(f"an argument of memsave.plan cannot be written as a key ({e})") from e


def entry_path(directory: Path, key: Dict[str, Any]) -> Path:
    """The file of ``key``'s entry in ``directory``: ``<model class>-<hash of the key>.json``.

    Args:
        directory: the cache directory (:func:`cache_directory`).
        key: the key (:func:`plan_key`).

    Returns:
        the path (the file may not exist).

    Raises:
        TypeError: ``key`` is not JSON-serialisable (a key from :func:`plan_key` always is).

    Examples:
        >>> entry_path(Path("/tmp/plans"), key).name
        'GPT2LMHeadModel-3f2a....json'
    """
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]
    name = "".join(c if c.isalnum() or c in "-_" else "_" for c in str(key.get("model_class", "model")))[:64]
    return directory / f"{name}-{digest}.json"


# ------------------------------------------------------------------------------------------------- read, write
def load_plan(path: Path, key: Dict[str, Any], model: nn.Module) -> Optional[Plan]:
    """The plan stored at ``path`` for ``key``, or None when there is none (a miss).

    An entry that cannot be read (not JSON, another layout, a bad plan field), or whose key or plan does not match
    ``key`` and ``model``, is a miss with a :class:`~memsave.errors.MemsaveWarning` saying what was wrong; the new
    plan replaces it.

    Args:
        path: the entry's file (:func:`entry_path`).
        key: the key looked up.
        model: the model, whose :func:`fingerprint` the plan must carry.

    Returns:
        the plan (``cached=True``), or None.

    Raises:
        Nothing: every problem with the entry is a warning and a miss.

    Examples:
        >>> load_plan(entry_path(directory, key), key, model)
    """
    plan, why = _read_entry(path, key, model)
    if why is not None:
        warnings.warn(
            f"memsave.plan: ignoring the plan cache entry {path}: {why}; planning afresh and replacing it",
            MemsaveWarning,
            stacklevel=4,
        )
    return plan


def _read_entry(path: Path, key: Dict[str, Any], model: nn.Module) -> Tuple[Optional[Plan], Optional[str]]:
    """(the plan of the entry at ``path``, None), or (None, why it cannot be used); (None, None) when there is
    none."""
    try:
        entry = json.loads(path.read_text())
    except (FileNotFoundError, NotADirectoryError):
        return None, None
    except (OSError, UnicodeDecodeError) as e:
        return None, f"it cannot be read ({e})"
    except json.JSONDecodeError as e:
        return None, f"it is not JSON ({e})"
    if not isinstance(entry, dict) or entry.get("format") != ENTRY_FORMAT or "plan" not in entry:
        return None, f"it is not a plan cache entry of format {ENTRY_FORMAT}"
    if entry.get("key") != key:
        return None, "its key is not the one looked up (a hash collision, or the file was edited)"
    try:
        plan = Plan(**read_plan_fields(entry["plan"]))
    except ValueError as e:
        return None, f"its plan is not valid ({e})"
    if plan.fingerprint != fingerprint(model):
        return None, "its plan was made for another model structure"
    plan.cached = True
    return plan, None


def store_plan(path: Path, key: Dict[str, Any], plan: Plan) -> bool:
    """Write ``plan`` as the entry of ``key`` at ``path``, atomically (a temporary file moved into place).

    A directory that cannot be created or written is a :class:`~memsave.errors.MemsaveWarning`, not an error: the
    plan is still returned to the caller, only not kept.

    Args:
        path: the entry's file (:func:`entry_path`).
        key: the key.
        plan: the plan.

    Returns:
        True when the entry was written.

    Raises:
        Nothing: a failed write is a warning.

    Examples:
        >>> store_plan(entry_path(directory, key), key, plan)
        True
    """
    entry = {"format": ENTRY_FORMAT, "key": key, "plan": json.loads(plan.to_json())}
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=path.stem + ".", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "w") as f:
            json.dump(entry, f, sort_keys=True)
        os.replace(tmp, path)
        return True
    except OSError as e:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
        warnings.warn(
            f"memsave.plan: could not write the plan cache entry {path} ({e}); the plan is returned but not kept. "
            f"Set {CACHE_DIR_ENV} to a writable directory, or plan with cache=False",
            MemsaveWarning,
            stacklevel=3,
        )
        return False
