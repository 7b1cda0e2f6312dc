"""Whether torchrun started this process, and where it sits in the job, without importing
torch: `dlrmkit --help` and the data commands decide this before torch loads (a second of
start-up per command). Every reader of torchrun's variables goes through `torchrun_env`, so a
garbage value (RANK=x, RANK beyond WORLD_SIZE) is one line naming the variable, not a
ValueError from deep inside process-group setup. Also the parallel section of `dlrmkit train`'s
options (ParallelOptions), which setup_parallel receives."""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import Iterable

from dlrmkit import cli_types as ct
from dlrmkit.errors import DlrmkitError
from dlrmkit.options import option

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


def check_batch_per_rank(batch_size: int, world_size: int) -> None:
    """Every rank needs at least one sample of each step's global batch."""
    if batch_size < world_size:
        raise DlrmkitError(
            f"--batch-size {batch_size} is smaller than the world size {world_size}: every rank "
            f"needs at least one sample per step; use --batch-size {world_size} or more"
        )


RANKED_COMMANDS = ("train", "evaluate", "bench")  # the commands that run one job over torchrun's ranks


def refuse_one_process_command_under_torchrun(command: str) -> None:
    """Any other command started by torchrun on N > 1 ranks would run N times over the same
    outputs (the second writer's lock error, or N copies of predict's rows on standard output):
    one line on every rank, before any work."""
    if command in RANKED_COMMANDS or not launched_by_torchrun():
        return
    world = torchrun_env().world_size
    if world > 1:
        raise DlrmkitError(
            f"{command} runs in one process, and torchrun started {world} ranks: run `dlrmkit {command} ...` "
            f"without torchrun (under torchrun: {', '.join(RANKED_COMMANDS)})"
        )


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


# the sharding strategies `--sharding` offers (dlrmkit.parallel.sharding, which imports torch)
SHARDINGS = ("auto", "table_wise", "column_wise", "row_wise", "data_parallel")
# process-group backends torch.distributed ships (dlrmkit.parallel.dist checks the device pairing)
BACKENDS = ("gloo", "nccl", "mpi", "ucc")
LOADERS = ("exchange", "own-features", "broadcast")
COLLECTIVE_TIMEOUT_S = 1800.0  # seconds a collective waits for a peer (dlrmkit.parallel.dist's default too)


@dataclass
class ParallelOptions:
    """The parallel section of `dlrmkit train`'s options: how a torchrun job shards its tables,
    reads its batches and talks. Every field acts under torchrun only (`torchrun_only`)."""

    sharding: str = option(
        "auto",
        "under torchrun: how tables are sharded (default {default}: the planner decides; on CPU it replicates "
        "every table that fits at up to 256 samples per rank)",
        choices=SHARDINGS,
    )
    plan: str | None = option(
        None, "under torchrun: a sharding plan JSON (from `dlrmkit plan --json`) to obey", parse=ct.small_file
    )
    loader: str = option("exchange", "under torchrun: how ranks read batches (default {default})", choices=LOADERS)
    backend: str | None = option(
        None,
        "under torchrun: process-group backend (default nccl with --device cuda, else gloo)",
        choices=BACKENDS,
    )
    comm_dtype: str = option(
        "fp32",
        "under torchrun: send all-to-all payloads and gradient all-reduces in this dtype (default {default}; "
        "fp32 sums of ranks on one host go through shared memory, bf16 ones through gloo)",
        choices=("fp32", "bf16"),
    )
    collective_timeout: float = option(
        COLLECTIVE_TIMEOUT_S,
        "under torchrun: seconds a collective may wait for a peer before the job fails (default {default})",
        parse=ct.timeout,
    )
    bind_cores: bool = option(
        True,
        "under torchrun on CPU: leave ranks unbound (default: each rank, with its "
        "collective threads, on its own share of the cores, when there are enough)",
        flag="--no-bind-cores",
        negate=True,
    )


def torchrun_only() -> tuple[str, ...]:
    """The train options that act only under torchrun: the parallel section's."""
    return tuple(f.name for f in fields(ParallelOptions))


def changed_torchrun_options(opts: ParallelOptions) -> list[tuple[str, bool]]:
    """(the option as the command line gives it, whether it differs from its default) for each
    field of `opts`: what `refuse_outside_torchrun` takes."""
    from dlrmkit.options import specs

    out = []
    for s in specs(ParallelOptions):
        value = s.get(opts)
        out.append((s.flag if s.kind == "switch" else f"{s.flag} {value}", value != s.default))
    return out
