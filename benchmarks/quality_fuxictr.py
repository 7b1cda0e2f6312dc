"""FuxiCTR's LR, FM, DNN, DeepFM, DCNv2 and DLRM as measuring sticks beside dlrmkit's default, on
the same FeatureSpec splits as `quality_peers.py` (the val mapping, else the last 10% of the train
rows; every choice made on the validation rows, the test rows scored once per chosen model).

The models are built from FuxiCTR's own layers and trained by FuxiCTR's own BaseModel (Adam at
1e-3, early stopping on validation AUC with patience 2, learning rate x0.1 on each plateau, the best
epoch's weights restored, FuxiCTR's embedding init and its embedding regularizer); they follow the
structure of FuxiCTR's model zoo, which its PyPI package does not ship:

    LR      FuxiCTR LogisticRegression layer (1-dim embeddings + bias)
    FM      FactorizationMachine layer (LR + pairwise inner products)
    DNN     embeddings -> MLP_Block [400, 400, 400] -> 1
    DeepFM  FactorizationMachine + MLP_Block [400, 400, 400]
    DCNv2   parallel: CrossNetV2 (3 layers) beside MLP_Block [400, 400, 400], concatenated -> 1
    DLRM    bottom MLP_Block [400, 400, 400] on the numerical features -> one embedding, dot
            interaction of all embeddings, top MLP_Block [400, 400, 400] -> 1

The features are prepared as FuxiCTR's FeatureProcessor would: each categorical id (dlrmkit's 0,
missing or unseen, is one more value) counted on the train rows, kept when it occurs at least
min_categr_count times, the others mapped to one OOV id (index 0 is FuxiCTR's padding, unused);
numerical features log-compressed when raw (as quality_peers.numerical()) and standardized on the
train rows (FuxiCTR's StandardScaler), fed as numeric features (a 1->dim linear embedding, which
FuxiCTR initializes xavier-normal: std 1 for LR's 1->1 weights, a large random start on small data).
With --numerical buckets, they are instead FuxiCTR's Criteo recipe: each one a categorical feature
of convert_to_bucket(v) = int(floor(log(v)^2)) if v > 2 else int(v), v the raw value (recovered
from the stored sign(v)*log1p(|v|), as the Criteo FeatureSpec data holds it); with --numerical
values, each stored value (to 0.01) is a categorical value (the column declared categorical in
FuxiCTR's feature_cols).

Search, per model, coordinate-wise on validation AUC (near-ties of 0.001 by log loss, as
quality_peers.pick()): embedding_regularizer over REGS at embedding_dim 16, min_categr_count 1,
net_dropout 0 (and REGS_MORE in turn while the largest one tried is the best); then min_categr_count 2 and 10; then embedding_dim 10; then (deep models) net_dropout
0.2; each stage keeps the best configuration so far. Batch size by train rows: 128 under 10k, 256
under 50k, else 512; at most 20 epochs. Prints one JSON line per (dataset, variant, model) with the
chosen configuration, its validation and test AUC and log loss, and seconds; --trace FILE writes one
line per configuration tried.

Install (a scratch venv; FuxiCTR 2.3.10's ray dependency is only needed by its parquet pipeline,
which is not used here, so it is installed without dependencies and ray is stubbed):

    python3 -m venv /work/scratch-fuxi
    /work/scratch-fuxi/bin/pip install -c constraints.txt torch==2.13.0
    /work/scratch-fuxi/bin/pip install -c constraints.txt --no-deps fuxictr==2.3.10
    /work/scratch-fuxi/bin/pip install -c constraints.txt pandas pyyaml scikit-learn numpy h5py tqdm \
        pyarrow polars pydantic lightgbm

Run:

    PYTHONPATH=src nice -n 10 /work/scratch-fuxi/bin/python benchmarks/quality_fuxictr.py \
        [--models LR,FM,DNN,DeepFM,DCNv2,DLRM] [--numerical numeric|buckets|values] [--trace FILE] [--seed S] \
        DATA [DATA ...]
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import tempfile
import time
import types
from collections import OrderedDict

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from quality_peers import numerical, pick, splits  # noqa: E402

REGS = (0.0, 1e-4, 1e-3, 1e-2, 5e-2)
REGS_MORE = (0.1, 0.2, 0.5)
HIDDEN = [400, 400, 400]
MODELS = ("LR", "FM", "DNN", "DeepFM", "DCNv2", "DLRM")
DEEP = ("DNN", "DeepFM", "DCNv2", "DLRM")
MAX_EPOCHS = 20
SEED = 2019


def _stub_ray() -> None:
    """fuxictr.preprocess and its parquet loader import ray at module level; nothing here uses it."""
    if "ray" in sys.modules:
        return
    try:
        import ray  # noqa: F401

        return
    except ImportError:
        pass

    class _Any:
        def __init__(self, *a, **k):
            pass

    def _module(name):
        m = types.ModuleType(name)

        def attr(a):
            if a.startswith("__"):
                raise AttributeError(a)
            return _Any

        m.__getattr__ = attr
        sys.modules[name] = m
        return m

    for name in ("ray", "ray.data", "ray.data.datasource", "ray.data.datasource.filename_provider"):
        _module(name)


_stub_ray()
import torch  # noqa: E402
from torch import nn  # noqa: E402
from fuxictr.features import FeatureMap  # noqa: E402
from fuxictr.pytorch.layers import (  # noqa: E402
    CrossNetV2,
    FactorizationMachine,
    FeatureEmbedding,
    InnerProductInteraction,
    LogisticRegression,
    MLP_Block,
)
from fuxictr.pytorch.models import BaseModel  # noqa: E402
from fuxictr.pytorch.torch_utils import seed_everything  # noqa: E402


# ---------------------------------------------------------------- features


def bucket(x: np.ndarray) -> np.ndarray:
    """FuxiCTR's Criteo convert_to_bucket on the raw value behind dlrmkit's sign(v)*log1p(|v|)."""
    v = np.sign(x) * np.expm1(np.abs(x.astype(np.float64)))
    v = np.where(np.abs(v) < 1000, np.round(v), v)
    big = v > 2
    out = np.where(big, np.floor(np.log(np.where(big, v, 3.0)) ** 2), np.trunc(v))
    return out.astype(np.int64)


def encode(columns, min_count: int):
    """Categorical columns (train, val, test) -> FuxiCTR-style ids: 0 padding, 1..m kept, m+1 OOV."""
    tr, va, te = columns
    values, counts = np.unique(tr, return_counts=True)
    kept = values[counts >= min_count]
    oov = len(kept) + 1

    def enc(c):
        pos = np.searchsorted(kept, c)
        pos = np.clip(pos, 0, max(len(kept) - 1, 0))
        hit = (kept[pos] == c) if len(kept) else np.zeros(len(c), bool)
        return np.where(hit, pos + 1, oov).astype(np.int64)

    return [enc(c) for c in (tr, va, te)], oov + 1


def features(parts, min_count: int, numerical_as: str):
    """(specs, [train, val, test] dicts of tensors incl. 'label')."""
    specs = OrderedDict()
    cols = [OrderedDict() for _ in parts]
    ids = [p.ids.astype(np.int64) for p in parts]
    dense = numerical(parts)
    n_num = dense[0].shape[1]
    if numerical_as in ("buckets", "values"):
        raw = [np.nan_to_num(p.dense.astype(np.float64)) for p in parts]
        conv = bucket if numerical_as == "buckets" else lambda r: np.round(r * 100).astype(np.int64)
        for j in range(n_num):
            enc, vocab = encode([conv(r[:, j]) for r in raw], min_count)
            specs[f"I{j + 1}"] = {"type": "categorical", "source": "", "vocab_size": vocab, "padding_idx": 0}
            for c, e in zip(cols, enc):
                c[f"I{j + 1}"] = torch.from_numpy(e)
    else:
        mu, sd = dense[0].mean(0), dense[0].std(0)
        sd = np.where(sd > 1e-12, sd, 1.0)
        for j in range(n_num):
            specs[f"I{j + 1}"] = {"type": "numeric", "source": ""}
            for c, d in zip(cols, dense):
                c[f"I{j + 1}"] = torch.from_numpy(((d[:, j] - mu[j]) / sd[j]).astype(np.float32))
    for j in range(ids[0].shape[1]):
        enc, vocab = encode([i[:, j] for i in ids], min_count)
        specs[f"C{j + 1}"] = {"type": "categorical", "source": "", "vocab_size": vocab, "padding_idx": 0}
        for c, e in zip(cols, enc):
            c[f"C{j + 1}"] = torch.from_numpy(e)
    for c, p in zip(cols, parts):
        c["label"] = torch.from_numpy(p.labels.astype(np.float32))
    return specs, cols


def feature_map(specs, dim: int) -> FeatureMap:
    fmap = FeatureMap("d", tempfile.gettempdir())
    fmap.features = OrderedDict((k, dict(v)) for k, v in specs.items())
    fmap.labels = ["label"]
    fmap.default_emb_dim = dim
    fmap.num_fields = fmap.get_num_fields()
    fmap.set_column_index()
    return fmap


class Batches:
    """What FuxiCTR's BatchCollator yields: one dict of column tensors per batch."""

    def __init__(self, cols, batch: int, shuffle: bool, seed: int = SEED):
        self.cols, self.batch, self.shuffle = cols, batch, shuffle
        self.n = len(cols["label"])
        self.gen = torch.Generator().manual_seed(seed)

    def __len__(self):
        return math.ceil(self.n / self.batch)

    def __iter__(self):
        order = torch.randperm(self.n, generator=self.gen) if self.shuffle else None
        for s in range(0, self.n, self.batch):
            if order is None:
                yield {k: v[s : s + self.batch] for k, v in self.cols.items()}
            else:
                idx = order[s : s + self.batch]
                yield {k: v[idx] for k, v in self.cols.items()}


# ---------------------------------------------------------------- models


def _base_kwargs(cfg, root):
    return dict(
        model_root=root,
        metrics=["logloss", "AUC"],
        verbose=0,
        embedding_regularizer=cfg["reg"] or None,
        net_regularizer=None,
        early_stop_patience=2,
    )


class _Model(BaseModel):
    def _finish(self, lr):
        self.compile("adam", "binary_crossentropy", lr)
        self.reset_parameters()
        self.model_to_device()


class LR(_Model):
    def __init__(self, fmap, cfg, root):
        super().__init__(fmap, model_id="LR", **_base_kwargs(cfg, root))
        self.lr_layer = LogisticRegression(fmap, use_bias=True)
        self._finish(cfg["lr"])

    def forward(self, inputs):
        return {"y_pred": self.output_activation(self.lr_layer(self.get_inputs(inputs)))}


class FM(_Model):
    def __init__(self, fmap, cfg, root):
        super().__init__(fmap, model_id="FM", **_base_kwargs(cfg, root))
        self.embedding_layer = FeatureEmbedding(fmap, cfg["dim"])
        self.fm = FactorizationMachine(fmap)
        self._finish(cfg["lr"])

    def forward(self, inputs):
        X = self.get_inputs(inputs)
        return {"y_pred": self.output_activation(self.fm(X, self.embedding_layer(X)))}


def _mlp(input_dim, cfg, output_dim=1):
    return MLP_Block(
        input_dim=input_dim,
        output_dim=output_dim,
        hidden_units=HIDDEN,
        hidden_activations="ReLU",
        output_activation=None,
        dropout_rates=cfg["dropout"],
        batch_norm=False,
    )


class DNN(_Model):
    def __init__(self, fmap, cfg, root):
        super().__init__(fmap, model_id="DNN", **_base_kwargs(cfg, root))
        self.embedding_layer = FeatureEmbedding(fmap, cfg["dim"])
        self.mlp = _mlp(fmap.sum_emb_out_dim(), cfg)
        self._finish(cfg["lr"])

    def forward(self, inputs):
        emb = self.embedding_layer(self.get_inputs(inputs), flatten_emb=True)
        return {"y_pred": self.output_activation(self.mlp(emb))}


class DeepFM(_Model):
    def __init__(self, fmap, cfg, root):
        super().__init__(fmap, model_id="DeepFM", **_base_kwargs(cfg, root))
        self.embedding_layer = FeatureEmbedding(fmap, cfg["dim"])
        self.fm = FactorizationMachine(fmap)
        self.mlp = _mlp(fmap.sum_emb_out_dim(), cfg)
        self._finish(cfg["lr"])

    def forward(self, inputs):
        X = self.get_inputs(inputs)
        emb = self.embedding_layer(X)
        y = self.fm(X, emb) + self.mlp(emb.flatten(start_dim=1))
        return {"y_pred": self.output_activation(y)}


class DCNv2(_Model):
    def __init__(self, fmap, cfg, root):
        super().__init__(fmap, model_id="DCNv2", **_base_kwargs(cfg, root))
        self.embedding_layer = FeatureEmbedding(fmap, cfg["dim"])
        d = fmap.sum_emb_out_dim()
        self.crossnet = CrossNetV2(d, 3)
        self.parallel_dnn = _mlp(d, cfg, output_dim=None)
        self.fc = nn.Linear(d + HIDDEN[-1], 1)
        self._finish(cfg["lr"])

    def forward(self, inputs):
        emb = self.embedding_layer(self.get_inputs(inputs), flatten_emb=True)
        out = torch.cat([self.crossnet(emb), self.parallel_dnn(emb)], dim=-1)
        return {"y_pred": self.output_activation(self.fc(out))}


class DLRM(_Model):
    def __init__(self, fmap, cfg, root):
        super().__init__(fmap, model_id="DLRM", **_base_kwargs(cfg, root))
        dim = cfg["dim"]
        self.dense_feats = [f for f, s in fmap.features.items() if s["type"] == "numeric"]
        self.embedding_layer = FeatureEmbedding(fmap, dim, not_required_feature_columns=self.dense_feats or None)
        n_fields = fmap.num_fields - len(self.dense_feats) + (1 if self.dense_feats else 0)
        if self.dense_feats:
            self.bottom_mlp = MLP_Block(
                input_dim=len(self.dense_feats),
                output_dim=dim,
                hidden_units=HIDDEN,
                hidden_activations="ReLU",
                output_activation="ReLU",
                dropout_rates=cfg["dropout"],
            )
        self.interact = InnerProductInteraction(num_fields=n_fields, output="inner_product")
        top_in = n_fields * (n_fields - 1) // 2 + (dim if self.dense_feats else 0)
        self.top_mlp = MLP_Block(
            input_dim=top_in,
            output_dim=1,
            hidden_units=HIDDEN,
            hidden_activations="ReLU",
            output_activation=None,
            dropout_rates=cfg["dropout"],
        )
        self._finish(cfg["lr"])

    def forward(self, inputs):
        X = self.get_inputs(inputs)
        emb = self.embedding_layer(X)
        if self.dense_feats:
            dense = torch.stack([X[k].float() for k in self.dense_feats], dim=-1)
            d = self.bottom_mlp(dense)
            emb = torch.cat([emb, d.unsqueeze(1)], dim=1)
            out = torch.cat([self.interact(emb), d], dim=-1)
        else:
            out = self.interact(emb)
        return {"y_pred": self.output_activation(self.top_mlp(out))}


# ---------------------------------------------------------------- search


def batch_size(n: int) -> int:
    return 128 if n < 10_000 else 256 if n < 50_000 else 512


class Runner:
    def __init__(self, parts, numerical_as: str, root: str, seed: int = SEED):
        self.parts, self.numerical_as, self.root, self.seed = parts, numerical_as, root, seed
        self.cache = {}
        self.batch = batch_size(len(parts[0].labels))

    def data(self, min_count):
        if min_count not in self.cache:
            self.cache[min_count] = features(self.parts, min_count, self.numerical_as)
        return self.cache[min_count]

    def fit(self, name: str, cfg: dict) -> dict:
        specs, cols = self.data(cfg["mcc"])
        fmap = feature_map(specs, cfg["dim"])
        seed_everything(self.seed)
        model = globals()[name](fmap, cfg, self.root)
        train = Batches(cols[0], self.batch, shuffle=True, seed=self.seed)
        val, test = (Batches(c, 4096, shuffle=False) for c in cols[1:])
        t0 = time.time()
        model.fit(train, epochs=MAX_EPOCHS, validation_data=val)
        secs = time.time() - t0
        v = model.evaluate(val, metrics=["logloss", "AUC"])
        t = model.evaluate(test, metrics=["logloss", "AUC"])
        return {
            "config": dict(cfg, batch=self.batch),
            "epochs": model._epoch_index + 1,
            "val_auc": float(v["AUC"]),
            "val_logloss": float(v["logloss"]),
            "test_auc": float(t["AUC"]),
            "test_logloss": float(t["logloss"]),
            "seconds": round(secs, 1),
        }


def search(runner: Runner, name: str, trace) -> dict:
    tried = {}

    def run(cfg):
        key = tuple(sorted(cfg.items()))
        if key not in tried:
            tried[key] = runner.fit(name, cfg)
            if trace:
                trace.write(json.dumps({"model": name, **tried[key]}) + "\n")
                trace.flush()
        return tried[key]

    best = lambda: pick(list(tried.values()))["config"]  # noqa: E731
    strip = lambda c: {k: v for k, v in c.items() if k != "batch"}  # noqa: E731
    base = {"lr": 1e-3, "dim": 1 if name == "LR" else 16, "mcc": 1, "dropout": 0.0, "reg": 0.0}
    for reg in REGS:
        run(dict(base, reg=reg))
    for reg in REGS_MORE:  # while the largest regularizer tried is the best, a larger one
        if best()["reg"] != max(r["config"]["reg"] for r in tried.values()):
            break
        run(dict(base, reg=reg))
    for mcc in (2, 10):
        run(dict(strip(best()), mcc=mcc))
    if name != "LR":
        run(dict(strip(best()), dim=10))
    if name in DEEP:
        run(dict(strip(best()), dropout=0.2))
    chosen = pick(list(tried.values()))
    return {
        **chosen,
        "configs_tried": len(tried),
        "search_seconds": round(sum(r["seconds"] for r in tried.values()), 1),
    }


def main(argv) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data", nargs="+")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument(
        "--numerical",
        choices=("numeric", "buckets", "values"),
        default="numeric",
        help="numerical features as FuxiCTR numeric features, as Criteo buckets, or as categorical values",
    )
    ap.add_argument("--trace", help="one JSON line per configuration tried")
    ap.add_argument("--seed", type=int, default=SEED, help=f"seed of the initialization and shuffling (default {SEED})")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    logging.disable(logging.WARNING)
    trace = open(args.trace, "a") if args.trace else None
    with tempfile.TemporaryDirectory() as root:
        for data in args.data:
            runner = Runner(splits(data), args.numerical, root, args.seed)
            os.makedirs(os.path.join(root, "d"), exist_ok=True)
            variant = args.numerical
            for name in args.models.split(","):
                if trace:
                    trace.write(json.dumps({"data": data, "variant": variant, "model": name}) + "\n")
                out = search(runner, name, trace)
                print(
                    json.dumps({"data": data, "variant": variant, "seed": args.seed, "model": "FuxiCTR " + name, **out}),
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
