"""A copy of a model's weights to put back later (the best validation weights). Small models are
copied in memory; above IN_MEMORY_MAX bytes (per rank) the copy goes to an unlinked temporary
file, written and read back in blocks, so selecting the best weights never holds the tables twice
in RAM: at real table sizes that copy would double the model's memory (5.1 -> 7.7 GB for tables
of 40M rows with Adagrad, docs/BENCHMARKS.md)."""

from __future__ import annotations

import os
import tempfile
from typing import Iterator

import torch

from dlrmkit.errors import DlrmkitError
from dlrmkit.checkpoint.storage import progress

IN_MEMORY_MAX = 256 << 20
BLOCK_BYTES = 64 << 20


def _blocks(t: torch.Tensor) -> Iterator[tuple[torch.Tensor, int]]:
    """`t` as 1-d blocks of at most BLOCK_BYTES (views where `t` is contiguous), each with its
    size in bytes."""
    flat = t.reshape(-1)
    step = max(BLOCK_BYTES // max(t.element_size(), 1), 1)
    for a in range(0, flat.numel(), step):
        block = flat[a : a + step]
        yield block, block.numel() * block.element_size()


def _layout(state: dict[str, torch.Tensor]) -> list[tuple[str, torch.Size, torch.dtype]]:
    return [(k, t.shape, t.dtype) for k, t in state.items()]


def _nbytes(state: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())


def _host_bytes(block: torch.Tensor):
    """A 1-d block's bytes as a writable numpy array (a view of CPU memory where possible)."""
    host = block if block.device.type == "cpu" else block.cpu()
    return host.contiguous().view(torch.uint8).numpy()


class WeightSnapshot:
    """`take(model)` copies every tensor of the model's state dict; `restore(model)` copies them
    back in place. `folder`: where the temporary file lives when the weights are large (the run's
    own output folder; None: the system's temporary folder). The file is unlinked from the
    start, so nothing is left behind, even after a crash."""

    def __init__(self, folder: str | None = None, show: bool = False, in_memory_max: int | None = None):
        self.folder, self.show = folder, show
        self.in_memory_max = IN_MEMORY_MAX if in_memory_max is None else in_memory_max
        self.memory: dict[str, torch.Tensor] | None = None
        self.file = None  # the temporary file, once the weights went to disk
        self.layout: list | None = None  # (name, shape, dtype) of each tensor in the file

    @property
    def taken(self) -> bool:
        return self.memory is not None or self.layout is not None

    def take(self, model: torch.nn.Module) -> None:
        state = model.state_dict()
        total = _nbytes(state)
        if total <= self.in_memory_max:
            self.memory = {k: v.detach().to("cpu", copy=True) for k, v in state.items()}
            return
        try:
            if self.file is None:
                if self.folder:
                    os.makedirs(self.folder, exist_ok=True)
                self.file = tempfile.TemporaryFile(dir=self.folder or None)
            self.file.seek(0)
            with progress(total, "keeping the best weights", self.show) as bar:
                for t in state.values():
                    for block, n in _blocks(t.detach()):
                        self.file.write(_host_bytes(block))
                        bar.update(n)
            self.file.flush()
        except OSError as exc:
            where = self.folder or tempfile.gettempdir()
            raise DlrmkitError(
                f"{where}: cannot keep a copy of the best weights ({total:,} bytes) there: "
                f"{exc.strerror or exc}; free space, or train with --restore-best false"
            ) from exc
        self.layout = _layout(state)

    @torch.no_grad()
    def restore(self, model: torch.nn.Module) -> None:
        state = model.state_dict()
        if self.memory is not None:
            for k, v in state.items():
                v.copy_(self.memory[k])
            return
        if self.layout is None:
            return
        if _layout(state) != self.layout:
            raise DlrmkitError("the model's weights changed shape since the best ones were kept")
        self.file.seek(0)
        with progress(_nbytes(state), "restoring the best weights", self.show) as bar:
            for t in state.values():
                flat = t.reshape(-1) if t.is_contiguous() else t.contiguous().reshape(-1)  # a copy: filled, then t
                for block, n in _blocks(flat):
                    buf = _host_bytes(block)
                    if self.file.readinto(memoryview(buf).cast("B")) != n:
                        raise DlrmkitError("the kept copy of the best weights is shorter than the model")
                    if buf.ctypes.data != block.data_ptr():  # read into a host copy: put it in place
                        block.copy_(torch.from_numpy(buf).view(block.dtype))
                    bar.update(n)
                if not t.is_contiguous():
                    t.copy_(flat.view_as(t))

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None
