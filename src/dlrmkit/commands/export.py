"""Write a trained checkpoint as one file for serving: `pt` (state dict + model config, loads
into dlrmkit's DLRM), `torchscript` (traced; runs with torch alone) or `onnx`. The exported
model maps (dense float32 [B, num_numerical], ids int64 [B, tables]) to click logits [B]: the
dataset's rows as stored, so a TorchScript or ONNX model trained with --min-id-count or
--numerical-buckets folds the rare ids to 0 and appends the bucket ids itself, as the readers do,
and one trained on a multi-hot dataset reads ids [B, sum of its bag sizes] (each table's bag side
by side) and sum-pools each bag, as training did."""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass

from dlrmkit import cli_types as ct
from dlrmkit.atomic_io import atomic_path, check_not_inside, check_output_file
from dlrmkit.errors import DlrmkitError
from dlrmkit.options import add_options, option


@dataclass
class ExportOptions:
    checkpoint: str = option(help="checkpoint folder, or a checkpoint dir with 'latest'", parse=ct.path, required=True)
    out: str = option(help="file to write", parse=ct.path, required=True)
    format: str = option("pt", "file format (default {default})", choices=("pt", "torchscript", "onnx"))


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_options(p, ExportOptions)


def load_model(checkpoint: str):
    """The single-process DLRM of a checkpoint, in eval mode."""
    from dlrmkit.checkpoint.save_load import load_single_process_model
    from dlrmkit.train.blend import is_blend, read_blend

    if is_blend(checkpoint):  # several models, each reading its own view of the rows: no one graph
        folders = read_blend(checkpoint).folders
        raise DlrmkitError(
            f"{checkpoint}: a blend of {len(folders)} models; export one member's checkpoint "
            f"(for example {folders[0]}), or train with --search-budget 0 for one model"
        )
    model, cfg = load_single_process_model(checkpoint)
    return model.eval(), cfg


def example_inputs(cfg, batch: int = 4, served: bool = False):
    """Random (dense, ids) for the model; `served`: for `served_model`, without the bucket tables."""
    import torch

    g = torch.Generator().manual_seed(0)
    dense = torch.randn(batch, cfg.num_numerical, generator=g)
    own = len(cfg.table_sizes) - len(cfg.numerical_buckets or []) if served else len(cfg.table_sizes)
    hotness = cfg.hotness or [1] * len(cfg.table_sizes)  # a multi-hot model's: each table's bag side by side
    parts = [torch.randint(0, n, (batch, k), generator=g) for n, k in zip(cfg.table_sizes[:own], hotness)]
    ids = torch.cat(parts, 1) if parts else torch.zeros(batch, 0, dtype=torch.int64)  # no table of its own: bucket tables only
    return dense, ids


def served_model(model, cfg):
    """`model` reading the dataset's rows as stored (data/numerical_buckets.py `model_view`): ids
    a --min-id-count model has no row for read as 0, and one bucket id per numerical feature
    appended (--numerical-buckets: the number of its boundaries at or below the value); a
    multi-hot model's ids [B, sum of its bag sizes] sum-pooled bag by bag, as its JaggedIds are in
    training. Without any of these, the model itself."""
    import torch
    import torch.nn.functional as F

    if cfg.min_id_count <= 1 and not cfg.numerical_buckets and cfg.hotness is None:
        return model
    hotness = cfg.hotness or [1] * len(cfg.table_sizes)
    bounds = [sum(hotness[:t]) for t in range(len(hotness) + 1)]  # table t: id columns [bounds[t], bounds[t+1])

    class Served(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model
            own = len(cfg.table_sizes) - len(cfg.numerical_buckets or [])
            rows = torch.tensor(cfg.table_sizes[:own], dtype=torch.int64)
            self.register_buffer("rows", rows.repeat_interleave(torch.tensor(hotness[:own], dtype=torch.int64)))  # per id column
            if cfg.hotness is not None:  # row of each column's table in the (one) fused weight
                table = model.embeddings.tables[0]
                self.register_buffer("starts", table.row_offsets.repeat_interleave(torch.tensor(hotness, dtype=torch.int64)))
            for j, b in enumerate(cfg.numerical_buckets or []):
                self.register_buffer(f"bounds_{j}", torch.tensor(b, dtype=torch.float32))

        def forward(self, dense, ids):
            if cfg.min_id_count > 1:
                ids = torch.where(ids < self.rows, ids, torch.zeros_like(ids))
            if cfg.numerical_buckets:
                x = dense.float()
                bucket = [
                    (x[:, j : j + 1] >= getattr(self, f"bounds_{j}")).sum(1) for j in range(len(cfg.numerical_buckets))
                ]
                ids = torch.cat([ids, torch.stack(bucket, 1).to(ids.dtype)], 1)
            if cfg.hotness is None:
                return self.model(dense, ids)
            rows = F.embedding(ids + self.starts, self.model.embeddings.tables[0].weight)  # [B, ids, dim]
            pooled = [rows[:, a:b].sum(1) for a, b in zip(bounds, bounds[1:])]
            return self.model.score(dense, torch.stack(pooled, 1))

    return Served().eval()


def export(checkpoint: str, out: str, fmt: str) -> str:
    import torch

    check_not_inside(out, "--out", {"--checkpoint": checkpoint})
    check_output_file(out, "--out")
    if fmt == "onnx":
        try:
            import onnx  # noqa: F401
        except ImportError:
            raise DlrmkitError("--format onnx needs the `onnx` package (pip install 'dlrmkit[onnx]')") from None
    model, cfg = load_model(checkpoint)
    with atomic_path(out) as tmp:  # a failed write (full disk) leaves the previous file as it was
        if fmt == "pt":
            torch.save({"model_config": asdict(cfg), "model": model.state_dict()}, tmp)
        elif fmt == "torchscript":
            with torch.no_grad():
                traced = torch.jit.trace(served_model(model, cfg), example_inputs(cfg, served=True), check_trace=False)
            traced.save(tmp)
        else:
            with torch.no_grad():
                torch.onnx.export(
                    served_model(model, cfg),
                    example_inputs(cfg, served=True),
                    tmp,
                    input_names=["dense", "ids"],
                    output_names=["logits"],
                    dynamic_axes={"dense": {0: "batch"}, "ids": {0: "batch"}, "logits": {0: "batch"}},
                    dynamo=False,
                )
    return out


def run(args: argparse.Namespace) -> int:
    from dlrmkit.atomic_io import is_stdout, output_lock

    if is_stdout(args.out):
        raise DlrmkitError(f"--out {args.out}: export writes a model file; give a file name")
    check_output_file(args.out, "--out")
    with output_lock(args.out, "--out"):  # one writer per output, before any work
        path = export(args.checkpoint, args.out, args.format)
    print(f"wrote {args.format} model to {path}")
    return 0
