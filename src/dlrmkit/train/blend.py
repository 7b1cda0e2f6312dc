"""A blend: several of the search's candidate recipes, each trained as a run of its own, their
logits averaged with whole-number weights and one temperature fitted on the validation rows.

The weights come from ensemble selection (Caruana et al., 2004), as AutoML systems blend their
models: starting from nothing, add (again, if it is best) the candidate whose logits, averaged
with those already in, give the lowest validation log loss; stop when no addition lowers it.
As in that paper it is bagged: run on bootstrap samples of the validation rows and the additions
summed, so that the weights do not follow the noise of one sample of a few thousand rows.
Each member's logits are taken after its own temperature, so a confident model is weighed
by its ranking, not its scale. The test rows are read after every member is trained and the
weights and temperature are fixed. docs/RECIPES.md measures it.

Each member weighing a tenth of the blend or more is trained --blend-seeds times (seeds --seed
and on): the mean of two seeds of a deep model ranks better than one. Each run carries its
member's weight, so such a member weighs --blend-seeds times its selection weight beside a member
run once.

On disk a blend is a checkpoint folder holding `blend.yaml` (the member runs' folders and seeds,
their member's weight, the blend's temperature) and one checkpoint folder per member run beside
it; `evaluate` and `predict` score it as one model, each member reading the rows as it was
trained to."""

from __future__ import annotations

import copy
import gc
import math
import os
import re
import time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from dlrmkit.checkpoint.dirs import BLEND_FILE
from dlrmkit.errors import DlrmkitError
from dlrmkit.train.options import MAX_BLEND_MEMBERS, MAX_BLEND_SEEDS, MAX_FOLDS
from dlrmkit.train.options import MAX_BLEND_WEIGHT as MAX_WEIGHT
from dlrmkit.train.options import blend_members

MAX_RUNS = MAX_BLEND_MEMBERS * max(MAX_BLEND_SEEDS, MAX_FOLDS)  # the runs a blend.yaml may list
MAX_STEPS = 20  # ensemble selection's additions (members with their repeats)
# a member weighing less than this share of a blend is run on one seed: its other seeds would
# cost a run each and move the blend little (docs/RECIPES.md, "Two seeds per member")
SEEDED_SHARE = 0.1
BAGS = 20  # bootstrap samples of the validation rows the selection runs on (Caruana et al.'s bagging)
FOLDER = re.compile(r"[a-z0-9][a-z0-9-]{0,63}")  # a member's folder: one plain name inside the blend's


@dataclass(frozen=True)
class Member:
    name: str  # the candidate recipe (dlrmkit.train.recipe_search.candidates)
    weight: int


def ensemble_selection(val_logits: dict[str, np.ndarray], labels: np.ndarray, bags: int = BAGS) -> list[Member]:
    """The members and their weights: greedy forward selection with repeats on the mean
    validation log loss of the weighted mean of the candidates' logits (in the order of
    `val_logits` on ties), bagged: run on `bags` bootstrap samples of the validation rows (a
    fixed seed), a candidate's weight its additions summed over the bags, divided by the weights'
    greatest common divisor (bags=0: one run on the rows themselves, unbagged). One member: no blend."""
    counts = {} if bags else greedy_selection(val_logits, labels)
    rng = np.random.default_rng(0)
    for _ in range(bags):
        rows = rng.integers(0, len(labels), len(labels))
        for name, n in greedy_selection({k: z[rows] for k, z in val_logits.items()}, labels[rows]).items():
            counts[name] = counts.get(name, 0) + n
    common = math.gcd(*counts.values()) if counts else 1
    return sorted((Member(k, v // common) for k, v in counts.items()), key=lambda m: -m.weight)


def greedy_selection(val_logits: dict[str, np.ndarray], labels: np.ndarray) -> dict[str, int]:
    """Caruana et al.'s selection on one sample of rows: {candidate: times added}."""
    from dlrmkit.train.calibration import log_loss_of_logits

    counts: dict[str, int] = {}
    total, best = 0.0, math.inf  # the chosen logits' running sum, and their mean's log loss
    for n in range(MAX_STEPS):
        with np.errstate(invalid="ignore"):  # a diverged candidate's NaN logits: its loss is NaN, never chosen
            trials = [(log_loss_of_logits((total + z) / (n + 1), labels), name) for name, z in val_logits.items()]
        # the first of equal losses; a NaN (a diverged candidate) is never the lowest
        loss, name = min(trials, key=lambda t: t[0] if t[0] == t[0] else math.inf)
        if not loss < best:
            break
        best, total = loss, total + val_logits[name].astype(np.float64)
        counts[name] = counts.get(name, 0) + 1
    return counts


def mean_logits(logits: list[np.ndarray], weights: list[int]) -> np.ndarray:
    """The weighted mean of the members' logits (float64)."""
    return sum(w * z.astype(np.float64) for z, w in zip(logits, weights)) / sum(weights)


def spec(members: list[Member]) -> str:
    """--blend's text: 'NAME=W; NAME=W'."""
    return "; ".join(f"{m.name}={m.weight}" for m in members)


def parse_spec(text: str) -> list[Member]:
    """--blend 'NAME=W; NAME=W' (names checked against the candidates where the recipe is chosen)."""
    try:
        return [Member(name, weight) for name, weight in blend_members(text)]
    except ValueError as exc:
        raise DlrmkitError(f"--blend: {exc}") from None


def folder_of(name: str) -> str:
    """A member's folder name: its candidate name in lower case, other characters as '-'."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:64] or "member"


# ---- on disk ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BlendFile:
    path: str  # the blend's folder
    folders: list[str]  # each member's checkpoint folder (absolute)
    weights: list[int]
    scale: float  # 1/T of the blend's temperature


def is_blend(path: str) -> bool:
    return os.path.isfile(os.path.join(path, BLEND_FILE))


def described(r: MemberRun) -> dict[str, Any]:
    """A member run as the log, plan.json and blend.yaml name it."""
    return {"name": r.member.name, "seed": r.seed, **({"fold": r.fold} if r.fold else {}),
            **({"refit": True} if r.refit else {}), "weight": r.member.weight}  # fmt: skip


def write_blend(path: str, runs: list[MemberRun], scale: float) -> None:
    """blend.yaml: each MemberRun's folder and its member's weight, and the blend's 1/T."""
    import yaml

    from dlrmkit.atomic_io import write_text

    doc = {"members": [{**described(r), "folder": r.folder} for r in runs], "scale": float(scale)}
    write_text(os.path.join(path, BLEND_FILE), yaml.safe_dump(doc, sort_keys=False))


def read_blend(path: str) -> BlendFile:
    """blend.yaml of `path`, read as an untrusted file: each member a plain folder inside `path`
    (no '..', no link), whole weights in 1..MAX_WEIGHT, a finite scale within the temperature's
    range; anything else one line naming the file and field."""
    from dlrmkit.train.calibration import MAX_SCALE, MIN_SCALE
    from dlrmkit.untrusted import load_yaml

    file = os.path.join(path, BLEND_FILE)
    doc = load_yaml(file, "blend description", 1 << 20)
    if not isinstance(doc, dict) or set(doc) != {"members", "scale"}:
        raise DlrmkitError(f"{file}: not a blend description (needs exactly 'members' and 'scale')")
    members, scale = doc["members"], doc["scale"]
    if not isinstance(members, list) or not 1 <= len(members) <= MAX_RUNS:
        raise DlrmkitError(f"{file}: 'members' must be a list of 1 to {MAX_RUNS} members")
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not MIN_SCALE <= scale <= MAX_SCALE:
        raise DlrmkitError(f"{file}: 'scale' must be a number in [{MIN_SCALE}, {MAX_SCALE}], got {scale!r}")
    folders, weights = [], []
    for i, m in enumerate(members):
        where = f"{file}: member {i + 1}"
        if not isinstance(m, dict) or not isinstance(m.get("folder"), str) or not FOLDER.fullmatch(m["folder"]):
            raise DlrmkitError(f"{where}: 'folder' must be one plain folder name (a-z, 0-9, '-')")
        w = m.get("weight")
        if isinstance(w, bool) or not isinstance(w, int) or not 1 <= w <= MAX_WEIGHT:
            raise DlrmkitError(f"{where}: 'weight' must be a whole number in 1..{MAX_WEIGHT}, got {w!r}")
        folder = os.path.join(path, m["folder"])
        if os.path.islink(folder) or not os.path.isdir(folder):
            raise DlrmkitError(f"{where}: {folder} is not a folder inside the blend's")
        folders.append(folder)
        weights.append(w)
    if len(set(folders)) != len(folders):
        raise DlrmkitError(f"{file}: a member's folder is listed twice")
    return BlendFile(path, folders, weights, float(scale))


# ---- scoring ------------------------------------------------------------------------------------
def load_members(blend: BlendFile, check: Any = None) -> list[tuple[Any, Any]]:
    """(model, ModelConfig) of each member, in one process."""
    from dlrmkit.checkpoint.save_load import load_single_process_model

    return [load_single_process_model(folder, check) for folder in blend.folders]


def blend_logits(blend: BlendFile, members: list[tuple[Any, Any]], dataset: Any, batch_size: int) -> tuple:
    """(the blend's logits, labels) on `dataset` (a mapping as the dataset stores it): each member
    reads it as it was trained to (dlrmkit.data.numerical_buckets.model_view)."""
    from dlrmkit.data.numerical_buckets import model_view
    from dlrmkit.train.calibration import logits_of

    zs, y = [], None
    for model, cfg in members:
        z, y = logits_of(model, model_view(dataset, cfg), batch_size)
        zs.append(z)
    return blend.scale * mean_logits(zs, blend.weights), y


def metrics_of(z: np.ndarray, y: np.ndarray, bins: bool = False) -> dict[str, Any]:
    """AUC, log loss (and ECE with the reliability table) of logits `z` for labels `y`."""
    from dlrmkit.metrics import roc_auc
    from dlrmkit.train.calibration import expected_calibration_error, log_loss_of_logits, reliability

    out: dict[str, Any] = {"auc": roc_auc(y, z) if len(y) else math.nan, "logloss": log_loss_of_logits(z, y)}
    if bins and len(y):
        p = np.exp(-np.logaddexp(0.0, -z))  # sigmoid(z), without overflow at large |z|
        out["ece"], out["reliability"] = expected_calibration_error(y, p), reliability(y, p)
    return out


def describe(members: list[Member], tried: list[Any], seeds: int, folds: int | None = None, refit: bool = False) -> str:
    """The search's lines on the blend it chose (`tried`: recipe_search.Candidate with results);
    `refit`: with `folds`, each member is refitted on all rows (refit_folds)."""
    from dlrmkit.train.calibration import kept_scale, log_loss_of_logits

    if folds and len(members) == 1:
        if refit:
            return (
                f"  the run: {members[0].name}, trained again on all rows as its median fold chose, with one "
                f"temperature fitted on the {folds} folds' validation logits (config.yaml: --blend, --folds, --refit)"
            )
        return (
            f"  the run: {members[0].name}'s {folds} models, one per fold, each its search run (trained on the other "
            f"folds), their logits averaged and one temperature fitted on the folds' validation rows (config.yaml: "
            f"--blend, --folds)"
        )
    if len(members) == 1:  # a single choice left unrefitted by --time-limit
        return f"  the run: {members[0].name}, the search's run of it, with its temperature (config.yaml: --blend)"
    by_name = {c.name: c.result for c in tried}
    y = tried[0].result["val_labels"]
    z = mean_logits([by_name[m.name]["val_logits"] for m in members], [m.weight for m in members])
    single = min(log_loss_of_logits(c.result["val_logits"], y) for c in tried)
    blended = log_loss_of_logits(kept_scale(z.astype(np.float32), y) * z, y)
    if folds and refit:
        runs = f"each member is trained again on all rows as its median fold of {folds} chose"
    elif folds:
        runs = f"each member is its {folds} search runs, one per fold"
    else:
        more = f" and, weighing a tenth of the blend or more, {seeds - 1} more on the next seed(s)"
        runs = f"each member is its search run{more if seeds > 1 else ''}"
    return (
        f"  blend: {', '.join(f'{m.name} x{m.weight}' for m in members)}: ensemble selection on the validation "
        f"log loss after the temperatures, bagged over {BAGS} bootstrap samples of the validation rows (best single "
        f"{single:.4f}, the blend {blended:.4f}); {runs}, each a run of its own, and the run is their weighted mean "
        f"(config.yaml: --blend, {('--folds, --refit' if refit else '--folds') if folds else '--blend-seeds'})"
    )


@dataclass(frozen=True)
class MemberRun:
    """One training of a member: one per seed, or one per fold with --folds (and with --refit,
    one per seed again, refitted from a fold's run: refit_folds)."""

    member: Member
    seed: int
    folder: str  # inside the blend's checkpoint folder
    cfg: Any  # its TrainConfig
    trained: tuple | None = None  # the search's run of it (trainer, test rows, metrics), taken over
    fold: int | None = None  # --folds: the fold (from 1) whose rows validate it
    refit: bool = False  # --folds with --refit: the fold's run refitted on all rows (refit_folds)


def seeded(member: Member, total: int, seeds: int, seed: int) -> list[tuple[int, str]]:
    """(seed, folder) of each run of `member` (`total`: the blend's weights summed): `seeds` runs,
    on `seed` and the next, where it weighs SEEDED_SHARE of the blend or more, else one; each
    folder the member's name, and its seed where the blend has several."""
    from dlrmkit.cli_types import MAX_SEED

    out = []
    for k in range(seeds if member.weight >= SEEDED_SHARE * total else 1):
        s = (seed + k) % (MAX_SEED + 1)
        out.append((s, folder_of(member.name)[:48] + (f"-seed{s}" if seeds > 1 else "")))
    return out


def member_runs(members: list[tuple[Member, Any, Any]], seeds: int, folds: int | None = None) -> list[MemberRun]:
    """Each member (with its TrainConfig and the search's runs of it, from
    dlrmkit.train.recipe.member_configs) once per seed: its config's seed, where the search's run
    is taken over if there is one, then the next seeds; a member weighing less than
    SEEDED_SHARE of the blend, once; with `folds`, once per fold instead (on its config's seed),
    each fold's search run taken over. Each run in a folder of its own (the member's name, and its
    seed or fold where the blend has several)."""
    from dlrmkit.options import assign

    runs = []
    total = sum(m.weight for m, _, _ in members)
    for m, mcfg, trained in members:
        if folds:
            for i in range(1, folds + 1):
                rcfg = copy.deepcopy(mcfg)
                assign(rcfg, {"fold": i})
                run = trained[i - 1] if trained else None
                runs.append(MemberRun(m, rcfg.seed, f"{folder_of(m.name)[:48]}-fold{i}", rcfg, run, i))
            continue
        for k, (seed, folder) in enumerate(seeded(m, total, seeds, mcfg.seed)):
            rcfg = copy.deepcopy(mcfg)
            rcfg.seed = seed
            runs.append(MemberRun(m, seed, folder, rcfg, trained[0] if trained and k == 0 else None))
    return runs


def validation_logits(runs: list[MemberRun], val: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """(the blend's validation logits before its temperature, their labels) from each run's
    (logits, labels) on its validation rows: the weighted mean of the runs, which share their
    validation rows; with folds, each fold's rows scored by that fold's runs, the folds together."""
    groups: dict[int | None, list[int]] = {}
    for j, r in enumerate(runs):
        groups.setdefault(r.fold, []).append(j)
    zs = [mean_logits([val[j][0] for j in js], [runs[j].member.weight for j in js]) for js in groups.values()]
    return np.concatenate(zs), np.concatenate([val[js[0]][1] for js in groups.values()])


def refit_folds(
    runs: list[MemberRun], trained: list[tuple], ck: str | None, seeds: int
) -> tuple[list[MemberRun], list[tuple]]:
    """--folds with --refit: each member's runs, one per fold, become models on all rows: the run
    of its median fold by the epochs it selected (of K = 5, the third), refitted as that fold chose
    (dlrmkit.train.refit), `seeds` times (the run's seed and the next) where the member weighs
    SEEDED_SHARE of the blend or more, as member_runs trains a held-out blend's, else once; each
    in a checkpoint folder of its own (the member's name, and its seed where it has several; `ck`:
    the blend's checkpoint folder, or None). `trained`: (trainer, test rows, metrics, validation
    logits) of each run; returns the refitted runs and theirs. The fold runs are let go."""
    from dlrmkit.options import assign
    from dlrmkit.train.config_file import dump_config
    from dlrmkit.train.refit import plan, refit
    from dlrmkit.train.run_dir import resolved_options

    def epochs(j: int) -> float:  # the epochs a refit of run j repeats
        trainer, _, metrics, _ = trained[j]
        return plan(trainer, metrics).epochs

    by_member: dict[str, list[int]] = {}
    for j, r in enumerate(runs):
        by_member.setdefault(r.member.name, []).append(j)
    total = sum(runs[js[0]].member.weight for js in by_member.values())
    out_runs, out = [], []
    for name, js in by_member.items():
        j = sorted(js, key=epochs)[(len(js) - 1) // 2]
        r, how = runs[j], epochs(j)
        for seed, folder in seeded(r.member, total, seeds, r.seed):
            path = os.path.join(ck, folder) if ck else None
            changes = {"seed": seed, "checkpoint_dir": path, "log_jsonl": path and os.path.join(path, "log.jsonl")}
            t0 = time.perf_counter()
            trainer, test, metrics = refit(trained[j][0], trained[j][2], read_test=False, changes=changes)
            print(f"{name}: refit on all rows, seed {seed}, as fold {r.fold} chose ({how:.2f} epochs of its rows, "
                  f"the median fold): {metrics['refit_steps']} steps  {time.perf_counter() - t0:.0f} s", flush=True)  # fmt: skip
            rcfg = copy.deepcopy(r.cfg)
            assign(rcfg, changes)
            if path:  # repeats it: `train --config` trains that fold's run (on this seed), then refits it
                dump_config(resolved_options(rcfg), os.path.join(path, "config.yaml"))
            out_runs.append(replace(r, seed=seed, folder=folder, cfg=rcfg, trained=None, refit=True))
            out.append((trainer, test, metrics, trained[j][3]))
        for k in js:
            trained[k] = None
        gc.collect()  # a trainer's references among its parts: freed by the cycle collector
    return out_runs, out


def train_blend(cfg: Any, run: Any, members: list[tuple[Member, Any, Any]]) -> dict[str, Any]:
    """Train each member (its TrainConfig from dlrmkit.train.recipe.member_configs) --blend-seeds
    times, or once per fold with --folds, each a run in its own folder under the run's checkpoint
    folder, with no test rows (the first seed's run, or each fold's, is the search's, taken over,
    where the search made it: the same training); then, every run trained, fit the blend's
    temperature on the validation rows (with folds: every fold's, each scored by its own runs),
    score the test rows once, and save each run's checkpoint and blend.yaml. Each run carries its
    member's weight: the blend is the weighted mean of the runs' logits.
    With --refit, each run is refitted on the training and validation rows; with --folds and
    --refit, each member once, after the weights and temperature are fitted on its fold runs
    (refit_folds), and the blend is the refitted members'. Returns the run's
    metrics; `run` is the run folder (dlrmkit.train.run_dir.RunDir). `members` is emptied: its
    runs take the search's trained runs over, and a refit lets each go once it is refitted.
    A run stopped by an error ends the run's log with a `failed` record (each member run's own log
    too, where it stopped in one), by Ctrl-C with an `interrupted` one (run_log.stop_record)."""
    try:
        return _train_blend(cfg, run, members)
    except (Exception, KeyboardInterrupt) as exc:
        from dlrmkit.train.run_log import append_record, log_line, stop_record

        record = stop_record(exc, cfg.parallel.collective_timeout)
        if record is not None:
            try:
                ck = run.checkpoint_dir if cfg.checkpoint.final_checkpoint else None
                append_record(run.log_jsonl, log_line({**record, "time": time.time()}), (ck, run.path))
            except (DlrmkitError, OSError):  # the error that stopped the run is the one reported
                pass
        raise


def _train_blend(cfg: Any, run: Any, members: list[tuple[Member, Any, Any]]) -> dict[str, Any]:
    from dataclasses import asdict

    from dlrmkit.atomic_io import write_json
    from dlrmkit.options import assign
    from dlrmkit.precision import autocast
    from dlrmkit.train.calibration import kept_scale, logits_of
    from dlrmkit.train.config_file import dump_config
    from dlrmkit.train.run_dir import resolved_options
    from dlrmkit.train.refit import refit, wanted
    from dlrmkit.train.run_log import append_record, log_line
    from dlrmkit.train.selection import cross_folds
    from dlrmkit.train.trainer import Trainer

    ck = run.checkpoint_dir if cfg.checkpoint.final_checkpoint else None
    folds = cross_folds(cfg)

    def scores(t: Any, dataset: Any) -> tuple[np.ndarray, np.ndarray]:  # a member's logits, as it evaluates
        with autocast(t.cfg.device.precision, t.device.type):
            return logits_of(t.model, dataset, cfg.selection.eval_batch_size, t.move)

    runs = member_runs(members, cfg.selection.blend_seeds, folds)
    members.clear()  # the runs hold the search's trained runs now, and let each go once it is refitted
    refitting = wanted(cfg, parallel=False)  # a blend trains in one process
    trained = []
    for i, r in enumerate(runs):
        folder = os.path.join(ck, r.folder) if ck else None
        assign(r.cfg, {
            "run_dir": None, "checkpoint_dir": folder, "log_jsonl": folder and os.path.join(folder, "log.jsonl"),
            "metrics_json": None, "tensorboard": None, "resume": False,
        })  # fmt: skip
        which = f"fold {r.fold} of {folds}" if r.fold else f"seed {r.seed}"
        print(f"blend member run {i + 1}/{len(runs)}: {r.member.name}, {which} (weight {r.member.weight})",
              flush=True)  # fmt: skip
        t0 = time.perf_counter()
        # the search trained it on this seed: the same run, taken over, not trained again
        metrics = r.trained[0].take_over(r.cfg, r.trained[2]) if r.trained is not None else None
        taken = metrics is not None
        if taken:
            trainer, test, _ = r.trained
        else:
            trainer = Trainer(r.cfg)
            test = trainer.test_set
            trainer.test_set = test.window(0, 0, "test")  # the blend reads the test rows, once all are trained
        if folder:
            dump_config(resolved_options(r.cfg), os.path.join(folder, "config.yaml"))
        if not taken:
            metrics = trainer.fit(save=False)  # saved once the blend is scored
        val = scores(trainer, trainer.val_set)  # the blend's weights and temperature: the run's figures
        how = " (the search's run of it, not trained again)" if taken else ""
        print(f"  val AUC {metrics['val_auc']:.4f}  {time.perf_counter() - t0:.0f} s{how}", flush=True)
        if refitting and not folds:  # the member is its refit on the training and validation rows
            t0 = time.perf_counter()
            trainer, test, metrics = refit(trainer, metrics, read_test=False)
            print(f"  refit on the training and validation rows: {metrics['refit_steps']} steps  "
                  f"{time.perf_counter() - t0:.0f} s", flush=True)  # fmt: skip
        trained.append((trainer, test, metrics, val))
        if refitting and r.trained is not None:  # the search's run, refitted: its model is not needed any more
            runs[i] = replace(r, trained=None)
            del r
            gc.collect()  # a trainer's references among its parts: freed by the cycle collector

    # the blend's weights and temperature: every run's validation logits (with folds, every fold's)
    z, y = validation_logits(runs, [v for _, _, _, v in trained])
    def train_seconds(done: list) -> float:  # each fit's time: its samples at its rate
        return sum(m["samples"] / m["samples_per_s"] for _, _, m, _ in done if m["samples_per_s"] > 0)

    seen = sum(r["samples"] for _, _, r, _ in trained)  # every member trained: every sample seen
    seconds = train_seconds(trained)
    if refitting and folds:  # each member is now one model on all rows: its median fold's run, refitted
        runs, trained = refit_folds(runs, trained, ck, cfg.selection.blend_seeds)
        seen += sum(r["samples"] for _, _, r, _ in trained)
        seconds += train_seconds(trained)

    def log(record: dict[str, Any]) -> None:
        append_record(run.log_jsonl, log_line({**record, "time": time.time(), "samples_seen": seen}),
                      (ck, run.path))  # fmt: skip

    plan = [{**described(r), "model_config": asdict(t.model_cfg)} for r, (t, _, _, _) in zip(runs, trained)]
    write_json(run.file("plan.json"), {"world_size": 1, "blend": plan})
    weights = [r.member.weight for r in runs]
    scale = kept_scale(z.astype(np.float32), y)
    val_metrics = metrics_of(scale * z, y)
    log({"event": "blend", "members": [{**described(r), "folder": r.folder} for r in runs]})
    log({"event": "calibration", "mapping": "val", "temperature": 1 / scale,
         "val_logloss_before": metrics_of(z, y)["logloss"], "val_logloss_after": val_metrics["logloss"]})  # fmt: skip
    log({"event": "eval", "step": 0, "mapping": "val", **val_metrics})
    scored = [scores(t, test) for t, test, _, _ in trained]
    test_metrics = metrics_of(scale * mean_logits([s[0] for s in scored], weights), scored[0][1], bins=True)
    log({"event": "test", "step": 0, "mapping": "test", **test_metrics})
    for i, (t, _, _, _) in enumerate(trained):  # as one model saves after its test read: a bad test file
        t.save_final(hint=i == 0)  # leaves no blend behind
    if ck:
        write_blend(ck, runs, scale)
    done = [m for _, _, m, _ in trained]
    metrics = {
        "auc": test_metrics["auc"],
        "logloss": test_metrics["logloss"],
        "val_auc": val_metrics["auc"],
        "val_logloss": val_metrics["logloss"],
        "ece": test_metrics.get("ece", math.nan),
        "temperature": 1 / scale,
        "steps": sum(m["steps"] for m in done),
        "samples": seen,
        "samples_per_s": seen / seconds if seconds > 0 else 0.0,
        "train_loss": sum(w * m["train_loss"] for w, m in zip(weights, done)) / sum(weights),
        "world_size": 1,
        "refit": all(m.get("refit", False) for m in done),
        **({"folds": folds} if folds else {}),
        "blend": [{**described(r), "val_auc": m["val_auc"]} for r, m in zip(runs, done)],
    }
    if "optimal_auc" in done[0]:  # a synthetic dataset's
        metrics["optimal_auc"] = done[0]["optimal_auc"]
    log({"event": "end", **metrics})
    return metrics
