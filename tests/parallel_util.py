"""Helpers for multi-rank tests: free ports and torchrun launches on CPU (gloo), 1 thread per rank."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_env() -> dict:
    """One thread per rank, the checkout's sources, and TMPDIR in the scratch folder: torchrun's
    agent makes a `torchelastic_*` folder under TMPDIR for every launch and leaves it there."""
    from helpers import scratch_cwd

    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1", TMPDIR=scratch_cwd())
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    return env


def torchrun(
    nproc: int, *args: str, timeout: float = 180, extra: list[str] | None = None
) -> subprocess.CompletedProcess:
    """`torchrun --nproc_per_node nproc ARGS` (a script path or `-m module ...`)."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        str(nproc),
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(free_port()),
        *(extra or []),
        *map(str, args),
    ]
    from helpers import scratch_cwd  # a default `runs/` lands there, never in the checkout

    return subprocess.run(cmd, env=torchrun_env(), cwd=scratch_cwd(), capture_output=True, text=True, timeout=timeout)


def train_one_process(data, args: list[str], out: Path) -> dict:
    """`dlrmkit train --data DATA ARGS` in one process, as torchrun's ranks run (1 thread): its metrics."""
    import json

    from helpers import scratch_cwd

    cmd = [sys.executable, "-m", "dlrmkit", "train", "--data", str(data), *args, "--metrics-json", str(out)]
    proc = subprocess.run(cmd, env=torchrun_env(), cwd=scratch_cwd(), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(out.read_text())
