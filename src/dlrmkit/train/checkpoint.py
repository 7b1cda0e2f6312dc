"""Placement-free checkpoints, written with torch.distributed.checkpoint (DCP).

A checkpoint is a folder `<dir>/step_N` holding DCP's files (`.metadata`, `__<rank>_<i>.distcp`)
and `manifest.json`. The DCP state dict is *logical*: each embedding table is one tensor
`table.<t>.weight` of shape [rows, dim] with its row-sized optimizer state `table.<t>.opt.<key>`,
whatever fused layout or sharding plan held it in memory; dense weights are `model.<fqn>` and
their optimizer state `dense_opt.<fqn>.<key>`; each rank's RNG state is `rng.<rank>`. Under
torchrun the tables come in as ShardedTensors, so each rank writes only its own shards and DCP
reshards on load to whatever plan (or single process) asks.

The manifest (JSON) carries what DCP cannot check or has no place for: the model and train
configs, step, LR schedule position, loader position (epoch, batch index), non-tensor optimizer
state, every tensor's shape and dtype, and a SHA-256 and size per file, verified before loading.

Atomic: everything is written into `<dir>/.tmp-step_N`, renamed to `step_N` when complete, then
`<dir>/latest` is replaced (atomic rename) to name it. A process killed while saving leaves the
previous checkpoint and `latest` intact; the next save removes the stale temporary folder.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import warnings
from dataclasses import asdict
from typing import Any

import torch
import torch.distributed as dist

from dlrmkit.errors import DlrmkitError
from dlrmkit.train.faults import fault_point

LATEST = "latest"
MANIFEST = "manifest.json"
FORMAT = "dlrmkit-checkpoint/1"


# ---- where checkpoints are ----------------------------------------------------------------------
def latest_checkpoint(directory: str) -> str | None:
    """Path of the checkpoint `latest` names, or None when there is none yet."""
    pointer = os.path.join(directory, LATEST)
    if not os.path.exists(pointer):
        return None
    with open(pointer, encoding="utf-8") as f:
        name = f.read().strip()
    path = os.path.join(directory, name)
    if not os.path.isdir(path):
        raise DlrmkitError(f"{pointer} names '{name}', which does not exist in {directory}; "
                           f"write the name of an existing step_N folder into it")
    return path


def resolve_checkpoint(path: str) -> str:
    """A checkpoint folder itself, or a checkpoint directory whose `latest` names one."""
    if os.path.exists(os.path.join(path, MANIFEST)):
        return path
    found = latest_checkpoint(path) if os.path.isdir(path) else None
    if found is None:
        raise DlrmkitError(f"{path}: no checkpoint there (expected {MANIFEST} or a '{LATEST}' pointer)")
    return found


# ---- distributed helpers (all no-ops in one process) ----------------------------------------------
def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _rank() -> int:
    return dist.get_rank() if _distributed() else 0


def _barrier() -> None:
    if _distributed():
        dist.barrier()


def _broadcast_error(message: str | None) -> None:
    """Raise the same DlrmkitError on every rank when any rank found one."""
    if _distributed():
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, message)
        message = next((m for m in gathered if m), None)
    if message:
        raise DlrmkitError(message)


@contextlib.contextmanager
def _quiet():
    """DCP and ShardedTensor warn about deprecations on every call; keep the user's log clean.
    (ShardedTensor stays: it expresses arbitrary (row range, column range) blocks per rank,
    which DTensor's even Shard(dim) placements cannot.)"""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _dcp():
    import torch.distributed.checkpoint as dcp

    return dcp


# ---- checksums ----------------------------------------------------------------------------------
def file_digest(path: str, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def _files_of(folder: str, rank: int | None) -> list[str]:
    """Data files a rank wrote (DCP names them __<rank>_<i>.distcp); rank None: all files."""
    names = sorted(n for n in os.listdir(folder) if n != MANIFEST and os.path.isfile(os.path.join(folder, n)))
    if rank is None:
        return names
    mine = [n for n in names if n.startswith(f"__{rank}_")]
    return mine + ([n for n in names if not n.startswith("__")] if rank == 0 else [])


def verify_checkpoint(path: str) -> dict[str, Any]:
    """The manifest of checkpoint `path`, after checking every file's size and SHA-256 against it
    (each rank checks a share of the files). Raises one DlrmkitError line on any mismatch."""
    path = resolve_checkpoint(path)
    manifest = read_manifest(path)
    files = manifest.get("files", {})
    rank, world = _rank(), (dist.get_world_size() if _distributed() else 1)
    error = None
    for i, (name, info) in enumerate(sorted(files.items())):
        if i % world != rank:
            continue
        fp = os.path.join(path, name)
        if not os.path.isfile(fp):
            error = f"{fp}: checkpoint file is missing; use an older checkpoint (point '{LATEST}' at it)"
        elif os.path.getsize(fp) != info["bytes"]:
            error = (f"{fp}: checkpoint file is truncated or altered ({os.path.getsize(fp)} bytes, manifest says "
                     f"{info['bytes']}); use an older checkpoint (point '{LATEST}' at it)")
        elif file_digest(fp) != info["sha256"]:
            error = (f"{fp}: checkpoint file is corrupt (SHA-256 differs from {MANIFEST}); "
                     f"use an older checkpoint (point '{LATEST}' at it)")
        if error:
            break
    _broadcast_error(error)
    return manifest


def read_manifest(path: str) -> dict[str, Any]:
    fp = os.path.join(path, MANIFEST)
    try:
        with open(fp, encoding="utf-8") as f:
            manifest = json.load(f)
    except (OSError, json.JSONDecodeError) as exc:
        raise DlrmkitError(f"{fp}: unreadable checkpoint manifest ({type(exc).__name__}: {str(exc)[:100]})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise DlrmkitError(f"{fp}: not a {FORMAT} manifest")
    return manifest


# ---- save -----------------------------------------------------------------------------------------
def save_checkpoint(directory: str, step: int, state: dict[str, Any], meta: dict[str, Any], keep: int = 2) -> str:
    """Write `state` (flat: name -> tensor, ShardedTensor or DTensor) with DCP and `meta` into the
    manifest, atomically. Under torch.distributed every rank calls this with its own shards."""
    name = f"step_{step}"
    tmp, final = os.path.join(directory, f".tmp-{name}"), os.path.join(directory, name)
    if _rank() == 0:
        os.makedirs(directory, exist_ok=True)
        for stale in os.listdir(directory):  # left by a process killed mid-save
            if stale.startswith(".tmp-step_"):
                shutil.rmtree(os.path.join(directory, stale), ignore_errors=True)
        os.makedirs(tmp)
    _barrier()
    with _quiet():
        metadata = _dcp().save(state, checkpoint_id=tmp, no_dist=not _distributed())
    fault_point("save:after-data")
    digests = {n: {"bytes": os.path.getsize(os.path.join(tmp, n)), "sha256": file_digest(os.path.join(tmp, n))}
               for n in _files_of(tmp, _rank())}
    if _distributed():
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, digests)
        digests = {k: v for d in gathered for k, v in d.items()}
    if _rank() == 0:
        manifest = {
            "format": FORMAT,
            **meta,
            "step": step,
            "world_size": dist.get_world_size() if _distributed() else 1,
            "tensors": {k: {"shape": list(v.size), "dtype": str(v.properties.dtype).replace("torch.", "")}
                        for k, v in sorted(metadata.state_dict_metadata.items()) if hasattr(v, "size")},
            "files": dict(sorted(digests.items())),
        }
        with open(os.path.join(tmp, MANIFEST), "w", encoding="utf-8") as f:
            json.dump(manifest, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        fault_point("save:before-rename")
        shutil.rmtree(final, ignore_errors=True)
        os.rename(tmp, final)
        fault_point("save:before-latest")
        pointer_tmp = os.path.join(directory, f".{LATEST}.tmp")
        with open(pointer_tmp, "w", encoding="utf-8") as f:
            f.write(name)
            f.flush()
            os.fsync(f.fileno())
        os.replace(pointer_tmp, os.path.join(directory, LATEST))
        _prune(directory, keep)
    _barrier()
    return final


def _global_shape(t: Any) -> torch.Size:
    with _quiet():
        return t.size() if callable(getattr(t, "size", None)) else t.shape


def _prune(directory: str, keep: int) -> None:
    steps = sorted(
        (int(n.split("_", 1)[1]), n) for n in os.listdir(directory) if n.startswith("step_") and n[5:].isdigit()
    )
    for _, name in steps[:-keep] if keep > 0 else []:
        shutil.rmtree(os.path.join(directory, name), ignore_errors=True)


# ---- load -----------------------------------------------------------------------------------------
def load_into(path: str, state: dict[str, Any], manifest: dict[str, Any]) -> None:
    """Fill `state` (flat, as saved; tensors are filled in place, resharded as their placement asks)
    from checkpoint `path`. Shapes are checked first so a mismatch is one clear line."""
    saved = manifest["tensors"]
    for key, value in state.items():
        if key not in saved:
            raise DlrmkitError(f"{path}: checkpoint has no tensor '{key}' (it was written for another model "
                               f"or optimizer); start a fresh --checkpoint-dir or match the run to the checkpoint")
        shape = list(_global_shape(value))
        if saved[key]["shape"] != shape:
            raise DlrmkitError(f"{path}: tensor '{key}' has shape {saved[key]['shape']} in the checkpoint "
                               f"but {shape} in this model; the checkpoint belongs to another model shape")
    with _quiet():
        try:
            _dcp().load(state, checkpoint_id=path, no_dist=not _distributed())
        except Exception as exc:  # DCP wraps reader errors in CheckpointException
            first = str(exc).strip().splitlines()[-1][:200] if str(exc).strip() else type(exc).__name__
            raise DlrmkitError(f"{path}: checkpoint could not be read ({first})") from None


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
        with _quiet():
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
                        optimizers: list[torch.optim.Optimizer]) -> None:
    """Load checkpoint `path` (verified, with its `manifest`) into a live model and optimizers,
    creating lazily-built optimizer state (e.g. Adam moments) that the checkpoint holds."""
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
    load_into(path, tensors, manifest)
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


# ---- single-process use (evaluate, export, tests) -------------------------------------------------
def load_single_process_model(path: str):
    """(DLRM, ModelConfig) in one process from any checkpoint, whatever world size and plan wrote it.

    `path` is a checkpoint folder or a checkpoint directory with `latest`. Checksums are verified."""
    from dlrmkit.model.dlrm import DLRM, ModelConfig

    path = resolve_checkpoint(path)
    manifest = verify_checkpoint(path)
    cfg = ModelConfig(**manifest["model_config"])
    model = DLRM(cfg)
    tensors, _ = model_state(model, [])
    tensors.pop(f"rng.{_rank()}")
    load_into(path, tensors, manifest)
    return model, cfg


def load_logical_state(path: str) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Every tensor of a checkpoint as one full tensor (name -> tensor), and its manifest."""
    path = resolve_checkpoint(path)
    manifest = verify_checkpoint(path)
    tensors = {k: torch.empty(v["shape"], dtype=getattr(torch, v["dtype"])) for k, v in manifest["tensors"].items()}
    load_into(path, tensors, manifest)
    return tensors, manifest


def load_parallel_model(path: str, options: Any):
    """Under torchrun: (model, ModelConfig, TrainerParallel) with `model`'s tables sharded by the
    plan `options` asks for (attributes sharding, plan, loader, backend, batch_size), filled from
    checkpoint `path` whatever world size and plan wrote it. Each rank reads only its shards."""
    from dlrmkit.model.dlrm import DLRM, ModelConfig
    from dlrmkit.parallel.hybrid import setup_parallel

    path = resolve_checkpoint(path)
    cfg = ModelConfig(**read_manifest(path)["model_config"])
    model = DLRM(cfg)
    _, par, _ = setup_parallel(model, options)
    manifest = verify_checkpoint(path)
    tensors, _ = model_state(model, [])
    tensors.pop(f"rng.{_rank()}")
    load_into(path, tensors, manifest)
    return model, cfg, par
