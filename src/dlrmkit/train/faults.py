"""Fault injection for reliability tests: `DLRMKIT_FAULT=<point>[@<rank>]` makes the process
SIGKILL itself when it reaches `fault_point(<point>)` (on every rank, or only on <rank>).
Points: save:after-data (DCP files written, no manifest yet), save:before-rename,
save:before-latest. Unset (always, outside tests) it costs one dict lookup."""

from __future__ import annotations

import os
import signal

ENV = "DLRMKIT_FAULT"


def fault_point(name: str) -> None:
    spec = os.environ.get(ENV)
    if not spec:
        return
    point, _, rank = spec.partition("@")
    if point == name and (not rank or rank == os.environ.get("RANK", "0")):
        os.kill(os.getpid(), signal.SIGKILL)
