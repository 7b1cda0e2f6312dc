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
def _table_views(embeddings: torch.nn.Module) -> list[tuple[torch.nn.Parameter, int, int, int]]:
    """(fused weight, table index, first row, rows) for each table of an EmbeddingCollection."""
    out = []
    for group, fused in zip(embeddings.groups, embeddings.tables):
        for t, offset, rows in zip(group, fused.row_offsets.tolist(), fused.table_sizes):
            out.append((fused.weight, t, offset, rows))
    return out


def _row_state_keys(emb: torch.nn.Module, optimizers: list[torch.optim.Optimizer]) -> list[str]:
    """Optimizer state keys with one entry per table row (e.g. Adagrad's `sum`)."""
    keys: set[str] = set()
    for opt in optimizers:
        for p in emb.parameters():
            for k, v in opt.state.get(p, {}).items():
                if torch.is_tensor(v) and v.dim() >= 1 and v.shape[0] == p.shape[0]:
                    keys.add(k)
    return sorted(keys)


def _sharded_table_state(emb: Any, optimizers: list[torch.optim.Optimizer]) -> dict[str, Any]:
    """table.<t>.* of a ShardedEmbedding: model-parallel tables as ShardedTensors whose local
    shards are views of this rank's weights (global metadata comes from the plan, which every
    rank knows, so no collective is needed); replicated tables as plain tensors (DCP writes one)."""
    from torch.distributed._shard.metadata import ShardMetadata
    from torch.distributed._shard.sharded_tensor import Shard as LocalShard
    from torch.distributed._shard.sharded_tensor import ShardedTensor
    from torch.distributed._shard.sharded_tensor.metadata import ShardedTensorMetadata, TensorProperties

    opt_of = {id(p): o for o in optimizers for g in o.param_groups for p in g["params"]}
    keys = _row_state_keys(emb, optimizers)
    state_dims = {k: v.dim() for o in optimizers for p in emb.parameters()
                  for k, v in o.state.get(p, {}).items() if k in keys}
    local: dict[int, list[tuple[Any, torch.nn.Parameter, int]]] = {}
    for (_, idx), table in zip(emb.group_keys, emb.local_tables):
        for j, i in enumerate(idx):
            t, sh = emb.shards[i]
            local.setdefault(t, []).append((sh, table.weight, int(table.row_offsets[j])))
    dev = str(emb.device)  # of this rank's shards (the only ones ShardedTensor checks); cpu or cuda:LOCAL_RANK

    def meta(sh: Any) -> ShardMetadata:
        return ShardMetadata([sh.row_start, sh.col_start], [sh.rows, sh.cols], f"rank:{sh.rank}/{dev}")

    out: dict[str, Any] = {}
    for t, tp in enumerate(emb.plan.tables):
        if tp.model_parallel:
            gmeta = [meta(sh) for sh in tp.shards]
            for key in ["weight"] + [f"opt.{k}" for k in keys]:
                shards = []
                one_d = key != "weight" and state_dims.get(key[4:]) == 1  # same on every rank: one optimizer
                if one_d and any(sh.cols != emb.dim for sh in tp.shards):
                    raise DlrmkitError(f"table {t}: a per-row optimizer state ('{key[4:]}') under column-wise sharding "
                                       f"has one copy per column shard and cannot be saved as one logical tensor; "
                                       f"use --sharding row_wise/table_wise or an element-wise optimizer")
                for sh, w, off in local.get(t, []):
                    src = w.data if key == "weight" else opt_of[id(w)].state[w][key[4:]]
                    m = meta(sh) if not one_d else ShardMetadata([sh.row_start], [sh.rows], meta(sh).placement)
                    shards.append(LocalShard(src[off:off + sh.rows], m))
                dtype = shards[0].tensor.dtype if shards else torch.float32  # no local shard: float32 state
                size = torch.Size([tp.rows] if one_d else [tp.rows, emb.dim])
                gm = gmeta if not one_d else [ShardMetadata([sh.row_start], [sh.rows], meta(sh).placement) for sh in tp.shards]
                st_meta = ShardedTensorMetadata(gm, size, TensorProperties(dtype=dtype))
                out[f"table.{t}.{key}"] = ShardedTensor._init_from_local_shards_and_global_metadata(shards, st_meta)
        else:
            j = emb.dp_tables_idx.index(t)
            w, off = emb.dp_table.weight, int(emb.dp_table.row_offsets[j])
            out[f"table.{t}.weight"] = w.data[off:off + tp.rows]
            for k in keys:
                out[f"table.{t}.opt.{k}"] = opt_of[id(w)].state[w][k][off:off + tp.rows]
    return out


def model_state(model: torch.nn.Module, optimizers: list[torch.optim.Optimizer]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(tensors, extras): the flat logical state of a DLRM and its optimizers, as views into the
    live tensors (so loading into it restores them in place), and the JSON-able non-tensor part.

    A sharded embedding module (dlrmkit.parallel) provides `checkpoint_tables(optimizers)`, which
    returns the same `table.<t>.*` keys as ShardedTensors over its local shards."""
    emb = model.embeddings
    emb_params = {id(p) for p in emb.parameters()}
    names = {id(p): n for n, p in model.named_parameters()}
    tensors: dict[str, Any] = {
        f"model.{k}": v for k, v in model.state_dict(keep_vars=True).items() if not k.startswith("embeddings.")
    }
    tensors = {k: (v.data if isinstance(v, torch.nn.Parameter) else v) for k, v in tensors.items()}
    extras: dict[str, Any] = {"optimizers": [type(o).__name__ for o in optimizers], "optimizer_scalars": {}}
    if hasattr(emb, "checkpoint_tables"):
        tensors.update(emb.checkpoint_tables(optimizers))
    elif hasattr(emb, "plan") and hasattr(emb, "local_tables"):  # dlrmkit.parallel.ShardedEmbedding
        with quiet():
            tensors.update(_sharded_table_state(emb, optimizers))
    else:
        for weight, t, lo, rows in _table_views(emb):
            tensors[f"table.{t}.weight"] = weight.data[lo:lo + rows]
            for opt in optimizers:
                for key, value in opt.state.get(weight, {}).items():
                    if torch.is_tensor(value) and value.dim() >= 1 and value.shape[0] == weight.shape[0]:
                        tensors[f"table.{t}.opt.{key}"] = value[lo:lo + rows]
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


def restore_model_state(path: str, manifest: dict[str, Any], model: torch.nn.Module,
                        optimizers: list[torch.optim.Optimizer], load: Callable[..., None], show: bool = True) -> None:
    """Load checkpoint `path` (verified, with its `manifest`) into a live model and optimizers,
    creating lazily-built optimizer state (e.g. Adam moments) that the checkpoint holds. `load`
    reads the stored tensors into the state (checkpoint.load_into: the storage lives there)."""
    saved_opts = manifest.get("optimizers")
    now = [type(o).__name__ for o in optimizers]
    if saved_opts is not None and saved_opts != now:
        raise DlrmkitError(f"{path}: checkpoint was trained with optimizers {saved_opts}, this run uses {now}; "
                           f"pass the same --optimizer or start a fresh --checkpoint-dir")
    params = dict(model.named_parameters())
    dense_opt = {id(p): o for o in optimizers for g in o.param_groups for p in g["params"]}
    for key, info in manifest["tensors"].items():  # create missing dense optimizer state
        if key.startswith("dense_opt."):
            fqn, k = key[len("dense_opt."):].rsplit(".", 1)
            p = params.get(fqn)
            if p is not None and id(p) in dense_opt and k not in dense_opt[id(p)].state.get(p, {}):
                # where dlrmkit's optimizers keep it: a 0-d `step` on the CPU (torch's Adam too, unless
                # fused or capturable, which keep it on the GPU), anything larger beside the parameter
                where = "cpu" if not info["shape"] else p.device
                dense_opt[id(p)].state[p][k] = torch.zeros(info["shape"], dtype=getattr(torch, info["dtype"]), device=where)
    tensors, _ = model_state(model, optimizers)
    rng_key = f"rng.{_rank()}"
    if rng_key not in manifest["tensors"]:
        rng_key = "rng.0"  # more ranks now than at save time: take rank 0's stream
    rng = tensors.pop(f"rng.{_rank()}")
    tensors[rng_key] = rng
    load(path, tensors, manifest, show)
    torch.set_rng_state(tensors[rng_key])
    for name, value in manifest.get("optimizer_scalars", {}).items():
        fqn, k = name.rsplit(".", 1)
        targets = list(model.embeddings.parameters()) if fqn == "embeddings" else [params.get(fqn)]
        for p in targets:
            opt = dense_opt.get(id(p)) if p is not None else None
            if opt is not None:
                current = opt.state[p].get(k)
                opt.state[p][k] = (torch.tensor(value, dtype=current.dtype, device=current.device)
                                   if torch.is_tensor(current) else value)


def checkpoint_meta(model_cfg: Any, train_cfg: Any, **train_state: Any) -> dict[str, Any]:
    """The manifest fields the trainer records besides tensors."""
    return {"model_config": asdict(model_cfg), "train_config": asdict(train_cfg), **train_state}
