"""`dlrmkit bench --device cuda`: the single-process step on a CUDA GPU.

The model stays the single-device DLRM; this module places it from outside. The MLPs and the
interaction go to the GPU. The tables go there too, or stay in host memory when they do not fit
(`--table-placement`, dlrmkit.device.table_placement). Host tables are looked up on the CPU, and a
forward hook copies the pooled embeddings to the GPU. Autograd's copy brings their gradient back
to host memory, where the fused CPU kernel updates the rows. Batches wait in pinned host memory
and are copied without blocking; each step starts the next batch's copy on a side stream, so it
overlaps the step's compute, as a loader feeding the GPU would.
After warm-up, the bottom and top MLPs (static shapes) are captured in CUDA graphs with
torch.cuda.make_graphed_callables, as NVIDIA's DLRM captures its step. The jagged lookups vary in
size from batch to batch, so they stay outside the graphs.

The GPU tests (tests/test_device.py, tests/test_train_device.py) skip without a GPU, saying so;
benchmarks/gpu_figures.sh runs them on one, and docs/BENCHMARKS.md ("GPU path") holds the figures.
"""

from __future__ import annotations

from typing import Callable

import torch

from dlrmkit.device import batch_to
from dlrmkit.errors import DlrmkitError
from dlrmkit.model.embedding import JaggedIds
from dlrmkit.precision import compute_dtype
from dlrmkit.train.step import training_step


def check_device_options(device: torch.device, parallel: bool, baselines: bool, profile: bool) -> None:
    """The GPU step's limits, as one-line errors before anything is built."""
    if device.type != "cuda":
        return
    if parallel:
        raise DlrmkitError("--device cuda: single process only for now (the sharded step runs on the CPU)")
    if baselines:
        raise DlrmkitError("--device cuda: --compare-fp32/--reference time CPU loops; run them with --device cpu")
    if profile:
        raise DlrmkitError(
            "--device cuda: --profile/--plot not yet (its phase shares are CPU time ranges, "
            "which do not wait for the GPU)"
        )


class Prefetcher:
    """The `move` of the GPU step: returns batch i on the device and starts copying batch i + 1
    (of the same pinned list, in a loop) on a side stream, so the next step's copy overlaps this
    step's compute, as a loader feeding a GPU does. A batch not in the list is copied at once."""

    def __init__(self, batches: list, device: torch.device, ids_device: torch.device):
        self.batches, self.device, self.ids_device = batches, device, ids_device
        self.index = {id(b): i for i, b in enumerate(batches)}
        self.stream = torch.cuda.Stream(device)
        self.ready: dict[int, object] = {}

    def __call__(self, batch):
        i = self.index.get(id(batch))
        moved = self.ready.pop(i, None) if i is not None else None
        if moved is None:
            moved = batch_to(batch, self.device, self.ids_device)
        else:  # copied on the side stream: wait for it, and keep its memory until this stream is done
            compute = torch.cuda.current_stream(self.device)
            compute.wait_stream(self.stream)
            for t in _tensors(moved):
                t.record_stream(compute)
        if i is not None:
            nxt = (i + 1) % len(self.batches)
            with torch.cuda.stream(self.stream):
                self.ready[nxt] = batch_to(self.batches[nxt], self.device, self.ids_device)
        return moved


def _tensors(batch) -> list[torch.Tensor]:
    ids = batch.ids
    ids = [ids.values, ids.offsets] if isinstance(ids, JaggedIds) else [ids]
    return [batch.dense, batch.labels] + [t for t in ids if t.is_cuda]


def gpu_autocast(precision: str):
    """CUDA autocast without its weight-cast cache: graphed callables require cache_enabled=False."""
    return torch.autocast("cuda", dtype=compute_dtype(precision), enabled=precision != "fp32", cache_enabled=False)


def gpu_training_step(
    model, optimizers: list, precision: str, device: torch.device, ids_device: torch.device, batches: list | None = None
) -> Callable:
    """train.step.training_step on the GPU: the pinned batch is copied in (the next of `batches`
    prefetched on a side stream, when given), then the same BCE step."""
    move = (
        Prefetcher(batches, device, ids_device)
        if batches and device.type == "cuda"
        else (lambda batch: batch_to(batch, device, ids_device))
    )
    return training_step(model, optimizers, precision, amp=lambda: gpu_autocast(precision), move=move)


def graph_mlps(model, batch, precision: str, device: torch.device, ids_device: torch.device) -> None:
    """Captures the bottom and top MLPs in CUDA graphs (forward and backward) after warm-up. Their
    inputs have static shapes at a fixed batch size; the sample inputs are made by one forward of
    the real model, under the same autocast, so the graphs see the dtypes training will feed them."""
    b = batch_to(batch, device, ids_device)
    with gpu_autocast(precision):
        with torch.no_grad():
            x = model.bottom_mlp(b.dense) if model.has_dense else None
            z = model.interaction(x, model.embeddings(b.ids))
        modules = ((model.bottom_mlp,) if model.has_dense else ()) + (model.top_mlp,)
        samples = (((b.dense,),) if model.has_dense else ()) + ((z.detach().requires_grad_(),),)
        torch.cuda.make_graphed_callables(modules, samples)
    torch.cuda.synchronize(device)
