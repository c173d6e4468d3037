"""The package's architecture rules, checked on its source: no import cycle inside memsave (module-level or deferred
imports alike), no private name imported from another part, and every part visible as a subpackage."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Optional, Set, Tuple

import pytest

import memsave

PACKAGE = Path(memsave.__file__).resolve().parent
PARTS = ("recompute", "operators", "amp", "measurement")


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> Dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _resolve(importer: str, is_package: bool, level: int, module: Optional[str]) -> str:
    base = importer.split(".")
    if not is_package:
        base = base[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join(base + ([module] if module else []))


def _imports(name: str, path: Path, modules: Dict[str, Path]) -> List[Tuple[str, str, int]]:
    """(imported memsave module, imported name or "", line) for every import in the file, at any depth."""
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.name == "__init__.py"
    out: List[Tuple[str, str, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("memsave"):
                    out.append((alias.name, "", node.lineno))
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(name, is_package, node.level, node.module) if node.level else (node.module or "")
            if not target.startswith("memsave"):
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                if sub in modules or sub == "memsave._C":
                    out.append((sub, "", node.lineno))
                else:
                    out.append((target, alias.name, node.lineno))
    return out


def _graph() -> Dict[str, Set[str]]:
    modules = _modules()
    graph: Dict[str, Set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        for target, _, _ in _imports(name, path, modules):
            if target in modules and target != name:
                graph[name].add(target)
    return graph


def _part(module: str) -> str:
    pieces = module.split(".")
    return pieces[1] if len(pieces) > 1 else ""


def _find_cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    state: Dict[str, int] = {}
    cycles: List[List[str]] = []

    def visit(node: str, stack: List[str]) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt) :] + [nxt])
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [])
    return cycles


def test_no_import_cycle_inside_memsave() -> None:
    # Explicit imports only: a package's __init__ running before its submodules is how Python imports, not a cycle.
    cycles = _find_cycles(_graph())
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_the_cycle_check_can_fail() -> None:
    assert _find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
    assert _find_cycles({"a": {"b"}, "b": set()}) == []


def test_no_private_name_crosses_parts() -> None:
    modules = _modules()
    bad = []
    for name, path in modules.items():
        for target, imported, line in _imports(name, path, modules):
            if target in ("memsave._C", "memsave._version"):
                # The compiled extension (like torch._C), loaded once by memsave/extension.py; the version, read by
                # the build (pyproject) and re-exported as memsave.__version__.
                continue
            crosses = _part(target) != _part(name)
            private_module = any(p.startswith("_") and not p.startswith("__") for p in target.split(".")[1:])
            private_name = imported.startswith("_")
            if crosses and (private_module or private_name):
                bad.append(f"{path.relative_to(PACKAGE)}:{line} imports {target}{'.' + imported if imported else ''}")
    assert not bad, "private names imported across parts:\n" + "\n".join(bad)


@pytest.mark.parametrize("part", PARTS)
def test_each_part_is_a_subpackage_not_named_like_a_public_function(part: str) -> None:
    assert (PACKAGE / part / "__init__.py").is_file()
    public = getattr(memsave, part, None)
    assert public is None or not callable(public) or isinstance(public, type(memsave))


def test_public_spellings_of_functional_and_nn() -> None:
    import memsave.functional
    import memsave.nn
    from memsave.nn import ReLU

    assert memsave.nn is memsave.operators.nn and memsave.functional is memsave.operators.functional
    assert ReLU is memsave.operators.nn.ReLU
