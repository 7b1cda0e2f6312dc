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
    StorageMeta,
    TensorStorageMetadata,
)

from dlrmkit.errors import DlrmkitError
from dlrmkit.checkpoint.manifest import DTYPES
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
    DCP with torch.load(weights_only=True)), with the metadata unpickled from an allow-list."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if getattr(self, "_meta", None) is None:
            self._meta = self._read_metadata()
        return self._meta

    def _read_metadata(self) -> Metadata:
        fp = os.path.join(str(self.path), ".metadata")
        data = read_bytes(fp, "checkpoint metadata", 256 << 20, follow_links=False)  # bounded, then unpickled
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
        for info in meta.storage_data.values():
            rel = getattr(info, "relative_path", None)
            if not isinstance(rel, str) or os.path.basename(rel) != rel or getattr(info, "transform_descriptors", None):
                raise DlrmkitError(f"{fp}: refused checkpoint metadata (file {rel!r} is not a plain name)")
        meta.storage_meta = StorageMeta(load_id=self.load_id)
        return meta


class TensorsOnlyLoadPlanner(DefaultLoadPlanner):
    """DCP's load planner, minus torch.load(weights_only=False) of non-tensor entries."""

    def load_bytes(self, read_item, value) -> None:
        raise DlrmkitError(f"checkpoint entry '{read_item.dest_index.fqn}' is not a tensor; refused")
