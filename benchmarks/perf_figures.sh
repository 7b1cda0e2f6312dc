#!/usr/bin/env bash
# Single-process performance figures, to run on a quiet machine (nothing else running). Prints:
# mlperf-shape and small fp32 vs the plain-PyTorch reference loop (same run, same batches),
# bf16 + split-SGD vs the reference, fp32 fraction of the compute bound, profile shares of
# the default path and of the optional kernels (FBGEMM TBE, torch.compile), and the simulator
# against NVIDIA's published figures. The default bench compiles the interaction (torch.compile won
# the side-by-side measurement); the --no-compile rows are the eager path. Record each printed figure with its command in
# docs/BENCHMARKS.md. Usage: bash benchmarks/perf_figures.sh [OUTDIR]   (about 15-25 min on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-perf_out}
mkdir -p "$OUT"
DL=".venv/bin/dlrmkit"
quiet() { grep -v -e USDT -e Warning -e warn -e 'Failed to import' -e '\[0m' -e '^ *$' || true; }
COMMON="--steps 10 --windows 5 --warmup 5"

echo "### machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2), $(date -u +%F)"
for model in small mlperf-shape; do
  echo "### $model fp32 sgd vs reference (plus profile of the default path)"
  $DL bench --model $model $COMMON --reference --profile --trace "$OUT/$model-fp32.trace.json" \
      --plot "$OUT/$model-fp32.png" --json "$OUT/$model-fp32.json" 2>&1 | quiet
  echo "### $model bf16 split-sgd vs reference"
  $DL bench --model $model $COMMON --precision bf16 --optimizer split-sgd --reference --profile \
      --json "$OUT/$model-bf16-splitsgd.json" 2>&1 | quiet
  echo "### $model fp32, FBGEMM table-batched embedding (fused exact SGD), after-profile"
  $DL bench --model $model $COMMON --no-compile --embedding-backend fbgemm --profile --json "$OUT/$model-fbgemm.json" 2>&1 | quiet \
      || echo "(fbgemm-gpu-cpu not installed: pip install -c constraints.txt 'dlrmkit[fbgemm]')"
  echo "### $model fp32, eager dense part (--no-compile), profile before torch.compile"
  $DL bench --model $model $COMMON --no-compile --profile --json "$OUT/$model-eager.json" 2>&1 | quiet \
      || echo "(eager run failed; see its output above)"
done
echo "### threads: 1 vs default (cores / LOCAL_WORLD_SIZE)"
$DL bench --model small $COMMON --threads 1 2>&1 | quiet | head -1
echo "### simulator vs published NVIDIA DLRM figures (A100-80GB)"
$DL plan --tables-preset criteo-1tb-mlperf --simulate --precision fp32 --anchors --json "$OUT/sim-fp32.json"
$DL plan --tables-preset criteo-1tb-mlperf --simulate --precision amp --json "$OUT/sim-amp.json"
.venv/bin/python -m dlrmkit.perf.plots "$OUT/sim-amp.json" "$OUT/sim-amp-scaling.png"
echo "### summary"
.venv/bin/python - "$OUT" <<'PY'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
for f in sorted(out.glob("*.json")):
    if f.name.startswith("sim") or f.name.endswith("trace.json"):
        continue
    r = json.loads(f.read_text())
    ref = f"  {r['speedup_vs_reference']:.2f}x reference" if "speedup_vs_reference" in r else ""
    print(f"{f.stem:32s} {r['samples_per_s']:>12,.0f} samples/s  {100 * r['compute_bound_fraction']:5.1f}% of bound{ref}")
    if "profile_shares" in r:
        print("    " + "  ".join(f"{k} {100 * v:.0f}%" for k, v in r["profile_shares"].items() if v >= 0.005))
PY
