"""Placement-free checkpoints, planned by torch.distributed.checkpoint (DCP).

A checkpoint is a folder `<dir>/step_N` holding `metadata.json` and `data_<rank>.bin` (written by
dlrmkit.checkpoint.storage under DCP's plan: raw tensor bytes, JSON metadata, no pickle) and
`manifest.json`. The DCP state dict is *logical* (dlrmkit.checkpoint.state): each embedding table
is one tensor whatever fused layout or sharding plan held it; under torchrun the tables come in as
ShardedTensors, so each rank writes only its own shards and DCP reshards on load.

The manifest (JSON) carries what DCP has no place for: the model and train configs, step, loader
position, the dataset's fingerprint, non-tensor optimizer state, every tensor's shape and dtype,
and the size and SHA-256 of every file in the folder. Loading refuses a folder whose files differ
from that list in any way. Checksums detect corruption; they do not authenticate (whoever can
write the folder can rewrite the manifest): safety against a crafted checkpoint comes from never
unpickling it (docs/RELIABILITY.md, "Trust model").

Atomic: everything is written into `<dir>/.tmp-step_N`, renamed to `step_N` when complete, then
`<dir>/latest` is replaced (atomic rename) to name it. A process killed or a disk that fills while
saving leaves the previous checkpoint and `latest` intact; the temporary folder is removed.
Finding, listing and pruning step folders: dlrmkit.checkpoint.dirs.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import stat
import sys
from typing import Any

import torch
import torch.distributed as dist

from dlrmkit.atomic_io import create_new, removed_if_interrupted
from dlrmkit.errors import DlrmkitError
from dlrmkit.checkpoint import storage as storage
from dlrmkit.checkpoint import legacy, state as ckpt_state
from dlrmkit.checkpoint.dirs import LATEST, MANIFEST, is_step_name, latest_or_none, prune, resolve_checkpoint, run_id_of
from dlrmkit.checkpoint.manifest import check_model_fits, model_config_of, read_manifest, recorded_bags

# re-exported: callers find every checkpoint function here
from dlrmkit.checkpoint.dirs import check_fresh_directory as check_fresh_directory
from dlrmkit.checkpoint.dirs import check_writable_directory as check_writable_directory
from dlrmkit.checkpoint.dirs import existing_checkpoints as existing_checkpoints
from dlrmkit.checkpoint.dirs import latest_checkpoint as latest_checkpoint
from dlrmkit.checkpoint.dirs import step_folders as step_folders
from dlrmkit.checkpoint.state import checkpoint_meta, model_state  # noqa: F401 (re-exported)
from dlrmkit.checkpoint.state import quiet as _quiet
from dlrmkit.faults import fault_point

FORMAT = "dlrmkit-checkpoint/2"  # raw data files, JSON metadata
LEGACY_FORMAT = "dlrmkit-checkpoint/1"  # DCP's own files (pickled .metadata): still read, never written


# ---- distributed helpers (all no-ops in one process) ----------------------------------------------
def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _rank() -> int:
    return dist.get_rank() if _distributed() else 0


def _broadcast_error(message: str | None) -> None:
    """Raise the same DlrmkitError on every rank when any rank found one (also a barrier)."""
    if _distributed():
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, message)
        message = next((m for m in gathered if m), None)
    if message:
        raise DlrmkitError(message)


def _dcp():
    import torch.distributed.checkpoint as dcp

    return dcp


# ---- checksums ----------------------------------------------------------------------------------
def file_digest(path: str, chunk: int = 1 << 22, bar: Any = None) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
            if bar is not None:
                bar.update(len(block))
    return h.hexdigest()


def _files_of(folder: str, rank: int | None) -> list[str]:
    """Files a rank wrote (data_<rank>.bin; rank 0 also the metadata); rank None: all files."""
    names = sorted(n for n in os.listdir(folder) if n != MANIFEST and os.path.isfile(os.path.join(folder, n)))
    if rank is None:
        return names
    return [n for n in names if n == f"data_{rank}.bin" or (rank == 0 and not n.startswith("data_"))]


def _listed_files(path: str, manifest: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The manifest's file list, checked against the folder: mandatory, plain names, and exactly
    the files present (a missing, extra or unlisted file refuses the checkpoint)."""
    fp = os.path.join(path, MANIFEST)
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        raise DlrmkitError(
            f"{fp}: lists no files with their SHA-256; refused (every checkpoint lists every file it holds)"
        )
    expected = storage.FORMAT_FILES[manifest.get("format") == LEGACY_FORMAT]
    for name, info in files.items():
        if (
            not isinstance(name, str)
            or not expected.fullmatch(name)
            or not isinstance(info, dict)
            or not isinstance(info.get("bytes"), int)
            or not isinstance(info.get("sha256"), str)
        ):
            raise DlrmkitError(
                f"{fp}: file entry {str(name)[:60]!r} is not a file of a {manifest.get('format')} checkpoint; refused"
            )
        _regular_file(os.path.join(path, name))
    for name in sorted(set(os.listdir(path)) - set(files) - {MANIFEST}):
        raise DlrmkitError(
            f"{os.path.join(path, name)}: not listed in {MANIFEST}; refused (a checkpoint holds only "
            f"the files its manifest lists); use an older checkpoint (point '{LATEST}' at it)"
        )
    return files


def _regular_file(fp: str) -> None:
    """A listed checkpoint file is a regular file of the folder itself: a symbolic link (which
    could name a file anywhere, or /dev/zero) or a FIFO is refused before it is opened."""
    try:
        st = os.lstat(fp)
    except FileNotFoundError:
        return  # reported as missing, in order, by verify_checkpoint
    except OSError as exc:
        raise DlrmkitError(f"{fp}: {storage.os_error(exc)}") from None
    if not stat.S_ISREG(st.st_mode):
        kind = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a regular file"
        raise DlrmkitError(f"{fp}: is {kind}; a checkpoint holds only regular files of its own folder; refused")


def verify_checkpoint(path: str, show: bool = True) -> dict[str, Any]:
    """The manifest of checkpoint `path`, after checking that the folder holds exactly the files it
    lists, each with its size and SHA-256 (each rank checks a share of the files). Raises one
    DlrmkitError line on any difference."""
    path = resolve_checkpoint(path)
    manifest = read_manifest(path)
    error = None
    try:
        files = _listed_files(path, manifest)
    except DlrmkitError as exc:
        files, error = {}, str(exc)
    rank, world = _rank(), (dist.get_world_size() if _distributed() else 1)
    mine = [(n, i) for k, (n, i) in enumerate(sorted(files.items())) if k % world == rank]
    with storage.progress(sum(i["bytes"] for _, i in mine), "verifying checkpoint", show and rank == 0) as bar:
        for name, info in mine:
            if error:
                break
            fp = os.path.join(path, name)
            if not os.path.isfile(fp):
                error = f"{fp}: checkpoint file is missing; use an older checkpoint (point '{LATEST}' at it)"
            elif os.path.getsize(fp) != info["bytes"]:
                error = (
                    f"{fp}: checkpoint file is truncated or altered ({os.path.getsize(fp)} bytes, manifest says "
                    f"{info['bytes']}); use an older checkpoint (point '{LATEST}' at it)"
                )
            elif file_digest(fp, bar=bar) != info["sha256"]:
                error = (
                    f"{fp}: checkpoint file is corrupt (SHA-256 differs from {MANIFEST}); "
                    f"use an older checkpoint (point '{LATEST}' at it)"
                )
    _broadcast_error(error)
    return manifest


def check_bags(checkpoint: str, data: str, names: list[str], hotness: list[int]) -> None:
    """The model of `checkpoint` (a folder, or a directory with `latest`) was trained on the bag
    sizes of dataset `data` (its categorical features `names`, `hotness` ids per sample each), or
    one line naming the first table that differs: sum-pooling bags of another size would score
    other ids than the model learned. Checkpoints written before the bag sizes were recorded are
    read as they come."""
    bags = recorded_bags(resolve_checkpoint(checkpoint))
    for t, (name, saved, here) in enumerate(zip(names, bags or [], hotness)):
        if saved != here:
            raise DlrmkitError(
                f"{checkpoint}: table {t} ({name}) was trained on bags of {saved} id{'s' if saved != 1 else ''} "
                f"per sample, but {data} has bags of {here}; score it with a model trained on bags of its sizes"
            )


# ---- save -----------------------------------------------------------------------------------------
def save_checkpoint(
    directory: str, step: int, state: dict[str, Any], meta: dict[str, Any], keep: int = 2, show: bool = True
) -> str:
    """Write `state` (flat: name -> tensor, ShardedTensor or DTensor) with DCP and `meta` into the
    manifest, atomically. Under torch.distributed every rank calls this with its own shards.
    A write error (disk full, read-only) is one line on every rank; the temporary folder is
    removed and the previous checkpoint and `latest` stay as they were; so it is when SIGINT,
    SIGTERM or SIGHUP stops the save. Pruning (--keep) removes only checkpoints of this run
    (`meta["run_id"]`)."""
    tmp = os.path.join(directory, f".tmp-step_{step}")
    with removed_if_interrupted(tmp if _rank() == 0 else None):
        return _save(directory, step, state, meta, keep, show)


def _save(directory: str, step: int, state: dict[str, Any], meta: dict[str, Any], keep: int, show: bool) -> str:
    name = f"step_{step}"
    tmp, final = os.path.join(directory, f".tmp-{name}"), os.path.join(directory, name)
    rank0 = _rank() == 0

    def failed(exc: BaseException) -> str:
        if rank0:
            shutil.rmtree(tmp, ignore_errors=True)
        prev = latest_or_none(directory)
        return (
            f"cannot write checkpoint {final}: {storage.os_error(exc)}; "
            f"{'the previous checkpoint ' + prev + ' is intact' if prev else 'no checkpoint was written'}"
        )

    error = None
    if rank0:
        try:
            os.makedirs(directory, exist_ok=True)
            for stale in sorted(os.listdir(directory)):  # left by a process killed mid-save (only our names)
                if stale.startswith(".tmp-") and is_step_name(stale[5:]) and stale != os.path.basename(tmp):
                    shutil.rmtree(os.path.join(directory, stale), ignore_errors=True)  # never through a link
                    if not os.path.lexists(os.path.join(directory, stale)):
                        print(f"removed {os.path.join(directory, stale)}, left by an interrupted save", file=sys.stderr)
            shutil.rmtree(tmp, ignore_errors=True)  # ours, from a run killed at this very step
            os.makedirs(tmp)
        except OSError as exc:
            error = failed(exc)
    _broadcast_error(error)
    try:
        with _quiet():
            writer = storage.RawWriter(tmp, show=rank0 and show)
            metadata = _dcp().save(state, storage_writer=writer, no_dist=not _distributed())
    except (Exception, storage.checkpoint_exception()) as exc:  # DCP raises the same on every rank
        cause = storage.cause(exc)
        if isinstance(cause, (KeyboardInterrupt, SystemExit)):  # a signal: removed_if_interrupted cleans up
            raise cause from None
        if isinstance(cause, DlrmkitError):  # refused state (not a tensor): no half-written folder either
            if rank0:
                shutil.rmtree(tmp, ignore_errors=True)
            raise DlrmkitError(str(cause)) from None
        raise DlrmkitError(failed(cause)) from None
    fault_point("save:after-data")
    error, digests = None, {}
    try:
        digests = {
            n: writer.digests.get(n)
            or {"bytes": os.path.getsize(os.path.join(tmp, n)), "sha256": file_digest(os.path.join(tmp, n))}
            for n in _files_of(tmp, _rank())
        }  # data files: hashed as they were written
    except OSError as exc:
        error = failed(exc)
    if _distributed():
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, (error, digests))
        error = next((e for e, _ in gathered if e), None)
        digests = {k: v for _, d in gathered for k, v in d.items()}
    if rank0 and error is None and os.path.lexists(final) and run_id_of(final) != meta.get("run_id"):
        shutil.rmtree(tmp, ignore_errors=True)  # never replace what another run (or no one known) wrote
        error = (
            f"cannot write checkpoint {final}: the folder exists and is not this run's checkpoint; "
            f"refused to replace it (move it away, or give a fresh --checkpoint-dir)"
        )
    if rank0 and error is None:
        try:
            _publish(
                directory,
                name,
                tmp,
                final,
                {
                    "format": FORMAT,
                    **meta,
                    "step": step,
                    "world_size": dist.get_world_size() if _distributed() else 1,
                    "tensors": {
                        k: {"shape": list(v.size), "dtype": str(v.properties.dtype).replace("torch.", "")}
                        for k, v in sorted(metadata.state_dict_metadata.items())
                        if hasattr(v, "size")
                    },
                    "files": dict(sorted(digests.items())),
                },
            )
        except OSError as exc:
            error = failed(exc)
        else:
            prune(directory, keep, meta.get("run_id"))
    _broadcast_error(error)
    return final


def _publish(directory: str, name: str, tmp: str, final: str, manifest: dict[str, Any]) -> None:
    """Manifest (fsynced), rename the folder into place, then point `latest` at it (atomic rename)."""
    with create_new(os.path.join(tmp, MANIFEST)) as f:
        json.dump(manifest, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    fault_point("save:before-rename")
    shutil.rmtree(final, ignore_errors=True)
    os.rename(tmp, final)
    fault_point("save:before-latest")
    pointer_tmp = os.path.join(directory, f".{LATEST}.tmp")
    try:
        with create_new(pointer_tmp) as f:  # never through a link planted there
            f.write(name)
            f.flush()
            os.fsync(f.fileno())
        os.replace(pointer_tmp, os.path.join(directory, LATEST))
    except OSError:
        with_suppressed(os.remove, pointer_tmp)
        raise


def with_suppressed(fn, *args) -> None:
    try:
        fn(*args)
    except OSError:
        pass


def _global_shape(t: Any) -> torch.Size:
    with _quiet():
        return t.size() if callable(getattr(t, "size", None)) else t.shape


# ---- load -----------------------------------------------------------------------------------------
def load_into(path: str, state: dict[str, Any], manifest: dict[str, Any], show: bool = True) -> None:
    """Fill `state` (flat, as saved; tensors are filled in place, resharded as their placement asks)
    from checkpoint `path`. Shapes are checked first so a mismatch is one clear line. Only the
    first format's pickled metadata is unpickled, from an allow-list of DCP's metadata classes."""
    saved = manifest["tensors"]
    for key, value in state.items():
        if key not in saved:
            raise DlrmkitError(
                f"{path}: checkpoint has no tensor '{key}' (it was written for another model "
                f"or optimizer); start a fresh --checkpoint-dir or match the run to the checkpoint"
            )
        shape = list(_global_shape(value))
        if saved[key].get("shape") != shape:
            raise DlrmkitError(
                f"{path}: tensor '{key}' has shape {saved[key].get('shape')} in the checkpoint "
                f"but {shape} in this model; the checkpoint belongs to another model shape"
            )
        with _quiet():  # a ShardedTensor's dtype warns of its deprecation on every read
            _check_dtype(path, key, saved[key].get("dtype"), value)
    show = show and _rank() == 0
    reader = (
        legacy.LegacyReader(path, manifest)
        if manifest.get("format") == LEGACY_FORMAT
        else storage.RawReader(path, manifest, show=show)
    )
    reader.read_metadata()  # refused here, in one line, before DCP (which would log and retry)
    with _quiet():
        try:
            _dcp().load(
                state, storage_reader=reader, planner=legacy.TensorsOnlyLoadPlanner(), no_dist=not _distributed()
            )
        except (Exception, storage.checkpoint_exception()) as exc:  # DCP wraps reader errors
            cause = storage.cause(exc)
            if isinstance(cause, DlrmkitError):
                raise DlrmkitError(str(cause)) from None
            raise DlrmkitError(f"{path}: checkpoint could not be read ({storage.os_error(cause)})") from None
    _broadcast_error(_not_finite(path, state))


def _not_finite(path: str, state: dict[str, Any]) -> str | None:
    """A refusal naming the first floating-point tensor of `state` (this rank's shards) holding a
    NaN or an infinity, else None: a run stops before it saves a non-finite loss's weights, so
    such a tensor is not a trained model's (its scores would be NaN, or one class everywhere).
    Checked block by block, so the check allocates at most a block's flags."""
    for key, value in state.items():
        with _quiet():
            parts = [s.tensor for s in value.local_shards()] if hasattr(value, "local_shards") else [value]
        if any(torch.is_tensor(t) and t.is_floating_point() and not storage.all_finite(t) for t in parts):
            return (
                f"{path}: tensor '{key}' holds a value that is not finite (NaN or infinity); "
                f"use an older checkpoint (point '{LATEST}' at it)"
            )
    return None


def _check_dtype(path: str, key: str, stored: Any, value: Any) -> None:
    """A stored dtype is read into the model's tensor as is, or converted between floating-point
    types (a bf16 table into an fp32 model); anything else (an RNG state as float, an integer
    counter as float) means the checkpoint is not this model's."""
    dtype = getattr(value, "dtype", None)
    if dtype is None or str(dtype).replace("torch.", "") == stored:
        return
    if not (dtype.is_floating_point and getattr(torch, str(stored), torch.uint8).is_floating_point):
        raise DlrmkitError(
            f"{path}: tensor '{key}' is {stored} in the checkpoint but {str(dtype).replace('torch.', '')} "
            f"in this model; refused"
        )


def restore_model_state(
    path: str, manifest: dict[str, Any], model: torch.nn.Module, optimizers: list, show: bool = True
) -> None:
    """Load checkpoint `path` into a live model and its optimizers (ckpt_state.restore_model_state)."""
    ckpt_state.restore_model_state(path, manifest, model, optimizers, load_into, show)


# ---- single-process use (evaluate, export, predict, tests) -------------------------------------------
def load_single_process_model(path: str, check: Any = None):
    """(DLRM, ModelConfig) in one process from any checkpoint, whatever world size and plan wrote it.

    `path` is a checkpoint folder or a checkpoint directory with `latest`. Checksums are verified;
    `check(cfg)`, if given, runs before the model is built (e.g. against the dataset's tables)."""
    from dlrmkit.model.dlrm import DLRM

    path = resolve_checkpoint(path)
    manifest = verify_checkpoint(path)
    cfg = model_config_of(path, manifest)
    if check is not None:
        check(cfg)
    check_model_fits(path, cfg)
    try:
        model = DLRM(cfg)
    except (RuntimeError, MemoryError) as exc:  # a manifest may describe a model larger than memory
        raise DlrmkitError(
            f"{path}: cannot allocate the model its manifest describes "
            f"(tables {cfg.table_sizes[:4]}{'...' if len(cfg.table_sizes) > 4 else ''}, "
            f"dim {cfg.embedding_dim}): {str(exc)[:80]}"
        ) from None
    tensors, _ = model_state(model, [])
    tensors.pop(f"rng.{_rank()}")
    load_into(path, tensors, manifest)
    return model, cfg


def load_logical_state(path: str) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Every tensor of a checkpoint as one full tensor (name -> tensor), and its manifest."""
    path = resolve_checkpoint(path)
    manifest = verify_checkpoint(path)
    from dlrmkit.resources import check_memory

    sizes = {k: (v["shape"], getattr(torch, v["dtype"])) for k, v in manifest["tensors"].items()}
    check_memory(sum(math.prod(s) * d.itemsize for s, d in sizes.values()), f"{path}: the tensors its manifest lists")
    tensors = {k: torch.zeros(s, dtype=d) for k, (s, d) in sizes.items()}  # never memory it did not fill
    load_into(path, tensors, manifest)
    return tensors, manifest


def load_parallel_model(path: str, options: Any, batch_size: int, check: Any = None):
    """Under torchrun: (model, ModelConfig, TrainerParallel) with `model`'s tables sharded by the
    plan `options` (dlrmkit.parallel.options.ParallelOptions) asks for at `batch_size`, filled from
    checkpoint `path` whatever world size and plan wrote it. Each rank reads only its shards."""
    from dlrmkit.model.dlrm import DLRM
    from dlrmkit.parallel.hybrid import setup_parallel

    path = resolve_checkpoint(path)
    cfg = model_config_of(path, read_manifest(path))
    if check is not None:
        check(cfg)
    check_model_fits(path, cfg, tables=False)  # each rank allocates only its shards of the tables
    model = DLRM(cfg, embedding_device="meta")
    _, par, _ = setup_parallel(model, options, "cpu", batch_size, None)
    manifest = verify_checkpoint(path)
    tensors, _ = model_state(model, [])
    tensors.pop(f"rng.{_rank()}")
    load_into(path, tensors, manifest)
    return model, cfg, par
