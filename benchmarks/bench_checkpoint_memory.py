"""Peak resident memory of saving and loading a checkpoint, against the bytes of the tables and
their optimizer state. Each phase runs in its own process so its peak (VmHWM) is its own.

    python benchmarks/bench_checkpoint_memory.py --tables 3000000,1000000 --dim 16 --optimizer adagrad

prints, per phase, the state bytes, RSS before, peak RSS and what the phase added beyond the state
(for a load, the state itself is allocated while loading, so it is subtracted)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict


def rss_gb(field: str) -> float:
    """VmRSS (now) or VmHWM (peak since start or since the last reset) of this process, GB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024 / 1e9
    return float("nan")


def reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:  # "5": reset VmHWM to the current RSS (Linux)
        f.write("5")


def build(tables: list[int], dim: int, optimizer: str):
    import torch

    from dlrmkit.model.dlrm import DLRM, ModelConfig
    from dlrmkit.optim.build import build_optimizers

    cfg = ModelConfig(num_numerical=13, table_sizes=tables, embedding_dim=dim, bottom_mlp=[64, dim], top_mlp=[64, 1])
    model = DLRM(cfg)
    model.reset_parameters(0)
    opts = build_optimizers(model, optimizer, 0.1)
    state = sum(
        v.numel() * v.element_size() for o in opts for s in o.state.values() for v in s.values() if torch.is_tensor(v)
    )
    tables_bytes = sum(p.numel() * p.element_size() for p in model.embeddings.parameters())
    return model, cfg, opts, tables_bytes + state


def phase(args: argparse.Namespace) -> None:
    from dlrmkit.checkpoint import save_load as ckpt

    tables = [int(x) for x in args.tables.split(",")]
    if args.phase == "save":
        model, cfg, opts, nbytes = build(tables, args.dim, args.optimizer)
        tensors, extras = ckpt.model_state(model, opts)
        before = rss_gb("VmRSS")
        reset_peak()
        t0 = time.perf_counter()
        ckpt.save_checkpoint(args.dir, 1, tensors, {"model_config": asdict(cfg), **extras})
        took = time.perf_counter() - t0
    else:
        import torch

        before = rss_gb("VmRSS")
        t0 = time.perf_counter()
        model, _ = ckpt.load_single_process_model(args.dir)
        took = time.perf_counter() - t0
        nbytes = sum(p.numel() * p.element_size() for p in model.embeddings.parameters())
        del torch
    peak, gb = rss_gb("VmHWM"), nbytes / 1e9
    # save: the state is already resident before; load: it is allocated while loading
    added = peak - before - (gb if args.phase == "load" else 0.0)
    print(
        f"{args.phase}: state {gb:.2f} GB  rss before {before:.2f} GB  peak {peak:.2f} GB  "
        f"added beyond the state {added:+.2f} GB ({added / gb:+.0%})  {took:.1f} s",
        flush=True,
    )


def main() -> None:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__)
    p.add_argument("--tables", default="3000000,1000000", help="table rows, comma-separated")
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--optimizer", default="adagrad", choices=["sgd", "adagrad"])
    p.add_argument("--dir", help="checkpoint folder (default: a temporary one)")
    p.add_argument("--phase", choices=["save", "load"], help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.phase:
        return phase(args)
    with tempfile.TemporaryDirectory() as tmp:
        d = args.dir or os.path.join(tmp, "C")
        for ph in ("save", "load"):
            cmd = [
                sys.executable,
                __file__,
                "--tables",
                args.tables,
                "--dim",
                str(args.dim),
                "--optimizer",
                args.optimizer,
                "--dir",
                d,
                "--phase",
                ph,
            ]
            subprocess.run(cmd, check=True)


if __name__ == "__main__":
    main()
