"""examples/compare_memory.ipynb runs headless from top to bottom (so it never rots) and is committed without
outputs."""

from __future__ import annotations

import json
import time

import pytest

from helpers import ROOT

NOTEBOOK = ROOT / "examples" / "compare_memory.ipynb"


def test_notebook_is_committed_without_outputs():
    nb = json.loads(NOTEBOOK.read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert code, "the notebook has no code cells"
    assert all(not c.get("outputs") and c.get("execution_count") is None for c in code)


def test_notebook_executes_headless():
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    pytest.importorskip("matplotlib")
    pytest.importorskip("pandas")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOK.parent)}}
    )
    start = time.perf_counter()
    client.execute()
    elapsed = time.perf_counter() - start
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    # The comparison tables render as HTML and the plots as PNG images.
    assert any("text/html" in o.get("data", {}) and "memsave.compare" in o["data"]["text/html"] for o in outputs)
    assert sum("image/png" in o.get("data", {}) for o in outputs) >= 2
    assert elapsed < 120, f"the notebook took {elapsed:.0f} s; keep it under 2 minutes on a CPU"
