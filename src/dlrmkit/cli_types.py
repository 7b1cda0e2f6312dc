"""argparse `type=` validators: every numeric option is range-checked while the command line is
parsed, so a bad value is one line naming the option (argparse adds "argument --x:") before any
data is read or any model is built. Upper bounds keep a typo (an extra few zeros) from asking
the machine for more memory or disk than any real run needs."""

from __future__ import annotations

import argparse
import math
import os
import re
import stat
from typing import Callable

# Largest values any real run needs; beyond them a value is a typo, not a plan.
MAX_BATCH = 1 << 24  # 16M samples: 64x MLPerf's largest global batch
MAX_STEPS = 1 << 40
MAX_ROWS = 1 << 40
MAX_WORLD_SIZE = 1 << 16  # 65,536 ranks
MAX_FLOAT = 1e9  # any float option's ceiling unless it says otherwise (1e30 is a typo)
MAX_TABLES = 10_000  # tables of one model: far beyond any published DLRM
PATH_MAX = 4096  # bytes in a whole path, Linux's limit (with the final NUL)
NAME_MAX = 255  # bytes in one file or folder name
MAX_SMALL_FILE = 64 << 20  # a config, plan, hardware profile or search space: text of a few KiB
MAX_DIM = 1 << 16
MAX_SEED = (1 << 32) - 1


def per_cpu_ceiling(factor: int, floor: int) -> int:
    """More processes or threads than `factor` per CPU only oversubscribe the machine."""
    return max(floor, factor * (os.cpu_count() or 1))


MAX_THREADS = per_cpu_ceiling(4, 16)
MAX_WORKERS = per_cpu_ceiling(4, 16)


# An underscore may only group thousands in the integer part ('1_000_000', '2_500.5'): Python's
# int() and float() also take '1_0' (10) or '1e1_0', most likely a typo, not a number.
_GROUPED = re.compile(r"[+-]?\d{1,3}(_\d{3})+(\.\d*)?([eE][+-]?\d+)?")


def _number(text: str, kind: type) -> float | int:
    what = "an integer" if kind is int else "a number"
    if not str(text).isascii():  # int() and float() also read Arabic-Indic or full-width digits
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    if "_" in str(text) and not _GROUPED.fullmatch(str(text).strip()):
        raise argparse.ArgumentTypeError(f"expected {what}, got '{text}' (an underscore may only group thousands)")
    try:
        if kind is int:
            value = int(str(text).strip())
        else:
            value = float(str(text).strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected {'an integer' if kind is int else 'a number'}, got '{text}'"
        ) from None
    if kind is float and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got '{text}'")
    return value


def int_range(lo: int | None = None, hi: int | None = None) -> Callable[[str], int]:
    """An integer in [lo, hi] (either bound may be open)."""

    def parse(text: str) -> int:
        v = _number(text, int)
        if lo is not None and v < lo:
            raise argparse.ArgumentTypeError(f"must be >= {lo}, got {v}")
        if hi is not None and v > hi:
            raise argparse.ArgumentTypeError(f"must be <= {hi:,}, got {v:,}")
        return int(v)

    parse.__name__ = "integer"
    return parse


def float_range(
    lo: float | None = None, hi: float | None = None, lo_open: bool = False, hi_open: bool = False
) -> Callable[[str], float]:
    """A finite float in the interval; `*_open` excludes the bound."""

    def parse(text: str) -> float:
        v = _number(text, float)
        if lo is not None and (v < lo or (lo_open and v == lo)):
            raise argparse.ArgumentTypeError(f"must be {'>' if lo_open else '>='} {lo:g}, got {v:g}")
        if hi is not None and (v > hi or (hi_open and v == hi)):
            raise argparse.ArgumentTypeError(f"must be {'<' if hi_open else '<='} {hi:g}, got {v:g}")
        return float(v)

    parse.__name__ = "number"
    return parse


positive_int = int_range(1, MAX_STEPS)
nonneg_int = int_range(0, MAX_STEPS)
batch_size = int_range(1, MAX_BATCH)
rows = int_range(1, MAX_ROWS)
nonneg_rows = int_range(0, MAX_ROWS)
threads = int_range(1, MAX_THREADS)
workers = int_range(1, MAX_WORKERS)
world_size = int_range(1, MAX_WORLD_SIZE)
dim = int_range(1, MAX_DIM)
seed = int_range(0, MAX_SEED)
learning_rate = float_range(0.0, 1e6, lo_open=True)  # finite and > 0
positive_float = float_range(0.0, MAX_FLOAT, lo_open=True)
timeout = float_range(0.0, 1e7, lo_open=True)  # seconds: up to about 115 days
seconds = float_range(0.0, 1e7)  # an interval in seconds, 0: off
nonneg_float = float_range(0.0, MAX_FLOAT)
fraction = float_range(0.0, 1.0, lo_open=True, hi_open=True)  # strictly between 0 and 1
auc = float_range(0.0, 1.0, lo_open=True)  # a target AUC in (0, 1]
frequency_threshold = int_range(1, 1 << 31)
table_size = int_range(2, 1 << 62)  # --max-table-size: id 0 plus at least one folded id


def _items(text: str, hi: int, most: int) -> list[int]:
    """'64,16' -> [64, 16]: at most `most` items, each an integer in [1, hi]; an empty item
    ('64,,16', a trailing comma) is refused, not dropped, as it is most likely a lost value."""
    parts = str(text).replace("[", "").replace("]", "").split(",")
    if not str(text).strip(" []"):
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}")
    if len(parts) > most:
        raise argparse.ArgumentTypeError(f"{len(parts):,} items; at most {most:,}")
    empty = [i for i, x in enumerate(parts) if not x.strip()]
    if empty:
        raise argparse.ArgumentTypeError(f"item {empty[0] + 1} is empty in {text!r}")
    values = []
    for i, x in enumerate(parts):
        if not x.strip().isascii() or not x.strip().lstrip("-").isdigit():
            raise argparse.ArgumentTypeError(f"item {i + 1} {x.strip()!r} is not an integer")
        values.append(int(x))
    bad = [v for v in values if not 1 <= v <= hi]
    if bad:
        raise argparse.ArgumentTypeError(f"every size must be in [1, {hi}], got {bad[0]}")
    return values


def int_list(text: str) -> list[int]:
    """'64,16' -> [64, 16], every size positive (for --bottom-mlp / --top-mlp)."""
    return _items(text, MAX_DIM, 1024)


def cardinalities(text: str) -> str:
    """'N1,N2,...': table sizes, at most MAX_TABLES tables of at most 2^62 rows (kept as text
    for the synthetic-data code, which reads it)."""
    return ",".join(str(v) for v in _items(text, 1 << 62, MAX_TABLES))


def path(text: str) -> str:
    """A file or folder name: not empty, no control character (a pasted line break or tab) and
    within the OS's length limits, so a bad path is refused while parsing, not when the first
    file is written, after the expensive work."""
    text = str(text)
    if not text.strip():
        raise argparse.ArgumentTypeError("a path cannot be empty")
    if any(ord(c) < 32 or ord(c) == 127 for c in text):
        raise argparse.ArgumentTypeError(f"holds a control character (a line break or tab): {text!r}")
    try:
        raw = os.fsencode(text)
    except UnicodeEncodeError:
        raise argparse.ArgumentTypeError(f"not a valid file name: {text!r}") from None
    if len(raw) >= PATH_MAX:
        raise argparse.ArgumentTypeError(f"{len(raw):,} bytes long; a path holds at most {PATH_MAX - 1:,}")
    longest = max(len(name) for name in raw.split(b"/"))
    if longest > NAME_MAX:
        raise argparse.ArgumentTypeError(f"holds a name of {longest:,} bytes; a name holds at most {NAME_MAX}")
    return text


def text(value: str) -> str:
    """A name or URL (a column, a study, a storage): not empty, no control character."""
    value = str(value)
    if not value.strip():
        raise argparse.ArgumentTypeError("cannot be empty")
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise argparse.ArgumentTypeError(f"holds a control character (a line break or tab): {value!r}")
    return value


def names(value: str) -> str:
    """'a,b,c': comma-separated names, none empty ('' alone: none at all)."""
    value = str(value)
    if not value:
        return value
    items = value.split(",")
    empty = [i for i, x in enumerate(items) if not x.strip()]
    if empty:
        raise argparse.ArgumentTypeError(f"item {empty[0] + 1} is empty in {value!r}")
    for item in items:
        text(item)
    return value


def label_values(value: str) -> tuple[str, str]:
    """'NEG,POS': the two values of a label column read as 0 and 1, distinct, neither empty."""
    items = [x.strip() for x in str(names(value)).split(",")]
    if len(items) != 2 or items[0] == items[1]:
        raise argparse.ArgumentTypeError(f"names two different values, the non-click's then the click's: {value!r}")
    return items[0], items[1]


def small_file(text: str) -> str:
    """A path naming a small text file (config, plan, profile, search space), if it exists: a
    regular file of at most MAX_SMALL_FILE bytes. A pipe would block the read forever, and a
    device such as /dev/zero never ends."""
    text = path(text)
    try:
        st = os.stat(text)
    except OSError:
        return text  # missing (or a name such as a hardware profile): the command says so
    if stat.S_ISDIR(st.st_mode):
        return text
    if not stat.S_ISREG(st.st_mode):
        raise argparse.ArgumentTypeError(f"{text}: not a regular file (a pipe or device cannot be read as text)")
    if st.st_size > MAX_SMALL_FILE:
        raise argparse.ArgumentTypeError(
            f"{text}: {st.st_size / (1 << 20):,.0f} MiB; a text file here holds at most {MAX_SMALL_FILE >> 20} MiB"
        )
    return text


def single_char(text: str) -> str:
    """A field delimiter: one character (escapes such as '\\t' are accepted), not a quote or newline."""
    value = {"\\t": "\t", "tab": "\t", "TAB": "\t"}.get(text, text)
    if len(value) != 1 or not value.isascii():
        raise argparse.ArgumentTypeError(f"must be one ASCII character, got '{text}'")
    if value in '"\r\n':
        raise argparse.ArgumentTypeError(f"cannot be a quote or a line break, got {text!r}")
    return value


def byte_size(text: str) -> int:
    """'80GiB', '80GB', '512MiB', '1.5TiB' or a plain byte count; positive and finite."""
    units = {
        "": 1,
        "b": 1,
        "kib": 1 << 10,
        "mib": 1 << 20,
        "gib": 1 << 30,
        "tib": 1 << 40,
        "pib": 1 << 50,
        "kb": 10**3,
        "mb": 10**6,
        "gb": 10**9,
        "tb": 10**12,
        "pb": 10**15,
        "k": 1 << 10,
        "m": 1 << 20,
        "g": 1 << 30,
        "t": 1 << 40,
        "p": 1 << 50,
    }
    s = str(text).strip().lower().replace(" ", "")
    num = s.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = s[len(num) :]
    try:
        value = float(num) if "_" not in num or _GROUPED.fullmatch(num) else float("nan")
    except ValueError:
        value = float("nan")
    if unit not in units or not math.isfinite(value) or value <= 0 or value * units[unit] > 1 << 60:
        raise argparse.ArgumentTypeError(f"cannot read '{text}' as a memory size (write e.g. 80GiB)")
    return int(value * units[unit])


def boolean(text: str) -> bool:
    """true/false, yes/no, on/off, 1/0 (for options a recipe may set either way)."""
    value = str(text).strip().lower()
    if value in ("true", "yes", "on", "1"):
        return True
    if value in ("false", "no", "off", "0"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got '{text}'")
