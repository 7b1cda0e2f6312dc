"""Whether torchrun started this process, and where it sits in the job, without importing
torch: `dlrmkit --help` and the data commands decide this before torch loads (a second of
start-up per command). Every reader of torchrun's variables goes through `torchrun_env`, so a
garbage value (RANK=x, RANK beyond WORLD_SIZE) is one line naming the variable, not a
ValueError from deep inside process-group setup."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterable

from dlrmkit.errors import DlrmkitError

MAX_WORLD_SIZE = 1 << 16


def launched_by_torchrun() -> bool:
    return "WORLD_SIZE" in os.environ and "RANK" in os.environ


@dataclass(frozen=True)
class TorchrunEnv:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1


def env_int(name: str, lo: int, hi: int, default: int | None = None) -> int:
    """Environment variable `name` as an integer in [lo, hi], or `default` when unset."""
    text = os.environ.get(name)
    if text is None and default is not None:
        return default
    value = str(text).strip()
    if not value.isascii() or not value.lstrip("-").isdigit():
        raise DlrmkitError(
            f"environment variable {name}={text!r}: expected an integer (torchrun sets it; "
            "unset RANK and WORLD_SIZE to run one process)"
        )
    number = int(value)
    if not lo <= number <= hi:
        raise DlrmkitError(f"environment variable {name}={number}: must be in [{lo}, {hi}]")
    return number


def torchrun_env() -> TorchrunEnv:
    """This process's place in the job: from RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE
    when torchrun started it (checked against each other), else a single process. MASTER_PORT,
    when set, must be a port number."""
    if not launched_by_torchrun():
        return TorchrunEnv()
    world = env_int("WORLD_SIZE", 1, MAX_WORLD_SIZE)
    rank = env_int("RANK", 0, world - 1)
    local_world = env_int("LOCAL_WORLD_SIZE", 1, world, default=1)
    local_rank = env_int("LOCAL_RANK", 0, (local_world if "LOCAL_WORLD_SIZE" in os.environ else world) - 1, 0)
    if "MASTER_PORT" in os.environ:
        env_int("MASTER_PORT", 1, 65535)
    return TorchrunEnv(rank, world, local_rank, local_world)


def refuse_outside_torchrun(options: Iterable[tuple[str, bool]]) -> None:
    """An option that acts only under torchrun would do nothing in one process: the first one set
    there is one line. `options`: (the option as given, e.g. "--sharding row_wise", whether it
    differs from its default); a value equal to the default (as a run's config.yaml holds) passes."""
    if launched_by_torchrun():
        return
    for shown, changed in options:
        if changed:
            raise DlrmkitError(
                f"{shown} takes effect under torchrun only, and this is one process "
                "(run `torchrun --nproc_per_node=N -m dlrmkit ...`, or leave it out)"
            )
