"""A checkpoint's `manifest.json`, read as untrusted input: every field that any command uses is
type- and range-checked here, once, so that a tampered manifest is one line naming the field
(exit 2), never an exception deep in the trainer, and so that no size taken from it is allocated
before it is checked (the model its `model_config` describes must agree with its own tensor list
and fit in the memory available)."""

from __future__ import annotations

import math
import os
from typing import Any

from dlrmkit.errors import DlrmkitError
from dlrmkit.untrusted import MiB, load_json

MANIFEST = "manifest.json"
FORMATS = ("dlrmkit-checkpoint/2", "dlrmkit-checkpoint/1")
MAX_MANIFEST = 64 * MiB
MAX_INT = 1 << 62  # sizes, offsets and counters: below what an int64 holds
MAX_NDIM = 64
MAX_WIDTH = 1 << 20  # MLP layer widths
MAX_TABLE_ROWS = 1 << 48
MAX_STEP = 1 << 53  # steps and samples: exact as a float (the log writes them as numbers)
# counters a command reads: each bounded (an epoch of 2^62 would resume past any --epochs)
COUNTERS = {
    "step": MAX_STEP,
    "epoch": MAX_STEP,
    "batch_in_epoch": MAX_STEP,
    "skipped_nonfinite": MAX_STEP,
    "samples_seen": MAX_STEP,
    "world_size": 1 << 16,
}
# a tuple, not a set: a crafted dtype (a list, a mapping) is then simply not in it, never a TypeError
DTYPES = ("float32", "float16", "bfloat16", "float64", "int64", "int32", "int16", "int8", "uint8", "bool")


def is_int(v: Any, lo: int = 0, hi: int = MAX_INT) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi


def _number(v: Any) -> bool:
    return v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))


def _bad(fp: str, field: str, why: str) -> DlrmkitError:
    return DlrmkitError(f"{fp}: field '{field}' {why}; refused")


def read_manifest(path: str) -> dict[str, Any]:
    """The manifest of checkpoint folder `path`, every field a command reads checked (types,
    ranges, tensor shapes and dtypes), or one line naming the field."""
    fp = os.path.join(path, MANIFEST)
    # the manifest records best_auc NaN as JSON's NaN token (a run not yet evaluated)
    m = load_json(fp, "checkpoint manifest", MAX_MANIFEST, follow_links=False, allow_nan=True)
    if not isinstance(m, dict) or m.get("format") not in FORMATS:
        raise DlrmkitError(f"{fp}: not a {FORMATS[0]} manifest")
    if not isinstance(m.get("tensors"), dict) or not isinstance(m.get("model_config"), dict):
        raise DlrmkitError(f"{fp}: manifest without 'tensors' or 'model_config'; refused")
    for name, info in m["tensors"].items():
        shape = info.get("shape") if isinstance(info, dict) else None
        if (
            not (isinstance(shape, list) and len(shape) <= MAX_NDIM and all(is_int(n) for n in shape))
            or info.get("dtype") not in DTYPES
        ):
            raise _bad(fp, f"tensors.{str(name)[:60]}", f"is not {{shape: [sizes], dtype: one of {sorted(DTYPES)}}}")
    for field, hi in COUNTERS.items():
        if field in m and not is_int(m[field], 0, hi):
            raise _bad(fp, field, f"is {str(m[field])[:40]!r}, not an integer in [0, {hi}]")
    auc = m.get("best_auc")
    if not _number(auc) or (auc is not None and not (math.isnan(auc) or 0 <= auc <= 1)):
        raise _bad(fp, "best_auc", "is not a number in [0, 1] (or NaN: not evaluated yet)")
    rid = m.get("run_id")
    if rid is not None and not (isinstance(rid, str) and 0 < len(rid) <= 64 and rid.isascii() and rid.isalnum()):
        raise _bad(fp, "run_id", "is not a run identifier (1 to 64 letters and digits)")
    for field in ("train_config", "dataset", "optimizer_scalars"):
        if field in m and not isinstance(m[field], dict):
            raise _bad(fp, field, "is not a mapping")
    if "optimizers" in m and not (
        isinstance(m["optimizers"], list) and all(isinstance(o, str) for o in m["optimizers"])
    ):
        raise _bad(fp, "optimizers", "is not a list of names")
    for name, value in m.get("optimizer_scalars", {}).items():
        if "." not in name or value is None or not (_number(value) or isinstance(value, bool)):
            raise _bad(fp, f"optimizer_scalars.{name[:60]}", "is not '<parameter>.<key>': number")
    data = m.get("dataset", {})
    if not all(isinstance(data.get(k, ""), str) for k in ("path", "fingerprint")):
        raise _bad(fp, "dataset", "does not hold a path and a fingerprint as text")
    if not isinstance(m.get("train_config", {}).get("data", ""), (str, type(None))):
        raise _bad(fp, "train_config.data", "is not a path")
    return m


# ---- the model a manifest describes ---------------------------------------------------------------
_INTS = {"num_numerical": (0, MAX_WIDTH), "embedding_dim": (1, 1 << 16), "min_id_count": (1, 1 << 62)}
_LISTS = {"table_sizes": (1, MAX_TABLE_ROWS), "bottom_mlp": (1, MAX_WIDTH), "top_mlp": (1, MAX_WIDTH)}
_BOOLS = ("self_interaction", "wide")
_TEXT = ("interaction", "numerical_transform")


def _check_fields(mc: dict[str, Any]) -> None:
    """Each model_config field of its type and range (ValueError naming it)."""
    for key, (lo, hi) in _INTS.items():
        if key in mc and not is_int(mc[key], lo, hi):
            raise ValueError(f"{key} must be an integer in [{lo}, {hi}], got {str(mc[key])[:40]!r}")
    for key, (lo, hi) in _LISTS.items():
        v = mc.get(key, [])
        if not isinstance(v, list) or len(v) > 1 << 20 or not all(is_int(n, lo, hi) for n in v):
            raise ValueError(f"{key} must be a list of integers in [{lo}, {hi}]")
    for key in _BOOLS:
        if key in mc and not isinstance(mc[key], bool):
            raise ValueError(f"{key} must be true or false, got {str(mc[key])[:40]!r}")
    for key in _TEXT:
        if key in mc and not isinstance(mc[key], str):
            raise ValueError(f"{key} must be text")
    for key in ("numerical_mean", "numerical_std"):
        v = mc.get(key)
        if v is not None and (not isinstance(v, list) or len(v) > MAX_WIDTH or not all(_number(x) for x in v)):
            raise ValueError(f"{key} must be a list of numbers or null")
    b = mc.get("numerical_buckets")
    if b is not None and (
        not isinstance(b, list)
        or len(b) > MAX_WIDTH
        or not all(isinstance(x, list) and len(x) <= 4096 and all(_number(v) for v in x) for x in b)
    ):
        raise ValueError("numerical_buckets must be lists of numbers or null")
    scale = mc.get("embedding_init_scale", 1.0)
    if not _number(scale) or scale is None or not math.isfinite(scale) or scale < 0:
        raise ValueError("embedding_init_scale must be a finite number >= 0")


def model_config_of(path: str, manifest: dict[str, Any]):
    """The ModelConfig a manifest records, checked field by field and against the manifest's own
    table tensors, or one line."""
    from dlrmkit.model.dlrm import ModelConfig

    fp = os.path.join(path, MANIFEST)
    try:
        _check_fields(manifest["model_config"])
        cfg = ModelConfig(**manifest["model_config"])
        cfg.check()
    except (TypeError, ValueError, DlrmkitError) as exc:
        raise DlrmkitError(f"{fp}: bad model_config ({str(exc)[:120]})") from None
    tensors = manifest["tensors"]
    for t, rows in enumerate(cfg.table_sizes):
        shape = tensors.get(f"table.{t}.weight", {}).get("shape")
        if shape != [rows, cfg.table_dim]:
            raise DlrmkitError(
                f"{fp}: model_config has table {t} of {rows} rows x {cfg.table_dim}, but its tensor "
                f"'table.{t}.weight' is {shape}; refused"
            )
    if f"table.{len(cfg.table_sizes)}.weight" in tensors:
        raise DlrmkitError(f"{fp}: holds more tables than model_config's {len(cfg.table_sizes)}; refused")
    return cfg


def recorded_bags(path: str) -> list[int] | None:
    """Ids per sample of each table of the dataset the model of checkpoint folder `path` was
    trained on: its model_config.hotness, one id per table where that is null (a one-hot
    dataset's); None for a checkpoint written before model_config recorded them (no `hotness`
    key), whose bags are unknown."""
    manifest = read_manifest(path)
    cfg = model_config_of(path, manifest)
    if "hotness" not in manifest["model_config"]:
        return None
    return list(cfg.hotness) if cfg.hotness is not None else [1] * len(cfg.table_sizes)


def model_bytes(cfg: Any, tables: bool = True) -> int:
    """Bytes a DLRM of `cfg` allocates: every parameter and buffer the model holds (MLPs, tables,
    the cross network's layers, the wide and FM terms, interaction index buffers), counted on a
    model built on the meta device, so a manifest describing a model larger than memory is
    refused before anything is allocated. `tables` False: without the tables (sharded elsewhere)."""
    import torch

    from dlrmkit.model.dlrm import DLRM

    with torch.device("meta"):
        model = DLRM(cfg)
    skip = set() if tables else {id(t) for t in model.embeddings.parameters()}
    held = [t for t in (*model.parameters(), *model.buffers()) if id(t) not in skip]
    return sum(t.numel() * t.element_size() for t in held)


def check_model_fits(path: str, cfg: Any, tables: bool = True) -> None:
    """The model a checkpoint describes fits in the memory available now, or one line."""
    from dlrmkit.resources import check_memory

    check_memory(
        model_bytes(cfg, tables),
        f"{path}: the model its manifest describes (tables {cfg.table_sizes[:4]}"
        f"{'...' if len(cfg.table_sizes) > 4 else ''}, dim {cfg.embedding_dim})",
    )
