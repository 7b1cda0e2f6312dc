"""Optimizer names, without torch: the `--optimizer` options (dlrmkit.config) take their choices
from here while the parser is built, before torch is imported."""

OPTIMIZERS = ("sgd", "adagrad", "split-sgd", "lamb")  # the dense (MLP) optimizer
EMBEDDING_OPTIMIZERS = ("sgd", "adagrad", "rowwise-adagrad")  # the tables' sparse optimizer
