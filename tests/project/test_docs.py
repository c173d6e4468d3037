"""The front door and the docs: a short README with the two commands, links that resolve, no reference to a file or
tracker that is not in the repository."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import List, Set, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [
    ROOT / "README.md",
    ROOT / "CONTRIBUTING.md",
    ROOT / "benchmarks" / "README.md",
    ROOT / "CHANGELOG.md",
    *sorted((ROOT / "docs").glob("*.md")),
]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _slug(heading: str) -> str:
    """GitHub's anchor for a markdown heading: lower case, punctuation dropped, spaces to dashes."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(path: Path) -> Set[str]:
    return {_slug(line.lstrip("#")) for line in path.read_text().splitlines() if line.startswith("#")}


def _tracked(*patterns: str) -> List[Path]:
    out = subprocess.run(["git", "ls-files", *patterns], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [ROOT / p for p in out.split() if (ROOT / p).is_file()]


def test_readme_is_short_and_starts_with_the_two_commands() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    quick = text[text.index("## Quick start") :]
    assert quick.index("bash tools/setup.sh && python3 -m memsave demo") < quick.index("bash .ci/run")
    assert 'pytest -m "not slow"' in text and "tools/gpu_check.sh" in text


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(doc: Path) -> None:
    broken = []
    for target in LINK.findall(doc.read_text()):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto
        file_part, _, anchor = target.partition("#")
        path = (doc.parent / file_part).resolve() if file_part else doc
        if not path.exists() or (anchor and path.suffix == ".md" and anchor not in _anchors(path)):
            broken.append(target)
    assert not broken, f"{doc.name}: links to nothing: {broken}"


def test_the_anchor_check_can_fail(tmp_path: Path) -> None:
    doc = tmp_path / "a.md"
    doc.write_text("# Real heading\n")
    assert "real-heading" in _anchors(doc) and "missing" not in _anchors(doc)


def test_no_reference_to_files_or_trackers_outside_the_repository() -> None:
    sources = _tracked(
        "python", "benchmarks/*.py", "tests", "examples", "tools", "docs", "README.md", "CONTRIBUTING.md"
    )
    stale = re.compile(r"DESIGN\.md|\b[Ii]ssue \d+\b|\bitem \d+\b")
    hits = [
        f"{p.relative_to(ROOT)}:{n}"
        for p in sources
        if p.suffix in {".py", ".md", ".sh", ".ipynb"} and p.name != "test_docs.py"
        for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
        if stale.search(line) and "pytorch" not in line.lower()
    ]
    assert not hits, f"references to a file or tracker that is not in the repository: {hits}"


#: The folders at the repository's root that CONTRIBUTING.md's recipes name files in.
ROOT_FOLDERS = ("csrc/", "python/", "tests/", "tools/", "docs/", "benchmarks/", "examples/", ".ci/")


def _missing_paths(text: str, root: Path) -> List[str]:
    """The repository paths quoted in ``text`` (code spans starting with a root folder) that match no file or
    folder; ``<family>`` and ``<op>`` match any name."""
    missing = []
    for span in re.findall(r"`([^`\s]+)`", text):
        if not span.startswith(ROOT_FOLDERS):
            continue
        pattern = re.sub(r"<[^>]*>", "*", span.rstrip("/"))
        if not any(root.glob(pattern)) if "*" in pattern else not (root / pattern).exists():
            missing.append(span)
    return missing


def test_every_path_in_the_contributing_recipes_exists() -> None:
    text = (ROOT / "CONTRIBUTING.md").read_text()
    assert "csrc/ops/<family>/<op>_math.h" in text
    missing = _missing_paths(text, ROOT)
    assert not missing, f"CONTRIBUTING.md names paths that do not exist: {missing}"


def test_the_contributing_path_check_can_fail(tmp_path: Path) -> None:
    (tmp_path / "csrc" / "ops" / "x").mkdir(parents=True)
    (tmp_path / "csrc" / "ops" / "x" / "y_math.h").write_text("")
    text = "`csrc/ops/<family>/<op>_math.h` `csrc/ops/<family>/` `tools/gone.sh` `memsave.convert` `bash x`"
    assert _missing_paths(text, tmp_path) == ["tools/gone.sh"]


def _public_objects() -> List[Tuple[str, object]]:
    import inspect

    import memsave
    import memsave.functional
    import memsave.nn

    found = []
    for module in (memsave, memsave.nn, memsave.functional, memsave.amp):
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.isclass(obj) or inspect.isfunction(obj):
                found.append((f"{module.__name__}.{name}", obj))
    return found


def test_every_public_class_and_function_has_an_example() -> None:
    import inspect

    objects = _public_objects()
    assert len(objects) > 50
    missing = [name for name, obj in objects if "Examples:" not in (inspect.getdoc(obj) or "")]
    assert not missing, f"public names whose docstring has no 'Examples:' section: {missing}"
