"""Dataclass configs and named presets. A preset fixes the model shape and a training recipe;
the table sizes always come from the dataset (or from the benchmark's own shape)."""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace
from typing import Any

from dlrmkit import cli_types as ct
from dlrmkit.device_options import TABLE_PLACEMENTS, DeviceOptions
from dlrmkit.errors import DlrmkitError
from dlrmkit.model.config import ModelConfig
from dlrmkit.model.options import ModelOptions
from dlrmkit.optim.names import ADAM_FAMILY, lr_family, resolve_embedding_optimizer
from dlrmkit.optim.options import ADAGRAD_LR, ADAM_LR, LAMB_LR, OptimizerOptions
from dlrmkit.options import build, option, section, spec_map
from dlrmkit.parallel.options import ParallelOptions
from dlrmkit.train.options import CheckpointOptions, OutputOptions, ScheduleOptions, SelectionOptions


@dataclass
class Preset:
    """Model shape plus the training recipe that goes with it."""

    embedding_dim: int
    bottom_mlp: list[int]
    top_mlp: list[int]
    batch_size: int
    lr: float
    optimizer: str = "sgd"
    epochs: int = 1
    warmup_steps: int = 0
    decay_start: int = 0  # 0: no decay
    decay_steps: int = 0
    interaction: str = "dot"
    # the dcn interaction's cross network: layers and rank (None: full rank)
    dcn_layers: int = 3
    dcn_rank: int | None = None
    evals_per_epoch: int = 0  # 0: evaluate at each epoch end (or every --eval-every steps)


PRESETS: dict[str, Preset] = {
    # trains in seconds on the `tiny` synthetic dataset
    "tiny": Preset(16, [64, 16], [64, 32, 1], batch_size=256, lr=1.0, optimizer="sgd", epochs=6),
    # the DLRM reference's Criteo Kaggle shape (facebookresearch/dlrm, dlrm_s_criteo_kaggle.sh)
    "small": Preset(16, [512, 256, 64, 16], [512, 256, 1], batch_size=512, lr=0.1, optimizer="adagrad", epochs=1),
    "criteo-kaggle": Preset(16, [512, 256, 64, 16], [512, 256, 1], batch_size=128, lr=0.1, optimizer="sgd", epochs=1),
    # MLPerf DLRM v1 shape; recipe of the reference at global batch 64K (SGD, warm-up, poly decay)
    "mlperf": Preset(
        128,
        [512, 256, 128],
        [1024, 1024, 512, 256, 1],
        batch_size=65536,
        lr=24.0,
        optimizer="sgd",
        epochs=1,
        warmup_steps=2750,
        decay_start=49315,
        decay_steps=27772,
    ),
    # MLPerf Training v3.0+ DLRM-DCNv2 (mlcommons/training recommendation_v2/torchrec_dlrm, docs/RECIPES.md):
    # multi-hot Criteo 1TB, a 3-layer rank-512 cross network, Adagrad at 0.005 with no warm-up or
    # decay, global batch 65,536, evaluated every 0.05 epoch; target AUC 0.80275
    "mlperf-dcnv2": Preset(
        128,
        [512, 256, 128],
        [1024, 1024, 512, 256, 1],
        batch_size=65536,
        lr=0.005,
        optimizer="adagrad",
        epochs=1,
        interaction="dcn",
        dcn_layers=3,
        dcn_rank=512,
        evals_per_epoch=20,
    ),
}
MLPERF_DCNV2_TARGET_AUC = 0.80275


def own_lr(optimizer: str | None, embedding_optimizer: str | None, preset: "Preset") -> float | None:
    """The LR for optimizers chosen without --lr whose kind of LR (optim.names.lr_family) is not the
    preset's; None where the preset's LR fits."""
    chosen = lr_family(optimizer or preset.optimizer, embedding_optimizer)
    if chosen == "adam":
        return ADAM_LR
    return ADAGRAD_LR if chosen == "adagrad" and lr_family(preset.optimizer) != "adagrad" else None


AUTO = "auto"  # `train`'s default: a recipe chosen from the dataset (dlrmkit.train.recipe)


def get_preset(name: str) -> Preset:
    """A named preset; "auto" falls back to `tiny` for whatever the chosen recipe leaves open."""
    if name == AUTO:
        return PRESETS["tiny"]
    if name not in PRESETS:
        raise DlrmkitError(f"unknown preset '{name}' (choose from: {AUTO}, {', '.join(PRESETS)})")
    return PRESETS[name]


def model_config(preset: Preset, num_numerical: int, table_sizes: list[int]) -> ModelConfig:
    return ModelConfig(
        num_numerical=num_numerical,
        table_sizes=list(table_sizes),
        embedding_dim=preset.embedding_dim,
        bottom_mlp=list(preset.bottom_mlp) if num_numerical else [],
        top_mlp=list(preset.top_mlp),
        interaction=preset.interaction,
        dcn_layers=preset.dcn_layers,
        dcn_rank=preset.dcn_rank,
    )


# TrainConfig options (flat names) a preset (or the recipe `auto` picks) fills when the command line leaves them unset
RECIPE_FIELDS = (
    "batch_size",
    "epochs",
    "lr",
    "optimizer",
    "warmup_steps",
    "decay_start",
    "decay_steps",
    "embedding_dim",
    "bottom_mlp",
    "top_mlp",
    # the interaction's block
    "interaction",
    "dcn_layers",
    "dcn_rank",
    "evals_per_epoch",
)


@dataclass
class TrainConfig:
    """Everything `dlrmkit train` needs, and the one definition of its options: a few of its own
    and one section per component (model, optimizer, schedule, selection, checkpoint, output,
    device, parallel), each a dataclass of `option(...)` fields giving flag, help, validator and
    choices (dlrmkit.options builds the parser and checks `--config` files from them). Unset
    recipe fields fall back to the preset's. `TrainConfig.of(batch_size=...)` builds one from
    flat option names."""

    data: str = option(help="dataset folder holding feature_spec.yaml (required, here or in --config)", parse=ct.path)
    preset: str = option(
        AUTO,
        f"model shape and recipe: {AUTO}, {', '.join(PRESETS)} (default {AUTO}: chosen from "
        "the dataset's size and printed; docs/RECIPES.md)",
    )  # in code, auto resolves as tiny
    seed: int = option(0, "seed of initialization and batch order (default {default})", parse=ct.seed)
    shuffle: bool = option(True, "read batches in file order", flag="--no-shuffle", negate=True)
    model: ModelOptions = section(ModelOptions)
    optimizer: OptimizerOptions = section(OptimizerOptions)
    schedule: ScheduleOptions = section(ScheduleOptions)
    selection: SelectionOptions = section(SelectionOptions)
    checkpoint: CheckpointOptions = section(CheckpointOptions)
    output: OutputOptions = section(OutputOptions)
    device: DeviceOptions = section(DeviceOptions)
    parallel: ParallelOptions = section(ParallelOptions)

    @classmethod
    def of(cls, **values: Any) -> "TrainConfig":
        """A config from flat option names (`TrainConfig.of(data=..., batch_size=64)`)."""
        return build(cls, values)

    def resolved(self) -> "TrainConfig":
        """A copy with every recipe field filled from the preset."""
        p = get_preset(self.preset)
        out = copy.deepcopy(self)
        opt = out.optimizer
        if opt.lr is None:
            opt.lr = own_lr(opt.optimizer, opt.embedding_optimizer, p)
        by_name = spec_map(TrainConfig)
        for name in RECIPE_FIELDS:
            if by_name[name].get(out) is None:
                by_name[name].set(out, getattr(p, name))
        if opt.optimizer == "lamb" and opt.lamb_lr is None:
            opt.lamb_lr = LAMB_LR
        if opt.optimizer in ADAM_FAMILY and opt.dense_lr is None:
            opt.dense_lr = ADAM_LR
        batch = out.schedule.batch_size
        if batch is not None and batch <= 0:
            raise DlrmkitError(f"--batch-size must be positive, got {batch}")
        from dlrmkit.optim.build import check_choice
        from dlrmkit.precision import check_precision

        dev = out.device
        if dev.table_placement not in TABLE_PLACEMENTS:
            raise DlrmkitError(f"--table-placement must be auto, device or host, got '{dev.table_placement}'")
        check_precision(dev.precision)
        check_choice(opt.optimizer, opt.embedding_optimizer, dev.precision)
        return out

    def model_preset(self) -> Preset:
        """The preset with this config's model-shape overrides applied."""
        p = get_preset(self.preset)
        m = self.model
        shape = {"embedding_dim": m.embedding_dim, "bottom_mlp": m.bottom_mlp, "top_mlp": m.top_mlp}
        shape.update(interaction=m.interaction, dcn_layers=m.dcn_layers, dcn_rank=m.dcn_rank)
        return replace(p, **{k: v for k, v in shape.items() if v is not None})


def resolve_run(cfg: TrainConfig, cardinalities: list[int], num_numerical: int) -> tuple[TrainConfig, ModelConfig]:
    """The resolved config and the model `dlrmkit train` builds for a dataset with these tables.
    `train` and `plan --data` both call this, so the plan shows the run train would make."""
    resolved = cfg.resolved()
    m = resolved.model
    model = replace(
        model_config(resolved.model_preset(), num_numerical, cardinalities),
        wide=bool(m.wide),
        numerical_transform=m.numerical_transform or "none",
        embedding_init_scale=m.embedding_init_scale if m.embedding_init_scale is not None else 1.0,
        fm=bool(m.fm),
        dcn_structure=m.dcn_structure or "stacked",
        deep=m.deep is not False,
        dropout=m.dropout or 0.0,
        min_id_count=m.min_id_count or 1,
    )
    return resolved, model


def table_state_per_weight(cfg: TrainConfig) -> float:
    """Optimizer values the tables keep per weight value, for memory plans: Adagrad one per
    weight, row-wise Adagrad one per row, SGD and split-SGD none (split-SGD's bf16 weight plus
    int16 bottom half make the 4 bytes of an fp32 weight)."""
    emb = resolve_embedding_optimizer(cfg.optimizer.optimizer, cfg.optimizer.embedding_optimizer)
    dim = cfg.model.embedding_dim or get_preset(cfg.preset).embedding_dim
    return {"adagrad": 1.0, "rowwise-adagrad": 1.0 / dim}.get(emb, 0.0)


def table_state_per_row(cfg: TrainConfig) -> bool:
    """Whether the tables' optimizer keeps one value per row (row-wise Adagrad): a table cut into
    column slices would keep one per slice and update unlike one process."""
    return resolve_embedding_optimizer(cfg.optimizer.optimizer, cfg.optimizer.embedding_optimizer) == "rowwise-adagrad"
