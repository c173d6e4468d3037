"""memsave's in-place functions return the model they were given typed as its own class, so that
``memsave.wrap(llama).generate(...)`` type-checks and IDEs keep the model's methods: mypy, on a user's snippet."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from helpers import ROOT

# A user's code: methods of the model's own class called on what memsave returns, and the result assigned to it.
SNIPPET = textwrap.dedent(
    """
    import torch
    from torch import nn

    import memsave


    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.blocks(x)

        def generate(self, x: torch.Tensor, steps: int) -> torch.Tensor:
            return x


    x = torch.zeros(1, 4)
    wrapped: Net = memsave.wrap(Net(), nn.Linear)
    converted: Net = memsave.convert(Net(), fuse=True)
    unwrapped: Net = memsave.unwrap(memsave.wrap(Net()))
    chunked: Net = memsave.chunked(Net(), 2)
    y: torch.Tensor = memsave.wrap(Net()).generate(x, steps=2)
    y = memsave.convert(Net()).generate(x, steps=2)
    y = memsave.unwrap(Net()).generate(x, steps=2)
    reveal_type(memsave.wrap(Net()))
    reveal_type(memsave.convert(Net()))
    reveal_type(memsave.unwrap(Net()))
    reveal_type(memsave.recompute.wrap(Net()))
    reveal_type(memsave.operators.convert(Net()))
    reveal_type(memsave.chunked(Net(), 2))
    """
)


def _mypy(path: Path) -> subprocess.CompletedProcess:
    # pyproject.toml's settings (python_version, mypy_path = "python", which is why it runs from the root).
    command = [sys.executable, "-m", "mypy", "--config-file", "pyproject.toml", "--no-error-summary", str(path)]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)


@pytest.mark.slow  # mypy follows the imports into memsave and torch: ~1 minute without a cache
def test_wrap_convert_unwrap_return_the_type_they_were_given(tmp_path: Path):
    pytest.importorskip("mypy")
    snippet = tmp_path / "user_code.py"
    snippet.write_text(SNIPPET)
    proc = _mypy(snippet)
    out = proc.stdout + proc.stderr
    errors = [line for line in out.splitlines() if ": error:" in line]
    assert not errors, out  # e.g. 'Incompatible types in assignment (expression has type "Module", variable ...'
    revealed = re.findall(r'Revealed type is "([^"]+)"', out)
    assert revealed == ["user_code.Net"] * SNIPPET.count("reveal_type("), out
    assert proc.returncode == 0, out
