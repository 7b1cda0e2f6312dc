#!/usr/bin/env bash
# Scaling figures on this machine: strong scaling (global batch 2048 at every world size)
# and weak scaling (1024 samples per rank) of `dlrmkit bench --model small`, 1 thread per rank,
# gloo, for world sizes 1, 2 and 4 per strategy. This VM has 2 cores, so world size 4 is
# OVERSUBSCRIBED (2 ranks per core) and flagged as such. Writes OUTDIR/scaling.json (one record
# per run: sharding, kind, world_size, samples_per_s) and OUTDIR/scaling.png (one curve per
# strategy and kind). Run on a quiet machine. Usage: bash benchmarks/scaling_figures.sh [OUTDIR]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-scaling_out}
mkdir -p "$OUT"
PY=${PY:-.venv/bin/python}
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
COMMON="--model small --steps 5 --windows 3 --warmup 3 --threads 1"
port=29800
for s in table_wise column_wise row_wise auto; do
  for n in 1 2 4; do
    for kind in strong weak; do
      batch=$([ "$kind" = strong ] && echo 2048 || echo $((1024 * n)))
      port=$((port + 1))
      $PY -m torch.distributed.run --nproc_per_node=$n --master_addr 127.0.0.1 --master_port $port \
        -m dlrmkit bench $COMMON --batch-size "$batch" --sharding $s --json "$OUT/$s-$kind-$n.json" \
        >"$OUT/$s-$kind-$n.log" 2>&1 || { echo "$s $kind $n failed: see $OUT/$s-$kind-$n.log"; continue; }
    done
  done
done
$PY - "$OUT" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
runs = []
for f in sorted(out.glob("*-*-*.json")):
    r = json.loads(f.read_text())
    kind = f.stem.split("-")[1]
    runs.append({"sharding": r["sharding"], "kind": kind, "world_size": r["world_size"],
                 "batch_size": r["batch_size"], "samples_per_s": r["samples_per_s"]})
(out / "scaling.json").write_text(json.dumps({"runs": runs}, indent=1))
base = {(r["sharding"], r["kind"]): r["samples_per_s"] for r in runs if r["world_size"] == 1}
print("| strategy | kind | world size | global batch | samples/s | vs 1 rank |")
print("|---|---|---|---|---|---|")
for r in sorted(runs, key=lambda r: (r["sharding"], r["kind"], r["world_size"])):
    flag = " (oversubscribed: 2 ranks per core)" if r["world_size"] > 2 else ""
    b = base.get((r["sharding"], r["kind"]))
    print(f"| {r['sharding']} | {r['kind']} | {r['world_size']}{flag} | {r['batch_size']} | "
          f"{r['samples_per_s']:,.0f} | {r['samples_per_s'] / b:.2f}x |" if b else "")
PY
$PY -m dlrmkit.perf.plots "$OUT/scaling.json" "$OUT/scaling.png" && echo "plot: $OUT/scaling.png"
