"""The measuring sticks beside dlrmkit's default, on the same FeatureSpec splits (the val mapping,
else the last 10% of the train rows, as `train` holds them out; the test rows scored once, every
choice made on the validation rows): scikit-learn's LogisticRegression on one-hot ids plus
standardized numerical features with C chosen on the validation rows, and for raw numbers (values
past 20) whether to take their signed log or the numbers as they are (fitted on the train rows,
as `dlrmkit baseline` does), and LightGBM with the ids as categorical features, its leaves and
learning rate chosen on the validation rows and its rounds stopped early on them. Prints one JSON
line per dataset and model. Runs in a separate environment holding scikit-learn and LightGBM
(they are measuring sticks, not dependencies; torch is not needed):

    python3 -m venv /tmp/peers && /tmp/peers/bin/pip install -c constraints.txt scikit-learn lightgbm pyyaml
    PYTHONPATH=src nice -n 10 /tmp/peers/bin/python benchmarks/quality_peers.py DATA [DATA ...]

FuxiCTR's LR, FM, DNN, DeepFM, DCNv2 and DLRM on the same splits: benchmarks/quality_fuxictr.py.
"""

from __future__ import annotations

import json
import sys

import numpy as np

C_GRID = (0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0)  # dlrmkit.train.regression.C_GRID
RAW_NUMERICAL = 20.0  # dlrmkit.data.split_binary.RAW_NUMERICAL


def splits(data: str):
    from dlrmkit.data.split_binary import open_dataset, open_val

    spec, train, test = open_dataset(data)
    val = open_val(spec)
    if val is None:
        held = min(int(round(len(train) * 0.1)), 1_000_000)
        train, val = train.window(0, len(train) - held), train.window(len(train) - held, len(train), "val")
    return [d.read(0, len(d), check_ids=False) for d in (train, val, test)]


def raw_numbers(parts) -> bool:
    """Values past RAW_NUMERICAL in the train rows: counts or measurements, as the model reads them."""
    return bool(parts[0].dense.size) and float(np.abs(parts[0].dense[:100_000]).max()) > RAW_NUMERICAL


def numerical(parts, signed_log: bool | None = None):
    """Each split's numerical features as float64; raw ones as sign(x) log(1+|x|) unless
    signed_log is False (None: by raw_numbers)."""
    dense = [np.nan_to_num(p.dense.astype(np.float64), nan=0.0, posinf=65504.0, neginf=-65504.0) for p in parts]
    if raw_numbers(parts) if signed_log is None else signed_log:
        dense = [np.sign(d) * np.log1p(np.abs(d)) for d in dense]
    return dense


def pick(scores):
    """Best validation AUC, near-ties (0.001) by log loss: as dlrmkit chooses."""
    top = max(s["val_auc"] for s in scores)
    return min((s for s in scores if s["val_auc"] >= top - 0.001), key=lambda s: s["val_logloss"])


def logistic(parts) -> dict:
    import scipy.sparse as sp
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import log_loss, roc_auc_score
    from sklearn.preprocessing import OneHotEncoder

    # a log without categorical columns has no one-hot block
    enc = OneHotEncoder(handle_unknown="ignore").fit(parts[0].ids) if parts[0].ids.shape[1] else None
    ys = [p.labels.astype(np.int64) for p in parts]
    scores = []
    # raw numbers: both their signed log and the numbers as they are, chosen on the validation rows
    # with C, as `dlrmkit baseline` chooses
    for signed_log in (True, False) if raw_numbers(parts) else (False,):
        dense = numerical(parts, signed_log)
        mu, sd = dense[0].mean(0), dense[0].std(0)
        sd = np.where(sd > 1e-12, sd, 1.0)
        ids = [enc.transform(p.ids) if enc else None for p in parts]
        xs = [
            sp.hstack([b for b in (i, sp.csr_matrix((d - mu) / sd)) if b is not None]).tocsr()
            for i, d in zip(ids, dense)
        ]
        for c in C_GRID:
            m = LogisticRegression(C=c, max_iter=5000).fit(xs[0], ys[0])
            pv, pt = m.predict_proba(xs[1])[:, 1], m.predict_proba(xs[2])[:, 1]
            scores.append(
                {
                    "c": c,
                    "numbers": "signed log" if signed_log else "as they are",
                    "val_auc": roc_auc_score(ys[1], pv),
                    "val_logloss": log_loss(ys[1], pv),
                    "test_auc": roc_auc_score(ys[2], pt),
                    "test_logloss": log_loss(ys[2], pt),
                }
            )
    return {"model": "sklearn LogisticRegression, C and the numbers' form on val", **pick(scores)}


def lightgbm(parts) -> dict:
    import lightgbm as lgb
    from sklearn.metrics import log_loss, roc_auc_score

    dense = numerical(parts)
    xs = [np.hstack([p.ids.astype(np.float64), d]) for p, d in zip(parts, dense)]
    ys = [p.labels.astype(np.int64) for p in parts]
    cats = list(range(parts[0].ids.shape[1]))
    scores = []
    for leaves in (7, 15, 31, 63):
        for lr in (0.03, 0.1):
            m = lgb.LGBMClassifier(
                n_estimators=2000,
                learning_rate=lr,
                num_leaves=leaves,
                min_child_samples=20,
                cat_smooth=10,
                subsample=0.8,
                subsample_freq=1,
                colsample_bytree=0.8,
                verbose=-1,
                n_jobs=1,
            )
            m.fit(
                xs[0],
                ys[0],
                eval_set=[(xs[1], ys[1])],
                eval_metric="auc",
                categorical_feature=cats,
                callbacks=[lgb.early_stopping(50, verbose=False)],
            )
            pv, pt = m.predict_proba(xs[1])[:, 1], m.predict_proba(xs[2])[:, 1]
            scores.append(
                {
                    "leaves": leaves,
                    "lr": lr,
                    "rounds": int(m.best_iteration_ or 0),
                    "val_auc": roc_auc_score(ys[1], pv),
                    "val_logloss": log_loss(ys[1], pv),
                    "test_auc": roc_auc_score(ys[2], pt),
                    "test_logloss": log_loss(ys[2], pt),
                }
            )
    return {"model": "LightGBM, leaves and lr on val, early-stopped on val", **pick(scores)}


def main(argv: list[str]) -> int:
    for data in argv:
        parts = splits(data)
        for fit in (logistic, lightgbm):
            print(json.dumps({"data": data, **fit(parts)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
