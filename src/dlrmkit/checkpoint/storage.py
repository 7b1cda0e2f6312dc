"""Pickle-free, copy-free storage under torch.distributed.checkpoint (DCP).

DCP plans which rectangles of which tensors each rank writes and reads (that is the resharding);
its stock FileSystemWriter/Reader then (1) clone every tensor that is a view into a larger
storage and keep all clones until the file is written, which doubled memory for the fused
tables, (2) read each stored chunk whole into a buffer, then torch.load a second copy, and
(3) pickle the metadata, so loading a `.metadata` runs whatever code it names.

RawWriter / RawReader keep DCP's planning and replace those three: each rank writes its tensors'
bytes as they lie in memory (row blocks of at most BLOCK bytes; only non-contiguous blocks, i.e.
column shards, are copied, one block at a time) into `data_<rank>.bin`; rank 0 writes the
metadata as JSON (`metadata.json`), validated field by field on read; reads go straight into
the destination tensors (the live parameters), through a bounded buffer only where the
destination is not contiguous. `legacy.LegacyReader` reads the first checkpoint format (DCP's own
files) with an allow-listed unpickler. Non-tensor values (DCP's BYTE_IO, loaded with
torch.load(weights_only=False)) are refused both ways.
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import re
import sys

from typing import Any

import torch
from torch.distributed.checkpoint import StorageReader, StorageWriter
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import LoadItemType, WriteItemType
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from dlrmkit.errors import DlrmkitError
from dlrmkit.atomic_io import create_new
from dlrmkit.checkpoint import coverage
from dlrmkit.checkpoint.manifest import DTYPES, MAX_INT, MAX_NDIM
from dlrmkit.untrusted import load_json

METADATA = "metadata.json"
STORAGE_FORMAT = "dlrmkit-raw/1"
BLOCK = 64 << 20  # bytes per write/read block: the most a save or load adds to resident memory
MAX_METADATA = 256 << 20  # bytes of metadata.json (one chunk entry is about 100 bytes)
DATA_FILE = re.compile(r"data_[0-9]{1,6}\.bin")
# the files a checkpoint folder may hold besides its manifest: [this format, the first format]
FORMAT_FILES = [
    re.compile(r"metadata\.json|data_[0-9]{1,6}\.bin"),
    re.compile(r"\.metadata|__[0-9]{1,6}_[0-9]{1,6}\.distcp"),
]


def progress(total: int, what: str, show: bool = True):
    """A byte progress bar on stderr that shows only after 2 s, only on a terminal, only if `show`
    (rank 0)."""
    from tqdm import tqdm

    return tqdm(
        total=total,
        desc=what,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        delay=2.0,
        disable=None if show else True,
        file=sys.stderr,
        leave=False,
        dynamic_ncols=True,
    )


def _flat(t: torch.Tensor) -> torch.Tensor | None:
    """`t` as a 1-d view with unit stride, or None (a one-element tensor can be contiguous with
    another stride, which a dtype view refuses)."""
    flat = t.reshape(-1) if t.is_contiguous() else None
    return flat if flat is not None and (flat.numel() == 0 or flat.stride(0) == 1) else None


def _bytes(t: torch.Tensor):
    """A CPU tensor's bytes: a view where _flat gives one, else of a copy (numpy has no bfloat16:
    go through uint8)."""
    flat = _flat(t)
    return (
        (flat if flat is not None else t.clone(memory_format=torch.contiguous_format).reshape(-1))
        .view(torch.uint8)
        .numpy()
    )


def _rows(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(1) if t.dim() == 0 else t


def _block_rows(shape: list[int] | torch.Size, itemsize: int) -> int:
    row = math.prod(shape[1:]) * itemsize if len(shape) > 1 else itemsize
    return max(1, BLOCK // max(row, 1))


def all_finite(t: torch.Tensor) -> bool:
    """Whether every value of `t` is finite, checked block by block (at most a block's flags held)."""
    rows = _rows(t.detach())
    step = _block_rows(list(rows.shape), rows.element_size())
    return all(bool(torch.isfinite(rows[lo : lo + step]).all()) for lo in range(0, rows.shape[0], step))


# ---- errors ----------------------------------------------------------------------------------------
def checkpoint_exception() -> type:
    from torch.distributed.checkpoint.api import CheckpointException  # a BaseException

    return CheckpointException


def cause(exc: BaseException) -> BaseException:
    """The first rank's exception inside DCP's CheckpointException (a BaseException), else `exc`."""
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict) and failures:
        first = next(iter(failures.values()))
        return first[0] if isinstance(first, tuple) else first
    return exc


def os_error(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.errno:
        return f"{exc.strerror or os.strerror(exc.errno)} ({errno.errorcode.get(exc.errno, exc.errno)})"
    return f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1][:160] if str(exc).strip() else ''}"


# ---- write ---------------------------------------------------------------------------------------
class RawWriter(StorageWriter):
    """One file per rank of raw tensor bytes; JSON metadata. `show` (rank 0): a progress bar."""

    def __init__(self, path: str, show: bool = False):
        super().__init__()
        self.path, self.show = str(path), show
        self.digests: dict[str, dict[str, Any]] = {}  # file -> {bytes, sha256}, computed while writing

    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        if checkpoint_id:
            self.path = str(checkpoint_id)

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        pass

    def prepare_local_plan(self, plan):
        return plan

    def prepare_global_plan(self, plans):
        import dataclasses

        return [dataclasses.replace(p, storage_data=f"data_{i}.bin") for i, p in enumerate(plans)]

    def write_data(self, plan, planner) -> Future:
        name = plan.storage_data
        total = sum(
            math.prod(i.tensor_data.size) * torch._utils._element_size(i.tensor_data.properties.dtype)
            for i in plan.items
            if i.type != WriteItemType.BYTE_IO
        )
        results, digest = [], hashlib.sha256()
        with create_new(os.path.join(self.path, name), "wb") as f, progress(total, "saving checkpoint", self.show) as bar:
            for item in plan.items:
                if item.type == WriteItemType.BYTE_IO:
                    raise DlrmkitError(f"checkpoint state '{item.index.fqn}' is not a tensor; only tensors are saved")
                t = planner.resolve_data(item).detach()
                offset = f.tell()
                rows = _rows(t)
                step = _block_rows(rows.shape, t.element_size())
                for lo in range(0, rows.shape[0], step):
                    block = rows[lo : lo + step].contiguous().cpu()  # a view unless a column shard or on a GPU
                    raw = _bytes(block)
                    f.write(raw)
                    digest.update(raw)
                    bar.update(block.numel() * block.element_size())
                length = f.tell() - offset
                results.append(
                    WriteResult(
                        index=item.index,
                        size_in_bytes=length,
                        storage_data={"file": name, "offset": offset, "length": length},
                    )
                )
            f.flush()
            os.fsync(f.fileno())
            self.digests[name] = {"bytes": f.tell(), "sha256": digest.hexdigest()}
        fut: Future = Future()
        fut.set_result(results)
        return fut

    def finish(self, metadata: Metadata, results) -> None:
        where = {(wr.index.fqn, tuple(wr.index.offset or ())): wr.storage_data for rs in results for wr in rs}
        tensors = {}
        for fqn, md in metadata.state_dict_metadata.items():
            if not isinstance(md, TensorStorageMetadata):
                raise DlrmkitError(f"checkpoint state '{fqn}' is not a tensor; only tensors are saved")
            tensors[fqn] = {
                "dtype": str(md.properties.dtype).replace("torch.", ""),
                "size": list(md.size),
                "chunks": [
                    {"offsets": list(c.offsets), "sizes": list(c.sizes), **where[(fqn, tuple(c.offsets))]}
                    for c in md.chunks
                ],
            }
        tmp = os.path.join(self.path, METADATA + ".tmp")
        with create_new(tmp) as f:
            json.dump({"format": STORAGE_FORMAT, "tensors": tensors}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, os.path.join(self.path, METADATA))

    def storage_meta(self) -> StorageMeta | None:
        return StorageMeta(checkpoint_id=self.path)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        return True


# ---- read ----------------------------------------------------------------------------------------
def _ints(value: Any, n: int | None, where: str) -> list[int]:
    if (
        not isinstance(value, list)
        or (n is not None and len(value) != n)
        or len(value) > MAX_NDIM
        or not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < MAX_INT for v in value)
    ):
        raise DlrmkitError(f"{where}: expected a list of {n if n is not None else ''} integers in [0, 2^62)")
    return value


def parse_metadata(path: str, manifest: dict[str, Any]) -> tuple[Metadata, dict[MetadataIndex, tuple[dict, list[int], torch.dtype]]]:
    """DCP Metadata from `path`/metadata.json, every field checked (types, dtypes from an
    allow-list, plain file names), its size bounded before parsing relative to the model the
    manifest declares, and its chunk lists proven whole (dlrmkit.checkpoint.coverage): each
    tensor tiled exactly once, each data file exactly its chunks' bytes, each tensor's dtype and
    shape those of the manifest."""
    fp = os.path.join(path, METADATA)
    raw = load_json(fp, "checkpoint metadata", coverage.metadata_limit(manifest, MAX_METADATA), follow_links=False)
    if not isinstance(raw, dict) or raw.get("format") != STORAGE_FORMAT or not isinstance(raw.get("tensors"), dict):
        raise DlrmkitError(f"{fp}: not {STORAGE_FORMAT} metadata")
    sd_md, storage, described = {}, {}, {}
    ranges: dict[str, list[tuple[int, int, str]]] = {}
    for fqn, t in raw["tensors"].items():
        where = f"{fp}: tensor '{str(fqn)[:80]}'"
        if not isinstance(t, dict) or t.get("dtype") not in DTYPES or not isinstance(t.get("chunks"), list):
            raise DlrmkitError(f"{where}: bad entry (dtype must be one of {sorted(DTYPES)})")
        dtype = getattr(torch, t["dtype"])
        size = _ints(t.get("size"), None, where)
        if len(t["chunks"]) > coverage.MAX_CHUNKS:
            raise DlrmkitError(f"{where}: {len(t['chunks'])} chunks, more than a checkpoint holds; refused")
        chunks, boxes = [], []
        for c in t["chunks"]:
            if not isinstance(c, dict):
                raise DlrmkitError(f"{where}: bad chunk")
            offs, sizes = _ints(c.get("offsets"), len(size), where), _ints(c.get("sizes"), len(size), where)
            if any(o + s > n for o, s, n in zip(offs, sizes, size)):
                raise DlrmkitError(f"{where}: chunk at {offs} of {sizes} lies outside the tensor {size}")
            name, start, length = c.get("file"), c.get("offset"), c.get("length")
            if not isinstance(name, str) or not DATA_FILE.fullmatch(name):
                raise DlrmkitError(f"{where}: chunk file {name!r} is not a data_<rank>.bin name")
            _ints([start, length], 2, where)
            if length != math.prod(sizes) * torch._utils._element_size(dtype):
                raise DlrmkitError(f"{where}: chunk length {length} does not match its shape {sizes}")
            chunks.append(ChunkStorageMetadata(torch.Size(offs), torch.Size(sizes)))
            boxes.append((offs, sizes))
            storage[MetadataIndex(fqn, offs)] = ({"file": name, "offset": start, "length": length}, sizes, dtype)
            ranges.setdefault(name, []).append((start, length, str(fqn)[:80]))
        coverage.check_tiling(where, size, boxes)
        described[fqn] = (t["dtype"], size)
        sd_md[fqn] = TensorStorageMetadata(TensorProperties(dtype=dtype), torch.Size(size), chunks)
    coverage.check_against_manifest(fp, described, manifest)
    data_files = [n for n in manifest.get("files", {}) if DATA_FILE.fullmatch(n)]
    coverage.check_byte_ranges(path, ranges, coverage.file_sizes(path, data_files), exact=True)
    meta = Metadata(
        state_dict_metadata=sd_md,
        planner_data={k: (k,) for k in sd_md},
        storage_data=storage,
        storage_meta=StorageMeta(),
        version="1.0.0",
    )
    return meta, storage


class RawReader(StorageReader):
    """Reads what RawWriter wrote, straight into the destination tensors."""

    def __init__(self, path: str, manifest: dict[str, Any], show: bool = False):
        super().__init__()
        self.path, self.show, self.storage, self.manifest = str(path), show, {}, manifest

    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        if checkpoint_id:
            self.path = str(checkpoint_id)

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        """Parsed once (load_into calls it before DCP, so a refusal is one line, not DCP's
        fallback tracebacks); DCP then gets the same object."""
        if getattr(self, "_meta", None) is None:
            self._meta, self.storage = parse_metadata(self.path, self.manifest)
        return self._meta

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.storage = metadata.storage_data

    def prepare_local_plan(self, plan):
        return plan

    def prepare_global_plan(self, plans):
        return plans

    def read_data(self, plan, planner) -> Future:
        per_file: dict[str, list] = {}
        for req in plan.items:
            if req.type == LoadItemType.BYTE_IO:
                raise DlrmkitError(f"{self.path}: checkpoint entry '{req.dest_index.fqn}' is not a tensor")
            per_file.setdefault(self.storage[req.storage_index][0]["file"], []).append(req)
        total = sum(math.prod(r.lengths) * self.storage[r.storage_index][2].itemsize for r in plan.items)
        with progress(total, "loading checkpoint", self.show) as bar:
            for name, reqs in sorted(per_file.items()):
                fp = os.path.join(self.path, name)
                with open(fp, "rb", buffering=0) as f:
                    size = os.fstat(f.fileno()).st_size
                    for req in sorted(reqs, key=lambda r: self.storage[r.storage_index][0]["offset"]):
                        info, shape, dtype = self.storage[req.storage_index]
                        if info["offset"] + info["length"] > size:
                            raise DlrmkitError(f"{fp}: shorter than its metadata says (truncated)")
                        target = planner.resolve_tensor(req).detach()  # another dtype: converted, as DCP does
                        _read_rectangle(
                            f,
                            fp,
                            info["offset"],
                            shape,
                            list(req.storage_offsets),
                            list(req.lengths),
                            target,
                            dtype,
                            bar,
                        )
                        planner.commit_tensor(req, target)
        fut: Future = Future()
        fut.set_result(None)
        return fut

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        return True


def _readinto(f, fp: str, pos: int, buf) -> None:
    view, done = memoryview(buf).cast("B"), 0
    while done < len(view):
        n = os.preadv(f.fileno(), [view[done:]], pos + done)
        if n <= 0:
            raise DlrmkitError(f"{fp}: shorter than its metadata says (truncated)")
        done += n


def _read_rectangle(
    f,
    fp: str,
    base: int,
    shape: list[int],
    offs: list[int],
    lens: list[int],
    target: torch.Tensor,
    dtype: torch.dtype,
    bar,
) -> None:
    """Copy the block [offs, offs+lens) of a row-major chunk `shape` stored at `base` into
    `target` (shape lens), row block by row block: straight into `target`'s memory when it is a
    contiguous CPU tensor and the block spans whole rows, else through a bounded buffer."""
    shape, offs, lens = (shape or [1]), (offs or [0]), (lens or [1])
    target = _rows(target)
    itemsize = torch._utils._element_size(dtype)
    row_bytes = math.prod(shape[1:]) * itemsize
    whole_rows = list(offs[1:]) == [0] * (len(shape) - 1) and list(lens[1:]) == list(shape[1:])
    step = _block_rows(shape, itemsize)
    for lo in range(0, lens[0], step):
        n = min(step, lens[0] - lo)
        pos = base + (offs[0] + lo) * row_bytes
        dest = target[lo : lo + n]
        if whole_rows and dest.is_cpu and dest.dtype == dtype and _flat(dest) is not None:
            _readinto(f, fp, pos, _bytes(dest))
        else:
            buf = torch.empty([n, *shape[1:]], dtype=dtype)
            _readinto(f, fp, pos, _bytes(buf))
            for d in range(1, len(shape)):
                buf = buf.narrow(d, offs[d], lens[d])
            dest.copy_(buf)
        bar.update(dest.numel() * itemsize)
