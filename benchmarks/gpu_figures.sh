#!/usr/bin/env bash
# Issue 7's GPU check in one call, for a session that is lent a CUDA GPU (the device tool's `run`,
# command `bash benchmarks/gpu_figures.sh $OUT`; about 5-8 min on one H100): the GPU tests (the GPU
# step against the CPU step, fp16 and TF32), then `dlrmkit bench --device cuda` on mlperf-shape, whose
# MLP and embedding shapes are NVIDIA's small Criteo model's (its tables are smaller: 26 x 200k rows),
# at batch 64K and 2048, fp32 (TF32) and bf16 (AMP), with and without CUDA graphs, and once with
# the tables in host memory. Record each printed figure with its command, GPU and date in
# docs/BENCHMARKS.md. Uses the python3 that holds a CUDA torch (PY=... to choose another) and this
# checkout's src/. Usage: bash benchmarks/gpu_figures.sh [OUTDIR]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-gpu_out}
mkdir -p "$OUT"
RUNS=$(mktemp -d)  # one json per run, merged into $OUT/gpu_bench.json (the device tool returns few files)
PY=${PY:-python3}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
$PY -c "import torch; print('torch', torch.__version__, 'on', torch.cuda.get_device_name())" || exit 1
echo "### GPU tests"
$PY -m pytest -q -rs -p no:cacheprovider tests/test_device.py tests/test_precision.py 2>&1 | tee "$OUT/tests.log"
BENCH="$PY -m dlrmkit bench --device cuda --model mlperf-shape --steps 20 --windows 5 --warmup 5"
for batch in 65536 2048; do
  for precision in fp32 bf16; do
    for graphs in cuda-graphs no-cuda-graphs; do
      echo "### mlperf-shape batch $batch $precision --$graphs"
      $BENCH --batch-size $batch --precision $precision --$graphs --json "$RUNS/b$batch-$precision-$graphs.json" 2>&1 \
        | grep -v -e Warning -e warn || echo "(failed: batch $batch $precision --$graphs)"
    done
  done
done
echo "### mlperf-shape batch 65536 bf16, tables in host memory"
$BENCH --batch-size 65536 --precision bf16 --table-placement host --json "$RUNS/b65536-bf16-host.json" 2>&1 \
  | grep -v -e Warning -e warn || echo "(failed: host tables)"
$PY - "$RUNS" "$OUT/gpu_bench.json" <<'PY'
import json, pathlib, sys
runs = {f.stem: json.loads(f.read_text()) for f in sorted(pathlib.Path(sys.argv[1]).glob("*.json"))}
pathlib.Path(sys.argv[2]).write_text(json.dumps(runs, indent=1))
print(f"{len(runs)} runs in {sys.argv[2]}")
PY
