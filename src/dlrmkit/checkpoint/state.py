"""The logical state of a DLRM and its optimizers, as DCP saves it: each table one tensor
`table.<t>.weight` ([rows, dim]) with its row-sized optimizer state `table.<t>.opt.<key>`, dense
weights `model.<fqn>` and their state `dense_opt.<fqn>.<key>`, each rank's RNG `rng.<rank>`.
The tensors are views into the live weights, so loading into them restores in place and saving
them copies nothing (a table is a row range of its fused weight, which is contiguous)."""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import asdict
from typing import Any, Callable

import torch
import torch.distributed as dist

from dlrmkit.errors import DlrmkitError


SCALAR_STATE = {"step"}  # optimizer state kept as one number per parameter (0-d tensor)


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


@contextlib.contextmanager
def quiet():
    """DCP and ShardedTensor warn about deprecations on every call; keep the user's log clean.
    (ShardedTensor stays: it expresses arbitrary (row range, column range) blocks per rank,
    which DTensor's even Shard(dim) placements cannot.)"""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


# ---- the logical state of a DLRM and its optimizers -----------------------------------------------
def _row_state_keys(emb: torch.nn.Module, optimizers: list[torch.optim.Optimizer]) -> list[str]:
    """Optimizer state keys with one entry per table row (e.g. Adagrad's `sum`)."""
    keys: set[str] = set()
    for opt in optimizers:
        for p in emb.parameters():
            for k, v in opt.state.get(p, {}).items():
                if torch.is_tensor(v) and v.dim() >= 1 and v.shape[0] == p.shape[0]:
                    keys.add(k)
    return sorted(keys)


def _table_state(emb: Any, optimizers: list[torch.optim.Optimizer]) -> dict[str, Any]:
    """table.<t>.* from the embedding module's logical pieces (`logical_shards()`, which every
    embedding module provides): a table held whole as views of the live weights and of their
    row-sized optimizer state; a table split over ranks as ShardedTensors whose local shards are
    such views (global metadata from the pieces, which every rank knows: no collective), so each
    rank writes its shards and DCP reshards on load."""
    opt_of = {id(p): o for o in optimizers for g in o.param_groups for p in g["params"]}
    keys = _row_state_keys(emb, optimizers)
    state_dims = {
        k: v.dim()
        for o in optimizers
        for p in emb.parameters()  # same on every rank: one optimizer
        for k, v in o.state.get(p, {}).items()
        if k in keys
    }
    by_table: dict[int, list[Any]] = {}
    for piece in emb.logical_shards():
        by_table.setdefault(piece.table, []).append(piece)
    out: dict[str, Any] = {}
    for t, pieces in by_table.items():
        if pieces[0].rank is None:
            whole = pieces[0]
            out[f"table.{t}.weight"] = whole.data
            state = opt_of[id(whole.weight)].state.get(whole.weight, {}) if id(whole.weight) in opt_of else {}
            for k in keys:
                if k in state:
                    out[f"table.{t}.opt.{k}"] = whole.rows_of(state[k])
        else:
            with quiet():
                out.update(_sharded_table(t, pieces, str(emb.device), keys, state_dims, opt_of))
    return out


def _sharded_table(
    t: int, pieces: list[Any], dev: str, keys: list[str], state_dims: dict[str, int], opt_of: dict
) -> dict[str, Any]:
    """table.<t>.weight and table.<t>.opt.<key> of a table split over ranks, as ShardedTensors.
    `dev`: this rank's device (cpu or cuda:LOCAL_RANK; ShardedTensor checks only local shards')."""
    from torch.distributed._shard.metadata import ShardMetadata
    from torch.distributed._shard.sharded_tensor import Shard as LocalShard
    from torch.distributed._shard.sharded_tensor import ShardedTensor
    from torch.distributed._shard.sharded_tensor.metadata import ShardedTensorMetadata, TensorProperties

    rows, dim = max(p.row_end for p in pieces), max(p.col_end for p in pieces)

    def meta(p: Any) -> ShardMetadata:
        return ShardMetadata([p.row_start, p.col_start], [p.rows, p.cols], f"rank:{p.rank}/{dev}")

    def meta_1d(p: Any) -> ShardMetadata:
        return ShardMetadata([p.row_start], [p.rows], meta(p).placement)

    out: dict[str, Any] = {}
    # this rank's pieces by (width, rows, columns): the order its data file has always held them in
    local = sorted((p for p in pieces if p.weight is not None), key=lambda p: (p.cols, p.row_start, p.col_start))
    for key in ["weight"] + [f"opt.{k}" for k in keys]:
        one_d = key != "weight" and state_dims.get(key[4:]) == 1
        if one_d and any(p.cols != dim for p in pieces):
            raise DlrmkitError(
                f"table {t}: a per-row optimizer state ('{key[4:]}') under column-wise sharding "
                f"has one copy per column shard and cannot be saved as one logical tensor; "
                f"use --sharding row_wise/table_wise or an element-wise optimizer"
            )
        shards = []
        for p in local:
            src = p.weight.data if key == "weight" else opt_of[id(p.weight)].state[p.weight][key[4:]]
            shards.append(LocalShard(p.rows_of(src), meta(p) if not one_d else meta_1d(p)))
        dtype = shards[0].tensor.dtype if shards else torch.float32  # no local shard: float32 state
        size = torch.Size([rows] if one_d else [rows, dim])
        st_meta = ShardedTensorMetadata(
            [meta_1d(p) if one_d else meta(p) for p in pieces], size, TensorProperties(dtype=dtype)
        )
        out[f"table.{t}.{key}"] = ShardedTensor._init_from_local_shards_and_global_metadata(shards, st_meta)
    return out


def model_state(
    model: torch.nn.Module, optimizers: list[torch.optim.Optimizer]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(tensors, extras): the flat logical state of a DLRM and its optimizers, as views into the
    live tensors (so loading into it restores them in place), and the JSON-able non-tensor part.
    The tables come from `model.embeddings.logical_shards()` (EmbeddingCollection, or
    dlrmkit.parallel's ShardedEmbedding), whatever fused layout or plan holds them."""
    emb = model.embeddings
    emb_params = {id(p) for p in emb.parameters()}
    names = {id(p): n for n, p in model.named_parameters()}
    tensors: dict[str, Any] = {
        f"model.{k}": v for k, v in model.state_dict(keep_vars=True).items() if not k.startswith("embeddings.")
    }
    tensors = {k: (v.data if isinstance(v, torch.nn.Parameter) else v) for k, v in tensors.items()}
    extras: dict[str, Any] = {"optimizers": [type(o).__name__ for o in optimizers], "optimizer_scalars": {}}
    tensors.update(_table_state(emb, optimizers))
    for opt in optimizers:
        for p, st in opt.state.items():
            if id(p) in emb_params:
                # row-sized state went into table.* above; anything else (a step count) is per weight
                scal = {k: v for k, v in st.items() if not (torch.is_tensor(v) and v.dim() >= 1)}
                for k, v in scal.items():
                    extras["optimizer_scalars"][f"embeddings.{k}"] = float(v)
                continue
            for key, value in st.items():
                if torch.is_tensor(value):
                    tensors[f"dense_opt.{names[id(p)]}.{key}"] = value
                else:
                    extras["optimizer_scalars"][f"{names[id(p)]}.{key}"] = value
    tensors[f"rng.{_rank()}"] = torch.get_rng_state()
    return tensors, extras


def restore_model_state(
    path: str,
    manifest: dict[str, Any],
    model: torch.nn.Module,
    optimizers: list[torch.optim.Optimizer],
    load: Callable[..., None],
    show: bool = True,
) -> None:
    """Load checkpoint `path` (verified, with its `manifest`) into a live model and optimizers,
    creating lazily-built optimizer state (e.g. Adam moments) that the checkpoint holds. `load`
    reads the stored tensors into the state (checkpoint.load_into: the storage lives there)."""
    saved_opts = manifest.get("optimizers")
    now = [type(o).__name__ for o in optimizers]
    if saved_opts is not None and saved_opts != now:
        raise DlrmkitError(
            f"{path}: checkpoint was trained with optimizers {saved_opts}, this run uses {now}; "
            f"pass the same --optimizer or start a fresh --checkpoint-dir"
        )
    params = dict(model.named_parameters())
    dense_opt = {id(p): o for o in optimizers for g in o.param_groups for p in g["params"]}
    for key, info in manifest["tensors"].items():  # create missing dense optimizer state
        if key.startswith("dense_opt."):
            fqn, k = key[len("dense_opt.") :].rsplit(".", 1)
            p = params.get(fqn)
            if p is not None and id(p) in dense_opt and k not in dense_opt[id(p)].state.get(p, {}):
                # never allocate a size only the file gives: a step count is a scalar, the rest
                # (moments) the parameter's shape, all floating point (as the optimizers make them)
                want = [] if k in SCALAR_STATE else list(p.shape)
                if info["shape"] != want or not getattr(torch, info["dtype"]).is_floating_point:
                    raise DlrmkitError(
                        f"{path}: optimizer state '{key}' is {info['dtype']} {info['shape'][:8]}, not a floating-point "
                        f"{'scalar' if not want else 'tensor of its parameter' + chr(39) + 's shape ' + str(want)}; refused"
                    )
                # where dlrmkit's optimizers keep it: a 0-d `step` on the CPU (torch's Adam too, unless
                # fused or capturable, which keep it on the GPU), anything larger beside the parameter
                where = "cpu" if not info["shape"] else p.device
                dense_opt[id(p)].state[p][k] = torch.zeros(
                    info["shape"], dtype=getattr(torch, info["dtype"]), device=where
                )
    tensors, _ = model_state(model, optimizers)
    rng_key = f"rng.{_rank()}"
    if rng_key not in manifest["tensors"]:
        rng_key = "rng.0"  # more ranks now than at save time: take rank 0's stream
    rng = tensors.pop(f"rng.{_rank()}")
    tensors[rng_key] = rng
    load(path, tensors, manifest, show)
    try:
        torch.set_rng_state(tensors[rng_key])
    except RuntimeError:  # bytes of the right size that are no generator's state
        raise DlrmkitError(f"{path}: tensor '{rng_key}' is not a random generator's state; refused") from None
    for name, value in manifest.get("optimizer_scalars", {}).items():
        fqn, k = name.rsplit(".", 1)
        targets = list(model.embeddings.parameters()) if fqn == "embeddings" else [params.get(fqn)]
        for p in targets:
            opt = dense_opt.get(id(p)) if p is not None else None
            if opt is not None:
                current = opt.state[p].get(k)
                if torch.is_tensor(current) and current.dim() > 0:  # a scalar over row-sized state
                    raise DlrmkitError(
                        f"{path}/manifest.json: field 'optimizer_scalars.{name[:60]}' is a number, but the "
                        f"optimizer keeps '{k}' as a tensor of shape {list(current.shape)[:8]}; refused"
                    )
                opt.state[p][k] = (
                    torch.tensor(value, dtype=current.dtype, device=current.device)
                    if torch.is_tensor(current)
                    else value
                )


def checkpoint_meta(model_cfg: Any, train_cfg: Any, **train_state: Any) -> dict[str, Any]:
    """The manifest fields the trainer records besides tensors; `train_cfg`: a dataclass, or the
    train options as {name: value} (flat, whatever section holds each)."""
    train = dict(train_cfg) if isinstance(train_cfg, dict) else asdict(train_cfg)
    return {"model_config": asdict(model_cfg), "train_config": train, **train_state}
