"""Torchrun-related CLI options and checks, without torch: `dlrmkit --help` and the data
commands build their parsers without importing torch (a second of start-up per command)."""

from __future__ import annotations

import os

from dlrmkit.parallel.sharding import STRATEGIES  # names only: no torch

SHARDINGS = ("auto", *STRATEGIES)  # --sharding choices


def launched_by_torchrun() -> bool:
    return "WORLD_SIZE" in os.environ and "RANK" in os.environ


def add_parallel_arguments(p, sharding_help: str) -> None:
    """The torchrun options `train` and `evaluate` share: sharding, plan, loader, backend."""
    p.add_argument("--sharding", default="auto", choices=SHARDINGS, help=sharding_help)
    p.add_argument("--plan", help="under torchrun: a sharding plan JSON (from `dlrmkit plan --json`) to obey")
    p.add_argument("--loader", default="exchange", choices=["exchange", "own-features", "broadcast"],
                   help="under torchrun: how ranks read batches (default exchange)")
    p.add_argument("--backend", help="under torchrun: process-group backend (default nccl with --device cuda, else gloo)")
