"""Convergence of low-precision and large-batch training on a synthetic dataset (default: the
`small` preset): fp32 SGD at the base batch, bf16 + split-SGD at the same batch, and LAMB (dense)
+ SGD (tables) at 16x the batch for the same number of epochs. Prints each run's test AUC and the
two gaps the precision issue checks (split-SGD vs fp32 within 0.002; LAMB@16x vs SGD within 0.003).

    python benchmarks/bench_precision_convergence.py --data DIR [--batch 512 --lr 0.5 --epochs 1]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path


def train(data: str, out: Path, flags: list[str]) -> dict:
    metrics = out / "metrics.json"
    cmd = [sys.executable, "-m", "dlrmkit", "train", "--data", data, "--preset", "small", "--no-progress",
           "--run-dir", str(out / "run"), "--metrics-json", str(metrics), *flags]
    print("$", " ".join(cmd[2:]), flush=True)
    subprocess.run(cmd, check=True)
    return json.loads(metrics.read_text())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="dataset folder (dlrmkit synth --preset small --out DIR)")
    p.add_argument("--batch", type=int, default=512, help="base batch size (default 512)")
    p.add_argument("--lr", type=float, default=0.5, help="SGD learning rate at the base batch (default 0.5)")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--scale", type=int, default=16, help="LAMB's batch multiple (default 16)")
    p.add_argument("--lamb-lr", type=float, default=0.02, help="LAMB's peak LR (default 0.02)")
    p.add_argument("--emb-lr", type=float, help="table SGD LR at the large batch (default lr * sqrt(scale))")
    p.add_argument("--warmup-steps", type=int, default=50, help="LAMB run warm-up steps (default 50)")
    p.add_argument("--threads", type=int, default=0)
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="dlrmkit-conv-"))
    common = ["--epochs", str(args.epochs), "--threads", str(args.threads), "--eval-batch-size", "65536"]
    emb_lr = args.emb_lr if args.emb_lr is not None else args.lr * args.scale**0.5
    runs = {
        "fp32-sgd": ["--batch-size", str(args.batch), "--lr", str(args.lr), "--optimizer", "sgd"],
        "bf16-split-sgd": ["--batch-size", str(args.batch), "--lr", str(args.lr), "--optimizer", "split-sgd",
                           "--precision", "bf16"],
        f"lamb-x{args.scale}": ["--batch-size", str(args.batch * args.scale), "--lr", str(emb_lr), "--optimizer",
                                "lamb", "--lamb-lr", str(args.lamb_lr), "--warmup-steps", str(args.warmup_steps)],
    }
    res = {name: train(args.data, tmp / name, common + flags) for name, flags in runs.items()}
    base = res["fp32-sgd"]["auc"]
    for name, m in res.items():
        print(f"{name:16s} AUC {m['auc']:.4f}  (vs fp32 SGD {m['auc'] - base:+.4f})  steps {m['steps']}  "
              f"samples/s {m['samples_per_s']:,.0f}  optimal {m.get('optimal_auc', float('nan')):.4f}")
    split_gap = abs(res["bf16-split-sgd"]["auc"] - base)
    lamb_gap = base - res[f"lamb-x{args.scale}"]["auc"]
    print(f"split-SGD gap {split_gap:.4f} (target <= 0.002): {'OK' if split_gap <= 0.002 else 'MISSED'}")
    print(f"LAMB x{args.scale} shortfall {lamb_gap:+.4f} (target <= 0.003): {'OK' if lamb_gap <= 0.003 else 'MISSED'}")


if __name__ == "__main__":
    main()
