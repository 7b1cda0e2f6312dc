"""Reading the first checkpoint format (DCP's FileSystemWriter: pickled `.metadata`, torch.save'd
chunks) without running code from it: the metadata is unpickled from an allow-list, and DCP's
non-tensor entries (which it would torch.load(weights_only=False)) are refused."""

from __future__ import annotations

import io
import os
import pickle
from typing import Any

from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import (
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorStorageMetadata,
)

from dlrmkit.errors import DlrmkitError
from dlrmkit.checkpoint import coverage
from dlrmkit.checkpoint.manifest import DTYPES, MAX_INT, MAX_NDIM
from dlrmkit.untrusted import read_bytes

# ---- the first format: DCP's own files, pickled metadata --------------------------------------------
_ALLOWED = {
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
    ("collections", "OrderedDict"),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    *(
        ("torch.distributed.checkpoint.metadata", n)
        for n in (
            "ChunkStorageMetadata",
            "Metadata",
            "MetadataIndex",
            "StorageMeta",
            "TensorProperties",
            "TensorStorageMetadata",
            "_MEM_FORMAT_ENCODING",
        )
    ),
}


class _MetadataUnpickler(pickle.Unpickler):
    """Builds only DCP metadata classes, torch dtypes and sizes: any other global is refused, so
    a crafted `.metadata` cannot name a function to call."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED or (module == "torch" and name in DTYPES):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refused global {module}.{name}")


class LegacyReader(FileSystemReader):
    """The first format (DCP's FileSystemWriter: pickled `.metadata`, torch.save'd chunks, read by
    DCP with torch.load(weights_only=True)), with the metadata unpickled from an allow-list, its
    size bounded relative to the model the manifest declares and its chunk lists proven whole
    (dlrmkit.checkpoint.coverage) before DCP plans a read."""

    def __init__(self, path: str, manifest: dict[str, Any]):
        super().__init__(path)
        self.manifest = manifest

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if getattr(self, "_meta", None) is None:
            self._meta = self._read_metadata()
        return self._meta

    def _read_metadata(self) -> Metadata:
        fp = os.path.join(str(self.path), ".metadata")
        limit = coverage.metadata_limit(self.manifest, 256 << 20)
        data = read_bytes(fp, "checkpoint metadata", limit, follow_links=False)  # bounded, then unpickled
        try:
            meta = _MetadataUnpickler(io.BytesIO(data)).load()
        except Exception as exc:  # any unpickling failure, refused global included
            raise DlrmkitError(f"{fp}: refused checkpoint metadata ({type(exc).__name__}: {str(exc)[:120]})") from None
        if (
            not isinstance(meta, Metadata)
            or not isinstance(meta.storage_data, dict)
            or not all(isinstance(v, TensorStorageMetadata) for v in meta.state_dict_metadata.values())
        ):
            raise DlrmkitError(f"{fp}: refused checkpoint metadata (not tensor metadata)")
        _check_chunks(fp, str(self.path), meta, self.manifest)
        meta.storage_meta = StorageMeta(load_id=self.load_id)
        return meta


def _check_chunks(fp: str, folder: str, meta: Metadata, manifest: dict[str, Any]) -> None:
    """Every tensor tiled exactly once by its chunks, each chunk stored once at a byte range
    inside a plain-named file of the folder, each tensor's dtype and shape the manifest's."""
    sd, storage = meta.state_dict_metadata, meta.storage_data
    per_tensor = sum(len(getattr(md, "chunks", ()) or ()) for md in sd.values())
    if len(sd) > len(manifest.get("tensors", {})) or per_tensor > coverage.MAX_CHUNKS * max(1, len(sd)):
        raise DlrmkitError(f"{fp}: refused checkpoint metadata (more tensors or chunks than the manifest's model)")
    if len(storage) != per_tensor:
        raise DlrmkitError(f"{fp}: refused checkpoint metadata ({len(storage)} stored chunks for {per_tensor} listed)")
    described, ranges = {}, {}
    for fqn, md in sd.items():
        where = f"{fp}: tensor '{str(fqn)[:80]}'"
        size = _ints(md.size, where)
        boxes = []
        for c in md.chunks:
            offs, sizes = _ints(c.offsets, where, len(size)), _ints(c.sizes, where, len(size))
            if any(o + n > s for o, n, s in zip(offs, sizes, size)):
                raise DlrmkitError(f"{where}: chunk at {offs} of {sizes} lies outside the tensor {size}")
            info = storage.get(MetadataIndex(fqn, offs))
            rel, start, length = (getattr(info, k, None) for k in ("relative_path", "offset", "length"))
            if not isinstance(rel, str) or os.path.basename(rel) != rel or getattr(info, "transform_descriptors", None):
                raise DlrmkitError(f"{fp}: refused checkpoint metadata (file {rel!r} is not a plain name)")
            _ints([start, length], where, 2)
            boxes.append((offs, sizes))
            ranges.setdefault(rel, []).append((start, length, str(fqn)[:80]))
        coverage.check_tiling(where, size, boxes)
        dtype = str(getattr(md.properties, "dtype", None)).replace("torch.", "")
        described[fqn] = (dtype, size)
    coverage.check_against_manifest(fp, described, manifest)
    names = [n for n in manifest.get("files", {}) if n != ".metadata"]
    coverage.check_byte_ranges(folder, ranges, coverage.file_sizes(folder, names), exact=False)


def _ints(value: Any, where: str, n: int | None = None) -> list[int]:
    out = list(value) if isinstance(value, (list, tuple)) else None  # torch.Size is a tuple
    if (
        out is None
        or (n is not None and len(out) != n)
        or len(out) > MAX_NDIM
        or not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < MAX_INT for v in out)
    ):
        raise DlrmkitError(f"{where}: refused checkpoint metadata (not a list of integers in [0, 2^62))")
    return out


class TensorsOnlyLoadPlanner(DefaultLoadPlanner):
    """DCP's load planner, minus torch.load(weights_only=False) of non-tensor entries."""

    def load_bytes(self, read_item, value) -> None:
        raise DlrmkitError(f"checkpoint entry '{read_item.dest_index.fqn}' is not a tensor; refused")
