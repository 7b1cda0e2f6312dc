"""The optimizer section of `dlrmkit train`'s options: which optimizers train the MLPs and the
tables, and their rates. Unset fields fall back to the preset's (dlrmkit.config). Imports no
torch: the parser is built before a command is chosen."""

from __future__ import annotations

from dataclasses import dataclass

from dlrmkit import cli_types as ct
from dlrmkit.optim.names import EMBEDDING_OPTIMIZERS, OPTIMIZERS
from dlrmkit.options import option

# an optimizer chosen without its learning rate: the preset's LR belongs to the preset's optimizer.
# Adagrad's and LAMB's own rates, and the runs that chose them: docs/PRECISION.md, learning rates
ADAGRAD_LR = 0.05
LAMB_LR = 0.005
ADAM_LR = 0.001  # torch's and FuxiCTR's default for Adam on the dense layers


@dataclass
class OptimizerOptions:
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
        "sparse optimizer of the tables (default: sgd, or adagrad with --optimizer adagrad, adam or adamw)",
        choices=EMBEDDING_OPTIMIZERS,
    )
    lamb_lr: float | None = option(
        None,
        f"LAMB's peak LR (default {LAMB_LR}); --lr stays the tables'; the LR schedule scales both",
        parse=ct.learning_rate,
    )
    embedding_weight_decay: float | None = option(
        None, "L2 on the tables: on the rows a batch touches (adagrad tables), on every row (adam tables)", parse=ct.nonneg_float
    )
    dense_lr: float | None = option(
        None,
        f"--optimizer adam/adamw: their peak LR (default {ADAM_LR}); --lr stays the tables'",
        parse=ct.learning_rate,
    )
    dense_weight_decay: float | None = option(
        None,
        "--optimizer adamw: decoupled weight decay; adam: L2 on the MLP weights (default 0)",
        parse=ct.nonneg_float,
    )
