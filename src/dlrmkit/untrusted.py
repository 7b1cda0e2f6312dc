"""Reading small files that come from elsewhere (checkpoint manifests and metadata, `latest`,
config files, sharding plans, search spaces) so that a hostile one costs bounded time and memory
and ends in one line naming the file: only regular files (a FIFO would block forever, /dev/zero
never ends), at most a stated size (checked before reading), UTF-8, JSON without NaN/Infinity
tokens, no nesting deep enough to exhaust the interpreter's stack, and YAML whose aliases cannot
expand into billions of nodes (a shared list referenced nine times, nine levels deep, is one
small object to the loader but 9^9 values to whatever walks it)."""

from __future__ import annotations

import json
import os
import re
import stat
from typing import Any

from dlrmkit.errors import DlrmkitError

MiB = 1 << 20
MAX_NODES = 1_000_000  # values a config, plan or search space may expand to (aliases counted each time)


def _size(n: int) -> str:
    return f"{n / MiB:.1f} MiB" if n >= MiB else f"{n} bytes"


def read_bytes(path: str, what: str, limit: int, follow_links: bool = True) -> bytes:
    """The bytes of regular file `path`, refused past `limit` bytes before any is read.
    `follow_links` False: a symbolic link is refused too (files inside a checkpoint folder)."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow_links else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if not follow_links and os.path.islink(path):
            raise DlrmkitError(f"{path}: is a symbolic link; a {what} must be a regular file in its folder") from None
        raise DlrmkitError(f"{path}: cannot read {what} ({exc.strerror or type(exc).__name__})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = "a folder" if stat.S_ISDIR(st.st_mode) else "not a regular file"
            raise DlrmkitError(f"{path}: is {kind}; a {what} must be a regular file")
        if st.st_size > limit:
            raise DlrmkitError(f"{path}: {_size(st.st_size)}, more than a {what} may be ({_size(limit)}); refused")
        chunks, total = [], 0
        while chunk := os.read(fd, min(limit + 1 - total, 1 << 22) or 1):
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:  # grew while being read
                raise DlrmkitError(f"{path}: more than a {what} may be ({_size(limit)}); refused")
        return b"".join(chunks)
    except OSError as exc:
        raise DlrmkitError(f"{path}: cannot read {what} ({exc.strerror or type(exc).__name__})") from None
    finally:
        os.close(fd)


def check_regular_input(path: str, what: str) -> None:
    """An input file read whole or by blocks is a regular file (after links): a FIFO would block the
    command forever and a character device (/dev/zero) never ends; either is one line, as is a
    missing file or a folder. Checked without opening (opening a FIFO blocks)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise DlrmkitError(f"{what} {path}: no such file") from None
    except OSError as exc:
        raise DlrmkitError(f"{what} {path}: cannot read ({exc.strerror or type(exc).__name__})") from None
    if stat.S_ISDIR(st.st_mode):
        raise DlrmkitError(f"{what} {path}: is a folder, a file is needed")
    if not stat.S_ISREG(st.st_mode):
        kind = "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a device" if stat.S_ISCHR(st.st_mode) else "special"
        raise DlrmkitError(f"{what} {path}: not a regular file ({kind}); give a file")


def open_regular(path: str, what: str, mode: str = "rb", **kwargs: Any):
    """`open(path, mode)` for reading, refused unless a regular file: opened non-blocking (a FIFO
    does not block the open), checked by fstat on the open descriptor (no swap in between)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise DlrmkitError(f"{what} {path}: no such file") from None
    except OSError as exc:
        raise DlrmkitError(f"{what} {path}: cannot read ({exc.strerror or type(exc).__name__})") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            check_regular_input(path, what)  # names what it is
            raise DlrmkitError(f"{what} {path}: not a regular file")
        os.set_blocking(fd, True)
        return os.fdopen(fd, mode, **kwargs)
    except BaseException:
        os.close(fd)
        raise


def read_text(path: str, what: str, limit: int, follow_links: bool = True) -> str:
    data = read_bytes(path, what, limit, follow_links)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DlrmkitError(f"{path}: not UTF-8 text (byte {exc.start}); not a {what}") from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def load_json(path: str, what: str, limit: int, follow_links: bool = True, allow_nan: bool = False) -> Any:
    """Strict JSON (NaN, Infinity refused unless `allow_nan`) from a bounded regular file, or one line."""
    text = read_text(path, what, limit, follow_links)
    try:
        return json.loads(text, **({} if allow_nan else {"parse_constant": _no_constant}))
    except json.JSONDecodeError as exc:
        raise DlrmkitError(f"{path}: line {exc.lineno}: invalid JSON ({exc.msg}); not a {what}") from None
    except ValueError as exc:  # NaN / Infinity, or an integer of more than 4300 digits
        raise DlrmkitError(f"{path}: invalid JSON ({str(exc)[:80]}); not a {what}") from None
    except RecursionError:
        raise DlrmkitError(f"{path}: nested too deeply; not a {what}") from None


def load_yaml(path: str, what: str, limit: int) -> Any:
    """YAML (safe_load: no tags that build Python objects) from a bounded regular file, its
    expansion bounded by MAX_NODES, or one line."""
    import yaml

    text = read_text(path, what, limit)
    try:
        data = yaml.load(text, Loader=_unique_keys_loader())  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or (str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        raise DlrmkitError(f"{path}: not valid YAML{where} ({problem})") from None
    except RecursionError:
        raise DlrmkitError(f"{path}: nested too deeply; not a {what}") from None
    except ValueError as exc:  # e.g. an integer of more than 4300 digits
        raise DlrmkitError(f"{path}: not valid YAML ({str(exc)[:80]})") from None
    check_expansion(data, path, what)
    return data


def _unique_keys_loader() -> type:
    """yaml.SafeLoader that refuses a key given twice in one mapping (SafeLoader keeps the last
    silently, so `lr: 0.1` ... `lr: 1` would train with a value the reader did not see first)."""
    import yaml

    class UniqueKeyLoader(yaml.SafeLoader):
        def construct_mapping(self, node: Any, deep: bool = False) -> dict:
            seen = set()
            for key_node, _ in node.value:  # scalar keys as written; merge keys (<<) may repeat
                if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                    if (key_node.tag, key_node.value) in seen:
                        raise yaml.constructor.ConstructorError(
                            None, None, f"key {key_node.value[:40]!r} given twice", key_node.start_mark
                        )
                    seen.add((key_node.tag, key_node.value))
            return super().construct_mapping(node, deep=deep)

    # YAML 1.1 reads `017` as 15, `0x10` as 16, `1_000` as 1000 and `1:30` as 90; the command line
    # reads 017 as 17 and refuses the others. Numbers are resolved in decimal only: the other
    # spellings stay text, which an option's own parser then reads as the command line does.
    int_tag, float_tag = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"
    UniqueKeyLoader.yaml_implicit_resolvers = {
        first: [(tag, rx) for tag, rx in resolvers if tag not in (int_tag, float_tag)]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    UniqueKeyLoader.add_implicit_resolver(int_tag, re.compile(r"^[-+]?(?:0|[1-9][0-9]*)$"), list("-+0123456789"))
    UniqueKeyLoader.add_implicit_resolver(
        float_tag,
        re.compile(r"^(?:[-+]?(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][-+][0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
        list("-+0123456789."),
    )
    return UniqueKeyLoader


def check_expansion(data: Any, path: str, what: str, limit: int = MAX_NODES) -> None:
    """Refuse a document whose values, counting every alias where it is used, exceed `limit`
    (or nest deeper than 100): walked iteratively, stopping at the limit, so the check itself is
    bounded."""
    stack, seen = [(data, 0)], 0
    while stack:
        value, depth = stack.pop()
        seen += 1
        if seen > limit:
            raise DlrmkitError(f"{path}: expands to more than {limit:,} values (aliases repeat them); not a {what}")
        if depth > 100:
            raise DlrmkitError(f"{path}: nested more than 100 deep; not a {what}")
        if isinstance(value, dict):
            stack.extend((v, depth + 1) for kv in value.items() for v in kv)
        elif isinstance(value, (list, tuple)):
            stack.extend((v, depth + 1) for v in value)
