"""Dataclass configs and named presets. A preset fixes the model shape and a training recipe;
the table sizes always come from the dataset (or from the benchmark's own shape)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from dlrmkit import cli_types as ct
from dlrmkit.errors import DlrmkitError
from dlrmkit.model.config import INTERACTIONS, ModelConfig
from dlrmkit.optim.names import EMBEDDING_OPTIMIZERS, OPTIMIZERS, lr_family, resolve_embedding_optimizer
from dlrmkit.options import option


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
    # MLPerf Training v3.0+ DLRM-DCNv2 (mlcommons/training recommendation_v2/torchrec_dlrm, docs/MLPERF.md):
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


# an optimizer chosen without its learning rate: the preset's LR belongs to the preset's optimizer.
# On `synth --preset small`, one epoch: Adagrad (MLPs and tables) at tiny's SGD 1.0 stayed at AUC
# 0.50, at 0.05 (the small-data recipe's) 0.726; SGD MLPs with Adagrad or row-wise Adagrad tables at
# 1.0: 0.504 / 0.509, at 0.05: 0.718 / 0.719. LAMB's own peak LR: 0.005 (docs/PRECISION.md; at batch
# 256 there 0.002 and 0.01 came within 0.003 AUC, 0.05 stuck at 0.50, and tiny's 1.0 gave a NaN loss)
ADAGRAD_LR = 0.05
LAMB_LR = 0.005


def own_lr(optimizer: str | None, embedding_optimizer: str | None, preset: "Preset") -> float | None:
    """The LR for optimizers chosen without --lr whose kind of LR (optim.names.lr_family) is not the
    preset's; None where the preset's LR fits."""
    chosen = lr_family(optimizer or preset.optimizer, embedding_optimizer)
    return ADAGRAD_LR if chosen == "adagrad" and lr_family(preset.optimizer) != "adagrad" else None


AUTO = "auto"  # `train`'s default: a recipe chosen from the dataset (dlrmkit.train.recipe)
# the sharding strategies `--sharding` offers (dlrmkit.parallel.sharding, which imports torch)
SHARDINGS = ("auto", "table_wise", "column_wise", "row_wise", "data_parallel")
# process-group backends torch.distributed ships (dlrmkit.parallel.dist checks the device pairing)
BACKENDS = ("gloo", "nccl", "mpi", "ucc")


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


# TrainConfig fields a preset (or the recipe `auto` picks) fills when the command line leaves them unset
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
    """Everything `dlrmkit train` needs, and the one definition of its options: each field's
    `option(...)` gives its flag, help, validator and choices (dlrmkit.options builds the parser
    and checks `--config` files from them). Unset recipe fields fall back to the preset's."""

    data: str = option(help="dataset folder holding feature_spec.yaml (required, here or in --config)", parse=ct.path)
    preset: str = option(
        AUTO,
        f"model shape and recipe: {AUTO}, {', '.join(PRESETS)} (default {AUTO}: chosen from "
        "the dataset's size and printed; docs/RECIPES.md)",
    )  # in code, auto resolves as tiny
    batch_size: int | None = option(None, "global batch size (default: the preset's)", parse=ct.batch_size)
    epochs: int | None = option(
        None, "passes over the train mapping (default: the preset's)", parse=ct.positive_int, group="length"
    )
    max_steps: int | None = option(None, "stop after this many steps instead", parse=ct.positive_int, group="length")
    lr: float | None = option(
        None,
        f"learning rate (default: the preset's, or {ADAGRAD_LR} for Adagrad MLPs or tables on an SGD preset)",
        parse=ct.learning_rate,
    )
    optimizer: str | None = option(
        None,
        "dense (MLP) optimizer; split-sgd also updates the tables and needs --precision bf16 (default: the preset's)",
        choices=OPTIMIZERS,
    )
    embedding_optimizer: str | None = option(
        None,
        "sparse optimizer of the tables (default: sgd, or adagrad with --optimizer adagrad)",
        choices=EMBEDDING_OPTIMIZERS,
    )
    lamb_lr: float | None = option(
        None,
        f"LAMB's peak LR (default {LAMB_LR}); --lr stays the tables'; the LR schedule scales both",
        parse=ct.learning_rate,
    )
    precision: str = option(
        "fp32",
        "autocast precision: bf16 on CPU/GPU; fp16 not yet (its loss scaling does not reach the tables) (default fp32)",
        choices=("fp32", "bf16", "fp16"),
    )
    comm_dtype: str = option(
        "fp32",
        "under torchrun: send all-to-all payloads and gradient all-reduces in this dtype (default fp32; "
        "fp32 sums of ranks on one host go through shared memory, bf16 ones through gloo)",
        choices=("fp32", "bf16"),
    )
    warmup_steps: int | None = option(None, "linear LR warm-up steps (0: none)", parse=ct.nonneg_int)
    decay_start: int | None = option(None, "step where polynomial LR decay starts (0: no decay)", parse=ct.nonneg_int)
    decay_steps: int | None = option(None, "steps of polynomial (power 2) decay to 0", parse=ct.nonneg_int)
    eval_every: int = option(
        0, "evaluate on the validation rows every N steps (default: each epoch end)", parse=ct.nonneg_int
    )
    # model selection (dlrmkit.train.selection): validation rows, early stop, best weights
    val_fraction: float | None = option(
        None,
        "hold out the last F of the train mapping for model selection (default: "
        "the dataset's val mapping, else 0.1 of the train rows, at most 1M; 0: none, not even the val mapping)",
        parse=ct.float_range(0.0, 1.0, hi_open=True),
    )
    patience: int | None = option(
        None, "stop after N evaluations without a better validation AUC (0: never)", parse=ct.nonneg_int
    )
    restore_best: bool | None = option(None, "end with the weights of the best validation AUC (true/false)")
    embedding_weight_decay: float | None = option(
        None, "L2 on the table rows a batch touches (Adagrad tables)", parse=ct.nonneg_float
    )
    wide: bool | None = option(
        None, "add a first-order term per id and numerical feature (Wide&Deep-style) (true/false)"
    )
    embedding_init_scale: float | None = option(
        None,
        "tables start at this fraction of the usual uniform +-sqrt(1/rows) init (default 1)",
        parse=ct.positive_float,
    )
    numerical_transform: str | None = option(
        None,
        "applied by the model to numerical inputs (signed-log: sign(x) log(1+|x|), for raw values)",
        choices=("none", "signed-log"),
    )
    eval_batch_size: int = option(16384, "batch size for evaluation (default 16384)", parse=ct.batch_size)
    target_auc: float | None = option(None, "stop as soon as a validation AUC reaches this", parse=ct.auc)
    checkpoint_dir: str | None = option(
        None,
        "write checkpoints (and log.jsonl) here; a folder holding another run's "
        "checkpoints or log needs --resume (default: <run folder>/checkpoints)",
        parse=ct.path,
    )
    checkpoint_every: int = option(0, "also checkpoint every N steps (default: only at the end)", parse=ct.nonneg_int)
    checkpoint_every_seconds: float = option(
        0.0, "also checkpoint when this many seconds passed since the last one (default: off)", parse=ct.seconds
    )
    collective_timeout: float = option(
        1800.0,
        "under torchrun: seconds a collective may wait for a peer before the job fails (default 1800)",
        parse=ct.timeout,
    )
    keep_checkpoints: int = option(
        2,
        "checkpoints kept in --checkpoint-dir: the one 'latest' names and the newest others (default 2)",
        parse=ct.positive_int,
        flag="--keep",
    )
    final_checkpoint: bool = option(
        True,
        "do not save a checkpoint when training ends (default: save one into "
        "--checkpoint-dir, else <run folder>/checkpoints, in one process and under "
        "torchrun alike)",
        flag="--no-final-checkpoint",
        negate=True,
    )
    skip_nonfinite: int = option(
        0,
        "skip up to N batches whose loss is NaN/Inf (counted in the log) before stopping (default 0)",
        parse=ct.nonneg_int,
    )
    resume: bool = option(
        False,
        "continue from the latest checkpoint in --checkpoint-dir (needed, or the --run-dir of the run "
        "to continue), or start fresh when there is none; stderr says which",
    )
    metrics_json: str | None = option(None, "write the final metrics as one JSON object to this file", parse=ct.path)
    log_jsonl: str | None = option(
        None,
        "JSON-lines log of steps and evaluations (default: log.jsonl in --checkpoint-dir, else in the run "
        "folder); without --resume, a file holding another run's log is refused",
        parse=ct.path,
    )
    seed: int = option(0, "seed of initialization and batch order (default 0)", parse=ct.seed)
    shuffle: bool = option(True, "read batches in file order", flag="--no-shuffle", negate=True)
    threads: int = option(0, "intra-op threads (default: torch's choice)", parse=ct.threads)
    progress: bool = option(True, "no progress bar", flag="--no-progress", negate=True)
    run_dir: str | None = option(
        None, "run folder: config.yaml, plan.json, log.jsonl, checkpoints/ (default runs/<timestamp>)", parse=ct.path
    )
    tensorboard: str | None = option(
        None, "at the end, also write the run's scalars as TensorBoard events into DIR", metavar="DIR", parse=ct.path
    )
    log_every: int = option(50, "steps between train-loss records in the log (default 50)", parse=ct.positive_int)
    # model shape overrides (default: the preset's); `dlrmkit tune` searches them
    embedding_dim: int | None = option(None, "embedding width (default: the preset's)", parse=ct.dim)
    bottom_mlp: list[int] | None = option(
        None, "bottom MLP sizes, e.g. 64,16; must end at the embedding dim", parse=ct.int_list
    )
    top_mlp: list[int] | None = option(None, "top MLP sizes, e.g. 64,32,1; must end in 1", parse=ct.int_list)
    device: str = option(
        "cpu",
        "where to train: cpu, cuda (under torchrun GPU LOCAL_RANK, with NCCL) or auto "
        "(the GPU if torch sees one) (default cpu)",
        choices=("cpu", "cuda", "auto"),
    )
    table_placement: str = option(
        "auto",
        "one process on a GPU: tables on the GPU, in host memory (looked up "
        "there), or auto (the GPU when they fit in 80%% of its free memory) (default auto)",
        choices=("auto", "device", "host"),
    )
    # torchrun (dlrmkit.parallel): how tables are sharded and batches read
    sharding: str = option(
        "auto",
        "under torchrun: how tables are sharded (default auto: the planner decides; on CPU it replicates "
        "every table that fits at up to 256 samples per rank)",
        choices=SHARDINGS,
    )
    plan: str | None = option(
        None, "under torchrun: a sharding plan JSON (from `dlrmkit plan --json`) to obey", parse=ct.small_file
    )
    loader: str = option(
        "exchange",
        "under torchrun: how ranks read batches (default exchange)",
        choices=("exchange", "own-features", "broadcast"),
    )
    backend: str | None = option(
        None,
        "under torchrun: process-group backend (default nccl with --device cuda, else gloo)",
        choices=BACKENDS,
    )
    bind_cores: bool = option(
        True,
        "under torchrun on CPU: leave ranks unbound (default: each rank, with its "
        "collective threads, on its own share of the cores, when there are enough)",
        flag="--no-bind-cores",
        negate=True,
    )

    # ---- the interaction (dlrmkit.model.interaction) ----------------------------------------------
    interaction: str | None = option(
        None,
        "feature interaction: dot, cat or dcn (DCNv2's cross network) (default: the preset's)",
        choices=INTERACTIONS,
    )
    dcn_layers: int | None = option(
        None, "with --interaction dcn: cross layers (default: the preset's, else 3)", parse=ct.positive_int
    )
    dcn_rank: int | None = option(
        None,
        "with --interaction dcn: rank of each cross layer's U V (default: the preset's, else full rank)",
        parse=ct.positive_int,
    )
    evals_per_epoch: int | None = option(
        None,
        "evaluate on the validation rows N times per epoch, unless --eval-every is given (default: the preset's; "
        "mlperf-dcnv2: 20, every 0.05 epoch)",
        parse=ct.nonneg_int,
    )

    def resolved(self) -> "TrainConfig":
        """A copy with every recipe field filled from the preset."""
        p = get_preset(self.preset)
        out = TrainConfig(**asdict(self))
        if out.lr is None:
            out.lr = own_lr(out.optimizer, out.embedding_optimizer, p)
        for name in RECIPE_FIELDS:
            if getattr(out, name) is None:
                setattr(out, name, getattr(p, name))
        if out.optimizer == "lamb" and out.lamb_lr is None:
            out.lamb_lr = LAMB_LR
        if out.batch_size is not None and out.batch_size <= 0:
            raise DlrmkitError(f"--batch-size must be positive, got {out.batch_size}")
        from dlrmkit.optim.build import check_choice
        from dlrmkit.precision import check_precision

        if out.precision == "fp16":  # on every device: CUDA too
            raise DlrmkitError(
                "--precision fp16 is not in `train` yet (its loss scaling does not reach the tables' "
                "deferred gradients); use --precision bf16 (CPU and GPU)"
            )
        if out.table_placement not in ("auto", "device", "host"):
            raise DlrmkitError(f"--table-placement must be auto, device or host, got '{out.table_placement}'")
        check_precision(out.precision, "cpu")
        check_choice(out.optimizer, out.embedding_optimizer, out.precision)
        return out

    def model_preset(self) -> Preset:
        """The preset with this config's model-shape overrides applied."""
        p = get_preset(self.preset)
        return replace(
            p,
            **{
                k: getattr(self, k)
                for k in ("embedding_dim", "bottom_mlp", "top_mlp", "interaction", "dcn_layers", "dcn_rank")
                if getattr(self, k) is not None
            },
        )


def resolve_run(cfg: TrainConfig, cardinalities: list[int], num_numerical: int) -> tuple[TrainConfig, ModelConfig]:
    """The resolved config and the model `dlrmkit train` builds for a dataset with these tables.
    `train` and `plan --data` both call this, so the plan shows the run train would make."""
    resolved = cfg.resolved()
    model = replace(
        model_config(resolved.model_preset(), num_numerical, cardinalities),
        wide=bool(resolved.wide),
        numerical_transform=resolved.numerical_transform or "none",
        embedding_init_scale=resolved.embedding_init_scale if resolved.embedding_init_scale is not None else 1.0,
    )
    return resolved, model


def table_state_per_weight(cfg: TrainConfig) -> float:
    """Optimizer values the tables keep per weight value, for memory plans: Adagrad one per
    weight, row-wise Adagrad one per row, SGD and split-SGD none (split-SGD's bf16 weight plus
    int16 bottom half make the 4 bytes of an fp32 weight)."""
    emb = resolve_embedding_optimizer(cfg.optimizer, cfg.embedding_optimizer)
    dim = cfg.embedding_dim or get_preset(cfg.preset).embedding_dim
    return {"adagrad": 1.0, "rowwise-adagrad": 1.0 / dim}.get(emb, 0.0)
