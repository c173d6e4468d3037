"""Reading a plan's JSON field by field: every field of :class:`~memsave.recompute.planning.plan.Plan` (and of its
chain's stages and skips, and of its stage modules) is checked against its declared type before a plan is built, so
that a hand-edited or corrupted file fails in :meth:`Plan.from_json` with the field's name and the expected type, not
later (a string peak in ``summary()``, ``"false"`` read as True, a segment end 2.5 truncated to 2).

Types are read from the dataclasses' annotations (``int``, ``float``, ``bool``, ``str``, ``Optional[...]``,
``List[...]``), so a field added to :class:`Stage`, :class:`Skip` or :class:`StageModules` is checked without a change
here. JSON's ``true``/``false`` are the only booleans; an int field takes only integers (not ``2.5``, ``"3"`` or
``true``); a float field takes any finite number.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Dict, List, Optional, Tuple, Type

from .chain import Chain, Skip, Stage, StageModules

__all__ = ["PlanFieldError", "read_plan_fields"]

#: The format a plan's JSON declares (``"format": 1``).
PLAN_FORMAT = 1


class PlanFieldError(ValueError):
    """A field of a plan's JSON is missing or has the wrong type or value (the message names it)."""


def _describe(value: Any) -> str:
    kind = {bool: "a bool", str: "a string", int: "an int", float: "a float", list: "a list", dict: "an object"}
    return f"{value!r} ({kind.get(type(value), type(value).__name__)})" if value is not None else "null"


def _fail(where: str, expected: str, value: Any) -> PlanFieldError:
    return PlanFieldError(
        f"memsave.Plan.from_json: field {where!r} must be {expected}, got {_describe(value)}; fix the field or make "
        f"the plan again with memsave.plan(...).to_json()"
    )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (_is_int(value) or isinstance(value, float)) and math.isfinite(value)


def check_value(value: Any, spec: str, where: str) -> Any:
    """``value`` checked against the annotation ``spec`` (``"int"``, ``"Optional[str]"``, ``"List[float]"``, ...);
    returns it (a float field's int as a float).

    Raises:
        PlanFieldError: naming ``where`` and the expected type.

    Examples:
        >>> check_value("12", "int", "predicted_peak_bytes")
        Traceback (most recent call last):
        PlanFieldError: memsave.Plan.from_json: field 'predicted_peak_bytes' must be an int, got '12' (a string); ...
    """
    spec = spec.replace(" ", "")
    if spec.startswith("Optional[") and spec.endswith("]"):
        return None if value is None else check_value(value, spec[len("Optional[") : -1], where)
    if spec.startswith("List[") and spec.endswith("]"):
        inner = spec[len("List[") : -1]
        if not isinstance(value, list):
            raise _fail(where, f"a list of {inner}", value)
        return [check_value(v, inner, f"{where}[{i}]") for i, v in enumerate(value)]
    if spec == "int":
        if not _is_int(value):
            raise _fail(where, "an int", value)
        return value
    if spec == "float":
        if not _is_number(value):
            raise _fail(where, "a finite number", value)
        return float(value)
    if spec == "bool":
        if not isinstance(value, bool):
            raise _fail(where, "true or false (a JSON bool)", value)
        return value
    if spec == "str":
        if not isinstance(value, str):
            raise _fail(where, "a string", value)
        return value
    raise AssertionError(f"no check for the annotation {spec!r} of {where}")


def _read_dataclass(cls: Type[Any], value: Any, where: str) -> Any:
    """An instance of the dataclass ``cls`` from the JSON object ``value``, each field checked."""
    if not isinstance(value, dict):
        raise _fail(where, f"an object (a {cls.__name__})", value)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(value) - set(fields))
    if unknown:
        raise PlanFieldError(
            f"memsave.Plan.from_json: {where} has unknown field(s) {unknown}; a {cls.__name__} has {sorted(fields)}"
        )
    kwargs = {}
    for name, f in fields.items():
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if name not in value:
            if required:
                raise PlanFieldError(f"memsave.Plan.from_json: {where} lacks the field {name!r}")
            continue
        kwargs[name] = check_value(value[name], str(f.type), f"{where}.{name}")
    return cls(**kwargs)


def _read_list(cls: Type[Any], value: Any, where: str) -> List[Any]:
    if not isinstance(value, list):
        raise _fail(where, f"a list of {cls.__name__} objects", value)
    return [_read_dataclass(cls, v, f"{where}[{i}]") for i, v in enumerate(value)]


def _read_chain(value: Any) -> Chain:
    if not isinstance(value, dict):
        raise _fail("chain", "an object (the cost model)", value)
    if "stages" not in value:
        raise PlanFieldError("memsave.Plan.from_json: chain lacks the field 'stages'")
    known = {"stages", "skips", "base_bytes", "segment_bytes", "recompute_bytes", "operator_classes", "policies"}
    unknown = sorted(set(value) - known)
    if unknown:
        raise PlanFieldError(f"memsave.Plan.from_json: chain has unknown field(s) {unknown}; it has {sorted(known)}")
    for name in ("base_bytes", "segment_bytes", "recompute_bytes"):
        check_value(value.get(name, 0), "int", f"chain.{name}")
    for name in ("operator_classes", "policies"):
        check_value(value.get(name), "Optional[List[str]]", f"chain.{name}")
    checked = dict(value)
    checked["stages"] = [dataclasses.asdict(s) for s in _read_list(Stage, value["stages"], "chain.stages")]
    checked["skips"] = [dataclasses.asdict(s) for s in _read_list(Skip, value.get("skips", []), "chain.skips")]
    try:
        return Chain.from_dict(checked)
    except ValueError as e:  # operator_classes and its old name policies differ
        raise PlanFieldError(f"memsave.Plan.from_json: {e}") from e


def _read_segments(value: Any) -> List[Tuple[int, int, bool]]:
    if not isinstance(value, list):
        raise _fail("segments", "a list of [begin, end, recompute] triples", value)
    segments = []
    for i, seg in enumerate(value):
        where = f"segments[{i}]"
        if not isinstance(seg, list) or len(seg) != 3:
            raise _fail(where, "a [begin, end, recompute] triple", seg)
        begin = check_value(seg[0], "int", f"{where}[0] (begin)")
        end = check_value(seg[1], "int", f"{where}[1] (end)")
        recompute = check_value(seg[2], "bool", f"{where}[2] (recompute)")
        if not 0 <= begin < end:
            raise PlanFieldError(
                f"memsave.Plan.from_json: {where} must satisfy 0 <= begin < end (stage indices, end exclusive), "
                f"got [{begin}, {end}]"
            )
        segments.append((begin, end, recompute))
    return segments


def _read_selective(value: Any) -> List[Tuple[str, ...]]:
    return [tuple(classes) for classes in check_value(value, "List[List[str]]", "selective")]


def _nonnegative(value: Any, spec: str, where: str) -> Any:
    checked = check_value(value, spec, where)
    if checked is not None and checked < 0:
        raise _fail(where, f"{'an int' if spec.endswith('int') else 'a number'} >= 0", value)
    return checked


def _partitioner_budget(value: Any) -> Optional[float]:
    budget = check_value(value, "Optional[float]", "activation_memory_budget")
    if budget is not None and not 0.0 <= budget <= 1.0:
        raise PlanFieldError(
            f"memsave.Plan.from_json: field 'activation_memory_budget' must be in [0, 1] or null, got {value!r}"
        )
    return budget


def _required(d: Dict[str, Any], *names: str) -> Any:
    """The value of the first of ``names`` present in ``d`` (later names: what older versions called the field)."""
    for name in names:
        if name in d:
            return d[name]
    raise PlanFieldError(f"memsave.Plan.from_json: the plan lacks the field {names[0]!r}")


def check_format(d: Any) -> Dict[str, Any]:
    """``d`` when it is a JSON object declaring ``"format": 1`` (the int, not ``"1"`` or ``true``).

    Raises:
        PlanFieldError: not an object, or another format.
    """
    if not isinstance(d, dict):
        raise PlanFieldError(
            f"memsave.Plan.from_json: not a memsave plan of format {PLAN_FORMAT} (got {type(d).__name__}, not an "
            f"object); make it with memsave.plan(...).to_json()"
        )
    fmt = d.get("format")
    if not _is_int(fmt) or fmt != PLAN_FORMAT:
        raise PlanFieldError(
            f"memsave.Plan.from_json: not a memsave plan of format {PLAN_FORMAT} (field 'format' is "
            f"{_describe(fmt) if 'format' in d else 'missing'}; it must be the int {PLAN_FORMAT}); make it with "
            f"memsave.plan(...).to_json()"
        )
    return d


def read_plan_fields(d: Any) -> Dict[str, Any]:
    """The keyword arguments of :class:`Plan` from a plan's parsed JSON, every field checked.

    Args:
        d: ``json.loads`` of the plan's text.

    Returns:
        ``Plan(**read_plan_fields(d))`` is the plan.

    Raises:
        PlanFieldError: (a ValueError) the format, or a field, is missing or of the wrong type or value; the message
            names the field (``chain.stages[2].fwd_time``) and what it must be.

    Examples:
        >>> read_plan_fields({"format": 1, "solver": 3})
        Traceback (most recent call last):
        PlanFieldError: memsave.Plan.from_json: field 'solver' must be a string, got 3 (an int); ...
    """
    d = check_format(d)
    solver = check_value(_required(d, "solver", "strategy"), "str", "solver")
    return {
        "solver": solver,
        "budget_bytes": _nonnegative(_required(d, "budget_bytes"), "Optional[int]", "budget_bytes"),
        "predicted_peak_bytes": _nonnegative(_required(d, "predicted_peak_bytes"), "int", "predicted_peak_bytes"),
        "measured_peak_bytes": _nonnegative(
            _required(d, "measured_peak_bytes"), "Optional[int]", "measured_peak_bytes"
        ),
        "eager_peak_bytes": _nonnegative(_required(d, "eager_peak_bytes"), "int", "eager_peak_bytes"),
        "min_feasible_bytes": _nonnegative(_required(d, "min_feasible_bytes"), "int", "min_feasible_bytes"),
        "predicted_extra_seconds": _nonnegative(
            _required(d, "predicted_extra_seconds"), "float", "predicted_extra_seconds"
        ),
        "eager_step_seconds": _nonnegative(_required(d, "eager_step_seconds"), "float", "eager_step_seconds"),
        "segments": _read_segments(_required(d, "segments")),
        "stage_modules": _read_list(StageModules, d.get("stage_modules", d.get("pieces", [])), "stage_modules"),
        "chain": _read_chain(_required(d, "chain")),
        "model_class": check_value(_required(d, "model_class"), "str", "model_class"),
        "fingerprint": check_value(_required(d, "fingerprint"), "str", "fingerprint"),
        "device": check_value(_required(d, "device"), "str", "device"),
        "selective": _read_selective(d.get("selective", [])),
        "compiled": check_value(d.get("compiled", False), "bool", "compiled"),
        "planning_seconds": _nonnegative(d.get("planning_seconds", 0.0), "float", "planning_seconds"),
        "activation_memory_budget": _partitioner_budget(d.get("activation_memory_budget")),
    }
