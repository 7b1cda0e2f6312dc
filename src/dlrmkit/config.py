"""Dataclass configs and named presets. A preset fixes the model shape and a training recipe;
the table sizes always come from the dataset (or from the benchmark's own shape)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from dlrmkit.errors import DlrmkitError
from dlrmkit.model.config import ModelConfig


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


PRESETS: dict[str, Preset] = {
    # trains in seconds on the `tiny` synthetic dataset
    "tiny": Preset(16, [64, 16], [64, 32, 1], batch_size=256, lr=1.0, optimizer="sgd", epochs=6),
    # the DLRM reference's Criteo Kaggle shape (facebookresearch/dlrm, dlrm_s_criteo_kaggle.sh)
    "small": Preset(16, [512, 256, 64, 16], [512, 256, 1], batch_size=512, lr=0.1, optimizer="adagrad", epochs=1),
    "criteo-kaggle": Preset(16, [512, 256, 64, 16], [512, 256, 1], batch_size=128, lr=0.1, optimizer="sgd", epochs=1),
    # MLPerf DLRM v1 shape; recipe of the reference at global batch 64K (SGD, warm-up, poly decay)
    "mlperf": Preset(
        128, [512, 256, 128], [1024, 1024, 512, 256, 1], batch_size=65536, lr=24.0, optimizer="sgd",
        epochs=1, warmup_steps=2750, decay_start=49315, decay_steps=27772,
    ),
}


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
    )


@dataclass
class TrainConfig:
    """Everything `dlrmkit train` needs; unset fields fall back to the preset's recipe."""

    data: str
    preset: str = "tiny"
    batch_size: int | None = None
    epochs: int | None = None
    max_steps: int | None = None
    lr: float | None = None
    optimizer: str | None = None  # sgd | adagrad | split-sgd | lamb (dense part)
    embedding_optimizer: str | None = None  # sgd | adagrad | rowwise-adagrad (default: the dense one's twin)
    lamb_lr: float | None = None  # LAMB's peak LR when it differs from the embeddings' --lr
    precision: str = "fp32"  # fp32 | bf16 | fp16 (autocast; fp16 on CUDA only)
    comm_dtype: str = "fp32"  # fp32 | bf16: wire format of all-to-alls and gradient all-reduces under torchrun
    warmup_steps: int | None = None
    decay_start: int | None = None
    decay_steps: int | None = None
    eval_every: int = 0  # steps; 0: only at the end of each epoch
    eval_batch_size: int = 16384
    target_auc: float | None = None
    checkpoint_dir: str | None = None
    checkpoint_every: int = 0  # steps; 0: at the end only
    resume: bool = False
    metrics_json: str | None = None
    log_jsonl: str | None = None
    seed: int = 0
    shuffle: bool = True
    progress: bool = True
    threads: int = 0  # 0: torch's default
    keep_checkpoints: int = 2  # newest checkpoints kept in checkpoint_dir
    final_checkpoint: bool = True  # save a checkpoint when training ends (into checkpoint_dir)
    checkpoint_every_seconds: float = 0.0  # also checkpoint when this much time passed (0: off)
    skip_nonfinite: int = 0  # batches with NaN/Inf loss skipped before stopping
    collective_timeout: float = 1800.0  # torchrun: seconds before a stuck collective fails
    log_every: int = 50  # steps between "train" records of the JSON-lines log
    embedding_dim: int | None = None  # model shape overrides (default: the preset's); `dlrmkit tune` searches them
    bottom_mlp: list[int] | None = None
    top_mlp: list[int] | None = None
    sharding: str = "auto"  # torchrun: auto | table_wise | column_wise | row_wise | data_parallel
    plan: str | None = None  # torchrun: a saved ShardingPlan JSON to obey
    loader: str = "exchange"  # torchrun: exchange | own-features | broadcast
    backend: str | None = None  # torchrun: gloo | nccl | mpi (default: nccl with --device cuda, else gloo)
    device: str = "cpu"  # cpu | cuda | auto (the GPU if there is one); under torchrun GPU LOCAL_RANK
    table_placement: str = "auto"  # one process on a GPU: auto | device | host (tables in host memory)
    # model selection (dlrmkit.train.selection): validation rows, early stop, best weights
    val_fraction: float | None = None  # None: the val mapping, else the last 10% of train (<= 1M rows); 0: none
    patience: int | None = None  # stop after this many evaluations without a better val AUC (0/None: never)
    restore_best: bool | None = None  # end with the weights of the best val AUC
    embedding_weight_decay: float | None = None  # lazy L2 on touched table rows (Adagrad tables)
    wide: bool | None = None  # first-order term per id and numerical feature (model.config.ModelConfig.wide)
    numerical_transform: str | None = None  # none | signed-log, applied by the model to numerical inputs
    embedding_init_scale: float | None = None  # tables start at this fraction of the usual init (default 1)

    def resolved(self) -> "TrainConfig":
        """A copy with every recipe field filled from the preset."""
        p = get_preset(self.preset)
        out = TrainConfig(**asdict(self))
        for name in ("batch_size", "epochs", "lr", "optimizer", "warmup_steps", "decay_start", "decay_steps",
                     "embedding_dim", "bottom_mlp", "top_mlp"):
            if getattr(out, name) is None:
                setattr(out, name, getattr(p, name))
        if out.batch_size is not None and out.batch_size <= 0:
            raise DlrmkitError(f"--batch-size must be positive, got {out.batch_size}")
        from dlrmkit.optim.build import check_choice
        from dlrmkit.precision import check_precision

        if out.precision == "fp16" and out.device != "cpu":
            raise DlrmkitError("--precision fp16 is not in `train` yet (its loss scaling does not reach the tables' "
                               "deferred gradients); use --precision bf16 on the GPU")
        if out.table_placement not in ("auto", "device", "host"):
            raise DlrmkitError(f"--table-placement must be auto, device or host, got '{out.table_placement}'")
        check_precision(out.precision, "cpu")
        check_choice(out.optimizer, out.embedding_optimizer, out.precision)
        return out

    def model_preset(self) -> Preset:
        """The preset with this config's model-shape overrides applied."""
        p = get_preset(self.preset)
        return replace(p, **{k: getattr(self, k) for k in ("embedding_dim", "bottom_mlp", "top_mlp")
                             if getattr(self, k) is not None})


def resolve_run(cfg: TrainConfig, cardinalities: list[int], num_numerical: int) -> tuple[TrainConfig, ModelConfig]:
    """The resolved config and the model `dlrmkit train` builds for a dataset with these tables.
    `train` and `plan --data` both call this, so the plan shows the run train would make."""
    resolved = cfg.resolved()
    model = replace(
        model_config(resolved.model_preset(), num_numerical, cardinalities),
        wide=bool(resolved.wide), numerical_transform=resolved.numerical_transform or "none",
        embedding_init_scale=resolved.embedding_init_scale if resolved.embedding_init_scale is not None else 1.0,
    )
    return resolved, model


def table_state_per_weight(cfg: TrainConfig) -> float:
    """Optimizer values the tables keep per weight value, for memory plans: Adagrad one per
    weight, row-wise Adagrad one per row, SGD and split-SGD none (split-SGD's bf16 weight plus
    int16 bottom half make the 4 bytes of an fp32 weight)."""
    from dlrmkit.optim.build import resolve_embedding_optimizer

    emb = resolve_embedding_optimizer(cfg.optimizer, cfg.embedding_optimizer)
    dim = cfg.embedding_dim or get_preset(cfg.preset).embedding_dim
    return {"adagrad": 1.0, "rowwise-adagrad": 1.0 / dim}.get(emb, 0.0)
