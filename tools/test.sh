#!/usr/bin/env bash
# The whole test suite: set up (idempotent), build and run the C++ unit tests (ctest), then pytest.
# CUDA tests skip cleanly without a GPU. Extra arguments go to pytest (e.g. -k checkpoint).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh --test
PY="${PYTHON:-python3}"
export CCACHE_BASEDIR="$(pwd)" CCACHE_NOHASHDIR=true

echo "[test] C++ unit tests (planner, GoogleTest)"
cmake -S tests/cpp -B build/cpp-tests -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build/cpp-tests --parallel 2
ctest --test-dir build/cpp-tests --output-on-failure

echo "[test] Python tests"
"$PY" -m pytest -q "$@"
