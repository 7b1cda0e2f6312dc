#!/usr/bin/env bash
# The GPU tests and figures, for a machine with a CUDA GPU, in one call of a few minutes
# (`bash benchmarks/gpu_figures.sh $OUT all`; the parts alone: `tests`, `profile`, `figures`).
#   tests:   the GPU tests, at most 240 s (the GPU step against the CPU step, bench and train on the
#            GPU, train under torchrun with NCCL, fp16 and TF32);
#   profile: benchmarks/gpu_profile.py, the kernels that take a 64K bf16 step's GPU time, for
#            both table gradient paths (at most 120 s);
#   figures: `dlrmkit bench --device cuda` on mlperf-shape, whose MLP and embedding shapes are
#            NVIDIA's small Criteo model's (its tables are smaller: 26 x 200k rows), at batch 64K
#            and 2048, fp32 (TF32) and bf16 (AMP), with and without CUDA graphs, and once with the
#            tables in host memory. Every run's json is merged into OUTDIR/gpu_bench.json as it ends.
# Record each printed figure with its command, GPU and date in docs/BENCHMARKS.md. Uses the python3
# that holds a CUDA torch (PY=... for another) and this checkout's src/.
# The whole script keeps to BUDGET seconds (default 420): each part has a time limit, and a figure
# is skipped, saying so, once the budget is spent; the most telling figures run first.
# Usage: [BUDGET=SECONDS] bash benchmarks/gpu_figures.sh [OUTDIR] [tests|profile|figures|all]
set -u
cd "$(dirname "$0")/.."
OUT=${1:-gpu_out}
PART=${2:-all}
mkdir -p "$OUT"
PY=${PY:-python3}
BUDGET=${BUDGET:-420}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
$PY -c "import torch; print('torch', torch.__version__, 'on', torch.cuda.get_device_name())" || exit 1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null

if [ "$PART" = tests ] || [ "$PART" = all ]; then
  echo "### GPU tests"
  # a hung test (an NCCL wait, say) is stopped with its stack after 120 s where pytest-timeout is there
  PER_TEST=$($PY -c "import pytest_timeout" 2>/dev/null && echo "--timeout=120")
  timeout 240 $PY -m pytest -q -rfEs --durations=8 -p no:cacheprovider $PER_TEST tests/test_device.py \
    tests/test_train_device.py tests/test_precision.py 2>&1 | tee "$OUT/tests.log"
fi
if [ "$PART" = profile ] || [ "$PART" = all ]; then
  echo "### where a step's GPU time goes: benchmarks/gpu_profile.py (batch 64K, bf16; table gradients by bag, then COO)"
  timeout 120 $PY benchmarks/gpu_profile.py --batch-size 65536 --precision bf16 --table-grads bag,coo 2>&1 |
    grep -v Warning | tee "$OUT/profile.log"
fi
[ "$PART" = figures ] || [ "$PART" = all ] || exit 0

RUN_JSON=$(mktemp)
bench() {  # bench NAME ARGS...: one run, its json merged into $OUT/gpu_bench.json
  local name=$1
  shift
  if [ $((SECONDS + 45)) -gt "$BUDGET" ]; then
    echo "(skipped: $name; ${SECONDS}s of the ${BUDGET}s budget spent)"
    return
  fi
  echo "### $name: dlrmkit bench --device cuda --model mlperf-shape --steps 10 --windows 3 --warmup 3 $*"
  timeout $((BUDGET - SECONDS)) $PY -m dlrmkit bench --device cuda --model mlperf-shape --steps 10 --windows 3 --warmup 3 "$@" --json "$RUN_JSON"
  local rc=$?
  if [ $rc = 124 ]; then
    echo "(stopped: $name, at the end of the ${BUDGET}s budget)"
  elif [ $rc = 0 ]; then
    $PY - "$RUN_JSON" "$OUT/gpu_bench.json" "$name" <<'PY'
import json, pathlib, sys
run, merged, name = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), sys.argv[3]
runs = json.loads(merged.read_text()) if merged.exists() else {}
runs[name] = json.loads(run.read_text())
merged.write_text(json.dumps(runs, indent=1))
PY
  else
    echo "(failed: $name, exit $rc)"
  fi
}
# most telling first: the large batch in both precisions, then what graphs and host tables change
bench b65536-bf16-graphs --batch-size 65536 --precision bf16
bench b65536-fp32-graphs --batch-size 65536 --precision fp32
bench b2048-bf16-graphs --batch-size 2048 --precision bf16
bench b2048-bf16-eager --batch-size 2048 --precision bf16 --no-cuda-graphs
bench b65536-bf16-eager --batch-size 65536 --precision bf16 --no-cuda-graphs
bench b65536-bf16-host-tables --batch-size 65536 --precision bf16 --table-placement host
bench b2048-fp32-graphs --batch-size 2048 --precision fp32
bench b2048-fp32-eager --batch-size 2048 --precision fp32 --no-cuda-graphs
bench b65536-fp32-eager --batch-size 65536 --precision fp32 --no-cuda-graphs
echo "### done in ${SECONDS}s"
