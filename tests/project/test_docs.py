"""The front door and the docs: a short README with the two commands, links that resolve, no reference to a file or
tracker that is not in the repository."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Callable, List, Set, Tuple

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


# ---------------------------------------------------------------- transformers' current checkpointing names only
def _warns_deprecated(call: Callable[[], object], name: str) -> bool:
    """Whether ``call()`` warns that ``name`` is deprecated (transformers' FutureWarning or a DeprecationWarning)."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call()
    return any(
        issubclass(w.category, (FutureWarning, DeprecationWarning))
        and name in str(w.message)
        and "deprecat" in str(w.message).lower()
        for w in caught
    )


def _deprecated_checkpointing_names(tmp_path: Path) -> Tuple[Set[str], Set[str]]:
    """The checkpointing names the installed transformers deprecates, each seen to warn when used: a model's methods
    and properties (``*checkpointing*`` on ``PreTrainedModel``, called or read on a tiny GPT-2) and
    ``TrainingArguments`` fields (set when the arguments are made)."""
    import dataclasses

    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=16, bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(config)
    members = set()
    for name in dir(transformers.PreTrainedModel):
        if "checkpointing" in name and not name.startswith("_"):
            use = (lambda n=name: getattr(model, n)()) if name.endswith(("_enable", "_disable")) else None
            if _warns_deprecated(use or (lambda n=name: getattr(model, n)), name):
                members.add(name)
    fields = set()
    for f in dataclasses.fields(transformers.TrainingArguments):
        if "checkpointing" in f.name:
            value = {} if f.name.endswith("_kwargs") else True
            make = lambda n=f.name, v=value: transformers.TrainingArguments(output_dir=str(tmp_path), **{n: v})  # noqa: E731
            if _warns_deprecated(make, f.name):
                fields.add(f.name)
    return members, fields


def _uses_of(text: str, members: Set[str], fields: Set[str]) -> List[str]:
    """The deprecated names ``text`` uses: a member by its name (``model.gradient_checkpointing_enable()``), a field
    as an argument (``gradient_checkpointing=True``, ``--gradient_checkpointing``; a layer's ``gradient_checkpointing``
    flag is another thing, still named so)."""
    found = [m for m in sorted(members) if re.search(rf"\b{m}\b", text)]
    return found + [f for f in sorted(fields) if re.search(rf"\b{f}\s*=|--{f}\b", text)]


def _documentation() -> List[Tuple[str, str]]:
    """(where, text) of every place a user reads how to call memsave: the markdown docs (not the changelog, a record
    of past releases), the examples (code cells of the notebook), and the docstrings of the package (the API pages
    render them)."""
    import ast
    import json

    pages = [p for p in (*DOCS, *sorted((ROOT / "docs" / "api").glob("*.md"))) if p.name != "CHANGELOG.md"]
    out = [(str(p.relative_to(ROOT)), p.read_text()) for p in pages]  # the changelog records past releases
    for p in sorted((ROOT / "examples").iterdir()):
        if p.suffix == ".py":
            out.append((str(p.relative_to(ROOT)), p.read_text()))
        elif p.suffix == ".ipynb":
            cells = json.loads(p.read_text())["cells"]
            out.append((str(p.relative_to(ROOT)), "\n".join("".join(c["source"]) for c in cells)))
    for p in sorted((ROOT / "python" / "memsave").rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node, clean=False)
                if doc:
                    out.append((f"{p.relative_to(ROOT)}:{getattr(node, 'name', '(module)')}", doc))
    return out


@pytest.mark.slow  # imports transformers and makes TrainingArguments
def test_docs_use_transformers_current_checkpointing_api(tmp_path: Path) -> None:
    members, fields = _deprecated_checkpointing_names(tmp_path)
    # What transformers 5 deprecates, found by calling it: the check below is not vacuous.
    assert members and fields, (members, fields)
    for name in (*members, *fields):  # the matcher finds each name used as users would write it
        assert _uses_of(f"model.{name}()\nTrainingArguments({name}=True)", members, fields)
    assert not _uses_of("layer.gradient_checkpointing flag; activation_checkpointing=True", members, fields)
    docs = _documentation()
    assert any(where.endswith("transformers.py:enable") for where, _ in docs)
    stale = [(where, _uses_of(text, members, fields)) for where, text in docs if _uses_of(text, members, fields)]
    assert not stale, f"docs name checkpointing calls transformers deprecates (use activation_checkpointing*): {stale}"


def test_readme_says_the_demo_takes_minutes_on_a_small_cpu_machine() -> None:
    # A first run of the demo should not look hung: the quick start says how long it takes where it shows the command.
    quick = (ROOT / "README.md").read_text().split("## Quick start", 1)[1]
    line = next(line for line in quick.splitlines() if "python3 -m memsave demo" in line)
    assert re.search(r"\bminutes\b.*\bCPU cores\b", line), line


def test_the_docs_say_why_the_callbacks_numbers_differ_from_measures() -> None:
    # MemoryCallback logs a few percent less than memsave.measure for the same step (7% has been seen): the page that
    # documents the callbacks says how each number is counted and why they differ, and the glossary says that they may.
    design = (ROOT / "docs" / "design.md").read_text()
    counted = design.index("How each is counted (`memsave.integrations.StepMemoryProbe`)")
    why = design.index("Why `memsave.measure` gives another number for the same step", counted)
    assert "kernel temporaries the live-tensor tracker does not see" in design[why : why + 600]
    glossary = (ROOT / "docs" / "glossary.md").read_text()
    step_memory = next(line for line in glossary.splitlines() if line.startswith("| **step memory**"))
    assert "may differ from `measure`'s peak bytes" in step_memory


@pytest.mark.slow
def test_readme_plan_line_runs_on_a_small_gpt2() -> None:
    # README's "plan = memsave.plan(gpt2, input_ids=ids, labels=ids, budget=0.6)", run as written on a GPT-2 of
    # transformers at a size where activations are most of the step (4 layers, width 64, 2 x 64 tokens); at
    # smaller sizes the parameters' floor makes 0.6 infeasible and InfeasibleBudgetError says so.
    import torch

    import memsave
    from helpers import hub

    text = (ROOT / "README.md").read_text()
    line = next(ln for ln in text.splitlines() if ln.startswith("plan = memsave.plan(gpt2,"))
    code = line.split("#")[0].strip()
    torch.manual_seed(0)
    gpt2 = hub.gpt2(layers=4, hidden=64, vocab=128, positions=64)
    ids = torch.randint(0, 128, (2, 64))
    scope = {"memsave": memsave, "gpt2": gpt2, "ids": ids}
    exec(code, scope)  # the README line itself
    plan = scope["plan"]
    assert plan.measured_peak_bytes is not None and plan.measured_peak_bytes <= plan.budget_bytes
    assert plan.budget_bytes == int(0.6 * plan.eager_peak_bytes) and any(rec for _, _, rec in plan.segments)
