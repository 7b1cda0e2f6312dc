"""Build-or-load of the split-SGD C++ kernel, safe across processes and checkouts.

torch.utils.cpp_extension.load() guards a build with a plain lock file that nobody removes when
its holder is killed (torchrun SIGTERMs the other ranks when one fails), and every later load then
waits on it forever. So:

- each build lives in a folder named by a hash of the source, the flags, Python's and torch's
  versions: checkouts with the same source share it, different sources never touch each other's;
- a finished build leaves a ``built`` marker; with it the library is loaded directly
  (torch.ops.load_library), no lock taken;
- a build runs under an fcntl.flock, which the kernel releases when its holder dies, and a stale
  torch lock file is removed under it; waiting for another process's build is bounded
  (DLRMKIT_KERNEL_BUILD_WAIT seconds, default 600), after which the caller falls back to pure torch;
- a library that fails to load (a corrupt file) is rebuilt from scratch, once.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

try:
    import fcntl
except ImportError:  # not POSIX: builds are not guarded across processes
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

WAIT_ENV = "DLRMKIT_KERNEL_BUILD_WAIT"
DEFAULT_WAIT_S = 600.0
TELL_AFTER_S = 20.0


class KernelBuildError(RuntimeError):
    """The kernel could not be built or loaded; the message says why and what to do."""


@dataclass(frozen=True)
class KernelBuild:
    """One build of one source with one set of flags."""

    source: Path
    cflags: tuple[str, ...]
    ldflags: tuple[str, ...] = ()
    prefix: str = "dlrmkit_split_sgd"

    def key(self) -> str:
        """Hash of everything the library depends on: same source and toolchain, same folder."""
        h = hashlib.sha256(self.source.read_bytes())
        for part in (*self.cflags, "|", *self.ldflags, "|", sys.version.split()[0], torch.__version__):
            h.update(part.encode() + b"\0")
        h.update(str(torch.version.cuda or torch.version.hip or "cpu").encode())
        return h.hexdigest()[:16]

    @property
    def name(self) -> str:
        return f"{self.prefix}_{self.key()}"

    def folder(self) -> Path:
        root = os.environ.get("TORCH_EXTENSIONS_DIR")
        if root is None:
            from torch.utils.cpp_extension import get_default_build_root

            root = get_default_build_root()
        return Path(root) / self.name


def _wait_limit() -> float:
    raw = os.environ.get(WAIT_ENV, "")
    try:
        return float(raw) if raw else DEFAULT_WAIT_S
    except ValueError:
        raise KernelBuildError(f"{WAIT_ENV}={raw!r}: not a number of seconds") from None


def _lock(folder: Path, limit_s: float):
    """An open file holding an exclusive flock on ``folder/build.flock``, polled up to limit_s."""
    f = open(folder / "build.flock", "a+")  # noqa: SIM115 (held until the build ends)
    if fcntl is None:
        return f
    start, told = time.monotonic(), False
    while True:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            return f
        except BlockingIOError:
            waited = time.monotonic() - start
            if waited >= limit_s:
                f.close()
                raise KernelBuildError(
                    f"another process has been building it in {folder} for over {limit_s:g} s "
                    f"(set {WAIT_ENV} to wait longer; if no build is running, delete {folder})"
                ) from None
            if not told and waited >= TELL_AFTER_S:  # a usual build takes ~15 s: say why nothing happens
                log.warning(
                    "split-SGD kernel: waiting up to %g s for another process building it in %s", limit_s, folder
                )
                told = True
            time.sleep(0.2)


def _load_built(folder: Path, name: str) -> bool:
    """Load a finished build of this folder; False if there is none, raises if it will not load."""
    lib = folder / f"{name}.so"
    if not (folder / "built").exists() or not lib.exists():
        return False
    torch.ops.load_library(str(lib))
    return True


def load_kernel(build: KernelBuild) -> None:
    """Make the kernel's ops available in torch.ops: load a finished build, else build it under
    the folder's flock (another process may finish it meanwhile), rebuilding a library that does
    not load. Raises KernelBuildError (or the compiler's error) when neither works."""
    folder, name = build.folder(), build.name
    try:
        if _load_built(folder, name):
            return
    except OSError as exc:
        log.warning("split-SGD kernel: %s/%s.so does not load (%s); rebuilding it", folder, name, exc)
    folder.mkdir(parents=True, exist_ok=True)
    held = _lock(folder, _wait_limit())
    try:
        try:
            if _load_built(folder, name):  # built by the process we waited for
                return
        except OSError:
            pass  # the same broken file: rebuilt below
        # no finished build: whatever is here is a dead build's (torch's lock, half-written objects)
        # or a library that does not load; we hold the flock, so start afresh
        for stale in folder.iterdir():
            if stale.name != "build.flock" and (stale.is_file() or stale.is_symlink()):
                stale.unlink()
        from torch.utils.cpp_extension import load

        if sys.stderr.isatty():  # once per source and toolchain: a person waiting is told why
            print(f"building the table-update C++ kernel once, in {folder} (about 15 s; later runs load it)",
                  file=sys.stderr, flush=True)  # fmt: skip
        load(
            name=name,
            sources=[str(build.source)],
            extra_cflags=list(build.cflags),
            extra_ldflags=list(build.ldflags),
            build_directory=str(folder),
            is_python_module=False,
            verbose=False,
        )
        (folder / "built").write_text(f"{name}\n")
    finally:
        held.close()  # releases the flock
