"""The `--out` folder of the commands that write datasets (synth, preprocess, transcode).

- `--force` replaces only a dlrmkit dataset (every entry of the folder is named by its
  feature_spec.yaml, or is its vocabulary) or an empty folder; anything else, the current folder
  or one holding an input file is refused, so a mistyped `--out` never deletes a user's files.
- The new dataset is built in `<out>.tmp` (marked as ours: a `.tmp` folder without the marker
  is never deleted) and swapped in with one atomic rename (Linux renameat2 RENAME_EXCHANGE), so a
  kill at any moment leaves the old dataset or the new one, never neither.
- `<out>.lock` (flock) keeps two processes from writing the same `--out`: the second one stops
  with one line."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import shutil
from typing import Iterable, Iterator


from dlrmkit.atomic_io import check_output_dir, os_error_text
from dlrmkit.atomic_io import output_lock as folder_lock
from dlrmkit.data.feature_spec import MAX_SPEC_BYTES, SPEC_FILE
from dlrmkit.errors import DatasetError, DlrmkitError
from dlrmkit.untrusted import load_yaml

MARKER = ".dlrmkit-partial"  # inside a temporary folder this code created
EXTRA_ENTRIES = {SPEC_FILE, "vocabulary", "baseline.json"}  # baseline.json: `dlrmkit baseline`


def _inside(path: str, folder: str) -> bool:
    path, folder = os.path.realpath(path), os.path.realpath(folder)
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def dataset_entries(path: str) -> set[str] | None:
    """Top-level names a dataset folder may hold (from its spec), or None if it has no readable spec."""
    spec_path = os.path.join(path, SPEC_FILE)
    if not os.path.isfile(spec_path):  # missing, or a FIFO whose read would block forever
        return None
    try:
        doc = load_yaml(spec_path, "FeatureSpec", MAX_SPEC_BYTES)
        names = set(EXTRA_ENTRIES)
        for chunks in (doc.get("source_spec") or {}).values():
            for chunk in chunks or []:
                for file in chunk.get("files") or []:
                    name = os.path.normpath(str(file)).split(os.sep)[0]
                    if name not in ("", ".", "..") and not os.path.isabs(str(file)):
                        names.add(name)
        return names
    except (DlrmkitError, AttributeError, TypeError):
        return None


def check_not_empty(out: str) -> None:
    """An empty --out is no folder at all, yet its absolute path is the current folder: it must
    never reach the writer, which would swap the current folder for the dataset."""
    if not str(out).strip():
        raise DlrmkitError(f"--out {out!r}: an empty path; give the folder to write the dataset to")


def check_replaceable(out: str, force: bool, inputs: Iterable[str] = ()) -> None:
    """Raise unless `out` is new, an empty folder, or (with force) a dlrmkit dataset. The checks
    look at the absolute path the writer will use; messages show `out` as the user gave it."""
    check_not_empty(out)
    path = os.path.abspath(out)
    if not os.path.lexists(path):
        check_output_dir(path, "--out")
        return
    if os.path.islink(path):
        raise DlrmkitError(f"--out {out}: is a symbolic link; give the folder it points to, or a new folder")
    if not os.path.isdir(path):
        raise DlrmkitError(f"--out {out}: is a file, not a dataset folder; choose another --out")
    cwd = os.getcwd()
    if _inside(cwd, path):
        raise DlrmkitError(f"--out {out}: is the current folder or holds it; choose a new folder")
    entries = os.listdir(path)
    if not entries:
        check_output_dir(path, "--out")
        return
    if not force:
        raise DatasetError(f"{out}: output folder already exists (pass --force to replace it)")
    allowed = dataset_entries(path)
    if allowed is None:
        raise DlrmkitError(
            f"--out {out}: not a dlrmkit dataset (no readable {SPEC_FILE}); "
            "--force replaces only a dataset or an empty folder"
        )
    foreign = sorted(e for e in entries if e not in allowed)
    if foreign:
        raise DlrmkitError(
            f"--out {out}: holds '{foreign[0]}', which is not part of its dataset; "
            "--force replaces only a dataset or an empty folder"
        )
    for p in inputs:
        if _inside(p, path):
            raise DlrmkitError(f"--out {out}: holds the input {p}; choose another --out")
    check_output_dir(path, "--out")
    check_output_dir(os.path.dirname(path), "--out", allow_root=True)


def fresh_temp_dir(path: str) -> None:
    """Create `path` (with our marker), first removing a stale one only if it carries the marker."""
    if os.path.lexists(path):
        if os.path.islink(path) or not os.path.isfile(os.path.join(path, MARKER)):
            raise DlrmkitError(f"{path}: exists and was not made by dlrmkit; remove or rename it")
        shutil.rmtree(path)
    try:
        os.makedirs(path)
        open(os.path.join(path, MARKER), "w").close()
    except OSError as exc:
        raise DlrmkitError(f"{path}: cannot create folder ({os_error_text(exc)})") from None


def remove_temp_dir(path: str) -> None:
    """Remove a temporary folder this code made (it carries the marker)."""
    if os.path.isdir(path) and not os.path.islink(path) and os.path.isfile(os.path.join(path, MARKER)):
        shutil.rmtree(path, ignore_errors=True)


def _exchange(a: str, b: str) -> bool:
    """Swap two paths atomically (renameat2 RENAME_EXCHANGE); False where unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), b)


def publish(tmp: str, out: str) -> None:
    """Put the finished folder `tmp` at `out`; an old `out` is removed only after the new one is in place.
    Never a folder holding the current one: its old contents would be removed."""
    if not str(out).strip() or (os.path.lexists(out) and _inside(os.getcwd(), out)):
        raise DlrmkitError(f"--out {out!r}: is the current folder or holds it; choose a new folder")
    try:
        if not os.path.lexists(out):
            os.rename(tmp, out)
        elif _exchange(tmp, out):
            shutil.rmtree(tmp)  # now the old dataset
        else:  # no renameat2: a short window in which `<out>.old` (or `<out>.old-K`) holds the old dataset
            old = out + ".old"
            for k in range(1, 1000):  # one there is not ours (a dataset put in place here never leaves one):
                if not os.path.lexists(old):  # it stays, and the dataset just written is not lost to it
                    break
                old = f"{out}.old-{k}"
            else:
                raise DlrmkitError(f"{out}.old-999: exists; move the {out}.old* folders away and run again")
            os.rename(out, old)
            os.rename(tmp, out)
            shutil.rmtree(old)
    except OSError as exc:
        raise DlrmkitError(f"{out}: cannot put the new dataset in place ({os_error_text(exc)})") from None


@contextlib.contextmanager
def output_lock(out: str) -> Iterator[None]:
    """Hold `<out>.lock` for the whole write; a second writer of the same folder stops at once
    (dlrmkit.atomic_io.output_lock, which every command that writes an output uses)."""
    check_not_empty(out)
    check_output_dir(out, "--out")
    with folder_lock(out, "--out"):
        yield
