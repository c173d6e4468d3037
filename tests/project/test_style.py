"""Short functions: no function body in python/memsave longer than 80 lines (its docstring excluded)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import List

import memsave

PACKAGE = Path(memsave.__file__).resolve().parent
MAX_BODY_LINES = 80


def _long_functions(source: str, name: str) -> List[str]:
    out = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        body = node.body
        if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
            body = body[1:]  # the docstring
        if not body:
            continue
        lines = (body[-1].end_lineno or body[-1].lineno) - body[0].lineno + 1
        if lines > MAX_BODY_LINES:
            out.append(f"{name}:{node.lineno} {node.name} ({lines} lines)")
    return out


def test_no_function_body_over_80_lines() -> None:
    found = [
        f for p in sorted(PACKAGE.rglob("*.py")) for f in _long_functions(p.read_text(), str(p.relative_to(PACKAGE)))
    ]
    assert not found, f"function bodies over {MAX_BODY_LINES} lines: {found}"


def test_the_length_check_can_fail() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_BODY_LINES + 1))
    assert _long_functions(f'def f():\n    """Doc."""\n{body}\n', "m.py") == [f"m.py:1 f ({MAX_BODY_LINES + 1} lines)"]
    short = "\n".join(f"    x{i} = {i}" for i in range(MAX_BODY_LINES))
    assert _long_functions(f'def f():\n    """Doc."""\n{short}\n', "m.py") == []
