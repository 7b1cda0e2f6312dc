"""What each modelling choice moves, per dataset and seed: trains named variants of the small-data
recipe (dlrmkit.train.recipe) on FeatureSpec datasets, selection on the validation rows as `train`
does, and prints one JSON line per run: validation and test AUC / log loss, the test log loss and
expected calibration error after a temperature fitted on the validation rows, the selected epoch
and the seconds it took. docs/RECIPES.md holds the tables made from these lines.

    PYTHONPATH=src nice -n 10 python benchmarks/quality_grid.py DATA [DATA ...] --seeds 0,1,2 \
        [--variants base,wide-only,...] [--folds K --fold F] > grid.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
import time

# each variant: TrainConfig values over the small-data recipe's
VARIANTS: dict[str, dict] = {
    "base": {},
    "wide-only": {"deep": False},
    "fm-only": {"deep": False, "fm": True},
    "fm": {"fm": True},
    "dropout-0.2": {"dropout": 0.2},
    "adam-dense": {"optimizer": "adam", "lr": 0.05, "embedding_weight_decay": 0.01},
    "l2-0": {"embedding_weight_decay": 0.0},
    "l2-0.03": {"embedding_weight_decay": 0.03},
    "dim-16": {"embedding_dim": 16, "bottom_mlp": [32, 16]},
    "batch-256": {"batch_size": 256},
    "lr-0.1": {"lr": 0.1},
    "regression": {"deep": False, "wide_init": "regression", "patience": 1},
    "from-regression": {"wide_init": "regression"},
    "from-regression-lr-0.01": {"wide_init": "regression", "lr": 0.01},
    "from-regression-l2-0": {"wide_init": "regression", "embedding_weight_decay": 0.0},
    "from-regression-fm-dropout": {"wide_init": "regression", "fm": True, "dropout": 0.2},
    # FuxiCTR's way: Adam for the tables too (every row, every step) with L2 on the tables
    "fm-adam": {"deep": False, "fm": True, **(ADAM := {
        "optimizer": "adam", "embedding_optimizer": "adam", "lr": 0.001, "dense_lr": 0.001,
        "embedding_weight_decay": 0.002, "embedding_dim": 16, "batch_size": 256, "standardize_numerical": True,
    })},  # fmt: skip
    "fm-adam-k2": {"deep": False, "fm": True, **ADAM, "min_id_count": 2},
    "deepfm-adam": {"fm": True, **ADAM, "bottom_mlp": [32, 16]},
    "deepfm-adam-k2": {"fm": True, **ADAM, "bottom_mlp": [32, 16], "min_id_count": 2},
    "regression-k2": {"deep": False, "wide_init": "regression", "patience": 1, "min_id_count": 2},
    "base-k2": {"min_id_count": 2},
    "base-k2-std": {"min_id_count": 2, "standardize_numerical": True},
    "fm-k2-std": {"min_id_count": 2, "standardize_numerical": True, "fm": True},
    "dropout-k2-std": {"min_id_count": 2, "standardize_numerical": True, "dropout": 0.2},
    "base-k2-std-b16": {"min_id_count": 2, "standardize_numerical": True, "numerical_buckets": 16},
    "base-k2-std-b32": {"min_id_count": 2, "standardize_numerical": True, "numerical_buckets": 32},
    "regression-k2-b32": {
        "deep": False, "wide_init": "regression", "patience": 1, "min_id_count": 2, "numerical_buckets": 32,
    },  # fmt: skip
    "regression-k2-b16": {
        "deep": False, "wide_init": "regression", "patience": 1, "min_id_count": 2, "numerical_buckets": 16,
    },  # fmt: skip
    "wider-k2-std": {
        "min_id_count": 2, "standardize_numerical": True, "embedding_dim": 16, "bottom_mlp": [64, 16],
        "top_mlp": [64, 32, 1],
    },  # fmt: skip
    "wider-k2-std-b16": {
        "min_id_count": 2, "standardize_numerical": True, "embedding_dim": 16, "bottom_mlp": [64, 16],
        "top_mlp": [64, 32, 1], "numerical_buckets": 16,
    },  # fmt: skip
    "wider-fm-dropout": {
        "min_id_count": 2, "standardize_numerical": True, "embedding_dim": 16, "bottom_mlp": [64, 16],
        "top_mlp": [64, 32, 1], "fm": True, "dropout": 0.2,
    },  # fmt: skip
    "base-k2-std-b256": {"min_id_count": 2, "standardize_numerical": True, "numerical_buckets": 256},
    "fm-k2-std-b256": {"min_id_count": 2, "standardize_numerical": True, "numerical_buckets": 256, "fm": True},
    "big-b256": {
        "min_id_count": 2, "standardize_numerical": True, "numerical_buckets": 256, "embedding_dim": 16,
        "bottom_mlp": [64, 16], "top_mlp": [400, 400, 400, 1], "optimizer": "adam", "dense_lr": 0.001,
    },  # fmt: skip
    "big-fm-b256": {
        "min_id_count": 2, "standardize_numerical": True, "numerical_buckets": 256, "embedding_dim": 16,
        "bottom_mlp": [64, 16], "top_mlp": [400, 400, 400, 1], "optimizer": "adam", "dense_lr": 0.001,
        "fm": True,
    },  # fmt: skip
    "deepfm-b256": {
        "min_id_count": 2, "standardize_numerical": True, "numerical_buckets": 256, "embedding_dim": 16,
        "bottom_mlp": [64, 16], "top_mlp": [400, 400, 400, 1], "optimizer": "adam", "dense_lr": 0.001,
        "fm": True, "interaction": "cat",
    },  # fmt: skip
    # FuxiCTR's DeepFM: Adam over whole tables with their L2, the embeddings concatenated
    "fuxi-deepfm-b256": {
        "min_id_count": 2, "standardize_numerical": True, "numerical_buckets": 256, "embedding_dim": 16,
        "bottom_mlp": [64, 16], "top_mlp": [400, 400, 400, 1], "optimizer": "adam", "dense_lr": 0.001,
        "fm": True, "interaction": "cat", "embedding_optimizer": "adam", "lr": 0.001, "embedding_weight_decay": 0.01,
    },  # fmt: skip
    "big-fm-b256-e4": {
        "min_id_count": 2, "standardize_numerical": True, "numerical_buckets": 256, "embedding_dim": 16,
        "bottom_mlp": [64, 16], "top_mlp": [400, 400, 400, 1], "optimizer": "adam", "dense_lr": 0.001,
        "fm": True, "evals_per_epoch": 4,
    },  # fmt: skip
    "base-k2-std-b256-e4": {
        "min_id_count": 2, "standardize_numerical": True, "numerical_buckets": 256, "evals_per_epoch": 4,
    },  # fmt: skip
    "regression-k2-std-b32": {
        "deep": False, "wide_init": "regression", "patience": 1, "min_id_count": 2, "standardize_numerical": True,
        "numerical_buckets": 32,
    },  # fmt: skip
    "regression-k2-std-b256": {
        "deep": False, "wide_init": "regression", "patience": 1, "min_id_count": 2, "standardize_numerical": True,
        "numerical_buckets": 256,
    },  # fmt: skip
    "regression-k1-std": {  # the search's `regression` candidate: every id its own weight
        "deep": False, "wide_init": "regression", "patience": 1, "min_id_count": 1, "standardize_numerical": True,
    },  # fmt: skip
    "regression-k2-std": {
        "deep": False, "wide_init": "regression", "patience": 1, "min_id_count": 2, "standardize_numerical": True,
    },  # fmt: skip
    "deepfm-adam-dropout": {
        "fm": True,
        "optimizer": "adam",
        "lr": 0.05,
        "embedding_weight_decay": 0.01,
        "dropout": 0.2,
    },
}
# FuxiCTR's DeepFM at FuxiCTR's batch of 512 (`-b512`), and with its learning rate x0.1 at each
# plateau too (`-plateau`: the `deepfm, adam, lr decay` candidate)
VARIANTS["deepfm-adam-b512"] = {**VARIANTS["fuxi-deepfm-b256"], "batch_size": 512, "patience": 2}
VARIANTS["deepfm-adam-plateau"] = {**VARIANTS["deepfm-adam-b512"], "lr_decay_on_plateau": 0.1}
# the same training for FuxiCTR's FM (no deep part) and for a DCNv2 cross network in place of the FM
VARIANTS["fm-adam-plateau"] = {**VARIANTS["deepfm-adam-plateau"], "deep": False, "interaction": None}
VARIANTS["dcn-adam-plateau"] = {**VARIANTS["deepfm-adam-plateau"], "fm": False, "interaction": "dcn", "dcn_layers": 3}


def run_one(data: str, seed: int, values: dict, dump: str | None = None) -> dict:
    import numpy as np

    from dlrmkit.config import TrainConfig
    from dlrmkit.data.split_binary import open_dataset
    from dlrmkit.metrics import log_loss, roc_auc
    from dlrmkit.train import recipe
    from dlrmkit.train.calibration import expected_calibration_error, fit_scale, logits_of
    from dlrmkit.train.trainer import Trainer

    cfg = TrainConfig.of(data=data, seed=seed, progress=False, final_checkpoint=False, threads=1, **values)
    spec, train, _ = open_dataset(data)
    base = recipe.choose(spec, train)
    base.values.pop("calibration", None)
    recipe.fill(cfg, base)
    t0 = time.perf_counter()
    trainer = Trainer(cfg)
    test = trainer.test_set
    trainer.test_set = test.window(0, 0, "test")  # scored below, once, by this script
    m = trainer.fit()
    seconds = time.perf_counter() - t0
    zv, yv = logits_of(trainer.model, trainer.val_set, 16384)
    zt, yt = logits_of(trainer.model, test, 16384)
    a = fit_scale(zv, yv)
    if dump:  # each row's logit, validation and test, for blends measured afterwards
        np.savez(dump, zv=zv, yv=yv, zt=zt, yt=yt)
    val_logloss_t = log_loss(yv, 1 / (1 + np.exp(-a * zv.astype(np.float64))))
    p, pc = 1 / (1 + np.exp(-zt.astype(np.float64))), 1 / (1 + np.exp(-a * zt.astype(np.float64)))
    return {
        "val_auc": m["val_auc"],
        "val_logloss": m["val_logloss"],
        "val_logloss_t": val_logloss_t,
        "test_auc": roc_auc(yt, p),
        "test_logloss": log_loss(yt, p),
        "test_logloss_calibrated": log_loss(yt, pc),
        "test_ece": expected_calibration_error(yt, p),
        "test_ece_calibrated": expected_calibration_error(yt, pc),
        "temperature": 1 / a,
        "selected_epoch": m["selected_step"] / max(1, m["steps"] / max(m["epochs"], 1e-9)),
        "seconds": seconds,
    }


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("data", nargs="+")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--dump", help="folder: each run's validation and test logits as DATA-VARIANT-SEED.npz")
    p.add_argument("--folds", type=int, help="with --fold: train the model fold F of K validates (train --folds)")
    p.add_argument("--fold", type=int)
    args = p.parse_args(argv)
    fold = {"folds": args.folds, "fold": args.fold} if args.fold else {}
    for data in args.data:
        for name in args.variants.split(","):
            for seed in (int(s) for s in args.seeds.split(",")):
                dump = args.dump and f"{args.dump}/{data.rstrip('/').split('/')[-1]}-{name}-{seed}.npz"
                out = {"data": data, "variant": name, "seed": seed, **run_one(data, seed, {**VARIANTS[name], **fold}, dump)}
                print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
