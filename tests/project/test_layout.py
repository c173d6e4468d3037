"""The package's architecture rules, checked on its source: no import cycle inside memsave (module-level or deferred
imports alike), no private name imported from another part, every part visible as a subpackage, every import allowed
by the table of docs/architecture.md, and that document's layout block naming files that exist and every source file.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Dict, List, Optional, Set, Tuple

import pytest

import memsave

PACKAGE = Path(memsave.__file__).resolve().parent
PARTS = ("recompute", "operators", "amp", "measurement")
ROOT = Path(__file__).resolve().parents[2]
ARCHITECTURE = ROOT / "docs" / "architecture.md"


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
            private_name = imported.startswith("_") and not (imported.startswith("__") and imported.endswith("__"))
            if crosses and (private_module or private_name):
                bad.append(f"{path.relative_to(PACKAGE)}:{line} imports {target}{'.' + imported if imported else ''}")
    assert not bad, "private names imported across parts:\n" + "\n".join(bad)


@pytest.mark.parametrize("part", PARTS)
def test_each_part_is_a_subpackage_not_named_like_a_public_function(part: str) -> None:
    assert (PACKAGE / part / "__init__.py").is_file()
    public = getattr(memsave, part, None)
    assert public is None or not callable(public) or isinstance(public, type(memsave))


def test_public_spellings_of_functional_and_nn_are_real_modules() -> None:
    import memsave.functional
    import memsave.nn
    from memsave.nn import ReLU

    # Real modules (files of the package), not sys.modules aliases: importers, IDEs and mypy see the same thing.
    assert (
        Path(memsave.nn.__file__) == PACKAGE / "nn.py"
        and Path(memsave.functional.__file__) == PACKAGE / "functional.py"
    )
    assert ReLU is memsave.operators.nn.ReLU
    for public, home in ((memsave.nn, memsave.operators.nn), (memsave.functional, memsave.operators.functional)):
        assert sorted(public.__all__) == sorted(home.__all__)
        assert all(getattr(public, name) is getattr(home, name) for name in home.__all__)


def test_no_import_of_a_family_module_registers_anything() -> None:
    # Registration is explicit (memsave.operators.ops.register, called once by memsave/__init__.py): each family
    # module only records what it registers, and registering again changes nothing.
    from memsave.operators import ops

    assert {f.__name__.rsplit(".", 1)[1] for f in ops.FAMILIES} == set(_families())
    assert all(f.REGISTRATIONS._applied for f in ops.FAMILIES)
    ops.register()
    source = "\n".join((PACKAGE / "operators" / "ops" / f"{f}.py").read_text() for f in _families())
    assert "torch.library.register_" not in source and "torch.library.impl" not in source


#: What registers something in a table another module reads: none may be called when a module is imported.
_REGISTERING = re.compile(r"^(register|add)_|^register$|_register$|^provide_")


def _module_level_registrations(path: Path) -> List[str]:
    """Calls at a module's top level (outside any function or class) to a function that registers something."""
    found = []
    for node in ast.parse(path.read_text(), str(path)).body:
        calls = [node.value] if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) else []
        for call in calls:
            func = call.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if _REGISTERING.search(name):
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {name}()")
    return found


def test_no_module_registers_anything_when_imported() -> None:
    # Operators, convert rules, strategies and the wrap listener are registered by explicit calls that
    # memsave/__init__.py makes once, in order; every other module only defines what those calls register.
    found = [
        hit
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != PACKAGE / "__init__.py"
        for hit in _module_level_registrations(path)
    ]
    assert not found, "registered at import time (move into a register function called by memsave/__init__.py):\n" + (
        "\n".join(found)
    )
    explicit = _module_level_registrations(PACKAGE / "__init__.py")
    assert any("register_convert_rules" in hit for hit in explicit), explicit


def test_convert_rules_are_registered_once_by_the_package() -> None:
    from memsave.operators.convert import registry

    assert registry.sequential_patterns() == [
        "batch_norm_act_conv2d",
        "batch_norm_act",
        "layer_norm_linear",
        "act_linear",
    ]
    assert {nn_type.__name__ for nn_type in registry._SWAPS} == {"ReLU", "LeakyReLU", "Dropout", "MaxPool2d"}
    assert set(registry._RULES) == {"timm.layers.mlp.Mlp", "timm.models.vision_transformer.Block"}


# ---- the import table of docs/architecture.md ----------------------------------------------------------------------

Table = Dict[str, Tuple[Tuple[str, ...], Set[str]]]


def _section(text: str, heading: str) -> str:
    start = text.index(heading)
    following = text.find("\n## ", start + len(heading))
    return text[start : following if following >= 0 else len(text)]


def _rules_table(text: str) -> Table:
    """part -> (its module specs, the parts it may import), from the table under "## Rules between parts"."""
    rows = [line for line in _section(text, "## Rules between parts").splitlines() if line.startswith("|")]
    table: Table = {}
    for row in rows[2:]:  # the header and the separator
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        assert len(cells) == 3, f"architecture.md: a row of the import table needs 3 cells: {row!r}"
        part, modules, allowed = (re.findall(r"`([^`]+)`", c) for c in cells)
        assert len(part) == 1 and modules, f"architecture.md: bad row of the import table: {row!r}"
        table[part[0]] = (tuple(modules), set(allowed))
    return table


def _spec_covers(spec: str, module: str) -> bool:
    """Whether a module spec of the table (``common/``, ``errors.py``, ``_C``, ``__init__.py``) covers ``module``."""
    if spec.endswith("/"):
        prefix = "memsave." + spec[:-1].replace("/", ".")
        return module == prefix or module.startswith(prefix + ".")
    name = spec[: -len(".py")] if spec.endswith(".py") else spec
    return module == ("memsave" if name == "__init__" else f"memsave.{name}")


def _owners(module: str, table: Table) -> List[str]:
    return [part for part, (specs, _) in table.items() if any(_spec_covers(s, module) for s in specs)]


def _forbidden_imports(table: Table, imports: Dict[str, List[Tuple[str, int]]]) -> List[str]:
    """``importer:line imports target`` for every import the table does not allow (``imports``: importer ->
    (imported module, line))."""
    bad = []
    for importer, targets in sorted(imports.items()):
        (source,) = _owners(importer, table)
        for target, line in sorted(set(targets), key=lambda t: (t[1], t[0])):
            owners = _owners(target, table)
            if len(owners) != 1:
                bad.append(f"{importer}:{line} imports {target}, which no row (or several) of the table owns")
            elif owners[0] != source and owners[0] not in table[source][1]:
                bad.append(f"{importer}:{line} imports {target}: {source} may not import {owners[0]}")
    return bad


def test_the_import_table_names_only_its_own_parts() -> None:
    table = _rules_table(ARCHITECTURE.read_text())
    assert {"recompute", "operators", "amp", "measurement", "common", "cli"} <= set(table)
    unknown = {(part, a) for part, (_, allowed) in table.items() for a in allowed if a not in table}
    assert not unknown, f"architecture.md: the import table allows parts it has no row for: {sorted(unknown)}"


def test_every_module_belongs_to_exactly_one_row_of_the_import_table() -> None:
    table = _rules_table(ARCHITECTURE.read_text())
    wrong = {m: _owners(m, table) for m in _modules() if len(_owners(m, table)) != 1}
    assert not wrong, f"modules owned by no row or several rows of architecture.md's import table: {wrong}"


def test_every_import_is_allowed_by_the_architecture_table() -> None:
    table = _rules_table(ARCHITECTURE.read_text())
    modules = _modules()
    imports = {name: [(t, line) for t, _, line in _imports(name, path, modules)] for name, path in modules.items()}
    bad = _forbidden_imports(table, imports)
    assert not bad, "imports that docs/architecture.md's table does not allow:\n" + "\n".join(bad)


def test_the_import_table_check_can_fail() -> None:
    text = """## Rules between parts

| part | modules | may import |
| --- | --- | --- |
| `common` | `common/` | nothing |
| `recompute` | `recompute/` `_C` | `common` |
| `operators` | `operators/` | `common` |
"""
    table = _rules_table(text)
    assert table["recompute"] == (("recompute/", "_C"), {"common"}) and table["common"][1] == set()
    ok = {"memsave.operators.convert.model_zoo": [("memsave.common.chunking", 39), ("memsave.operators.nn", 40)]}
    assert _forbidden_imports(table, ok) == []
    bad = {"memsave.operators.convert.model_zoo": [("memsave.recompute.chunked", 39), ("memsave.cli", 41)]}
    assert _forbidden_imports(table, bad) == [
        "memsave.operators.convert.model_zoo:39 imports memsave.recompute.chunked: operators may not import recompute",
        "memsave.operators.convert.model_zoo:41 imports memsave.cli, which no row (or several) of the table owns",
    ]


# ---- the layout block of docs/architecture.md ----------------------------------------------------------------------

#: What a file named in the layout block ends with; other words (memsave.plan, amp:fp16) are prose.
FILE_SUFFIXES = (".py", ".py.in", ".h", ".cpp", ".cu", ".cuh", ".md", ".sh", ".txt", ".ipynb", ".json", ".toml")
NAME = re.compile(r"[\w<>*-]+(/[\w<>*-]+)*(\.\w+)*(/\.\w+)*/?")


def _layout_block(text: str) -> str:
    section = _section(text, "## Layout")
    return section[section.index("```\n") + 4 : section.rindex("```")]


def _glob(directory: Path, name: str) -> List[Path]:
    pattern = re.sub(r"<[^>]*>", "*", name.rstrip("/"))
    return sorted(directory.glob(pattern)) if "*" in pattern else [p for p in [directory / pattern] if p.exists()]


def _layout_names(block: str, root: Path) -> List[Tuple[int, str, List[Path]]]:
    """(line, name, the paths it names) for every file or folder the layout block names; no paths: it names nothing.

    The block is a tree drawn with indentation: a line at column 0 starts at the repository root; a name ending in
    ``/`` is a folder, holding the names after it on its line and on the more indented lines below. A name is looked
    up in the innermost folder that holds it, then in each enclosing one (``recompute/ operators/ amp/`` are
    siblings). ``<family>`` and ``*`` match any name; ``planner_bindings.cpp/.h`` names a .cpp and a .h file.
    """
    out: List[Tuple[int, str, List[Path]]] = []
    stack: List[Tuple[int, List[Path]]] = []  # (column, the folders a folder name matched)
    for number, line in enumerate(block.splitlines(), 1):
        for index, word in enumerate(re.finditer(r"\S+", line)):
            column, name = word.start(), word.group().strip(",;:()")
            if index == 0:
                stack = [entry for entry in stack if entry[0] < column]
            is_path = NAME.fullmatch(name) and (name.endswith("/") or name.split("/.")[0].endswith(FILE_SUFFIXES))
            if not is_path and not (column == 0 and "/" in name):  # .ci/run: a path from the root
                continue
            first, *other_suffixes = name.split("/.") if not name.endswith("/") else [name]
            names = [first] + [first[: first.rindex(".") + 1] + s for s in other_suffixes]
            folders = [root] if column == 0 else [d for _, dirs in reversed(stack) for d in dirs]
            for one in names:
                found = next((hits for d in folders for hits in [_glob(d, one)] if hits), [])
                out.append((number, one, found))
                if one.endswith("/") and found:
                    stack.append((column, found))
    return out


def _families() -> List[str]:
    return sorted(d.name for d in (ROOT / "csrc" / "ops").iterdir() if d.is_dir() and d.name != "common")


def _needs_a_name(path: Path, families: List[str]) -> bool:
    """Whether the layout block must name this source file (one family's modules and files are named as a rule)."""
    rel = path.relative_to(ROOT)
    if path.name == "__init__.py" and rel.parent != Path("python/memsave"):
        return False
    per_family = {"ops", "nn"}
    if rel.parts[:3] == ("python", "memsave", "operators") and rel.parts[3] in per_family:
        return path.stem not in families
    return not (rel.parts[:2] == ("csrc", "ops") and rel.parts[2] in families)


def test_every_name_in_the_layout_block_exists() -> None:
    names = _layout_names(_layout_block(ARCHITECTURE.read_text()), ROOT)
    assert len(names) > 100
    missing = [f"line {n} of the block: {name}" for n, name, found in names if not found]
    assert not missing, "docs/architecture.md's layout names what does not exist:\n" + "\n".join(missing)


def test_every_source_file_is_named_in_the_layout_block() -> None:
    named = {p.resolve() for _, _, found in _layout_names(_layout_block(ARCHITECTURE.read_text()), ROOT) for p in found}
    families = _families()
    sources = [*sorted(PACKAGE.rglob("*.py")), *sorted(p for p in (ROOT / "csrc").rglob("*") if p.is_file())]
    absent = [str(p.relative_to(ROOT)) for p in sources if _needs_a_name(p, families) and p.resolve() not in named]
    assert not absent, "source files docs/architecture.md's layout does not name:\n" + "\n".join(absent)


def test_every_operator_family_is_in_the_layout_and_has_its_registration() -> None:
    block = _layout_block(ARCHITECTURE.read_text())
    families = _families()
    assert {"masks", "rms_norm", "gated_mlp", "amp"} <= set(families)
    lines = block.splitlines()
    ops_line = next(line for line in lines if "ops/<family>/" in line)
    py_ops = lines.index(next(line for line in lines if "operators/" in line and " ops/ " in line))
    for family in families:
        assert (PACKAGE / "operators" / "ops" / f"{family}.py").is_file(), f"{family}: no operators/ops/{family}.py"
        word = re.compile(rf"(?<![\w/]){family}(?![\w/.])")
        assert word.search(ops_line), f"{family}: not in the layout's ops/<family>/ list"
        assert word.search(lines[py_ops] + lines[py_ops + 1]), f"{family}: not in the layout's operators/ops/ list"


def test_the_layout_checks_can_fail(tmp_path: Path) -> None:
    for path in ("pkg/sub/a.py", "pkg/sub/b.cpp", "pkg/sub/b.h", "pkg/ops/x/y_math.h", "pkg/top.py", "tools/t.sh"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("")
    block = """pkg/
  sub/    a.py (the a) b.cpp/.h, gone.py; memsave.plan amp:fp16
          other.py
  ops/<family>/ the math (*_math.h)
  top.py  sub/
tools/    t.sh, missing.sh
"""
    found = {name: [str(p.relative_to(tmp_path)) for p in paths] for _, name, paths in _layout_names(block, tmp_path)}
    assert found["a.py"] == ["pkg/sub/a.py"] and found["b.h"] == ["pkg/sub/b.h"] and found["*_math.h"]
    assert found["top.py"] == ["pkg/top.py"] and found["t.sh"] == ["tools/t.sh"]
    assert [n for n, paths in found.items() if not paths] == ["gone.py", "other.py", "missing.sh"]
    assert "memsave.plan" not in found and "amp:fp16" not in found


# ---- the package ships only the product ----------------------------------------------------------------------------

#: Top-level names of the repository's scaffolding: tests/ (also as ``helpers``, the name tests/conftest.py puts on
#: sys.path) and benchmarks/. The installed package has neither, so no module of it may import them.
SCAFFOLDING = ("tests", "benchmarks", "helpers")

#: Test scaffolding that shipped in the package once and lives in tests/helpers/ now.
MOVED_OUT = {"memsave.models.hub": "tests/helpers/hub.py", "memsave.models.eager": "tests/helpers/eager.py"}


def _imported_names(tree: ast.AST) -> List[Tuple[str, int]]:
    """(absolute module name, line) of every import statement and ``import_module`` / ``__import__`` of a literal."""
    out: List[Tuple[str, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:  # a relative import stays inside the package
            out.append((node.module or "", node.lineno))
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if called in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                out.append((node.args[0].value, node.lineno))
    return out


def _scaffolding_imports(package: Path) -> List[str]:
    """``file:line imports name`` for every import of tests/ or benchmarks/ in the package's sources, at any depth."""
    bad = []
    for path in sorted(package.rglob("*.py")):
        for name, line in _imported_names(ast.parse(path.read_text(), str(path))):
            if name.split(".")[0] in SCAFFOLDING:
                bad.append(f"{path.relative_to(package)}:{line} imports {name}")
    return bad


def _moved_back(package: Path) -> List[str]:
    """The moved-out modules that exist again under ``package``, as a module file or as a package folder."""
    back = []
    for name in MOVED_OUT:
        where = package.joinpath(*name.split(".")[1:])
        if where.with_suffix(".py").exists() or where.is_dir():
            back.append(name)
    return back


def test_the_package_imports_nothing_from_tests_or_benchmarks() -> None:
    bad = _scaffolding_imports(PACKAGE)
    assert not bad, "python/memsave imports what the wheel does not ship (tests/, benchmarks/):\n" + "\n".join(bad)


def test_the_test_scaffolding_stays_out_of_the_package() -> None:
    back = _moved_back(PACKAGE)
    assert not back, f"test scaffolding is back in the package: {back}; it lives in {sorted(MOVED_OUT.values())}"
    assert all((ROOT / home).is_file() for home in MOVED_OUT.values())


def test_the_shipping_checks_can_fail(tmp_path: Path) -> None:
    package = tmp_path / "memsave"
    sources = {
        "__init__.py": "from . import models\nfrom .tests_util import x\nimport testsuite\n",
        "models/__init__.py": "from tests.helpers import hub\nimport benchmarks.harness as h\n",
        "models/zoo.py": "def f():\n    from helpers.eager import ACTS\n    importlib.import_module('tests.helpers')\n",
        "models/hub.py": "",
        "models/eager/__init__.py": "",
    }
    for rel, text in sources.items():
        (package / rel).parent.mkdir(parents=True, exist_ok=True)
        (package / rel).write_text(text)
    assert _scaffolding_imports(package) == [
        "models/__init__.py:1 imports tests.helpers",
        "models/__init__.py:2 imports benchmarks.harness",
        "models/zoo.py:2 imports helpers.eager",
        "models/zoo.py:3 imports tests.helpers",
    ]
    assert _moved_back(package) == ["memsave.models.hub", "memsave.models.eager"]
    (package / "models" / "hub.py").unlink()
    (package / "models" / "eager" / "__init__.py").unlink()
    (package / "models" / "eager").rmdir()
    assert _moved_back(package) == []
