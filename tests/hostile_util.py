"""Shared by the hostile-input tables of tests/test_hostile_datasets.py (dataset folders read by
the commands) and tests/test_hostile_raw_inputs.py (the rows, files and paths of the commands
that write datasets): inputs that must be accepted, each with what the result must hold, so a
fix never turns good data into an error (or garbage into a dataset)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from helpers import CliResult, run_cli


@dataclass
class Accepted:
    id: str
    argv: tuple
    check: Callable[[Path, CliResult], None]
    setup: Callable[[Path], None] | None = None


def summarized(phrase: str) -> Callable[[Path, CliResult], None]:
    def check(root: Path, r: CliResult) -> None:
        assert phrase in r.out, r.out

    return check


def run_accepted(ws: Path, case: Accepted) -> None:
    """Set up the workspace, run the command: exit 0, and the result holds what the case says."""
    if case.setup:
        case.setup(ws)
    r = run_cli(*[a.replace("{ws}", str(ws)) for a in case.argv], cwd=ws)
    assert r.code == 0, r.err
    case.check(ws, r)
