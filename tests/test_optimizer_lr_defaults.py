"""An optimizer chosen without its learning rate never inherits another optimizer's: the preset's
LR belongs to the preset's optimizer (Adagrad at tiny's SGD 1.0 does not learn), LAMB has a peak
LR of its own, and the recipe shows the LR it filled in."""

from __future__ import annotations

import pytest

from dlrmkit.config import TrainConfig
from dlrmkit.optim.options import ADAGRAD_LR, LAMB_LR, OptimizerOptions
from dlrmkit.train import recipe


@pytest.mark.parametrize(
    "preset, optimizer, embedding_optimizer, lr, want",
    [
        ("tiny", "adagrad", None, None, ADAGRAD_LR),  # tiny is SGD 1.0
        ("tiny", "adagrad", None, 0.3, 0.3),  # a given LR always wins
        ("tiny", None, "rowwise-adagrad", None, ADAGRAD_LR),  # Adagrad tables under SGD MLPs
        ("tiny", "lamb", "adagrad", None, ADAGRAD_LR),
        ("small", "adagrad", None, None, 0.1),  # small is Adagrad: its own LR
        ("small", None, "rowwise-adagrad", None, 0.1),
        ("tiny", "sgd", None, None, 1.0),
        ("tiny", "lamb", None, None, 1.0),  # LAMB's tables are SGD; its own rate is --lamb-lr
        ("criteo-kaggle", None, None, None, 0.1),
    ],
)
def test_lr_belongs_to_the_optimizer(preset, optimizer, embedding_optimizer, lr, want):
    opt = OptimizerOptions(optimizer=optimizer, embedding_optimizer=embedding_optimizer, lr=lr)
    cfg = TrainConfig(data="d", preset=preset, optimizer=opt).resolved()
    assert cfg.optimizer.lr == want


def test_lamb_has_its_own_peak_lr():
    def lamb_lr(**kw):
        return TrainConfig(data="d", optimizer=OptimizerOptions(**kw)).resolved().optimizer.lamb_lr

    assert lamb_lr(optimizer="lamb") == LAMB_LR
    assert lamb_lr(optimizer="lamb", lamb_lr=0.002) == 0.002
    assert lamb_lr(optimizer="sgd") is None


def test_recipe_shows_the_lr_it_fills_for_a_chosen_optimizer():
    chosen = recipe.Recipe("medium-data", {"optimizer": "sgd", "lr": 1.0, "batch_size": 256})
    args = dict(optimizer="adagrad", embedding_optimizer=None, lr=None, batch_size=None)
    filled = recipe.apply(args, chosen)
    assert args["lr"] == ADAGRAD_LR and "lr" in filled
    text = recipe.describe(chosen, filled)
    assert f"lr {ADAGRAD_LR}" in text and "--optimizer adagrad without --lr" in text
    # the recipe's own optimizer: its LR, as before
    args = dict(optimizer=None, embedding_optimizer=None, lr=None, batch_size=None)
    recipe.apply(args, recipe.Recipe("medium-data", {"optimizer": "sgd", "lr": 1.0}))
    assert args["lr"] == 1.0


def test_recipe_names_the_kind_of_rate_it_fills():
    """Adam tables without --lr get Adam's rate, and the recipe says so, not that it is Adagrad's."""
    from dlrmkit.optim.options import ADAM_LR

    for emb, rate, kind in (("adam", ADAM_LR, "an Adam rate"), ("rowwise-adagrad", ADAGRAD_LR, "an Adagrad rate")):
        chosen = recipe.Recipe("medium-data", {"optimizer": "sgd", "lr": 1.0})
        args = dict(optimizer=None, embedding_optimizer=emb, lr=None)
        filled = recipe.apply(args, chosen)
        text = recipe.describe(chosen, filled)
        assert args["lr"] == rate and f"--embedding-optimizer {emb} without --lr: lr {rate}, {kind}" in text, text
