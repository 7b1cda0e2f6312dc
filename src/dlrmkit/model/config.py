"""The DLRM's shape, without torch: the CLI and the presets import it without paying for torch."""

from __future__ import annotations

from dataclasses import dataclass, field


INTERACTIONS = ("dot", "cat", "dcn")
MAX_DCN_LAYERS, MAX_DCN_RANK = 64, 1 << 16


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
    # the dcn interaction's cross network (DCNv2): layers, and the rank of each layer's U V
    # factorization (None: full-rank W)
    dcn_layers: int = 3
    dcn_rank: int | None = None

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
        if not _int_in(self.dcn_layers, 1, MAX_DCN_LAYERS):
            raise DlrmkitError(f"dcn_layers must be an integer in [1, {MAX_DCN_LAYERS}], got {self.dcn_layers!r}")
        if self.dcn_rank is not None and not _int_in(self.dcn_rank, 1, MAX_DCN_RANK):
            raise DlrmkitError(f"dcn_rank must be an integer in [1, {MAX_DCN_RANK}] or unset, got {self.dcn_rank!r}")
        if self.numerical_transform not in ("none", "signed-log"):
            raise DlrmkitError(f"unknown numerical transform '{self.numerical_transform}' (choose none or signed-log)")
        if self.num_numerical == 0 and self.bottom_mlp:
            raise DlrmkitError("a dataset without numerical features needs an empty bottom MLP")
