"""Process-group setup from the standard torchrun environment (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR/PORT). The device picks the backend: gloo on CPU, NCCL on CUDA (`--backend`
overrides where the pair works); collectives time out so a dead rank fails the job instead of
hanging it. Under NCCL a second, gloo group carries the collectives of CPU tensors (the ids the
loader reads, batch sizes, flags), as torchrec keeps its id exchange off the GPU."""

from __future__ import annotations

import gc
import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from dlrmkit.errors import DlrmkitError
from dlrmkit.parallel.options import COLLECTIVE_TIMEOUT_S, launched_by_torchrun, torchrun_env  # noqa: F401  (re-exported)


@dataclass
class DistContext:
    """Where this process sits in the job. world_size 1 without a process group is plain
    single-process training; every collective helper is a no-op then."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    backend: str = "none"
    device: torch.device = torch.device("cpu")
    cpu_group: object | None = None  # group for CPU-tensor collectives; None: the default group
    cores: list[int] | None = None  # the cores this rank is bound to (bind_cores); None: not bound


def check_backend(backend: str | None, device_type: str) -> str:
    """The backend for tensors on `device_type` ('cpu' or 'cuda'): the default, or the one asked
    for when it can carry them; a one-line error otherwise."""
    if backend is None:
        return "nccl" if device_type == "cuda" else "gloo"
    if backend == "nccl" and device_type != "cuda":
        raise DlrmkitError("--backend nccl carries CUDA tensors only: add --device cuda, or use --backend gloo on CPU")
    if device_type == "cuda" and backend != "nccl":
        raise DlrmkitError(f"--device cuda needs --backend nccl (the default there); {backend} has no CUDA all-to-all")
    return backend


def bind_cores(local_rank: int, local_world: int) -> list[int] | None:
    """Binds every thread of this process to this rank's share of the cores the process may use
    (contiguous shares by local rank, as `mpirun --bind-to core` does) and returns it; None, and
    nothing changed, when ranks outnumber cores. Gloo's threads then wake on the core whose caches
    hold the rank's tensors, and ranks stop trading cores (docs/BENCHMARKS.md, `--no-pin`).
    Threads started later inherit the binding."""
    try:
        cores = sorted(os.sched_getaffinity(0))
    except AttributeError:  # no affinity API (not Linux)
        return None
    if local_world < 2 or len(cores) < local_world:
        return None
    share = [c for i, c in enumerate(cores) if i * local_world // len(cores) == local_rank]
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), share)
        except OSError:  # a thread that ended meanwhile
            pass
    return share


def init_distributed(
    backend: str | None = None, timeout_s: float = COLLECTIVE_TIMEOUT_S, device: str = "cpu", bind: bool = False
) -> DistContext:
    """The DistContext of this process: a process group when started by torchrun, else single.
    `device` 'cuda' puts this rank on GPU LOCAL_RANK, with NCCL; on CPU, `bind` binds the rank
    to its share of the cores (bind_cores) before the process group starts its threads."""
    if not launched_by_torchrun():
        return DistContext()
    env = torchrun_env()  # checked: a garbage RANK or WORLD_SIZE is one line
    rank, world, local_rank = env.rank, env.world_size, env.local_rank
    backend = check_backend(backend, device)
    if device == "cuda":
        if not torch.cuda.is_available():
            raise DlrmkitError("--device cuda needs a CUDA GPU; torch sees none here")
        if local_rank >= torch.cuda.device_count():
            raise DlrmkitError(
                f"local rank {local_rank} has no GPU of its own ({torch.cuda.device_count()} visible): "
                f"start at most that many processes per node"
            )
        ctx_device = torch.device("cuda", local_rank)
        torch.cuda.set_device(ctx_device)
    else:
        ctx_device = torch.device("cpu")
    cores = bind_cores(local_rank, env.local_world_size) if bind and device == "cpu" else None
    timeout = timedelta(seconds=timeout_s)
    if not dist.is_initialized():
        try:
            bound = (
                {"device_id": ctx_device} if ctx_device.type == "cuda" else {}
            )  # NCCL: this rank's GPU from the start
            dist.init_process_group(backend=backend, timeout=timeout, **bound, **_attempt_store(rank, world))
        except (RuntimeError, ValueError) as exc:
            raise DlrmkitError(f"could not start process group (backend {backend}): {exc}".splitlines()[0]) from exc
    cpu_group = dist.new_group(backend="gloo", timeout=timeout) if backend == "nccl" else None
    return DistContext(rank, world, local_rank, backend, ctx_device, cpu_group, cores)


def _attempt_store(rank: int, world: int) -> dict:
    """After a torchrun restart (--max-restarts), the agent's store still holds the dead attempt's
    peer addresses, and gloo may connect to them; a per-attempt key prefix keeps attempts apart."""
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if not attempt or attempt == "0" or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return {}
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        world,
        is_master=False,
        timeout=timedelta(seconds=300),
    )
    return {"store": dist.PrefixStore(f"dlrmkit/attempt_{attempt}", store), "rank": rank, "world_size": world}


def shutdown() -> None:
    """Leave the group together: a rank destroying gloo while peers still talk to it can abort.
    Then collect what still holds a process group (sharded modules and their transports in
    reference cycles), so the groups die while the interpreter is whole, not during its
    finalization, where tearing down gloo's threads and the tensors of their finished work can
    abort a rank at exit ("terminate called without an active exception", seen on loaded runs
    of several plans in one process)."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
        gc.collect()


def batch_split(global_batch: int, world_size: int) -> list[int]:
    """Local batch of each rank: the first (G mod N) ranks take one extra sample, so uneven
    global batches work and rank slices are contiguous in rank order."""
    base, extra = divmod(global_batch, world_size)
    return [base + (1 if r < extra else 0) for r in range(world_size)]


def batch_slice(global_batch: int, rank: int, world_size: int) -> tuple[int, int]:
    """[start, end) of `rank`'s samples within a global batch."""
    sizes = batch_split(global_batch, world_size)
    start = sum(sizes[:rank])
    return start, start + sizes[rank]


# below about this many samples per rank, a CPU rank's fixed cost per step (its collectives, the
# gradients' sum, the sharded step's bookkeeping) outweighs what splitting the batch saves
# (docs/BENCHMARKS.md, "Hybrid parallel": benchmarks/parallel_pingpong.py at 64 to 1,024 per rank)
MIN_SAMPLES_PER_RANK_CPU = 1000


def small_batch_note(global_batch: int, world_size: int, device_type: str) -> str | None:
    """What train says when a CPU job splits too small a batch over its ranks (None: nothing)."""
    per_rank = global_batch // max(world_size, 1)
    if world_size < 2 or device_type != "cpu" or per_rank >= MIN_SAMPLES_PER_RANK_CPU:
        return None
    return (
        f"note: {per_rank:,} samples per rank: on CPU, below about {MIN_SAMPLES_PER_RANK_CPU:,} samples per "
        "rank model parallelism is slower than one process with threads on the same cores "
        "(docs/BENCHMARKS.md); use fewer ranks or a larger --batch-size unless the tables need the memory"
    )
