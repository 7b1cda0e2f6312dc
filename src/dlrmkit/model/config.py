"""The DLRM's shape, without torch: the CLI and the presets import it without paying for torch."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ModelConfig:
    num_numerical: int
    table_sizes: list[int]
    embedding_dim: int = 16
    bottom_mlp: list[int] = field(default_factory=lambda: [64, 16])  # last size == embedding_dim
    top_mlp: list[int] = field(default_factory=lambda: [64, 1])  # last size == 1
    interaction: str = "dot"  # dot | cat
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
        if self.interaction not in ("dot", "cat"):
            raise DlrmkitError(f"unknown interaction '{self.interaction}' (choose dot or cat)")
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
