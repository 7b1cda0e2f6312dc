"""The model section of `dlrmkit train`'s options: the DLRM's shape beyond what the dataset
fixes. Unset fields fall back to the preset's (dlrmkit.config); `dlrmkit tune` searches them.
Imports no torch: the parser is built before a command is chosen."""

from __future__ import annotations

from dataclasses import dataclass

from dlrmkit import cli_types as ct
from dlrmkit.model.config import INTERACTIONS
from dlrmkit.options import option


@dataclass
class ModelOptions:
    embedding_dim: int | None = option(None, "embedding width (default: the preset's)", parse=ct.dim)
    bottom_mlp: list[int] | None = option(
        None, "bottom MLP sizes, e.g. 64,16; must end at the embedding dim", parse=ct.int_list
    )
    top_mlp: list[int] | None = option(None, "top MLP sizes, e.g. 64,32,1; must end in 1", parse=ct.int_list)
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
