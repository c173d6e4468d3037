"""examples/compare_memory.ipynb is committed with the outputs of a run at a size where the strategies differ, and
runs headless from top to bottom (so it never rots)."""

from __future__ import annotations

import json

import pytest

from helpers import ROOT

NOTEBOOK = ROOT / "examples" / "compare_memory.ipynb"


def _outputs(cells) -> list:
    return [o for c in cells if c["cell_type"] == "code" for o in c.get("outputs", [])]


def _check_outputs(outputs: list) -> None:
    assert not [o for o in outputs if o["output_type"] == "error"]
    tables = [o["data"]["text/html"] for o in outputs if "text/html" in o.get("data", {})]
    tables = ["".join(t) if isinstance(t, list) else t for t in tables]
    assert any("memsave.compare" in t for t in tables), "no comparison table"
    assert sum("image/png" in o.get("data", {}) for o in outputs) >= 2, "the plots are missing"


def test_notebook_is_committed_with_outputs_where_the_strategies_differ():
    nb = json.loads(NOTEBOOK.read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert code and all(c.get("execution_count") is not None for c in code), "run the notebook before committing"
    outputs = _outputs(nb["cells"])
    _check_outputs(outputs)
    # The GPT comparison is printed as text: checkpointing the blocks keeps clearly fewer bytes than eager.
    text = "".join("".join(o.get("text", "")) for o in outputs if o["output_type"] == "stream")
    row = next(line for line in text.splitlines() if line.startswith("checkpoint:blocks "))
    saving = float(next(cell for cell in row.split() if cell.endswith("%")).rstrip("%"))
    assert saving <= -10.0, row


@pytest.mark.slow
def test_notebook_executes_headless():
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    pytest.importorskip("matplotlib")
    pytest.importorskip("pandas")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOK.parent)}}
    )
    client.execute()
    _check_outputs(_outputs(nb.cells))
