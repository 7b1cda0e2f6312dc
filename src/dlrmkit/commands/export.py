"""Write a trained checkpoint as one file for serving: `pt` (state dict + model config, loads
into dlrmkit's DLRM), `torchscript` (traced; runs with torch alone) or `onnx`. The exported
model maps (dense float32 [B, num_numerical], ids int64 [B, tables]) to click logits [B]."""

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


def example_inputs(cfg, batch: int = 4):
    import torch

    g = torch.Generator().manual_seed(0)
    dense = torch.randn(batch, cfg.num_numerical, generator=g)
    ids = torch.stack([torch.randint(0, n, (batch,), generator=g) for n in cfg.table_sizes], dim=1)
    return dense, ids


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
                traced = torch.jit.trace(model, example_inputs(cfg), check_trace=False)
            traced.save(tmp)
        else:
            with torch.no_grad():
                torch.onnx.export(
                    model,
                    example_inputs(cfg),
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
