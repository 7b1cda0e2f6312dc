"""Fault injection for reliability tests: `DLRMKIT_FAULT=<point>[@<rank>]` makes the process
SIGKILL itself when it reaches `fault_point(<point>)` (on every rank, or only on <rank>).
`DLRMKIT_FAULT=<point>@<rank>:SIGSTOP` stops the rank instead (a hung peer).
Points: save:after-data (DCP files written, no manifest yet), save:before-rename,
save:before-latest, train:step-<N> (after optimizer step N). `train:nan-loss-<N>` does not
kill: the loss of step N reads as NaN (a diverged step), for the --skip-nonfinite tests. Under torchrun it fires only in the
first attempt (TORCHELASTIC_RESTART_COUNT 0), so a restarted job gets past it. Unset (always,
outside tests) it costs one dict lookup."""

from __future__ import annotations

import os
import signal

ENV = "DLRMKIT_FAULT"


def fault_point(name: str) -> None:
    spec = os.environ.get(ENV)
    if not spec:
        return
    point, _, where = spec.partition("@")
    rank, _, sig = where.partition(":")  # e.g. train:step-3@1:SIGSTOP (default SIGKILL)
    first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    if point == name and first_attempt and (not rank or rank == os.environ.get("RANK", "0")):
        number = getattr(signal, sig or "SIGKILL", None)
        if not isinstance(number, signal.Signals):
            from dlrmkit.errors import DlrmkitError

            raise DlrmkitError(f"environment variable {ENV}={spec!r}: unknown signal {sig!r} (e.g. SIGKILL, SIGSTOP)")
        os.kill(os.getpid(), number)


def nan_loss_injected(step: int) -> bool:
    """True when DLRMKIT_FAULT=train:nan-loss-<step> asks this step's loss to read as NaN."""
    spec = os.environ.get(ENV)
    return bool(spec) and spec.partition("@")[0] == f"train:nan-loss-{step}"


def collective_failure(exc: BaseException, timeout_s: float) -> str | None:
    """One line for a collective that failed because a peer died or stopped answering, naming
    the torch.distributed operation (the innermost distributed_c10d frame); None otherwise."""
    import traceback

    text = str(exc)
    if not any(w in text.lower() for w in ("timed out", "timeout", "connection closed", "connection reset")):
        return None
    ops = [f.name for f in traceback.extract_tb(exc.__traceback__) if f.filename.endswith("distributed_c10d.py")]
    op = ops[-1] if ops else "collective"
    why = "timed out" if "time" in text.lower() else "lost its peer"
    return (
        f"collective '{op}' {why} on rank {os.environ.get('RANK', '0')} (--collective-timeout {timeout_s:g}s): "
        f"a peer rank stopped answering or died; restart the job (--resume continues from the last checkpoint)"
    )
