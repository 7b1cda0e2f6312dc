#!/usr/bin/env bash
# 2 ranks against one process, robust to this VM's drift: alternate single-process 2-thread and torchrun
# 2 ranks x 1 thread table-wise runs of `dlrmkit bench --model small` (same data, same global
# batch) PAIRS times and print each pair's ratio and the median ratio.
# Usage: bash benchmarks/parallel_ratio.sh [PAIRS]   (about 3 min per pair on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/.."
PAIRS=${1:-3}
PY=.venv/bin/python
COMMON="--model small --batch-size 2048 --steps 10 --windows 5 --warmup 5"
rate() { grep -oE '[0-9,]+ samples/s' | head -1 | tr -d ',' | cut -d' ' -f1; }
ratios=()
for i in $(seq "$PAIRS"); do
  one=$(OMP_NUM_THREADS=2 $PY -m dlrmkit bench $COMMON --threads 2 2>&1 | rate)
  two=$(OMP_NUM_THREADS=1 $PY -m torch.distributed.run --nproc_per_node=2 --master_addr 127.0.0.1 \
        --master_port $((29700 + i)) -m dlrmkit bench $COMMON --threads 1 --sharding table_wise 2>&1 | rate)
  r=$($PY -c "print(f'{$two / $one:.3f}')")
  ratios+=("$r")
  echo "pair $i: 1 process x 2 threads $one samples/s, 2 ranks x 1 thread table_wise $two samples/s, ratio $r"
done
$PY -c "import statistics, sys; print('median ratio', statistics.median(map(float, sys.argv[1:])))" "${ratios[@]}"
