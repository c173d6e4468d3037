"""Print the C++ standard the installed torch's headers need (17, 20, ...), for CMakeLists.txt.

torch's own extension builder (torch/utils/cpp_extension.py) compiles every extension with the ``-std=c++NN`` its
headers need, and TorchConfig.cmake asks for ``cxx_std_NN``; the highest either names is the answer, 17 when neither
says (torch < 2.1 named it in neither place). The files are read as text: importing torch.utils.cpp_extension would
probe for a CUDA runtime and print warnings into the build log.
"""

from __future__ import annotations

import importlib.util
import pathlib
import re
import sys

FALLBACK = 17


def torch_dir() -> pathlib.Path:
    """Return the installed torch package's folder without importing torch."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("torch is not installed in this interpreter")
    return pathlib.Path(next(iter(spec.submodule_search_locations)))


def named_standards(root: pathlib.Path) -> list[int]:
    """Return every C++ standard torch's extension builder and CMake config name."""
    found = []
    sources = {
        root / "utils" / "cpp_extension.py": r"-std=c\+\+(\d+)",
        root / "share" / "cmake" / "Torch" / "TorchConfig.cmake": r"cxx_std_(\d+)",
    }
    for path, pattern in sources.items():
        if path.is_file():
            found += [int(n) for n in re.findall(pattern, path.read_text(errors="replace"))]
    return found


if __name__ == "__main__":
    print(max(named_standards(torch_dir()), default=FALLBACK))
    sys.exit(0)
