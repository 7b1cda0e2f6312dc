"""`--preset auto` on data small enough to search: a few candidate recipes, each trained on the
train rows with early stopping on the validation rows, the best by validation AUC (near-ties by
log loss) kept and trained again as the run itself, or, where ensemble selection on their
validation logits keeps several, their blend (blend_of; dlrmkit.train.blend). The test mapping
is never read here (each candidate's trainer gets an empty test window). The candidates and what
each one measured on six real datasets: docs/RECIPES.md."""

from __future__ import annotations

import copy
import gc
import math
import time
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from dlrmkit.errors import NonFiniteLoss

# validation AUCs this close are a tie, broken by the lower log loss: 0.002 on 4,000 validation
# rows, scaled as an AUC's sampling error is, by 1/sqrt(rows) (near_tie_auc)
NEAR_TIE_AUC, NEAR_TIE_ROWS = 0.002, 4_000
NEAR_TIE_LOGLOSS = 0.001  # ... and log losses this close by the order of the candidates (simplest first)
# a candidate whose validation log loss (after the temperature) is worse than the lowest one by more
# than this many standard errors of the rows' paired differences is out of the choice: on a few
# hundred validation rows a deep model can lead on AUC by chance while its probabilities are
# clearly worse than the regression's
LOGLOSS_SIGNIFICANCE = 2.0
# quantiles per numerical feature of the candidates with buckets (fewer where values repeat; each
# frequent value has a bucket of its own besides): the DLRM's, and the regression's, whose single
# weight per bucket shares one C with the ids
BUCKETS, REGRESSION_BUCKETS = 256, 32
# options that describe the deep part: a user who gives one asked for a deep model, so the
# candidates without it (the regression) are not tried
DEEP_OPTIONS = ("interaction", "dcn_layers", "dcn_rank", "dcn_structure", "bottom_mlp", "top_mlp", "dropout")
# a candidate's trainer writes nothing and scores no test rows: its outputs are switched off
QUIET = {
    "run_dir": None,
    "checkpoint_dir": None,
    "log_jsonl": None,
    "metrics_json": None,
    "tensorboard": None,
    "final_checkpoint": False,
    "resume": False,
    "progress": False,
    "calibration": "none",
    "checkpoint_every": 0,
    "checkpoint_every_seconds": 0.0,
}


@dataclass
class Candidate:
    name: str
    values: dict[str, Any]  # TrainConfig values over the base recipe's
    why: str
    result: dict[str, float] = field(default_factory=dict)
    # the trained runs (each its Trainer, its test rows, its metrics: one, or one per fold with
    # --folds), kept for the run or a blend to take over (dlrmkit.train.blend.train_blend) instead
    # of training them again
    trained: list[tuple] | None = field(default=None, repr=False)


def cut(cand: Candidate, epochs: int) -> Candidate:
    """The candidate whose training --time-limit ended after `epochs` (Trainer.fit's deadline):
    the candidate of those epochs, named so (`named` reads the name back, as --blend gives it)."""
    length = f"{epochs} epoch{'s' if epochs != 1 else ''}"
    return replace(
        cand,
        name=f"{cand.name}, {length}",
        values={**cand.values, "epochs": epochs},
        why=f"{cand.why}; {length}, where --time-limit ended its training",
    )


def named(pool: list[Candidate], name: str) -> Candidate | None:
    """The candidate of `pool` called `name`, or one `cut` to N epochs ("NAME, N epochs", "NAME, 1
    epoch"); None for a name of neither."""
    by_name = {c.name: c for c in pool}
    if name in by_name:
        return by_name[name]
    head, _, tail = name.rpartition(", ")
    count = tail.partition(" ")[0]
    if head in by_name and count.isascii() and count.isdigit() and int(count) >= 1:
        c = cut(by_name[head], int(count))
        return c if c.name == name else None
    return None


def candidates(num_numerical: int, base: str = "small-data") -> list[Candidate]:
    """In the order tried (a smaller --search-budget keeps the first ones), over the base recipe
    named `base` (dlrmkit.train.recipe.choose): the small-data base's seven, or, over the
    medium-data base, the regression and the base's own DLRM."""
    regression = {"deep": False, "wide_init": "regression", "patience": 1}
    every_id = Candidate(
        "regression",
        {**regression, "wide": True, "min_id_count": 1},  # the small-data base has the wide term, medium-data not
        "the logistic regression inside the model (the wide term alone, C chosen on the validation rows), "
        "every id a weight of its own: `dlrmkit baseline`'s model",
    )
    if base == "medium-data":
        return [every_id, Candidate("dlrm", {}, "the medium-data recipe's DLRM, trained from scratch")]
    # the candidates with buckets, only with numerical features
    regression_buckets = [
        Candidate(
            "regression, buckets",
            {**regression, "numerical_buckets": REGRESSION_BUCKETS},
            f"the regression with each numerical feature also a category ({REGRESSION_BUCKETS} quantile "
            "buckets and the frequent values)",
        )
    ] if num_numerical else []  # fmt: skip
    dlrm_buckets = [
        Candidate(
            "dlrm+wide, buckets",
            {"numerical_buckets": BUCKETS},
            f"the DLRM with its wide term, each numerical feature also a category ({BUCKETS} quantile buckets "
            "and the frequent values)",
        )
    ] if num_numerical else []  # fmt: skip
    # the two DeepFM-sized candidates: dim 16, a 400-400-400 top MLP by Adam, the FM term, buckets;
    # one thread, as the base (two were 1.5x faster on an idle machine and 4-40x slower on a busy
    # one, their threads spinning while they wait for each other; docs/BENCHMARKS.md)
    deepfm_sized = {
        "fm": True,
        "embedding_dim": 16,
        "bottom_mlp": [64, 16] if num_numerical else [],
        "top_mlp": [400, 400, 400, 1],
        "optimizer": "adam",
        "dense_lr": 0.001,
        **({"numerical_buckets": BUCKETS} if num_numerical else {}),
    }
    with_buckets = f"numerical features also {BUCKETS}-quantile buckets" if num_numerical else ""
    # the costliest last (its 400-wide MLP runs every step at batch 64): where --time-limit stops
    # the search, it is the first candidate left out
    return [
        every_id,
        *regression_buckets,
        Candidate("dlrm+wide", {}, "the DLRM with its wide term, trained from scratch"),
        *dlrm_buckets,
        Candidate("dlrm+wide+fm", {"fm": True}, "the DLRM with the wide and factorization-machine terms"),
        Candidate(
            "deepfm, adam, lr decay",
            {
                **deepfm_sized,
                "interaction": "cat",
                "embedding_optimizer": "adam",
                "lr": 0.001,
                "embedding_weight_decay": 0.01,
                "batch_size": 512,
                "patience": 2,
                "lr_decay_on_plateau": 0.1,
            },
            "DeepFM trained as FuxiCTR trains it: dim 16, the embeddings concatenated into a 400-400-400 MLP "
            "beside the FM term, Adam 0.001 on whole tables (L2 0.01 on every row) and the MLPs, batch 512, "
            "the learning rate x0.1 at each evaluation without a better validation AUC, stop after 2"
            + (f"; {with_buckets}" if with_buckets else ""),
        ),
        Candidate(
            "dlrm+wide+fm, wide top MLP",
            {**deepfm_sized, "embedding_weight_decay": 0.0},
            "a DeepFM-sized model: dim 16, top MLP 400-400-400 trained by Adam, the FM term"
            + (f", {with_buckets}" if with_buckets else ""),
        ),
    ]


def near_tie_auc(val_rows: int | None) -> float:
    """The AUC gap that counts as a tie on `val_rows` validation rows (NEAR_TIE_AUC at NEAR_TIE_ROWS)."""
    return NEAR_TIE_AUC * math.sqrt(NEAR_TIE_ROWS / val_rows) if val_rows else NEAR_TIE_AUC


def choose(tried: list[Candidate]) -> Candidate:
    """The best validation AUC among the candidates whose log loss is not clearly worse
    (`clearly_worse`); the candidates within near_tie_auc(validation rows) of it are a tie, broken
    by the lower log loss (after the temperature: settled_logloss); log losses within
    NEAR_TIE_LOGLOSS of the lowest are a tie too, won by the candidate tried first (the simplest:
    the order of `candidates`). On a few thousand validation rows AUC moves by about 0.01 between
    samples, so a deeper model must win clearly to be kept; on more rows a smaller gap is clear."""
    scored = [c for c in tried if not math.isnan(c.result.get("val_auc", math.nan))]
    out = clearly_worse(scored)
    scored = [c for c in scored if c.name not in out]
    if not scored:
        return tried[0]
    top = max(c.result["val_auc"] for c in scored)
    tie = near_tie_auc(scored[0].result.get("val_rows"))
    near = [c for c in scored if c.result["val_auc"] >= top - tie]
    low = min(settled_logloss(c) for c in near)
    return next(c for c in near if settled_logloss(c) <= low + NEAR_TIE_LOGLOSS)


def clearly_worse(scored: list[Candidate]) -> dict[str, str]:
    """{candidate name: why it is out} for the candidates whose validation log loss after the
    temperature exceeds the lowest one's by more than LOGLOSS_SIGNIFICANCE standard errors of the
    paired per-row differences (on the same validation rows). Without per-row losses (a replay of
    figures), nobody is out."""
    rows = [c.result.get("val_row_logloss") for c in scored]
    if not scored or any(r is None or len(r) != len(rows[0]) or len(r) < 2 for r in rows):
        return {}
    means = [float(np.mean(r)) for r in rows]
    best = int(np.argmin(means))
    out = {}
    for c, r, m in zip(scored, rows, means):
        d = r.astype(np.float64) - rows[best]
        se = float(np.std(d, ddof=1)) / math.sqrt(len(d))
        if m - means[best] > LOGLOSS_SIGNIFICANCE * se:
            out[c.name] = f"log loss after T {m - means[best]:+.4f} over {scored[best].name}'s ({se:.4f} standard error)"
    return out


def settled_logloss(c: Candidate) -> float:
    """The log loss near-ties are settled on: after the temperature where it was measured."""
    t = c.result.get("val_logloss_t", math.nan)
    return c.result["val_logloss"] if math.isnan(t) else t


def train_candidate(cfg: Any, deadline: float | None = None) -> tuple[dict[str, Any], list[tuple]]:
    """One candidate: the trainer of `cfg` (outputs off) to its early stop, or with --folds K one
    per fold; its validation figures (with folds: of every fold's validation rows, each scored by
    the model that did not train on them) and the trained runs (each the trainer, its test rows,
    its metrics). `deadline`: see Trainer.fit (one run, not folds)."""
    from dlrmkit.options import assign
    from dlrmkit.train.selection import cross_folds

    folds = cross_folds(cfg)
    if not folds:
        return one_candidate_run(cfg, deadline)
    runs = []
    for i in range(1, folds + 1):
        trial = copy.deepcopy(cfg)
        assign(trial, {"fold": i})
        runs.append(one_candidate_run(trial))
    return pooled([r for r, _ in runs]), [t for _, (t,) in runs]


def pooled(results: list[dict[str, Any]]) -> dict[str, Any]:
    """One candidate's figures over its folds: each fold's validation rows scored by its own model
    (after its own temperature), the rows of all folds together."""
    from dlrmkit.metrics import roc_auc

    rows = sum(r["val_rows"] for r in results)
    out = {
        "val_rows": rows,
        "val_logloss": sum(r["val_logloss"] * r["val_rows"] for r in results) / rows,
        "best_epoch": float(np.mean([r["best_epoch"] for r in results])),
        "seconds": sum(r["seconds"] for r in results),
        "val_row_logloss": None, "val_logits": None, "val_labels": None, "val_logloss_t": math.nan,
        "val_auc": float(np.mean([r["val_auc"] for r in results])),
    }  # fmt: skip
    if all(r["val_logits"] is not None for r in results):
        z = np.concatenate([r["val_logits"] for r in results])
        y = np.concatenate([r["val_labels"] for r in results])
        losses = np.concatenate([r["val_row_logloss"] for r in results])
        out.update(val_logits=z, val_labels=y, val_row_logloss=losses, val_auc=roc_auc(y, z),
                   val_logloss_t=float(np.mean(losses, dtype=np.float64)))  # fmt: skip
    return out


def one_candidate_run(cfg: Any, deadline: float | None = None) -> tuple[dict[str, Any], list[tuple]]:
    """train_candidate's one training."""
    from dlrmkit.train.calibration import row_log_losses
    from dlrmkit.train.trainer import Trainer

    from dlrmkit.options import assign

    quiet = copy.deepcopy(cfg)
    assign(quiet, QUIET)
    t0 = time.perf_counter()
    trainer = Trainer(quiet, keep_log=True)  # its log's records, for a blend member that takes it over
    test = trainer.test_set
    trainer.test_set = test.window(0, 0, "test")  # selection never reads the test rows
    m = trainer.fit(deadline=deadline)
    epoch_steps = m["steps"] / m["epochs"] if m["epochs"] else float("nan")
    z, y = logits_after_temperature(trainer)
    rows = None if z is None else row_log_losses(z, y).astype(np.float32)
    return {
        "val_rows": len(trainer.val_set) if trainer.val_set is not None else 0,
        "val_auc": m["val_auc"],
        "val_logloss": m["val_logloss"],
        "val_logloss_t": float(np.mean(rows, dtype=np.float64)) if rows is not None else math.nan,
        "val_row_logloss": rows,
        "val_logits": z,  # after the temperature: what a blend averages (dlrmkit.train.blend)
        "val_labels": y,
        "best_epoch": m["selected_step"] / epoch_steps if epoch_steps else float("nan"),
        "seconds": time.perf_counter() - t0,
        "deadline_epochs": m.get("deadline_epochs"),  # ended by the deadline: the epochs it trained
    }, [(trainer, test, m)]


def logits_after_temperature(trainer: Any) -> tuple[np.ndarray | None, np.ndarray | None]:
    """The validation rows' logits after the temperature the run fits once a candidate is chosen
    (dlrmkit.train.calibration.kept_scale, as calibrate fits it), and their labels; (None, None)
    where the run would fit none. Each row's log loss of these settles near-ties, so that a
    confident model is not passed over for a miscalibration the temperature removes, and says
    whether a candidate's log loss is clearly worse (`clearly_worse`); a blend averages them."""
    from dlrmkit.train.calibration import kept_scale, skipped, val_logits

    if skipped(trainer) is not None:
        return None, None
    z, y = val_logits(trainer)
    return (kept_scale(z, y) * z).astype(np.float32), y


def blend_of(tried: list[Candidate]) -> list:
    """The blend of the tried candidates (dlrmkit.train.blend.ensemble_selection on their
    validation logits), or [] where one candidate is best alone or logits are missing."""
    from dlrmkit.train.blend import ensemble_selection

    scored = [c for c in tried if c.result.get("val_logits") is not None]
    if len(scored) < 2 or len(scored) != len(tried):
        return []
    members = ensemble_selection({c.name: c.result["val_logits"] for c in scored}, scored[0].result["val_labels"])
    return members if len(members) > 1 else []


def release(tried: list[Candidate], keep: set[str]) -> None:
    """Let go of the trained runs of the candidates not in `keep` (a blend's members), now, so
    that their models and optimizer state are not held while the blend trains."""
    for c in tried:
        if c.name not in keep:
            c.trained = None
    gc.collect()  # a trainer's references among its parts: freed by the cycle collector


def search(
    cfg: Any, base: Any, budget: int, train: Any, apply, clock: Any = None
) -> tuple[Candidate, list[Candidate], list[str]]:
    """Tries the first `budget` candidates on the dataset whose train mapping is `train`, each as
    `apply` (recipe.fill) fills a copy of `cfg` from the base recipe plus the candidate's values.
    Options the user gave win in every candidate; candidates that come out the same are tried once
    (the FM term where the model has fewer than two tables, categorical and bucket tables, is no
    term at all: its pairs are none); a user who gave a deep-model option (DEEP_OPTIONS, or --deep
    true) gets no candidate without the deep part. A candidate whose training loss goes NaN or
    infinite is left out, named in a line of its own; where every one does, the first one's error
    stops the run. Each candidate's figures are printed as it ends (a search may take minutes;
    standard output, as the recipe's lines: an error stays one line). With a `clock`
    (dlrmkit.train.time_limit.Clock), the candidates after the first are tried only while it says
    the search is open, and a candidate's training ends by its deadline (then the candidate of the
    epochs it trained: `cut`). Returns (winner, tried, the lines of those left out)."""
    from dlrmkit.data.split_binary import numerical_scale
    from dlrmkit.options import flatten
    from dlrmkit.train.selection import cross_folds

    num_numerical, num_categorical = train.num_numerical, len(train.cardinalities)
    tried: list[Candidate] = []
    seen: list[dict] = []
    failed: list[tuple[str, NonFiniteLoss]] = []
    late: list[str] = []  # --time-limit: not tried past the search's share, or ended by the deadline
    given = flatten(cfg)
    deep_asked = given.get("deep") is True or any(given.get(k) is not None for k in DEEP_OPTIONS)
    # a candidate's training ends by the limit's deadline, where no length was given and no folds
    # (the fold runs of a candidate would end after different epochs, which no --epochs repeats)
    timed = clock is not None and given.get("epochs") is None and given.get("max_steps") is None
    deadline = clock.deadline() if timed and not cross_folds(cfg) else None
    pool = [c for c in candidates(num_numerical, base.name) if not (deep_asked and c.values.get("deep") is False)]
    pool = pool[: max(budget, 1)]
    for k, cand in enumerate(pool, 1):
        trial = copy.deepcopy(cfg)  # the sections too: a candidate's values stay its own
        apply(trial, replace(base, values={**base.values, **cand.values}, reasons=[]))  # a Recipe
        values = flatten(trial)
        shape = {name: values[name] for name in (*base.values, *cand.values)}
        tables = num_categorical + (num_numerical if values.get("numerical_buckets") else 0)
        shape["fm"] = bool(values.get("fm")) and tables >= 2  # no pair of tables: the same model without it
        if shape in seen:
            continue
        seen.append(shape)
        if budget > 0 and tried and clock is not None and not clock.search_open():
            late.append(clock.skipped(cand.name))
            print(f"search {k}/{len(pool)}: {cand.name}: not tried (--time-limit)", flush=True)
            continue
        if budget > 0:
            try:
                cand.result, cand.trained = train_candidate(trial, deadline)
            except NonFiniteLoss as exc:
                failed.append((cand.name, exc))
                print(f"search {k}/{len(pool)}: {cand.name}: {exc}; left out", flush=True)
                gc.collect()
                continue
            r = cand.result
            print(f"search {k}/{len(pool)}: {cand.name}: val AUC {r['val_auc']:.4f}  val logloss "
                  f"{r['val_logloss']:.4f}  {r['seconds']:.0f} s", flush=True)  # fmt: skip
            if r.get("deadline_epochs"):
                cand = cut(cand, r["deadline_epochs"])  # its result and trained run with it
                late.append(clock.ended(cand.name))
                print(f"search {k}/{len(pool)}: ended by --time-limit after its epoch {r['deadline_epochs']}: "
                      f"{cand.name}", flush=True)  # fmt: skip
        tried.append(cand)
        if budget > 0 and cand.name == "regression" and base.values.get("numerical_transform") == "signed-log":
            # values past float16's range: only the log keeps them finite
            if given.get("numerical_transform") is None and math.isfinite(numerical_scale(train)):
                check_numbers(cfg, base, cand, apply)
        if budget > 0 and cand.name == "regression" and (base.values.get("min_id_count") or 1) > 1 and given.get("min_id_count") is None:
            check_rare_ids(cfg, base, cand, apply)
    if not tried:
        name, exc = failed[0]
        raise NonFiniteLoss(f"search candidate {name}: {exc}") from None
    left_out = [f"  {name:<26} left out: its training {str(exc).split(';')[0]}" for name, exc in failed]
    return choose(tried), tried, left_out + late


def check_numbers(cfg: Any, base: Any, regression: Candidate, apply) -> None:
    """The base's signed log of large numerical values (recipe.choose: sign(x) log(1+|x|)) checked on
    the validation rows before the candidates that use it: the `regression` candidate against the
    same regression on the numbers as they are (standardized, --numerical-transform none), chosen
    between as the search chooses (`choose`). Where the numbers as they are win, they are the run's
    (in every later candidate, a blend's members and config.yaml) and the `regression` candidate is
    their fit: heavy-tailed counts (clicks, views) gain from the log, but measurements whose size
    itself tells the label (a protein's homology scores) lose what their tails say. The search
    checks neither a --numerical-transform the user gave nor values past float16's range."""
    plain = Candidate("regression, numbers as they are", {**regression.values, "numerical_transform": "none"}, "")
    trial = copy.deepcopy(cfg)
    apply(trial, replace(base, values={**base.values, **plain.values}, reasons=[]))
    plain.result, plain.trained = train_candidate(trial)
    figures = (
        f"val AUC {plain.result['val_auc']:.4f} against {regression.result['val_auc']:.4f}, log loss after T "
        f"{settled_logloss(plain):.4f} against {settled_logloss(regression):.4f}; {plain.result['seconds']:.0f} s"
    )
    if choose([regression, plain]) is regression:
        release([plain], set())
        base.reasons.append(f"the signed log kept: on the validation rows the regression on the numbers as they are "
                            f"does not beat it ({figures})")  # fmt: skip
        return
    from dlrmkit.options import assign

    assign(cfg, {"numerical_transform": "none"})  # as if given: every later candidate, a blend's members, config.yaml
    del base.values["numerical_transform"]  # the run's option now, not the recipe's
    base.reasons[:] = [r for r in base.reasons if "sign(x) log(1+|x|)" not in r]
    base.reasons.append(f"numerical features as they are, standardized (--numerical-transform none): on the "
                        f"validation rows the regression on them beats the one on sign(x) log(1+|x|) ({figures})")  # fmt: skip
    release([regression], set())
    regression.values, regression.result, regression.trained = plain.values, plain.result, plain.trained


def check_rare_ids(cfg: Any, base: Any, regression: Candidate, apply) -> None:
    """The base's rare-id rule (ids seen fewer than --min-id-count times in the training rows share
    id 0) checked on the validation rows before the candidates that use it: the regression with
    the rule against the `regression` candidate (every id its own weight). Where the rule's log
    loss is clearly worse (clearly_worse) and by more than a tie (NEAR_TIE_LOGLOSS), `cfg` keeps
    every id (--min-id-count 1 in every later candidate, a blend's members and the run's
    config.yaml): on logs whose label follows an id's novelty (a first purchase is never a
    reorder), "seen once" in the training rows means another thing than an id first seen at test
    time, and validation rows read as test rows are (Trainer) show it."""
    k = base.values["min_id_count"]
    folded = Candidate("regression, rare ids folded", {**regression.values, "min_id_count": k}, "")
    trial = copy.deepcopy(cfg)
    apply(trial, replace(base, values={**base.values, **folded.values}, reasons=[]))
    folded.result, _ = train_candidate(trial)
    worse = clearly_worse([regression, folded]).get(folded.name)
    gap = folded.result["val_logloss_t"] - regression.result["val_logloss_t"]
    if worse is None or not gap > NEAR_TIE_LOGLOSS:  # a gap the choice calls a tie changes nothing
        base.reasons.append(
            f"ids seen fewer than {k} times folded onto id 0: on the validation rows the regression with them folded is "
            f"not clearly worse than with every id its own (log loss after T {folded.result['val_logloss_t']:.4f} "
            f"against {regression.result['val_logloss_t']:.4f}; clearly: by more than {LOGLOSS_SIGNIFICANCE:g} standard "
            f"errors and more than {NEAR_TIE_LOGLOSS}; {folded.result['seconds']:.0f} s)"
        )
        return
    from dlrmkit.options import assign

    assign(cfg, {"min_id_count": 1})  # as if given: every later candidate, a blend's members and config.yaml keep it
    del base.values["min_id_count"]  # the run's option now, not the recipe's
    base.reasons[:] = [r for r in base.reasons if "--min-id-count" not in r]
    base.reasons.append(
        f"every id its own row (--min-id-count 1): on the validation rows the regression with ids seen fewer than {k} "
        f"times folded onto id 0 is clearly worse than with every id its own ({worse})"
    )


def describe(winner: Candidate, tried: list[Candidate], budget: int, folds: int | None = None) -> list[str]:
    """The lines `train` prints: each candidate's figures, the winner and why."""
    if len(tried) == 1 and not tried[0].result:
        return [f"search: off (--search-budget {budget}): the first candidate, {winner.name}"]
    total = sum(c.result["seconds"] for c in tried)
    runs = f"candidates, each trained once per fold (--folds {folds})" if folds else "runs"
    where = f"all {folds} folds' validation rows" if folds else "the validation rows"
    lines = [
        f"search: {len(tried)} candidate recipes on {where} ({total:.0f} s, at most --search-budget {budget} "
        f"{runs}; the test rows are not read)"
    ]
    out = clearly_worse([c for c in tried if not math.isnan(c.result.get("val_auc", math.nan))])
    width = max(26, *(len(c.name) + 1 for c in tried))  # a name cut to its epochs by --time-limit: longer
    for c in tried:
        r = c.result
        out_of = f"  (out of the single choice, not of a blend: {out[c.name]})" if c.name in out else ""
        mark = "  <- chosen" if c is winner else out_of
        after_t = r.get("val_logloss_t", math.nan)
        after_t = "" if math.isnan(after_t) else f" ({after_t:.4f} after T)"
        lines.append(
            f"  {c.name:<{width}} val AUC {r['val_auc']:.4f}  val logloss {r['val_logloss']:.4f}{after_t}  "
            f"best epoch {r['best_epoch']:.0f}  {r['seconds']:.0f} s{mark}"
        )
    others = [c for c in tried if c is not winner and c.name not in out]
    if others:
        best_other = max(others, key=lambda c: c.result["val_auc"])
        gap = winner.result["val_auc"] - best_other.result["val_auc"]
        tie = near_tie_auc(winner.result.get("val_rows"))
        if gap > tie:
            why = f"the best validation AUC, {gap:+.4f} over {best_other.name}"
        else:
            why = (
                f"a near-tie on validation AUC (within {tie:.4f}) with {best_other.name}, settled by the "
                f"lower log loss after the temperature, or, within {NEAR_TIE_LOGLOSS} of it, by the simpler model"
            )
        if out:
            why += f"; out of the choice: {len(out)} candidate(s) whose log loss is clearly worse"
        lines.append(f"  why: {winner.name} ({winner.why}): {why}")
    return lines
