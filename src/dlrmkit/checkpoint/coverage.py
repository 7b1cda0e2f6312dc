"""A checkpoint's chunk lists checked before a byte is read, so that a checkpoint describes a
whole model or is refused: each tensor's chunks tile it exactly once (no overlap, no gap, no
repeat), every chunk's bytes lie inside its file, and the files hold exactly the bytes their
chunks name. The storage readers (dlrmkit.checkpoint.storage, .legacy) call these on the
metadata they parsed; what the metadata says about each tensor must also agree with the
manifest (`check_against_manifest`), which is what the model is checked against.

The cost of reading metadata is bounded before it is parsed, relative to the model the manifest
declares (`metadata_limit`), and the cost of these checks by `MAX_CHUNKS` per tensor."""

from __future__ import annotations

import math
from typing import Any, Iterable, Sequence

import numpy as np

from dlrmkit.errors import DlrmkitError

MAX_CHUNKS = 1 << 14  # chunks of one tensor: far more than any plan writes (one per shard)
CHUNK_BYTES = 512  # metadata bytes one chunk entry may take (JSON: about 100)
BASE_METADATA = 1 << 20  # metadata bytes allowed whatever the model


def metadata_limit(manifest: dict[str, Any], hard_limit: int) -> int:
    """Bytes a checkpoint's storage metadata may have: room for 64 chunks per tensor per rank
    that wrote it (a shard per rank is the common case), but never more chunks than the tensors
    have values (each chunk but an empty tensor's holds one at least), nor more than `hard_limit`
    bytes: a manifest claiming many ranks cannot buy a large parse for a small model."""
    tensors = manifest.get("tensors") if isinstance(manifest.get("tensors"), dict) else {}
    world = manifest.get("world_size")
    world = world if isinstance(world, int) and not isinstance(world, bool) and 0 < world <= 1 << 16 else 1
    values = sum(math.prod(t.get("shape") or [1]) for t in tensors.values() if isinstance(t, dict))
    chunks = min(64 * max(1, len(tensors)) * world, values + len(tensors))
    return min(hard_limit, BASE_METADATA + CHUNK_BYTES * chunks)


def check_tiling(where: str, size: Sequence[int], chunks: Sequence[tuple[Sequence[int], Sequence[int]]]) -> None:
    """The boxes (offsets, sizes) cover the tensor `size` exactly once, or one line naming it.
    Each box lies inside the tensor (checked by the caller); with the volumes summing to the
    tensor's, no two boxes overlapping means no gap either. Pairs are compared vectorized,
    block by block, so the check costs O(n^2 d / vector width) for n chunks of d dimensions."""
    n, total = len(chunks), math.prod(size)
    if n > MAX_CHUNKS:
        raise DlrmkitError(f"{where}: {n} chunks, more than a checkpoint holds ({MAX_CHUNKS}); refused")
    nonempty = [(list(o), list(s)) for o, s in chunks if math.prod(s) > 0]
    seen: set[tuple[int, ...]] = set()
    for o, _ in chunks:
        key = tuple(o)
        if key in seen:
            raise DlrmkitError(f"{where}: chunk at {list(o)} is listed twice; refused")
        seen.add(key)
    stored = sum(math.prod(s) for _, s in nonempty)
    if stored != total:
        kind = "a part is missing" if stored < total else "parts overlap"
        raise DlrmkitError(
            f"{where}: its chunks hold {stored} values, the tensor {list(size)} has {total} ({kind}); refused"
        )
    if len(nonempty) < 2:
        return
    lo = np.array([o for o, _ in nonempty], dtype=np.int64).reshape(len(nonempty), -1)
    hi = lo + np.array([s for _, s in nonempty], dtype=np.int64).reshape(len(nonempty), -1)
    step = max(1, (1 << 22) // max(1, len(nonempty) * max(1, lo.shape[1])))
    for a in range(0, len(nonempty), step):
        b = min(len(nonempty), a + step)
        overlap = np.ones((b - a, len(nonempty)), dtype=bool)
        for d in range(lo.shape[1]):
            overlap &= (lo[a:b, d, None] < hi[None, :, d]) & (lo[None, :, d] < hi[a:b, d, None])
        overlap[np.arange(b - a), np.arange(a, b)] = False
        hit = np.argwhere(overlap)
        if len(hit):
            i, j = int(hit[0][0]) + a, int(hit[0][1])
            raise DlrmkitError(
                f"{where}: chunks at {nonempty[i][0]} and {nonempty[j][0]} overlap (and so leave a part "
                f"uncovered); refused"
            )


def check_byte_ranges(
    folder: str, ranges: dict[str, list[tuple[int, int, str]]], sizes: dict[str, int], exact: bool
) -> None:
    """Each file's chunk byte ranges [(offset, length, tensor)] lie inside the file (`sizes`:
    its size) and do not overlap; `exact`: they also cover it end to end (the raw format writes
    each rank's chunks back to back, so a file is exactly its chunks)."""
    for name, spans in sorted(ranges.items()):
        fp = f"{folder}/{name}"
        if name not in sizes:
            raise DlrmkitError(f"{fp}: named by the checkpoint metadata but not in the folder's file list; refused")
        end = 0
        for offset, length, fqn in sorted(spans):
            if offset < end:
                raise DlrmkitError(
                    f"{fp}: the chunk of tensor '{fqn}' at byte {offset} overlaps the bytes of another chunk; refused"
                )
            if exact and offset != end:
                raise DlrmkitError(
                    f"{fp}: the chunk of tensor '{fqn}' starts at byte {offset}, leaving bytes {end}..{offset} that "
                    f"no chunk names (the metadata and the file disagree); refused"
                )
            end = offset + length
        if end > sizes[name]:
            raise DlrmkitError(
                f"{fp}: {sizes[name]} bytes, but the metadata places the chunk of tensor '{spans[-1][2]}' up to "
                f"byte {end} (truncated); refused"
            )
        if exact and end != sizes[name]:
            raise DlrmkitError(f"{fp}: {sizes[name]} bytes, but its chunks hold {end}; refused")
    if exact:
        for name in sorted(set(sizes) - set(ranges)):
            if sizes[name]:
                raise DlrmkitError(f"{folder}/{name}: {sizes[name]} bytes that no chunk names; refused")


def check_against_manifest(fp: str, described: dict[str, tuple[str, list[int]]], manifest: dict[str, Any]) -> None:
    """The tensors the storage metadata describes ({name: (dtype, size)}) are exactly the
    manifest's, each with the same dtype and shape; else one line naming the tensor."""
    listed = manifest.get("tensors", {})
    for name in sorted(set(listed) ^ set(described)):
        side = "the manifest" if name in listed else "the metadata"
        raise DlrmkitError(f"{fp}: tensor '{str(name)[:80]}' is only in {side}; refused")
    for name, (dtype, size) in described.items():
        want = listed[name]
        if want.get("dtype") != dtype or list(want.get("shape", [])) != list(size):
            raise DlrmkitError(
                f"{fp}: tensor '{name[:80]}' is {dtype} {list(size)[:8]} here but {want.get('dtype')} "
                f"{list(want.get('shape', []))[:8]} in the manifest; refused"
            )


def file_sizes(folder: str, names: Iterable[str]) -> dict[str, int]:
    """Sizes of the listed files, by lstat (a link or other non-regular file is refused elsewhere)."""
    import os

    out = {}
    for name in names:
        try:
            out[name] = os.lstat(os.path.join(folder, name)).st_size
        except OSError:
            continue  # missing: reported by the checksum pass
    return out
