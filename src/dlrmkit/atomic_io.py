"""Files written for the user appear whole or not at all: each is written to a temporary name in
the same folder and renamed over the target (a rename within one file system is atomic), so a
kill, a full disk or a read-only folder never leaves a half-written file or destroys the old one.
OS errors become one line naming the file; the temporary file is removed.

Output paths are also checked up front (`check_output_file`, `check_output_dir`): a folder where
a file is needed, a file where a folder is needed, or a folder that cannot be written is an
error before any expensive work, not after it."""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import stat
import tempfile
from typing import IO, Any, Iterator

from dlrmkit.errors import DlrmkitError


def os_error_text(exc: OSError) -> str:
    """'No space left on device' etc.; the errno name when there is no text."""
    if exc.strerror:
        return exc.strerror
    return errno.errorcode.get(exc.errno or 0, str(exc)) if exc.errno else str(exc)


def nearest_existing(path: str) -> str:
    p = os.path.abspath(path)
    while not os.path.lexists(p):
        parent = os.path.dirname(p)
        if parent == p:
            break
        p = parent
    return p


def _check_parent(path: str, what: str) -> None:
    """The folder that will hold `path` exists or can be created, and is writable."""
    parent = os.path.dirname(os.path.abspath(path))
    base = nearest_existing(parent)
    if not os.path.isdir(base):
        raise DlrmkitError(f"{what} {path}: {base} is a file, not a folder")
    if not os.access(base, os.W_OK | os.X_OK):
        raise DlrmkitError(f"{what} {path}: cannot write in {base} (permission denied or read-only)")


def _check_link(path: str, what: str, follow: bool) -> None:
    """A symbolic link as an output that is written through (`follow`: a folder, a log appended
    to) must name something that exists: a dangling one would create its target wherever it
    points. A file replaced by rename replaces the link itself, never its target."""
    if follow and os.path.islink(path) and not os.path.exists(path):
        raise DlrmkitError(f"{what} {path}: is a symbolic link to {os.readlink(path)}, which does not exist")


def _check_space(path: str, what: str) -> None:
    """The file system that will hold `path` has free blocks: a full disk is found before the work,
    not at the first write. (One that reports no size at all, like /proc, is not judged.)"""
    base = nearest_existing(os.path.dirname(os.path.realpath(path)))
    try:
        st = os.statvfs(base)
    except OSError:
        return
    free = st.f_bfree if os.geteuid() == 0 else st.f_bavail  # root may use the reserved blocks
    if st.f_blocks and not free:
        raise DlrmkitError(f"{what} {path}: cannot write ({os.strerror(errno.ENOSPC)} in {base})")


def _probe_device(path: str, what: str) -> None:
    """An empty write to a character device: /dev/full fails it (no space), /dev/null and a
    terminal take it and show nothing, so a log that cannot be written fails before the work."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, b"")
        finally:
            os.close(fd)
    except OSError as exc:
        raise DlrmkitError(f"{what} {path}: cannot write ({os_error_text(exc)})") from None


def check_output_file(path: str | None, what: str, append: bool = False) -> None:
    """A file `path` can be (re)placed: not a folder, its folder creatable and writable, its disk
    not full. A file only appended to (`append`, e.g. a log) may also be a device such as
    /dev/null (written to once, empty, to prove it), or a link to an existing file; one that is
    replaced by rename may not be a device (the rename would replace the device itself; a link is
    replaced, never the file it names)."""
    if not path or is_stdout(path):
        return
    if not append:  # a log may be appended to a stream the caller opened (/dev/stderr, /dev/fd/N)
        _check_pseudo(path, what)
    if not append and _in_system_folder(path):
        raise DlrmkitError(
            f"{what} {path}: is in /dev, where a file would replace a device or the system's link; "
            f"`-` (or /dev/stdout) writes to standard output"
        )
    _check_link(path, what, follow=append)
    if os.path.isdir(path):
        raise DlrmkitError(f"{what} {path}: is a folder, a file name is needed")
    if append and os.path.exists(path) and stat.S_ISCHR(os.stat(path).st_mode):
        _probe_device(path, what)
        return
    if os.path.lexists(path) and not os.path.isfile(path) and not os.path.islink(path):
        if append and os.access(path, os.W_OK):
            return
        raise DlrmkitError(f"{what} {path}: exists and is not a regular file")
    if not append and os.path.islink(path) and os.path.exists(path) and not os.path.isfile(path):
        # e.g. /dev/stderr, /dev/fd/N: a rename would replace the link (the system's) with a file
        raise DlrmkitError(
            f"{what} {path}: is a link to a device or stream, not a file; `-` (or /dev/stdout) writes to "
            f"standard output"
        )
    _check_parent(path, what)
    _check_space(path, what)
    if not append:
        _probe_folder(path, what)


PSEUDO = ("/proc", "/sys")  # kernel file systems: nothing a command writes belongs there


def _under(path: str, tops: tuple[str, ...]) -> str | None:
    return next((t for t in tops if path == t or path.startswith(t + os.sep)), None)


def _in_system_folder(path: str) -> bool:
    """`path` (as given, or after links) names something in /dev (but /dev/shm, a plain tmpfs),
    /proc or /sys."""
    return any(
        _under(p, ("/dev", *PSEUDO)) and not _under(p, ("/dev/shm",))
        for p in (os.path.abspath(path), os.path.realpath(path))
    )


def _check_pseudo(path: str, what: str) -> None:
    for p in (os.path.abspath(path), os.path.realpath(path)):
        top = _under(p, PSEUDO)
        if top:
            raise DlrmkitError(f"{what} {path}: is in {top}, a kernel file system; choose another path")


def _probe_folder(path: str, what: str) -> None:
    """Create and remove an empty file (exclusive, not following links) in the folder that will
    hold `path`, when it exists: what permission bits cannot tell (root, a read-only mount, a
    file system that refuses new files) is found before the work, not after it."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        return
    probe = os.path.join(folder, f".dlrmkit-probe-{os.getpid()}")
    try:
        fd = os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW, 0o600)
        os.close(fd)
        os.remove(probe)
    except FileExistsError:
        return
    except OSError as exc:
        raise DlrmkitError(f"{what} {path}: cannot write in {folder} ({os_error_text(exc)})") from None


def check_output_dir(path: str | None, what: str, allow_root: bool = False) -> None:
    """A folder `path` exists (writable) or can be created; not the root folder, unless
    `allow_root` (the parent of an output, checked for writing)."""
    if not path:
        return
    if path == "-":  # standard output elsewhere: never a folder of that name made in its place
        raise DlrmkitError(f"{what} -: a folder is needed, not standard output (write ./- for a folder named '-')")
    _check_pseudo(path, what)
    _check_link(path, what, follow=True)
    if not allow_root and os.path.abspath(path) == os.path.abspath(os.sep):
        raise DlrmkitError(f"{what} {path}: the root folder cannot be an output; choose a new folder")
    if os.path.lexists(path):
        if not os.path.isdir(path):
            raise DlrmkitError(f"{what} {path}: is a file, a folder is needed (cannot write there)")
        if not os.access(path, os.W_OK | os.X_OK):
            raise DlrmkitError(f"{what} {path}: cannot write in it (permission denied or read-only)")
        return
    _check_parent(path, what)


def check_not_inside(path: str | None, what: str, inputs: dict[str, str | None]) -> None:
    """An output must not overwrite an input: `path` is not inside any of `inputs` ({option: path})."""
    if not path:
        return
    real = os.path.realpath(path)
    for option, folder in inputs.items():
        if not folder or not os.path.exists(folder):
            continue
        base = os.path.realpath(folder)
        if real == base and not os.path.isdir(base):
            raise DlrmkitError(f"{what} {path}: is the input {option} {folder}; choose another path")
        if real == base or real.startswith(base.rstrip(os.sep) + os.sep):
            raise DlrmkitError(f"{what} {path}: is inside {option} {folder}, an input; choose another path")


def check_distinct(outputs: dict[str, str | None]) -> None:
    """Two options ({option: path}) must not name the same output file: one would overwrite or
    interleave with the other."""
    seen: dict[str, str] = {}
    for option, path in outputs.items():
        if not path:
            continue
        real = os.path.realpath(path)
        if real in seen:
            raise DlrmkitError(f"{option} {path}: is also {seen[real]}; give each output its own path")
        seen[real] = option


def make_dirs(path: str, what: str = "") -> None:
    """os.makedirs with an OS error as one line naming the folder."""
    try:
        os.makedirs(path, exist_ok=True)
    except FileExistsError:
        raise DlrmkitError(f"{what + ' ' if what else ''}{path}: is a file, a folder is needed") from None
    except OSError as exc:
        raise DlrmkitError(f"{what + ' ' if what else ''}{path}: cannot create folder ({os_error_text(exc)})") from None


@contextlib.contextmanager
def atomic_path(path: str) -> Iterator[str]:
    """A temporary path beside `path` for a library that writes by name (torch.save, savefig,
    onnx); renamed over `path` when the block ends without error, removed otherwise."""
    path = os.fspath(path)
    if _in_system_folder(path):  # a rename there would replace a device or the system's link (/dev/stderr)
        raise DlrmkitError(f"{path}: is in a system folder (/dev, /proc, /sys); not replaced by a file")
    folder = os.path.dirname(os.path.abspath(path))
    make_dirs(folder)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=folder)
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600; the file gets the usual permissions
        os.close(fd)
    except OSError as exc:
        raise DlrmkitError(f"{path}: cannot write ({os_error_text(exc)})") from None
    try:
        yield tmp
        _fsync_file(tmp)
        os.replace(tmp, path)
    except OSError as exc:
        _remove(tmp)
        raise DlrmkitError(
            f"{path}: cannot write ({os_error_text(exc)}); the previous file, if any, is unchanged"
        ) from None
    except BaseException:
        _remove(tmp)
        raise


@contextlib.contextmanager
def atomic_write(path: str, mode: str = "w") -> Iterator[IO[Any]]:
    """An open file on a temporary name beside `path`, renamed over it on success."""
    with atomic_path(path) as tmp:
        with open(tmp, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
            yield f
            f.flush()


@contextlib.contextmanager
def removed_if_interrupted(folder: str | None) -> Iterator[None]:
    """Run the block with SIGTERM (and SIGHUP) raising SystemExit(128 + signal) instead of ending
    the process where it stands, and remove the temporary `folder` (None: nothing of ours) when the
    block ends by any exception, an interrupt (SIGINT) or such a signal included: a process
    stopped while saving leaves nothing behind. (SIGKILL cannot be caught: the next save removes
    what it leaves, saying so.) Handlers are set only in the main thread, and restored after."""
    import shutil
    import signal
    import threading

    def stop(signum: int, frame: Any) -> None:  # noqa: ARG001
        raise SystemExit(128 + signum)

    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGHUP):
            with contextlib.suppress(ValueError, OSError):
                previous[sig] = signal.signal(sig, stop)
    try:
        yield
    except BaseException:
        if folder:
            shutil.rmtree(folder, ignore_errors=True)
        raise
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def create_new(path: str, mode: str = "w") -> IO[Any]:
    """A new file at `path`, never written through a link: whatever is there (a stale temporary
    file, or a link planted to a file elsewhere) is removed first, not followed, and the file is
    created exclusively (O_EXCL | O_NOFOLLOW)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    return os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"}))


def append_no_follow(path: str, text: str) -> None:
    """Append `text` to the file `path` inside an output folder, created if missing; a symbolic
    link there is refused (ELOOP), never appended through."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    with os.fdopen(fd, "a", encoding="utf-8") as f:
        f.write(text)


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _fsync_file(path: str) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        os.remove(path)


def strict_json(obj: Any) -> Any:
    """`obj` with every NaN or infinity replaced by None: JSON has no NaN, and a bare `NaN` token
    breaks strict parsers. Callers say in the document why a value is null."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: strict_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict_json(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item) and getattr(obj, "ndim", 1) == 0:  # numpy/torch scalars
        return strict_json(obj.item())
    return obj


def nonfinite_keys(obj: dict[str, Any]) -> list[str]:
    """Top-level keys whose value is a NaN or infinite float."""
    return [k for k, v in obj.items() if isinstance(v, float) and not math.isfinite(v)]


@contextlib.contextmanager
def output_text(path: str) -> Iterator[IO[Any]]:
    """A text file to write `path` through: standard output itself for `-` or /dev/stdout (never
    replaced by a file of that name), else atomic_write."""
    if is_stdout(path):
        import sys

        stream = _json_stdout[-1] if _json_stdout else sys.stdout
        yield stream
        stream.flush()
        return
    with atomic_write(path) as f:
        yield f


_json_stdout: list[IO[Any]] = []  # the standard output text_to_stderr set aside for the JSON


@contextlib.contextmanager
def text_to_stderr(json_out: str | None) -> Iterator[None]:
    """With `--json -` (or /dev/stdout), standard output is the JSON: what the command prints
    meanwhile goes to stderr, so the output parses (write_json still writes standard output)."""
    if not is_stdout(json_out):
        yield
        return
    import sys

    _json_stdout.append(sys.stdout)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        _json_stdout.pop()


def write_json(path: str, obj: Any, indent: int | None = 2) -> None:
    """Strict JSON (no NaN tokens), written atomically (or to standard output: output_text)."""
    with output_text(path) as f:
        json.dump(strict_json(obj), f, indent=indent, allow_nan=False)
        f.write("\n")


def write_text(path: str, text: str) -> None:
    with atomic_write(path) as f:
        f.write(text)


# ---- one writer per output ----------------------------------------------------------------------------
STREAMS = ("-", "/dev/stdout")  # outputs that mean standard output: written there, never replaced


def is_stdout(path: str | None) -> bool:
    return path is not None and (path in STREAMS or os.path.abspath(path) in ("/dev/stdout", "/proc/self/fd/1"))


def _boot_id() -> str:
    with contextlib.suppress(OSError), open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
        return f.read().strip()[:64]
    return "unknown"


@contextlib.contextmanager
def output_lock(out: str, option: str = "--out") -> Iterator[None]:
    """Hold `<out>.lock` (flock; `out`'s real path, links resolved) for the whole write: a second process writing the same output stops
    at once with one line naming the holder. The lock file records the holder (pid and boot id) and is
    removed when the block ends; a file left by a holder that died (flock is released with its
    process) is taken over, saying so. Standard output (`-`) takes no lock."""
    if is_stdout(out):
        yield
        return
    # the real path: two names of one folder (a symbolic link to it) take the same lock
    absolute = os.path.realpath(out)
    if not os.path.basename(absolute):
        raise DlrmkitError(f"{option} {out}: the root folder cannot be an output; choose a new folder")
    path = absolute.rstrip(os.sep) + ".lock"
    make_dirs(os.path.dirname(path), option)
    while True:
        try:
            fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise DlrmkitError(f"{option} {out}: cannot create lock file {path} ({os_error_text(exc)})") from None
        try:
            import fcntl

            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(fd, 200, 0).decode("utf-8", "replace").split()
            os.close(fd)
            who = f" (pid {holder[1][:12]})" if len(holder) > 1 and holder[0] == "pid" else ""
            raise DlrmkitError(
                f"{option} {out}: another dlrmkit process{who} is writing it (lock {path} is held); wait for it or choose another {option}"
            ) from None
        try:  # the holder before us may have removed the file after we opened it: lock the current one
            same = os.stat(path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    left = os.pread(fd, 200, 0).decode("utf-8", "replace").split()
    if len(left) >= 4 and left[0] == "pid" and left[2] == "boot":
        import sys

        on = "" if left[3] == _boot_id() else " before the machine restarted"
        print(f"took over the lock {path} left by process {left[1]}{on}, which is no longer running", file=sys.stderr)
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} boot {_boot_id()}\n".encode(), 0)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.remove(path)
        os.close(fd)


_held = contextlib.ExitStack()


def hold_output_lock(out: str, option: str) -> None:
    """output_lock held until release_output_locks() (the CLI calls it when a command ends): for a
    command whose outputs are set up in one function and written until it returns."""
    _held.enter_context(output_lock(out, option))


def release_output_locks() -> None:
    _held.close()

