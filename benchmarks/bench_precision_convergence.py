"""Convergence of low-precision and large-batch training on a synthetic dataset (default: the
`small` preset): fp32 SGD at the base batch, bf16 + split-SGD at the same batch, and LAMB (dense)
+ SGD or row-wise Adagrad (tables, --emb-optimizer) at 16x the batch for the same number of
epochs. Prints each run's test AUC and the two gaps the precision issue checks (split-SGD vs fp32
within 0.002; LAMB@16x vs SGD within 0.003).

    python benchmarks/bench_precision_convergence.py --data DIR [--batch 512 --lr 0.5 --epochs 1]
    # LAMB@16x with row-wise Adagrad tables (1 epoch):
    python benchmarks/bench_precision_convergence.py --data DIR --emb-optimizer rowwise-adagrad \\
        --emb-lr 0.03 --lamb-lr 0.005 --warmup-steps 5
    # only the LAMB run, compared with an fp32 SGD AUC measured before:
    python benchmarks/bench_precision_convergence.py --data DIR --skip-baselines --base-auc 0.7088 ...
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
    cmd = [
        sys.executable,
        "-m",
        "dlrmkit",
        "train",
        "--data",
        data,
        "--preset",
        "small",
        "--no-progress",
        "--run-dir",
        str(out / "run"),
        "--metrics-json",
        str(metrics),
        *flags,
    ]
    print("$", " ".join(cmd[2:]), flush=True)
    subprocess.run(cmd, check=True)
    return json.loads(metrics.read_text())


def main() -> None:
    p = argparse.ArgumentParser(
        allow_abbrev=False, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--data", required=True, help="dataset folder (dlrmkit synth --preset small --out DIR)")
    p.add_argument("--batch", type=int, default=512, help="base batch size (default 512)")
    p.add_argument("--lr", type=float, default=0.5, help="SGD learning rate at the base batch (default 0.5)")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--scale", type=int, default=16, help="LAMB's batch multiple (default 16)")
    p.add_argument("--lamb-lr", type=float, default=0.02, help="LAMB's peak LR (default 0.02)")
    p.add_argument(
        "--emb-optimizer",
        choices=["sgd", "adagrad", "rowwise-adagrad"],
        default="sgd",
        help="LAMB run's table optimizer (default sgd)",
    )
    p.add_argument(
        "--emb-lr",
        type=float,
        help="LAMB run's table LR (default: lr * sqrt(scale) for sgd; required for the Adagrads)",
    )
    p.add_argument("--warmup-steps", type=int, default=50, help="LAMB run warm-up steps (default 50)")
    p.add_argument("--decay-start", type=int, help="LAMB run: step where power-2 LR decay starts")
    p.add_argument("--decay-steps", type=int, help="LAMB run: steps of LR decay to 0")
    p.add_argument("--seed", type=int, default=0, help="seed of every run (default 0)")
    p.add_argument(
        "--skip-baselines",
        action="store_true",
        help="run only LAMB (for searching); give --base-auc to print its shortfall",
    )
    p.add_argument("--base-auc", type=float, help="fp32 SGD AUC to compare with under --skip-baselines")
    p.add_argument("--threads", type=int, default=0)
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="dlrmkit-conv-"))
    common = [
        "--epochs",
        str(args.epochs),
        "--threads",
        str(args.threads),
        "--eval-batch-size",
        "65536",
        "--seed",
        str(args.seed),
    ]
    if args.emb_lr is not None:
        emb_lr = args.emb_lr
    elif args.emb_optimizer == "sgd":
        emb_lr = args.lr * args.scale**0.5
    else:
        p.error(f"--emb-optimizer {args.emb_optimizer} needs --emb-lr (e.g. 0.03 for rowwise-adagrad)")
    if args.skip_baselines and args.base_auc is None:
        print("note: --skip-baselines without --base-auc prints no shortfall", flush=True)
    lamb = f"lamb-x{args.scale}"
    lamb_flags = [
        "--batch-size",
        str(args.batch * args.scale),
        "--lr",
        str(emb_lr),
        "--optimizer",
        "lamb",
        "--embedding-optimizer",
        args.emb_optimizer,
        "--lamb-lr",
        str(args.lamb_lr),
        "--warmup-steps",
        str(args.warmup_steps),
    ]
    if args.decay_start is not None:
        lamb_flags += ["--decay-start", str(args.decay_start)]
    if args.decay_steps is not None:
        lamb_flags += ["--decay-steps", str(args.decay_steps)]
    runs = (
        {}
        if args.skip_baselines
        else {
            "fp32-sgd": ["--batch-size", str(args.batch), "--lr", str(args.lr), "--optimizer", "sgd"],
            "bf16-split-sgd": [
                "--batch-size",
                str(args.batch),
                "--lr",
                str(args.lr),
                "--optimizer",
                "split-sgd",
                "--precision",
                "bf16",
            ],
        }
    )
    runs[lamb] = lamb_flags
    res = {name: train(args.data, tmp / name, common + flags) for name, flags in runs.items()}
    base = res["fp32-sgd"]["auc"] if "fp32-sgd" in res else args.base_auc
    for name, m in res.items():
        vs = f"(vs fp32 SGD {m['auc'] - base:+.4f})  " if base is not None else ""
        print(
            f"{name:16s} AUC {m['auc']:.4f}  {vs}steps {m['steps']}  "
            f"samples/s {m['samples_per_s']:,.0f}  optimal {m.get('optimal_auc', float('nan')):.4f}"
        )
    if "bf16-split-sgd" in res:
        split_gap = abs(res["bf16-split-sgd"]["auc"] - base)
        print(f"split-SGD gap {split_gap:.4f} (target <= 0.002): {'OK' if split_gap <= 0.002 else 'MISSED'}")
    if base is not None:
        lamb_gap = base - res[lamb]["auc"]
        print(
            f"LAMB x{args.scale} ({args.emb_optimizer} tables) shortfall {lamb_gap:+.4f} (target <= 0.003): "
            f"{'OK' if lamb_gap <= 0.003 else 'MISSED'}"
        )


if __name__ == "__main__":
    main()
