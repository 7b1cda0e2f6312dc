"""Where checkpoints are: a checkpoint directory holds `step_N` folders and a `latest` file
naming the newest complete one (dlrmkit.checkpoint.save_load writes them). Finding, listing and
pruning them, and checking a directory before training writes there."""

from __future__ import annotations

import os
import shutil

from dlrmkit.atomic_io import create_new
from dlrmkit.errors import DlrmkitError
from dlrmkit.checkpoint.storage import os_error
from dlrmkit.untrusted import read_text

LATEST = "latest"
MANIFEST = "manifest.json"
BLEND_FILE = "blend.yaml"  # a blend's folder: its members' checkpoint folders beside it (dlrmkit.train.blend)


def _pointer_name(pointer: str) -> str:
    """What `latest` says, read as untrusted: a regular file of at most 4 KiB, UTF-8 text."""
    return read_text(pointer, "'latest' pointer", 4096).strip()


def latest_checkpoint(directory: str) -> str | None:
    """Path of the checkpoint `latest` names, or None when there is none yet (a `latest` that
    exists but cannot be read, e.g. a dangling link, is an error, not "none": resuming would
    otherwise start a fresh run over the old one's checkpoints)."""
    pointer = os.path.join(directory, LATEST)
    if not os.path.lexists(pointer):
        return None
    name = _pointer_name(pointer)
    if not is_step_name(name):
        raise DlrmkitError(f"{pointer}: names {name[:60]!r}, not a step_N folder; write the name of one into it")
    path = os.path.join(directory, name)
    if os.path.islink(path):  # a checkpoint's folder is the directory's own, as its files are the folder's
        raise DlrmkitError(
            f"{pointer} names '{name}', a symbolic link (to {os.readlink(path)[:80]!r}); a checkpoint "
            f"is read only from a step_N folder of {directory}"
        )
    if not os.path.isdir(path):
        raise DlrmkitError(
            f"{pointer} names '{name}', which does not exist in {directory}; "
            f"write the name of an existing step_N folder into it"
        )
    return path


def resolve_checkpoint(path: str) -> str:
    """A checkpoint folder itself, or a checkpoint directory whose `latest` names one."""
    if os.path.exists(os.path.join(path, MANIFEST)):
        return path
    found = latest_checkpoint(path) if os.path.isdir(path) else None
    if found is None:
        inner = os.path.join(path, "checkpoints")  # a run folder's (train --run-dir)
        held = any(os.path.lexists(os.path.join(inner, name)) for name in (MANIFEST, LATEST))
        hint = f"; a run folder? its checkpoints are in {inner}" if os.path.isdir(path) and held else ""
        raise DlrmkitError(f"{path}: no checkpoint there (expected {MANIFEST} or a '{LATEST}' pointer){hint}")
    return found


def is_step_name(name: str) -> bool:
    return name.startswith("step_") and name[5:].isascii() and name[5:].isdigit() and len(name) < 30


def existing_checkpoints(directory: str) -> list[str]:
    """step_N folders and the `latest` pointer in `directory` (empty when it does not exist)."""
    if not os.path.isdir(directory):
        return []
    return sorted(n for n in os.listdir(directory) if n == LATEST or (is_step_name(n)))


def check_writable_directory(directory: str) -> None:
    """Create `directory` and write a probe file there, so a checkpoint folder that cannot be
    written fails before training, not at the first save."""
    probe = os.path.join(directory, f".write-probe-{os.getpid()}")
    try:
        os.makedirs(directory, exist_ok=True)
        with create_new(probe) as f:  # not through a link planted there
            f.write("ok")
        os.remove(probe)
    except OSError as exc:
        raise DlrmkitError(f"--checkpoint-dir {directory}: cannot write there ({os_error(exc)})") from None


def check_fresh_directory(directory: str, flag: str = "--checkpoint-dir", given: str | None = None) -> None:
    """A run without --resume must not write into a folder holding another run's checkpoints:
    pruning and `latest` would mix the two runs (and could delete the other run's newest). A
    blend's folder is another run's too: a run would replace its blend.yaml or write beside it.
    `flag` and `given`: the option that chose `directory` and its value (--run-dir R for R/checkpoints)."""
    where = f"{flag} {directory}" if given is None else f"{flag} {given}: {directory}"
    if os.path.isfile(os.path.join(directory, BLEND_FILE)):
        raise DlrmkitError(f"{where} already holds another run's blend ({BLEND_FILE}); give a new or empty {flag}")
    found = existing_checkpoints(directory)
    if found:
        latest = os.path.join(directory, LATEST)
        try:
            named = _pointer_name(latest)[:40] if os.path.lexists(latest) else found[-1]
        except DlrmkitError:
            named = f"an unreadable '{LATEST}'"
        raise DlrmkitError(
            f"{where} already holds checkpoints of another run (latest: {named}); "
            f"pass --resume to continue it, or give a new or empty {flag}"
        )


def latest_or_none(directory: str) -> str | None:
    """The checkpoint `latest` names, or None when there is none or the pointer is unusable."""
    try:
        return latest_checkpoint(directory)
    except (OSError, DlrmkitError):
        return None


def step_folders(directory: str) -> list[str]:
    """The step_N folders of `directory`, newest (highest N) first."""
    names = [n for n in existing_checkpoints(directory) if n != LATEST]
    return sorted(names, key=lambda n: -int(n[5:]))


def run_id_of(folder: str) -> str | None:
    """The run a checkpoint folder belongs to (its manifest's `run_id`), or None when it has none
    or its manifest cannot be read (such a folder is never treated as this run's)."""
    from dlrmkit.checkpoint.manifest import read_manifest

    try:
        rid = read_manifest(folder).get("run_id")
    except (OSError, DlrmkitError):
        return None
    return rid if isinstance(rid, str) else None


def prune(directory: str, keep: int, run_id: str | None) -> None:
    """Keep the checkpoint `latest` names and the newest others, `keep` in all; only checkpoints
    of run `run_id` (their manifest says so) are ever removed: a folder another run wrote, or one
    whose manifest cannot be read, stays."""
    if keep <= 0 or run_id is None:
        return
    current = os.path.basename(latest_or_none(directory) or "")
    others = sorted(
        (int(n[5:]), n)
        for n in existing_checkpoints(directory)
        if n not in (LATEST, current) and run_id_of(os.path.join(directory, n)) == run_id
    )
    for _, name in others[: max(0, len(others) - (keep - 1 if current else keep))]:
        shutil.rmtree(os.path.join(directory, name), ignore_errors=True)
