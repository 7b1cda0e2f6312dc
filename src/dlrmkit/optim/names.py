"""Optimizer names and choices, without torch: the `--optimizer` options (dlrmkit.config) take their choices
from here while the parser is built, before torch is imported."""

# the dense (MLP) optimizer; adam and adamw train the MLPs only, beside a sparse table optimizer
OPTIMIZERS = ("sgd", "adagrad", "split-sgd", "lamb", "adam", "adamw")
# the tables' optimizer: sparse row updates, or adam (dense over whole tables: small data)
EMBEDDING_OPTIMIZERS = ("sgd", "adagrad", "rowwise-adagrad", "adam")
ADAM_FAMILY = ("adam", "adamw")  # dense optimizers with their own learning rate (--dense-lr)


def resolve_embedding_optimizer(optimizer: str, embedding_optimizer: str | None) -> str:
    """The embedding optimizer a run uses: the dense one's sparse twin unless given (LAMB: sgd;
    Adam/AdamW: Adagrad, the sparse optimizer whose steps are normalized per weight as Adam's are)."""
    if embedding_optimizer is not None:
        return embedding_optimizer
    return {"adagrad": "adagrad", "adam": "adagrad", "adamw": "adagrad"}.get(optimizer, "sgd")


def lr_family(optimizer: str, embedding_optimizer: str | None = None) -> str:
    """Which kind of learning rate `--lr` is for this choice: "adagrad" when the tables (or the
    MLPs) train with Adagrad, whose steps are normalized, else "sgd" (LAMB's own rate is --lamb-lr,
    Adam's --dense-lr)."""
    tables = resolve_embedding_optimizer(optimizer, embedding_optimizer)
    if tables == "adam":
        return "adam"
    return "adagrad" if optimizer == "adagrad" or tables in ("adagrad", "rowwise-adagrad") else "sgd"
