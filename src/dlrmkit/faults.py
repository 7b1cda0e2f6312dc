"""Fault injection for reliability tests, driven by the environment variable DLRMKIT_FAULT.

Grammar (the whole value must match; anything else is one line, exit 2, when a command starts):

    DLRMKIT_FAULT = POINT [ "@" [RANK] [ ":" SIGNAL ] ]
    POINT  = "save:after-data"      DCP files written, no manifest yet
           | "save:before-rename"   manifest written, folder not yet renamed into place
           | "save:before-latest"   folder in place, `latest` not yet updated
           | "shared-memory:created" a rank's shared-memory slot made, not yet shared
           | "shared-memory:mapped"  the peers' slots mapped
           | "train:step-" N        after optimizer step N (N >= 1)
           | "train:nan-loss-" N    does not signal: the loss of step N reads as NaN (a diverged step)
    RANK   = decimal digits          only that rank (default: every rank)
    SIGNAL = a signal name, e.g. SIGKILL (default), SIGSTOP (a hung peer), SIGTERM, SIGINT

Examples: `save:after-data`, `train:step-3@1:SIGSTOP`, `save:before-rename@:SIGTERM`. The process
sends itself SIGNAL when it reaches `fault_point(POINT)`. Under torchrun it fires only in the
first attempt (TORCHELASTIC_RESTART_COUNT 0), so a restarted job gets past it. Unset (always,
outside tests) it costs one dict lookup."""

from __future__ import annotations

import os
import re
import signal
from typing import NamedTuple

ENV = "DLRMKIT_FAULT"
GRAMMAR = re.compile(
    r"(?P<point>save:(?:after-data|before-rename|before-latest)|shared-memory:(?:created|mapped)"
    r"|train:(?:step|nan-loss)-[1-9][0-9]{0,17})"
    r"(?:@(?P<rank>[0-9]{0,6})(?::(?P<signal>[A-Za-z0-9]{1,16}))?)?"
)


class Fault(NamedTuple):
    point: str
    rank: str  # "" for every rank
    signal: signal.Signals


def parse(spec: str) -> Fault:
    """The fault a DLRMKIT_FAULT value asks for, or one DlrmkitError line quoting the grammar."""
    from dlrmkit.errors import DlrmkitError

    m = GRAMMAR.fullmatch(spec)
    if m is None:
        raise DlrmkitError(
            f"environment variable {ENV}={spec[:80]!r}: expected POINT[@[RANK][:SIGNAL]], POINT one of "
            f"save:after-data, save:before-rename, save:before-latest, shared-memory:created, "
            f"shared-memory:mapped, train:step-N, train:nan-loss-N "
            f"(dlrmkit/faults.py); unset it outside reliability tests"
        )
    name = m["signal"] or "SIGKILL"
    sig = getattr(signal, name, None) if name.startswith("SIG") and "_" not in name else None
    if not isinstance(sig, signal.Signals):
        raise DlrmkitError(f"environment variable {ENV}={spec[:80]!r}: unknown signal {m['signal']!r} (e.g. SIGKILL)")
    return Fault(m["point"], m["rank"] or "", sig)


def check_environment() -> None:
    """Parse DLRMKIT_FAULT when set (a command calls this before any work)."""
    spec = os.environ.get(ENV)
    if spec:
        parse(spec)


def fault_point(name: str) -> None:
    spec = os.environ.get(ENV)
    if not spec:
        return
    fault = parse(spec)
    first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    if fault.point == name and first_attempt and (not fault.rank or fault.rank == os.environ.get("RANK", "0")):
        os.kill(os.getpid(), fault.signal)


def nan_loss_injected(step: int) -> bool:
    """True when DLRMKIT_FAULT=train:nan-loss-<step> asks this step's loss to read as NaN."""
    spec = os.environ.get(ENV)
    return bool(spec) and parse(spec).point == f"train:nan-loss-{step}"


COLLECTIVE_NOTE = "collective: "  # how a failed collective wait names the collective on its error (transport.py)


def collective_failure(exc: BaseException, timeout_s: float) -> str | None:
    """One line for a collective that failed because a peer died or stopped answering, naming
    the torch.distributed operation (the note a failed wait carries, else the innermost
    distributed_c10d frame); None otherwise."""
    import traceback

    text = str(exc)
    if not any(w in text.lower() for w in ("timed out", "timeout", "connection closed", "connection reset")):
        return None
    ops = [f.name for f in traceback.extract_tb(exc.__traceback__) if f.filename.endswith("distributed_c10d.py")]
    notes = [n[len(COLLECTIVE_NOTE) :] for n in getattr(exc, "__notes__", ()) if n.startswith(COLLECTIVE_NOTE)]
    named = notes[-1] if notes else ops[-1] if ops else None
    what = f"collective '{named}'" if named else "a collective"
    why = "timed out" if "time" in text.lower() else "lost its peer"
    return (
        f"{what} {why} on rank {os.environ.get('RANK', '0')} (--collective-timeout {timeout_s:g}s): "
        f"a peer rank stopped answering or died; restart the job (--resume continues from the last checkpoint)"
    )
