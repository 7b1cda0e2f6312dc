"""The DLRM's shape, without torch: the CLI and the presets import it without paying for torch."""

from __future__ import annotations

import math
from dataclasses import dataclass, field


INTERACTIONS = ("dot", "cat", "dcn")
DCN_STRUCTURES = ("stacked", "parallel")
MAX_DCN_LAYERS, MAX_DCN_RANK = 64, 1 << 16
MAX_HOTNESS = 1 << 16  # ids per bag of a multi-hot feature (MLPerf DCNv2's largest: 100)


def _int_in(value, lo: int, hi: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and lo <= value <= hi


@dataclass
class ModelConfig:
    num_numerical: int
    table_sizes: list[int]
    embedding_dim: int = 16
    bottom_mlp: list[int] = field(default_factory=lambda: [64, 16])  # last size == embedding_dim
    top_mlp: list[int] = field(default_factory=lambda: [64, 1])  # last size == 1
    interaction: str = "dot"  # dot | cat | dcn
    self_interaction: bool = False
    # a first-order (wide) term, as in Wide&Deep/DeepFM: one more table column per id, summed into
    # the logit, plus a linear term on the numerical features; the model is then a logistic
    # regression plus the DLRM, which is what wins on small data (docs/RECIPES.md)
    wide: bool = False
    # numerical inputs: "none", or "signed-log" (sign(x) log(1+|x|), infinities clamped) for raw values
    numerical_transform: str = "none"
    # tables start at this fraction of the reference's +-sqrt(1/rows): small data wants quiet ids
    embedding_init_scale: float = 1.0
    # a second-order factorization-machine term (sum of the pairwise dot products of the pooled
    # embeddings, with one learned weight) added to the logit beside the wide term (model/fm.py)
    fm: bool = False
    # the deep part (MLPs and interaction): off leaves the wide and/or FM terms alone, i.e. the
    # logistic regression (wide) or factorization machine (fm) inside the model
    deep: bool = True
    dropout: float = 0.0  # after each hidden layer of both MLPs (training only)
    # the dcn interaction's cross network (DCNv2): layers, and the rank of each layer's U V
    # factorization (None: full-rank W)
    dcn_layers: int = 3
    dcn_rank: int | None = None
    # stacked: the cross network feeds the top MLP (DCNv2's stacked form, MLPerf's); parallel: the
    # top MLP's hidden layers read the same input beside it, its last layer reads both (FuxiCTR's)
    dcn_structure: str = "stacked"
    # ids seen fewer than this many times in the training rows read as id 0 (data/id_counts.py):
    # table_sizes then count the kept ids, and readers fold the others to 0
    min_id_count: int = 1
    # numerical inputs standardized after the transform: (x - mean) / std, the training rows' figures
    # (--standardize-numerical; None: as they come)
    numerical_mean: list[float] | None = None
    numerical_std: list[float] | None = None
    # --numerical-buckets: per numerical feature, the boundaries of its buckets; the last
    # len(numerical_buckets) tables are the bucket tables (data/numerical_buckets.py)
    numerical_buckets: list[list[float]] | None = None
    # a multi-hot dataset's bag size of each table (its fixed-size bags, sum-pooled; the bucket
    # tables' 1): what `export` reads, ids [B, sum of the sizes]. None: one id per table
    hotness: list[int] | None = None

    @property
    def parallel_cross(self) -> bool:
        """DCNv2's parallel structure: the top MLP's hidden layers beside the cross network."""
        return self.interaction == "dcn" and self.dcn_structure == "parallel"

    @property
    def table_dim(self) -> int:
        """Width of a table row: the embedding, plus the first-order weight with `wide`."""
        return self.embedding_dim + int(self.wide)

    def check(self) -> None:
        from dlrmkit.errors import DlrmkitError

        if self.bottom_mlp and self.bottom_mlp[-1] != self.embedding_dim:
            raise DlrmkitError(f"bottom MLP must end at the embedding dim {self.embedding_dim}, got {self.bottom_mlp}")
        if not self.top_mlp or self.top_mlp[-1] != 1:
            raise DlrmkitError(f"top MLP must end in 1 output (the logit), got {self.top_mlp}")
        if self.interaction not in INTERACTIONS:
            raise DlrmkitError(f"unknown interaction '{self.interaction}' (choose {', '.join(INTERACTIONS)})")
        if self.dcn_structure not in DCN_STRUCTURES:
            raise DlrmkitError(
                f"unknown dcn_structure {str(self.dcn_structure)[:40]!r} (choose {', '.join(DCN_STRUCTURES)})"
            )
        if not _int_in(self.dcn_layers, 1, MAX_DCN_LAYERS):
            raise DlrmkitError(f"dcn_layers must be an integer in [1, {MAX_DCN_LAYERS}], got {self.dcn_layers!r}")
        if self.dcn_rank is not None and not _int_in(self.dcn_rank, 1, MAX_DCN_RANK):
            raise DlrmkitError(f"dcn_rank must be an integer in [1, {MAX_DCN_RANK}] or unset, got {self.dcn_rank!r}")
        if not _int_in(self.min_id_count, 1, 1 << 62):
            raise DlrmkitError(f"min_id_count must be a positive integer, got {str(self.min_id_count)[:40]!r}")
        for name in ("numerical_mean", "numerical_std"):
            v = getattr(self, name)
            if v is not None and (
                not isinstance(v, list)
                or len(v) != self.num_numerical
                or not all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in v)
            ):
                raise DlrmkitError(f"{name} must be {self.num_numerical} finite numbers or unset")
        if self.numerical_std is not None and (self.numerical_mean is None or min(self.numerical_std, default=1) <= 0):
            raise DlrmkitError("numerical_std must come with numerical_mean and be > 0")
        if self.numerical_buckets is not None:
            b = self.numerical_buckets
            ok = isinstance(b, list) and len(b) == self.num_numerical and len(self.table_sizes) >= len(b)
            ok = ok and all(
                isinstance(x, list)
                and len(x) <= 4096
                and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in x)
                and all(u < v for u, v in zip(x, x[1:]))
                for x in b
            )
            if not ok or [len(x) + 1 for x in b] != list(self.table_sizes[len(self.table_sizes) - len(b) :]):
                raise DlrmkitError(
                    "numerical_buckets must hold, per numerical feature, increasing finite boundaries whose "
                    "bucket counts are the last table sizes"
                )
        h = self.hotness
        if h is not None and not (
            isinstance(h, list) and len(h) == len(self.table_sizes) and all(_int_in(k, 1, MAX_HOTNESS) for k in h)
        ):
            raise DlrmkitError(f"hotness must hold one integer in [1, {MAX_HOTNESS}] per table, or be unset")
        if self.numerical_transform not in ("none", "signed-log"):
            raise DlrmkitError(f"unknown numerical transform '{self.numerical_transform}' (choose none or signed-log)")
        if not isinstance(self.fm, bool) or not isinstance(self.deep, bool):
            raise DlrmkitError(f"fm and deep must be true or false, got {self.fm!r}, {self.deep!r}")
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, (int, float)):
            raise DlrmkitError(f"dropout must be a number, got {str(self.dropout)[:40]!r}")
        if not self.deep and not (self.wide or self.fm):
            raise DlrmkitError("a model without its deep part needs the wide or the FM term (wide: true or fm: true)")
        if not 0 <= self.dropout < 1:
            raise DlrmkitError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.num_numerical == 0 and self.bottom_mlp:
            raise DlrmkitError("a dataset without numerical features needs an empty bottom MLP")
