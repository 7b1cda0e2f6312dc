"""argparse `type=` validators: every numeric option is range-checked while the command line is
parsed, so a bad value is one line naming the option (argparse adds "argument --x:") before any
data is read or any model is built. Upper bounds keep a typo (an extra few zeros) from asking
the machine for more memory or disk than any real run needs."""

from __future__ import annotations

import argparse
import math
from typing import Callable

# Largest values any real run needs; beyond them a value is a typo, not a plan.
MAX_BATCH = 1 << 24  # 16M samples: 64x MLPerf's largest global batch
MAX_STEPS = 1 << 40
MAX_ROWS = 1 << 40
MAX_WORLD_SIZE = 1 << 16  # 65,536 ranks
MAX_THREADS = 4096
MAX_WORKERS = 1024
MAX_DIM = 1 << 16
MAX_SEED = (1 << 32) - 1


def _number(text: str, kind: type) -> float | int:
    try:
        if kind is int:
            value = int(str(text).strip().replace("_", ""))
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
threads = int_range(0, MAX_THREADS)
workers = int_range(1, MAX_WORKERS)
world_size = int_range(1, MAX_WORLD_SIZE)
dim = int_range(1, MAX_DIM)
seed = int_range(0, MAX_SEED)
learning_rate = float_range(0.0, 1e6, lo_open=True)  # finite and > 0
positive_float = float_range(0.0, lo_open=True)
timeout = float_range(0.0, 1e7, lo_open=True)  # seconds: up to about 115 days
nonneg_float = float_range(0.0)
fraction = float_range(0.0, 1.0, lo_open=True, hi_open=True)  # strictly between 0 and 1
auc = float_range(0.0, 1.0, lo_open=True)  # a target AUC in (0, 1]
frequency_threshold = int_range(1, 1 << 31)
table_size = int_range(2, 1 << 62)  # --max-table-size: id 0 plus at least one folded id


def int_list(text: str) -> list[int]:
    """'64,16' -> [64, 16], every size positive (for --bottom-mlp / --top-mlp)."""
    parts = [x for x in str(text).replace("[", "").replace("]", "").split(",") if x.strip()]
    if not parts:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got '{text}'")
    try:
        values = [int(x) for x in parts]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got '{text}'") from None
    bad = [v for v in values if not 1 <= v <= MAX_DIM]
    if bad:
        raise argparse.ArgumentTypeError(f"every size must be in [1, {MAX_DIM}], got {bad[0]}")
    return values


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
        value = float(num)
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
