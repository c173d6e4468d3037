#!/usr/bin/env bash
# Reruns every committed CPU benchmark (results/*_cpu*), one after the other (never two at once on a 2-core machine).
#   bash benchmarks/rerun_cpu.sh            # ~45 minutes on 2 cores (real_models.py ~7 of them, frontier.py ~25)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
run() { echo "== $*"; "$PY" "$@"; }
run benchmarks/run.py --size cpu
run benchmarks/run.py --models vgg16 unet --size cpu --steps 3 --plugins benchmarks.strategies_convert \
    --strategies eager checkpoint:blocks convert convert+checkpoint:blocks convert_dropout --name convert_cpu
run benchmarks/run.py --models resnet50 --size cpu --steps 9 --plugins benchmarks.strategies_fused \
    --strategies eager fused:batch_norm_act_conv2d fused:inplace_abn --name fused_resnet50_cpu
run benchmarks/run.py --models gpt2 --size cpu --steps 9 --plugins benchmarks.strategies_fused \
    --strategies eager fused:layer_norm_mlp --name fused_gpt2_cpu
run benchmarks/run.py --models unet gpt2 --size cpu --steps 9 --plugins benchmarks.strategies_plan \
    --strategies eager plan:sqrt plan_range:25% plan_range:50% plan_range:75% torch_checkpoint_sequential:2 --name plan_cpu
run benchmarks/plan_benefit.py
run benchmarks/estimate_accuracy.py --device cpu --size cpu
run benchmarks/convert_zoo.py
run benchmarks/real_models.py
run benchmarks/frontier.py
run benchmarks/selective_region.py
