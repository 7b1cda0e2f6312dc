"""Loading the split-SGD kernel across processes (dlrmkit.optim.kernel_build): a lock left by a
killed process never hangs a run, a corrupt library is rebuilt, two first loads at once both get
the kernel, a build still running elsewhere is waited for only so long, and the build folder is
named by the source. Every build here goes to a private TORCH_EXTENSIONS_DIR under tmp_path."""

import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dlrmkit.optim.kernel_build import KernelBuild

LOAD = "from dlrmkit.optim import split_sgd_kernel as k; print('kernel', k.fused_kernel() is not None)"


def start(ext_dir: Path, **env: str) -> subprocess.Popen:
    full = {**os.environ, "TORCH_EXTENSIONS_DIR": str(ext_dir), **env}
    full.pop("DLRMKIT_SPLIT_SGD_KERNEL", None)
    return subprocess.Popen(
        [sys.executable, "-c", LOAD], env=full, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def finish(proc: subprocess.Popen, timeout: float = 240) -> tuple[str, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"loading the kernel hung for {timeout} s; stderr: {err[-2000:]}")
    assert proc.returncode == 0, err[-2000:]
    return out, err


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """A private extensions folder where two processes made their first load at the same time."""
    if not (shutil.which("c++") or shutil.which("g++")) or not shutil.which("ninja"):
        pytest.skip("no C++ compiler or ninja here: the kernel cannot be built, the pure-torch path runs")
    ext = tmp_path_factory.mktemp("ext")
    procs = [start(ext), start(ext)]
    results = [finish(p) for p in procs]
    for out, err in results:
        assert out.strip() == "kernel True", err[-2000:]
    return ext


def only_folder(ext: Path) -> Path:
    (folder,) = [p for p in ext.iterdir() if p.is_dir()]
    return folder


def copy_of(built: Path, tmp_path: Path) -> tuple[Path, Path]:
    ext = tmp_path / "ext"
    shutil.copytree(built, ext)
    return ext, only_folder(ext)


@pytest.mark.slow  # builds the C++ kernel in a private folder
def test_two_first_loads_at_once_share_one_build(built):
    folder = only_folder(built)
    assert (folder / "built").exists()
    assert len(list(folder.glob("*.so"))) == 1


@pytest.mark.slow  # builds the C++ kernel in a private folder
def test_stale_torch_lock_of_a_dead_process_does_not_hang(built, tmp_path):
    ext, folder = copy_of(built, tmp_path)
    (folder / "lock").touch()  # torch's lock file, left by a process killed mid-build
    out, _ = finish(start(ext), timeout=120)  # a finished build: loaded directly, the lock not looked at
    assert out.strip() == "kernel True"

    (folder / "built").unlink()  # and mid-build: no finished build, the stale lock still there
    out, err = finish(start(ext), timeout=240)
    assert out.strip() == "kernel True", err[-2000:]
    assert (folder / "built").exists() and not (folder / "lock").exists()


@pytest.mark.slow  # builds the C++ kernel in a private folder
def test_corrupt_library_is_rebuilt_with_a_message(built, tmp_path):
    ext, folder = copy_of(built, tmp_path)
    (lib,) = folder.glob("*.so")
    lib.write_bytes(b"not a shared library\n")
    out, err = finish(start(ext), timeout=240)
    assert out.strip() == "kernel True", err[-2000:]
    assert "does not load" in err and "rebuilding it" in err
    assert lib.read_bytes()[:4] == b"\x7fELF"


def test_build_running_elsewhere_is_waited_for_then_pure_torch(built, tmp_path):
    ext, folder = copy_of(built, tmp_path)
    (folder / "built").unlink()
    with open(folder / "build.flock", "a+") as held:  # a live process building it
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        out, err = finish(start(ext, DLRMKIT_KERNEL_BUILD_WAIT="1"), timeout=120)
    assert out.strip() == "kernel False"
    line = next(s for s in err.splitlines() if "unavailable" in s)
    assert "pure-torch" in line and "DLRMKIT_KERNEL_BUILD_WAIT" in line and str(folder) in line


def test_build_folder_is_named_by_source_and_torch(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    a, b, c = tmp_path / "a.cpp", tmp_path / "b.cpp", tmp_path / "sub" / "a.cpp"
    c.parent.mkdir()
    a.write_text("int x;\n")
    b.write_text("int y;\n")
    c.write_text("int x;\n")  # another checkout, same source
    flags = ("-O3",)
    fa, fb, fc = (KernelBuild(p, flags).folder() for p in (a, b, c))
    assert fa != fb and fa == fc and fa.parent == tmp_path / "ext"
    assert KernelBuild(a, ("-O2",)).folder() != fa
    monkeypatch.setattr(torch, "__version__", "0.0.0")
    assert KernelBuild(a, flags).folder() != fa


def test_no_working_compiler_falls_back_to_pure_torch_with_one_line(tmp_path):
    out, err = finish(start(tmp_path / "ext", CXX=str(tmp_path / "no-such-c++")), timeout=120)
    assert out.strip() == "kernel False"
    (line,) = [s for s in err.splitlines() if "split-SGD" in s]
    assert "unavailable, using the pure-torch update" in line and "DLRMKIT_SPLIT_SGD_KERNEL=0" in line
