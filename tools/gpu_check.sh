#!/usr/bin/env bash
# The GPU run in one command, for a machine with an NVIDIA GPU: build memsave with its CUDA kernels for this GPU, run
# the whole test suite (the CUDA tests included: they skip only without a GPU), then every benchmark in its CUDA
# configuration, writing benchmarks/results/*cuda*. Each stage's log and time go to $LOG_DIR (default
# benchmarks/results/gpu_check/); a failing stage is recorded and the next one still runs; the exit status is that of
# the first failure.
#   bash tools/gpu_check.sh             # everything (build, ctest + pytest, every benchmark at its CUDA size)
#   bash tools/gpu_check.sh --quick     # build, the fast tier (pytest -m "not slow" and every CUDA test), smoke-sized
#                                       # benchmarks: fits a short lease of a GPU machine (about 10 minutes)
#   bash tools/gpu_check.sh --no-tests  # build and benchmarks only
# Environment: TORCH_CUDA_ARCH_LIST (default: the visible GPU's capability, e.g. 9.0), PYTHON.
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
QUICK=0
TESTS=1
for arg in "$@"; do
  case "$arg" in
    --quick) QUICK=1 ;;
    --no-tests) TESTS=0 ;;
    *) echo "usage: bash tools/gpu_check.sh [--quick] [--no-tests]" >&2; exit 2 ;;
  esac
done
LOG_DIR="${LOG_DIR:-benchmarks/results/gpu_check}"
SUMMARY="$LOG_DIR/summary.txt"
STATUS=0

# stage NAME COMMAND...: run it with its output in $LOG_DIR/NAME.log, record its time and exit status.
stage() {
  local name="$1"; shift
  local start rc
  start=$(date +%s)
  echo "[gpu_check] $name: $*"
  "$@" > "$LOG_DIR/$name.log" 2>&1
  rc=$?
  printf '%-28s rc=%-3s %5ss  %s\n' "$name" "$rc" "$(( $(date +%s) - start ))" "$*" | tee -a "$SUMMARY"
  if (( rc != 0 )); then
    tail -n 30 "$LOG_DIR/$name.log"
    (( STATUS == 0 )) && STATUS=$rc
  fi
  return $rc
}

if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "[gpu_check] no NVIDIA GPU visible (nvidia-smi -L failed): this script is for a GPU machine" >&2
  exit 3
fi
mkdir -p "$LOG_DIR"
: > "$SUMMARY"
nvidia-smi -L | tee "$LOG_DIR/device.txt"

# torch first (the pinned one when missing), so that the arch list can come from the GPU itself unless given; then
# the CUDA build, forced when an earlier build in this tree has no CUDA kernels.
if ! "$PY" -c "import torch" 2>/dev/null; then
  stage torch bash tools/setup.sh --torch-only || exit 1
fi
if [[ -z "${TORCH_CUDA_ARCH_LIST:-}" ]]; then
  TORCH_CUDA_ARCH_LIST="$("$PY" -c 'import torch; print("%d.%d" % torch.cuda.get_device_capability())')"
  export TORCH_CUDA_ARCH_LIST
fi
export MEMSAVE_CUDA=ON CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
rebuild=()
(cd /tmp && "$PY" -c "import memsave, sys; sys.exit(not memsave.build_info()['cuda'])" 2>/dev/null) || rebuild=(--rebuild)
stage build bash tools/setup.sh --test "${rebuild[@]}" || { echo "[gpu_check] the CUDA build failed" >&2; exit 1; }
stage build_info "$PY" -c '
import torch, memsave
info = memsave.build_info()
print(info)
assert info["cuda"], "memsave was built without its CUDA kernels"
assert torch.cuda.is_available(), "torch sees no GPU"
print("device:", torch.cuda.get_device_name(0), "capability", torch.cuda.get_device_capability(0))
' || exit 1

if (( TESTS )); then
  stage ctest bash -c 'cmake -S tests/cpp -B build/cpp-tests -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null &&
                       cmake --build build/cpp-tests && ctest --test-dir build/cpp-tests --output-on-failure'
  stage pytest_cuda "$PY" -m pytest -q -m cuda -p no:cacheprovider -o addopts="-ra"
  if (( QUICK )); then
    stage pytest_fast "$PY" -m pytest -q -m "not slow" -p no:cacheprovider
  else
    stage pytest_all "$PY" -m pytest -q -p no:cacheprovider
  fi
fi

# Every benchmark's CUDA configuration; results land beside the CPU ones as *cuda*.
if (( QUICK )); then
  stage bench_harness "$PY" benchmarks/run.py --size tiny --device cuda --steps 3 --name bench_cuda_tiny
  stage ops_speed "$PY" benchmarks/ops_speed.py --device cuda
  stage amp_unscale "$PY" benchmarks/amp_unscale_speed.py --devices cuda
  stage transformer_ops "$PY" benchmarks/transformer_ops.py --device cuda
  stage linear_cross_entropy "$PY" benchmarks/linear_cross_entropy.py --device cuda
  stage convert_zoo "$PY" benchmarks/convert_zoo.py --device cuda
  stage real_models "$PY" benchmarks/real_models.py --device cuda --quick --out benchmarks/results/real_models_cuda_quick.json
else
  stage bench_harness "$PY" benchmarks/run.py --size full --device cuda
  stage ops_speed "$PY" benchmarks/ops_speed.py --device cuda
  stage amp_unscale "$PY" benchmarks/amp_unscale_speed.py --devices cuda
  stage transformer_ops "$PY" benchmarks/transformer_ops.py --device cuda
  stage linear_cross_entropy "$PY" benchmarks/linear_cross_entropy.py --device cuda
  stage convert_zoo "$PY" benchmarks/convert_zoo.py --device cuda
  stage estimate_accuracy "$PY" benchmarks/estimate_accuracy.py --device cuda --size full
  stage real_models "$PY" benchmarks/real_models.py --device cuda
  for script in frontier selective_region plan_benefit long_context; do
    if "$PY" "benchmarks/$script.py" --help 2>/dev/null | grep -q -- "--device"; then
      stage "$script" "$PY" "benchmarks/$script.py" --device cuda
    else
      echo "$script: no CUDA configuration (CPU-only benchmark)" | tee -a "$SUMMARY"
    fi
  done
fi

echo "[gpu_check] done (status $STATUS); stages:"
cat "$SUMMARY"
ls benchmarks/results/*cuda* 2>/dev/null
exit $STATUS
