#!/usr/bin/env bash
# Rebuild memsave's C++/CUDA extension in place (editable install), serialised by a lock so that several people or
# agents working in one tree never run two builds at once. Incremental: ninja + ccache in build/<wheel tag>.
#   MEMSAVE_CUDA=OFF bash tools/dev_build.sh    # CPU kernels only (faster while iterating on Python)
set -euo pipefail
cd "$(dirname "$0")/.."
export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}"
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}"
# Hash paths relative to the checkout so a fresh clone on this machine reuses the compiled objects.
export CCACHE_BASEDIR="$(pwd)" CCACHE_NOHASHDIR=true CCACHE_SLOPPINESS="${CCACHE_SLOPPINESS:-include_file_ctime,include_file_mtime,time_macros}"
exec flock /tmp/memsave-build.lock \
  python3 -m pip install --no-build-isolation --no-deps -q -e . \
  -Cbuild.verbose=false -Ccmake.define.MEMSAVE_CUDA="${MEMSAVE_CUDA:-AUTO}"
