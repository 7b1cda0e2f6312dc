"""User-facing errors: the CLI prints them as one line and exits with code 2, no traceback."""

from __future__ import annotations

import json


class DlrmkitError(Exception):
    """A problem with the user's input (data, option, file) that they can fix.

    The message must say what is wrong and where (file, line, feature or option).
    """


class DatasetError(DlrmkitError):
    """A dataset whose files do not match its FeatureSpec, or hold invalid values."""


class NonFiniteLoss(DlrmkitError):
    """A training loss that is NaN or infinite (and not allowed to be skipped): the message names
    its step and what to try."""


class RunEnded(Exception):
    """`train --resume` of a run that ended (its final checkpoint, or its blend): nothing to train,
    score or write; the message says so and names it, and the command exits 0."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGINT), with what the command leaves behind: `detail` follows "interrupted"."""

    def __init__(self, detail: str = "") -> None:
        super().__init__(detail)
        self.detail = detail


def one_line(text: str) -> str:
    """`text` on one line, whitespace runs as one space and every other character that is not
    printable (NUL, an escape sequence's ESC, a bidirectional override) written as its escape: a
    message quotes names from hostile files, and a terminal must show it as it is, not obey it."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in " ".join(str(text).split()))


def _allocation_failed(text: str) -> bool:
    """torch's allocators raise RuntimeError, not MemoryError, when an allocation fails."""
    return any(s in text for s in ("can't allocate memory", "CUDA out of memory", "out of memory"))


def describe_error(exc: BaseException) -> tuple[str, int]:
    """(one-line message, exit code) for an exception that reached the command line: 2 for bad
    input and for the environment's faults (a full disk, a read-only or missing file, a file that
    does not parse), 1 for a bug, with how to see its traceback."""
    if isinstance(exc, DlrmkitError):
        return one_line(str(exc)), 2
    if isinstance(exc, OSError) and (exc.errno is not None or exc.filename):
        where = exc.filename if exc.filename is not None else ""
        other = f" -> {exc.filename2}" if getattr(exc, "filename2", None) else ""
        text = exc.strerror or type(exc).__name__
        return one_line(f"{where}{other}: {text}" if where else text), 2
    if isinstance(exc, MemoryError) or (isinstance(exc, RuntimeError) and _allocation_failed(str(exc))):
        return "out of memory; use a smaller --batch-size or dataset, or a machine with more memory", 2
    if isinstance(exc, json.JSONDecodeError):
        return one_line(f"invalid JSON at line {exc.lineno} ({exc.msg})"), 2
    try:
        import yaml

        if isinstance(exc, yaml.YAMLError):
            mark = getattr(exc, "problem_mark", None)
            where = f"{mark.name}: line {mark.line + 1}: " if mark is not None else ""
            return one_line(f"{where}invalid YAML ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})"), 2
    except ImportError:
        pass
    first = str(exc).splitlines()[0] if str(exc) else ""
    return one_line(
        f"internal error {type(exc).__name__}: {first} (run with DLRMKIT_DEBUG=1 for the traceback, and report it)"
    ), 1
