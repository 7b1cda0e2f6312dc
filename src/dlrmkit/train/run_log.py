"""The run's JSON-lines log (`log.jsonl`) read back: by `dlrmkit train --tensorboard` when the run
ends and by `dlrmkit report`, so it sits with training rather than with the report command."""

from __future__ import annotations

import json
import re
import sys
from typing import Any

from dlrmkit.errors import DlrmkitError
from dlrmkit.untrusted import open_regular

NUMERIC = (
    "time",
    "step",
    "steps",
    "samples_seen",
    "loss",
    "lr",
    "samples_per_s",
    "auc",
    "logloss",
    "train_loss",
    "best_auc",
    "optimal_auc",
)
MAX_RECORD = 1 << 20  # characters of one log line (a record is a few hundred)
MAX_TRAIN_RECORDS = 100_000  # training-loss records read_log keeps (a plot's points); past it, thinned
MAX_OTHER_BYTES = 256 << 20  # the other records read_log keeps, together (a run's evaluations: far less)
RECORD_COST = 1024  # bytes each of those records counts at least (a parsed record's own memory)
MAPPING = re.compile(r"[A-Za-z0-9_-]{1,64}")  # a mapping names report files (`val_auc.png`): no path parts


def log_line(record: dict[str, Any]) -> str:
    """One record as a strict JSON line: a NaN or infinity is null (a bare `NaN` token breaks
    strict parsers; read_log takes null as absent)."""
    from dlrmkit.atomic_io import strict_json

    return json.dumps(strict_json(record), allow_nan=False) + "\n"


def stop_record(exc: BaseException, collective_timeout: float) -> dict[str, Any] | None:
    """The record a run that stopped on `exc` ends its log with, so that `report` says how it
    ended rather than "unfinished": `interrupted` for Ctrl-C; `failed`, with the one line the
    command prints (`why`), for an error the command reports as one (bad input, a NaN/Inf loss, a
    full disk, too little memory, a lost peer). None for anything else (a bug's traceback, or
    another tool's control flow, such as a tune trial pruned), whose log stays without an end."""
    from dlrmkit.errors import describe_error
    from dlrmkit.faults import collective_failure

    if isinstance(exc, KeyboardInterrupt):
        return {"event": "interrupted"}
    why = collective_failure(exc, collective_timeout) if isinstance(exc, RuntimeError) else None
    if why is None:
        why, code = describe_error(exc)
        if code != 2:
            return None
    return {"event": "failed", "why": why}


class Records(list):
    """read_log's records, and how many training-loss records the file held (`train_seen`), of
    which every `train_every`-th is kept."""

    train_seen = 0
    train_every = 1


def read_log(path: str) -> Records:
    """The JSON-lines log; each record an object whose known numeric fields are numbers a float
    holds (null, as strict JSON writes NaN, counts as absent) and whose `mapping`, if any, is a
    plain name.
    Anything else is one line naming file:line.

    Memory stays bounded on any file: training-loss records keep their known numeric fields
    (NUMERIC) and, past MAX_TRAIN_RECORDS of them, every second one is let go (then every fourth,
    ...), as a plot needs no more; the other records (evaluations, the end) may hold MAX_OTHER_BYTES
    together, each counted at least RECORD_COST bytes, past which the file is refused."""
    records: list[dict[str, Any]] = []
    train_at: list[int] = []  # each kept training record's place in `records`
    stride, train_seen, other_bytes = 1, 0, 0
    try:
        with open_regular(path, "run log", "r", encoding="utf-8") as f:  # a FIFO or /dev/zero: refused
            for n, line in enumerate(iter(lambda: f.readline(MAX_RECORD + 1), ""), 1):
                if len(line) > MAX_RECORD:
                    raise DlrmkitError(f"{path}:{n}: a line longer than {MAX_RECORD >> 20} MiB, not a log record")
                if line.strip():
                    try:
                        r = json.loads(line)
                    except (json.JSONDecodeError, RecursionError):
                        raise DlrmkitError(f"{path}:{n}: not a JSON line") from None
                    except ValueError:  # json's limit on an integer's digits (sys.get_int_max_str_digits)
                        raise DlrmkitError(
                            f"{path}:{n}: an integer of more than {sys.get_int_max_str_digits()} digits, not a log record"
                        ) from None
                    if not isinstance(r, dict):
                        raise DlrmkitError(f"{path}:{n}: not a JSON object")
                    for k in NUMERIC:
                        v = r.get(k)
                        if v is None:
                            r.pop(k, None)
                        elif isinstance(v, bool) or not isinstance(v, (int, float)):
                            raise DlrmkitError(f"{path}:{n}: field '{k}' is {v!r}, not a number")
                        elif isinstance(v, int) and abs(v) > sys.float_info.max:  # past any float
                            raise DlrmkitError(
                                f"{path}:{n}: field '{k}' is an integer of {len(str(abs(v)))} digits, not a number a run logs"
                            )
                    m = r.get("mapping")
                    if m is not None and not (isinstance(m, str) and MAPPING.fullmatch(m)):
                        raise DlrmkitError(f"{path}:{n}: field 'mapping' is {m!r:.80}, not a mapping name")
                    if r.get("event") == "train":
                        train_seen += 1
                        if (train_seen - 1) % stride:
                            continue
                        train_at.append(len(records))
                        records.append({k: v for k, v in r.items() if k == "event" or k in NUMERIC})
                        if len(train_at) > MAX_TRAIN_RECORDS:  # keep every second one of those kept
                            stride *= 2
                            records, train_at = thin_train(records, train_at)
                        continue
                    other_bytes += max(len(line), RECORD_COST)
                    if other_bytes > MAX_OTHER_BYTES:
                        raise DlrmkitError(
                            f"{path}:{n}: more than {MAX_OTHER_BYTES >> 20} MiB of records besides training "
                            "losses; a run logs a few hundred bytes per evaluation"
                        )
                    records.append(r)
    except FileNotFoundError:
        raise DlrmkitError(f"{path}: no log (was the run started?)") from None
    except UnicodeDecodeError:
        raise DlrmkitError(f"{path}: not UTF-8 text") from None
    except OSError as exc:
        raise DlrmkitError(f"{path}: cannot read ({exc.strerror or exc})") from None
    out = Records(records)
    out.train_seen, out.train_every = train_seen, stride
    return out


def thin_train(records: list[dict[str, Any]], train_at: list[int]) -> tuple[list[dict[str, Any]], list[int]]:
    """Every second training record of `records` let go (the first kept), the others all kept."""
    gone = set(train_at[1::2])
    kept = [r for i, r in enumerate(records) if i not in gone]
    return kept, [i for i, r in enumerate(kept) if r.get("event") == "train"]


def append_record(path: str, line: str, output_folders: tuple[str | None, ...]) -> None:
    """Append one JSON line to the run log. A log inside an output folder (the run folder's or the
    checkpoint folder's own `log.jsonl`) is never written through a symbolic link (one planted
    there is refused); a --log-jsonl the user named may be a link or a stream they chose."""
    import errno
    import os

    from dlrmkit.atomic_io import append_no_follow

    folder = os.path.dirname(os.path.abspath(path))
    if any(f and os.path.abspath(f) == folder for f in output_folders):
        try:
            append_no_follow(path, line)
        except OSError as exc:
            link = exc.errno == errno.ELOOP
            why = "is a symbolic link; a log inside an output folder is never written through one" if link else exc.strerror
            if not link:
                raise
            raise DlrmkitError(f"{path}: {why}") from None
        return
    with open(path, "a", encoding="utf-8") as f:
        f.write(line)


def since_restart(records: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    """(the records after the log's last `restart` record, how many came before it): a --resume
    that found no checkpoint starts the run over at step 0 and appends to the log, whose earlier
    records are an attempt that left nothing to continue."""
    last = max((i for i, r in enumerate(records) if r.get("event") == "restart"), default=None)
    return (records, 0) if last is None else (records[last + 1 :], last)


def summary_writer_class() -> Any:
    """torch's SummaryWriter (needs `tensorboard`) or tensorboardX's; a one-line error without either."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        try:
            from tensorboardX import SummaryWriter
        except ImportError:
            raise DlrmkitError(
                "--tensorboard needs the `tensorboard` or `tensorboardX` package (pip install 'dlrmkit[report]')"
            ) from None
    return SummaryWriter


def tensorboard(records: list[dict[str, Any]], logdir: str) -> None:
    """Scalars of a run log as TensorBoard events in `logdir` (x axis: step). Scores are tagged by
    the mapping they were computed on (`val/auc` during training, `test/auc` once at the end)."""
    writer = summary_writer_class()(logdir)
    for r in records:
        step, ev = r.get("step"), r.get("event")
        if step is None:
            continue
        if ev == "train":
            tag, keys = "train", ("loss", "lr", "samples_per_s")
        elif ev in ("eval", "test"):
            tag, keys = str(r.get("mapping", "unrecorded" if ev == "eval" else "test")), ("auc", "logloss")
        else:
            continue
        for k in keys:
            if k in r and r[k] is not None:
                writer.add_scalar(f"{tag}/{k}", r[k], step)
    writer.close()
