"""Where a single-device model runs: the device a `--device` option names, the table placement
on a GPU (tables on the device, or in host memory when they do not fit), and batches moved there.
Training, the sharded runs and the benchmarks all place models through this module."""

from __future__ import annotations

import dataclasses
from typing import Callable

import torch

from dlrmkit.data.loader import pin_batch
from dlrmkit.errors import DlrmkitError
from dlrmkit.precision import enable_tf32


def resolve_device(requested: str) -> torch.device:
    """`auto` is the GPU when there is one, else the CPU; `cuda` without a GPU is an error."""
    if requested not in ("auto", "cpu", "cuda"):
        raise DlrmkitError(f"--device must be auto, cpu or cuda, got '{requested}'")
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if requested == "cuda" and not torch.cuda.is_available():
        raise DlrmkitError("--device cuda needs a CUDA GPU; torch sees none here")
    return torch.device(requested)


def place_model(model: torch.nn.Module, device: torch.device, placement: str) -> None:
    """Moves all but the tables to `device`, and the tables too when `placement` is 'device';
    host tables hand their pooled output to the device through a forward hook. Call it before the
    optimizers are built, so their state is made where the parameters live."""
    if device.type == "cpu":
        return
    tables = model.embeddings
    if placement == "device" and not tables.uniform:
        raise DlrmkitError("--table-placement device: tables of mixed widths not yet (their ids are split on the CPU)")
    for child in model.children():
        if child is not tables:
            child.to(device)
    for name, buf in list(model.named_buffers(recurse=False)):  # its own: the numerical mean and deviation
        setattr(model, name, buf.to(device))
    if placement == "device":
        tables.to(device)
    else:
        tables.register_forward_hook(lambda module, inputs, out: out.to(device, non_blocking=True))


def pin_batches(batches: list, device: torch.device) -> list:
    """The batches in pinned host memory (page-locked), so each step's copy to the GPU can run
    without blocking; unchanged on the CPU."""
    if device.type == "cpu":
        return batches
    return [pin_batch(b) for b in batches]


def batch_to(batch, device: torch.device, ids_device: torch.device):
    """Non-blocking copies of a pinned batch: dense features and labels to `device`, ids to where
    the tables are."""
    ids = batch.ids
    if ids_device.type != "cpu":
        ids = ids.to(ids_device, non_blocking=True)  # one-hot tensor or JaggedIds
    return dataclasses.replace(
        batch,
        dense=batch.dense.to(device, non_blocking=True),
        ids=ids,
        labels=batch.labels.to(device, non_blocking=True),
    )


def table_placement(requested: str, table_bytes: int, device: torch.device | str = "cuda") -> tuple[str, str]:
    """(placement, reason). On the CPU every table lives in host memory; on a GPU, `auto` puts
    the tables on the device when they (with their optimizer state, counted in `table_bytes`) fit
    in 80% of its free memory, else in host memory; the rest is for activations and graphs."""
    if not torch.cuda.is_available() or torch.device(device).type == "cpu":
        if requested == "device":
            raise DlrmkitError("--table-placement device needs --device cuda and a CUDA GPU")
        if requested == "host":  # it would change nothing
            raise DlrmkitError("--table-placement host needs --device cuda (on the CPU every table is in host memory)")
        return "host", "no CUDA GPU in use: tables and MLPs run on the CPU"
    if requested != "auto":
        return requested, "as requested"
    free, _ = torch.cuda.mem_get_info(torch.device(device))
    if table_bytes <= 0.8 * free:
        return "device", f"tables {table_bytes / 2**30:.1f} GiB fit in the GPU's {free / 2**30:.1f} GiB free"
    return "host", f"tables {table_bytes / 2**30:.1f} GiB exceed 80% of the GPU's {free / 2**30:.1f} GiB free"


def place_tables(model: torch.nn.Module, device: torch.device, requested: str, accumulator: bool) -> tuple[str, str]:
    """--table-placement chosen (table_placement) and applied: on a GPU the model moves there
    (place_model) and TF32 is enabled. With `accumulator`, the tables' optimizer keeps
    an fp32 value per weight (Adagrad), counted with them. Call it before the optimizers are built."""
    table_bytes = sum(p.numel() * (p.element_size() + (4 if accumulator else 0)) for p in model.embeddings.parameters())
    placement = table_placement(requested, table_bytes, device)
    if device.type == "cuda":
        place_model(model, device, placement[0])
        enable_tf32(device)
    return placement


def synchronizer(device: torch.device) -> Callable[[], None] | None:
    """What the timers call before reading the clock: the GPU's queue must be drained first."""
    return (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else None


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def place_run(
    model: torch.nn.Module, device: torch.device, table_placement: str, accumulator: bool, parallel: bool
) -> tuple[torch.device, tuple[str, str] | None, Callable | None]:
    """A training run's (device, (table placement, why) or None, how a batch gets there or None):
    under torchrun (`parallel`) HybridParallel already moved the model; one process here puts the
    MLPs on the GPU and the tables there or in host memory (--table-placement, as bench does).
    `accumulator`: the tables' optimizer keeps state (Adagrad's, counted as one fp32 value a weight)."""
    if device.type == "cpu":
        if table_placement in ("device", "host"):  # host would change nothing
            raise DlrmkitError(f"--table-placement {table_placement} needs --device cuda")
        return device, None, None
    if parallel:
        if table_placement == "host":
            raise DlrmkitError("--table-placement host: single process only (under torchrun shards live on the GPUs)")
        enable_tf32(device)
        return device, None, None
    placement = place_tables(model, device, table_placement, accumulator)
    ids_device = device if placement[0] == "device" else torch.device("cpu")
    return device, placement, lambda batch: batch_to(batch, device, ids_device)
