#!/usr/bin/env bash
# Hybrid-parallel figures for docs/BENCHMARKS.md: run on a quiet machine from the repo root.
# Prints, for each strategy, global samples/s at world sizes 1 and 2 (1 thread per rank), the
# single-process 2-thread throughput in the same run (the 0.9x check for table-wise), bytes/step
# against the analytic minimum, and the step breakdowns (blocking and overlapped all-reduce).
set -euo pipefail
PY=${PY:-.venv/bin/python}
COMMON="--model small --batch-size 2048 --steps 10 --windows 5 --warmup 5"
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
run() { echo "\$ $*"; "$@" 2>&1 | grep -v Warning; echo; }

echo "== single process, 2 threads (reference for the 0.9x check) =="
OMP_NUM_THREADS=2 run $PY -m dlrmkit bench $COMMON --threads 2
echo "== single process, 1 thread =="
run $PY -m dlrmkit bench $COMMON --threads 1
for s in table_wise column_wise row_wise data_parallel auto; do
  for n in 1 2; do
    echo "== $s, world size $n, 1 thread per rank =="
    run $PY -m torch.distributed.run --nproc_per_node=$n --master_addr 127.0.0.1 --master_port $((29600 + n)) \
      -m dlrmkit bench $COMMON --threads 1 --sharding $s --breakdown
  done
done
echo "== table_wise, 2 ranks, blocking all-reduce (--no-overlap; overlap is the default) =="
run $PY -m torch.distributed.run --nproc_per_node=2 --master_addr 127.0.0.1 --master_port 29610 \
  -m dlrmkit bench $COMMON --threads 1 --sharding table_wise --no-overlap
echo "== single process, 2 threads, again (drift check for the 0.9x comparison) =="
OMP_NUM_THREADS=2 run $PY -m dlrmkit bench $COMMON --threads 2
