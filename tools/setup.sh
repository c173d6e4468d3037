#!/usr/bin/env bash
# Set up memsave from a fresh machine (python3, pip, and for CUDA kernels nvcc): torch, build tools, ccache, then an
# editable build of memsave against the installed torch. Idempotent: a second run installs nothing and the build is
# a ninja no-op (seconds).
#   bash tools/setup.sh            # runtime + build
#   bash tools/setup.sh --test     # also the test dependencies
#   bash tools/setup.sh --rebuild  # rebuild even when no tracked source changed (while editing C++)
#   bash tools/setup.sh --torch-only  # only torch (the pinned one, when missing): gpu_check.sh's first stage
# Environment: MEMSAVE_TORCH (pip requirement used only when torch is missing; default torch==2.15.0, the package
# index's default wheel), MEMSAVE_CUDA=AUTO|ON|OFF, TORCH_CUDA_ARCH_LIST (default 9.0 here; set yours, e.g. "8.0;9.0").
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$(pwd)"
PY="${PYTHON:-python3}"
WITH_TEST=0
REBUILD=0
TORCH_ONLY=0
for arg in "$@"; do
  case "$arg" in
    --test) WITH_TEST=1 ;;
    --rebuild) REBUILD=1 ;;
    --torch-only) TORCH_ONLY=1 ;;
    *) echo "usage: bash tools/setup.sh [--test] [--rebuild] [--torch-only]" >&2; exit 2 ;;
  esac
done

pip_install() { "$PY" -m pip install -q --disable-pip-version-check --root-user-action=ignore "$@"; }
have_module() { "$PY" -c "import $1" >/dev/null 2>&1; }

if ! have_module torch; then
  echo "[setup] installing ${MEMSAVE_TORCH:-torch==2.15.0} (several GB the first time; pip caches it)"
  pip_install "${MEMSAVE_TORCH:-torch==2.15.0}"
fi
(( TORCH_ONLY )) && exit 0
# Every later install is constrained to the installed torch (and, once there, torchvision): pip can never replace them.
pins="$(mktemp)"
trap 'rm -f "$pins"' EXIT
write_pins() {
  "$PY" -c 'from importlib.metadata import version as v, PackageNotFoundError as E
for name in ("torch", "torchvision"):
    try: print(f"{name}=={v(name)}")
    except E: pass' > "$pins"
}
write_pins

need=()
for spec in "scikit_build_core:scikit-build-core>=0.10" "pybind11:pybind11>=2.12" "ninja:ninja" "numpy:numpy" "tqdm:tqdm"; do
  have_module "${spec%%:*}" || need+=("${spec#*:}")
done
if [[ $WITH_TEST == 1 ]]; then
  # parameterized: transformers' own tests/test_modeling_common.py imports it (tests/integrations/hf_suite runs it).
  for spec in "pytest:pytest>=7" "expecttest:expecttest" "hypothesis:hypothesis" "matplotlib:matplotlib" \
              "pandas:pandas" "nbformat:nbformat" "nbclient:nbclient" "ipykernel:ipykernel" \
              "parameterized:parameterized"; do
    have_module "${spec%%:*}" || need+=("${spec#*:}")
  done
fi
if (( ${#need[@]} )); then
  echo "[setup] installing ${need[*]}"
  pip_install "${need[@]}"
fi
# torchvision for the real-model tests: the newest release whose own torch requirement accepts the installed torch
# (torch 2.N pairs with torchvision 0.(N+15); torch 2.15 has none of its own yet and takes 0.29, which asks for
# torch >= 2.14), resolved by pip under the torch pin so that it never replaces torch.
if [[ $WITH_TEST == 1 ]] && ! have_module torchvision; then
  echo "[setup] installing torchvision (the newest release for $(cat "$pins"))"
  pip_install -c "$pins" torchvision
  write_pins
fi
# The model libraries the real-model tests build from configs with random weights (transformers, timm, peft,
# lightning), under the same pins (timm requires torchvision, peft requires accelerate; none pins torch).
# Exact versions, the current releases the suite was last run with: transformers renames layer arguments between
# minor releases (5.24: past_key_values -> cache), and a CI run must not change with the day it runs on.
have_version() { "$PY" -c "import sys, importlib.metadata as m; sys.exit(m.version('$1') != '$2')" >/dev/null 2>&1; }
if [[ $WITH_TEST == 1 ]]; then
  hub=()
  for spec in "transformers==5.24.0" "timm==1.0.31" "peft==0.21.2" "lightning==2.6.6"; do
    have_version "${spec%%==*}" "${spec#*==}" || hub+=("$spec")
  done
  if (( ${#hub[@]} )); then
    echo "[setup] installing ${hub[*]} (kept: $(tr '\n' ' ' < "$pins"))"
    pip_install -c "$pins" "${hub[@]}"
  fi
fi
# The linters .ci/run runs before the tests, at the versions .pre-commit-config.yaml names, and the documentation
# site's builder (mkdocs.yml: the API reference from the docstrings).
if [[ $WITH_TEST == 1 ]]; then
  lint=()
  for spec in "ruff==0.17.6" "mypy==2.4.1" "mkdocs==1.6.1" "mkdocs-material==9.8.2" "mkdocstrings-python==2.0.11"; do
    have_version "${spec%%==*}" "${spec#*==}" || lint+=("$spec")
  done
  if (( ${#lint[@]} )); then
    echo "[setup] installing ${lint[*]}"
    pip_install "${lint[@]}"
  fi
fi
command -v cmake >/dev/null || { echo "[setup] installing cmake"; pip_install "cmake>=3.24"; }

# ccache makes a rebuild in a fresh clone on the same machine take seconds; paths are hashed relative to the clone.
if ! command -v ccache >/dev/null && command -v apt-get >/dev/null && [[ $(id -u) == 0 ]]; then
  echo "[setup] installing ccache"
  (apt-get install -y -qq ccache >/dev/null 2>&1 || { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq ccache >/dev/null 2>&1; }) \
    || echo "[setup] ccache unavailable; building without it"
fi
export CCACHE_BASEDIR="$ROOT" CCACHE_NOHASHDIR=true CCACHE_SLOPPINESS="${CCACHE_SLOPPINESS:-include_file_ctime,include_file_mtime,time_macros}"

# Rebuild only when a source changed since the last successful build (or memsave does not import).
stamp="build/.memsave-build-stamp"
sources_hash="$( (git ls-files -z -- csrc cmake CMakeLists.txt pyproject.toml python/memsave/_build_config.py.in python/memsave/_version.py 2>/dev/null \
                  | xargs -0 cat 2>/dev/null; "$PY" -c 'import torch; print(torch.__version__)') | sha1sum | cut -d' ' -f1)"
if [[ $REBUILD == 0 && -f "$stamp" && "$(cat "$stamp")" == "$sources_hash" ]] && (cd /tmp && "$PY" -c "import memsave" 2>/dev/null) \
   && [[ "$("$PY" -c 'import memsave,os;print(os.path.dirname(memsave.__file__))' 2>/dev/null)" == "$ROOT/python/memsave" ]]; then
  echo "[setup] memsave is built and up to date"
else
  echo "[setup] building memsave (MEMSAVE_CUDA=${MEMSAVE_CUDA:-AUTO}, TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0})"
  mkdir -p build
  TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}" CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}" \
    flock /tmp/memsave-build.lock "$PY" -m pip install -q --disable-pip-version-check --root-user-action=ignore \
    --no-build-isolation --no-deps -e . -Ccmake.define.MEMSAVE_CUDA="${MEMSAVE_CUDA:-AUTO}"
  echo "$sources_hash" > "$stamp"
fi
(cd /tmp && "$PY" -c "import memsave; i = memsave.build_info(); print(f\"[setup] memsave {i['version']} ready (torch {i['torch_version']}, CUDA kernels: {i['cuda']})\")")
