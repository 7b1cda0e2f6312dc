"""Checkpoints written atomically: into `<dir>/.tmp-step_N`, renamed to `<dir>/step_N` when
complete, then `<dir>/latest` is replaced (atomic rename) to name it. A process killed while
saving leaves the previous checkpoint and `latest` intact."""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

import torch

from dlrmkit.errors import DlrmkitError

LATEST = "latest"


def latest_checkpoint(directory: str) -> str | None:
    """Path of the checkpoint `latest` names, or None when there is none yet."""
    pointer = os.path.join(directory, LATEST)
    if not os.path.exists(pointer):
        return None
    with open(pointer, encoding="utf-8") as f:
        name = f.read().strip()
    path = os.path.join(directory, name)
    if not os.path.isdir(path):
        raise DlrmkitError(f"{pointer} names '{name}', which does not exist in {directory}")
    return path


def resolve_checkpoint(path: str) -> str:
    """A checkpoint folder itself, or a checkpoint directory whose `latest` names one."""
    if os.path.exists(os.path.join(path, "state.pt")):
        return path
    found = latest_checkpoint(path) if os.path.isdir(path) else None
    if found is None:
        raise DlrmkitError(f"{path}: no checkpoint there (expected state.pt or a '{LATEST}' pointer)")
    return found


def save_checkpoint(directory: str, step: int, state: dict[str, Any], meta: dict[str, Any], keep: int = 2) -> str:
    os.makedirs(directory, exist_ok=True)
    name = f"step_{step}"
    tmp = os.path.join(directory, f".tmp-{name}")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    torch.save(state, os.path.join(tmp, "state.pt"))
    with open(os.path.join(tmp, "meta.json"), "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=2)
    final = os.path.join(directory, name)
    shutil.rmtree(final, ignore_errors=True)
    os.rename(tmp, final)
    pointer_tmp = os.path.join(directory, f".{LATEST}.tmp")
    with open(pointer_tmp, "w", encoding="utf-8") as f:
        f.write(name)
    os.replace(pointer_tmp, os.path.join(directory, LATEST))
    _prune(directory, keep)
    return final


def _prune(directory: str, keep: int) -> None:
    steps = sorted(
        (int(n.split("_", 1)[1]), n) for n in os.listdir(directory) if n.startswith("step_") and n[5:].isdigit()
    )
    for _, name in steps[:-keep] if keep > 0 else []:
        shutil.rmtree(os.path.join(directory, name), ignore_errors=True)


def load_checkpoint(path: str) -> tuple[dict[str, Any], dict[str, Any]]:
    path = resolve_checkpoint(path)
    try:
        state = torch.load(os.path.join(path, "state.pt"), map_location="cpu", weights_only=False)
        with open(os.path.join(path, "meta.json"), encoding="utf-8") as f:
            meta = json.load(f)
    except (OSError, RuntimeError, EOFError, json.JSONDecodeError) as exc:
        raise DlrmkitError(f"{path}: checkpoint is unreadable ({type(exc).__name__}: {str(exc)[:120]})") from None
    return state, meta
