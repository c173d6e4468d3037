#!/usr/bin/env bash
# The supported torch range, tested: for each torch release given, a fresh venv with that torch's default wheel from
# the package index, a copy of this working tree built into it (tools/setup.sh --test: the build, the test
# dependencies under a pin on that torch), then the fast tier (pytest -m "not slow") and `python -m memsave demo`.
# Each version's row (build ok, tests passed/failed/skipped, demo, minutes) is written into docs/compatibility.md's
# table; logs stay in $COMPAT_DIR.
#   bash tools/compat.sh 2.11 2.13 2.15          # one row per version (a release: its newest patch)
#   MEMSAVE_CUDA=OFF bash tools/compat.sh 2.11   # CPU kernels only (AUTO by default, as in setup.sh)
# About 20 minutes a version on 2 cores (download, CUDA build, fast tier, demo); the venvs are made anew each run.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT="$(pwd)"
COMPAT_DIR="${COMPAT_DIR:-$ROOT/build/compat}"
(( $# )) || { echo "usage: bash tools/compat.sh TORCH_VERSION [TORCH_VERSION ...]   (e.g. 2.11 2.13 2.15)" >&2; exit 2; }
mkdir -p "$COMPAT_DIR"
STATUS=0

# run_version V: venv, build and fast tier for torch V; records its row.
run_version() {
  local version="$1" dir="$COMPAT_DIR/torch-$1" start build_rc=1 test_rc=1 summary="not run"
  start=$(date +%s)
  rm -rf "$dir" && mkdir -p "$dir/src"
  echo "[compat] torch $version: venv and copy of the working tree in $dir"
  python3 -m venv "$dir/venv"
  local py="$dir/venv/bin/python"
  # The tracked and new (not ignored) files as they are now, so an uncommitted change is what gets tested.
  git ls-files -z --cached --others --exclude-standard | xargs -0 -I{} cp --parents {} "$dir/src/" 2>/dev/null
  git -C "$dir/src" init -q && git -C "$dir/src" add -A >/dev/null  # setup.sh hashes the sources with git ls-files
  "$py" -m pip install -q --disable-pip-version-check "torch==$version.*" > "$dir/install.log" 2>&1
  if PYTHON="$py" bash "$dir/src/tools/setup.sh" --test > "$dir/build.log" 2>&1; then
    build_rc=0
    (cd "$dir/src" && "$py" -m pytest -q -m "not slow" -p no:cacheprovider > "$dir/tests.log" 2>&1)
    test_rc=$?
    summary="$(grep -E '(passed|failed|error).* in [0-9.]+s' "$dir/tests.log" | tail -n 1 | sed -E 's/^=+ //; s/ =+$//')"
    # The main job as a user runs it, from outside the checkout (about 4 minutes on 2 cores).
    if (cd "$dir" && "$py" -m memsave demo > "$dir/demo.log" 2>&1); then summary+="; demo ok"; else
      summary+="; demo failed (demo.log)"; test_rc=1; fi
  else
    tail -n 30 "$dir/build.log"
  fi
  local torch_full
  torch_full="$("$py" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo "$version (not installed)")"
  echo "[compat] torch $torch_full: build rc=$build_rc, tests rc=$test_rc: $summary"
  "$py" "$ROOT/tools/compat_table.py" "$ROOT/docs/compatibility.md" --torch "$torch_full" \
    --python "$("$py" -c 'import platform; print(platform.python_version())')" --cuda "${MEMSAVE_CUDA:-AUTO}" \
    --build-rc "$build_rc" --test-rc "$test_rc" --summary "$summary" --minutes "$(( ($(date +%s) - start) / 60 ))"
  (( build_rc == 0 && test_rc == 0 )) || STATUS=1
}

for v in "$@"; do
  run_version "$v"
done
exit $STATUS
