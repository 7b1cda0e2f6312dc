"""The model section of `dlrmkit train`'s options: the DLRM's shape beyond what the dataset
fixes. Unset fields fall back to the preset's (dlrmkit.config); `dlrmkit tune` searches them.
Imports no torch: the parser is built before a command is chosen."""

from __future__ import annotations

from dataclasses import dataclass

from dlrmkit import cli_types as ct
from dlrmkit.model.config import DCN_STRUCTURES, INTERACTIONS, MAX_DCN_LAYERS, MAX_DCN_RANK
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
    min_id_count: int | None = option(
        None,
        "ids seen fewer than K times in the training rows share id 0 (rare/unseen); the tables keep the "
        "others (default 1: every id its own row)",
        parse=ct.positive_int,
    )
    standardize_numerical: bool | None = option(
        None,
        "standardize numerical inputs (after --numerical-transform) with the training rows' mean and "
        "deviation, kept in the model's config (true/false; default false)",
    )
    numerical_buckets: int | None = option(
        None,
        "also read each numerical feature as a category: its bucket among N quantiles of the training "
        "rows (a value held by 10 or more rows has a bucket of its own), with its own embedding row "
        "and wide weight (default 0: off)",
        parse=ct.int_range(0, 1024),
    )
    # ---- the interaction (dlrmkit.model.interaction) ----------------------------------------------
    interaction: str | None = option(
        None,
        "feature interaction: dot, cat or dcn (DCNv2's cross network) (default: the preset's)",
        choices=INTERACTIONS,
    )
    dcn_layers: int | None = option(
        None,
        "with --interaction dcn: cross layers (default: the preset's, else 3)",
        parse=ct.int_range(1, MAX_DCN_LAYERS),
    )
    dcn_rank: int | None = option(
        None,
        "with --interaction dcn: rank of each cross layer's U V (default: the preset's, else full rank)",
        parse=ct.int_range(1, MAX_DCN_RANK),
    )
    dcn_structure: str | None = option(
        None,
        "with --interaction dcn: stacked (the cross network feeds the top MLP) or parallel (the top "
        "MLP's hidden layers beside it, both read by its last layer) (default stacked)",
        choices=DCN_STRUCTURES,
    )
    # ---- model quality: the FM term, the deep part, dropout, the wide term's start ------------------
    fm: bool | None = option(
        None, "add a factorization-machine (second-order) term on the pooled embeddings to the logit (true/false)"
    )
    deep: bool | None = option(
        None, "keep the deep part (MLPs, interaction); false leaves the wide and/or FM terms (true/false)"
    )
    dropout: float | None = option(
        None, "dropout after each hidden layer of the MLPs (default 0)", parse=ct.float_range(0.0, 1.0, hi_open=True)
    )
    wide_init: str | None = option(
        None,
        "regression: start the wide term from the logistic regression (C chosen on the validation rows) "
        "and the deep part at 0, evaluated before the first step (one process; default none)",
        choices=("none", "regression"),
    )
