"""Hyperparameter search with Optuna: TPE sampling over a YAML search space of `train` options,
intermediate validation AUC reported at every evaluation so a median pruner stops bad trials early,
the study kept in SQLite (a stopped search resumes; several processes may share it),
`--parallel K` trials at once. Writes the best config as YAML for `dlrmkit train --config`,
a table of the best trials and PNG plots of the history and parameter importances."""

from __future__ import annotations

import argparse
import math
import os
from dataclasses import dataclass
from importlib import resources
from typing import Any


from dlrmkit import cli_types as ct
from dlrmkit.atomic_io import atomic_path, check_not_inside, check_output_dir, make_dirs
from dlrmkit.errors import DlrmkitError, one_line
from dlrmkit.options import add_options, option
from dlrmkit.untrusted import MiB, load_yaml

FINISHED = ("COMPLETE", "PRUNED")


@dataclass
class TuneOptions:
    """tune's own options; those every trial passes to training are train's (TrainConfig)."""

    trials: int = option(
        help="finished trials the study should hold in total", parse=ct.int_range(1, 100_000), required=True
    )
    space: str | None = option(None, "search space YAML (default: dlrmkit/tune_space.yaml)", parse=ct.small_file)
    storage: str | None = option(None, "Optuna storage URL (default sqlite:///<out>/study.db)", parse=ct.text)
    study: str = option("dlrmkit", "study name inside the storage (default {default})", parse=ct.text)
    parallel: int = option(1, "trials run at once in this process (default {default})", parse=ct.int_range(1, 256))
    out: str | None = option(None, "folder for trial runs, best.yaml and plots (default tune-<study>)", parse=ct.path)
    budget: float | None = option(
        None, "stop starting trials after this many minutes", parse=ct.float_range(0.0, 1e7, lo_open=True)
    )
    no_prune: bool = option(False, "never prune a trial")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from dlrmkit.config import TrainConfig

    add_options(
        p,
        TrainConfig,
        {
            "data": {"required": True, "help": "dataset folder holding feature_spec.yaml"},
            "preset": {
                "help": "base preset of every trial (default auto: the recipe `train` would choose for the data)"
            },
            "seed": {"help": "seed of the sampler and of every trial's training"},
            "epochs": {"help": "epochs per trial (default: the preset's)"},
            "max_steps": {"help": "steps per trial"},
            "eval_every": {"help": "evaluate (and report for pruning) every N steps"},
        },
    )
    add_options(p, TuneOptions)


TUNE_FILES = ("study.db", "best.yaml", "history.png", "importances.png")


def check_tune_dir(out: str) -> None:
    """An existing --out is empty or a tune folder (a search continues there): it receives
    best.yaml, the plots and trial_N run folders, and must not replace someone else's files."""
    names = sorted(os.listdir(out)) if os.path.isdir(out) else []
    if names and not any(n in TUNE_FILES or (n.startswith("trial_") and n[6:].isdigit()) for n in names):
        raise DlrmkitError(
            f"--out {out}: holds '{names[0][:60]}' and is not a tune folder (no study.db, best.yaml or "
            f"trial_N); give a new or empty folder"
        )
    for n in names:
        if n.startswith("trial_") and n[6:].isdigit():
            check_trial_folder(os.path.join(out, n))


def check_trial_folder(run: str) -> None:
    """A trial's run folder (trial_N, with its config.yaml and log.jsonl) is a folder of --out, never
    a symbolic link to another folder nor a log linked elsewhere: a trial would write through it
    (a link trial_0 -> the user's folder had its config.yaml replaced and a log appended there)."""
    log = os.path.join(run, "log.jsonl")
    if os.path.islink(run) or (os.path.lexists(run) and not os.path.isdir(run)):
        raise DlrmkitError(f"--out: {run} is not a folder (a symbolic link or a file); a trial writes there: remove it")
    if os.path.islink(log):
        raise DlrmkitError(f"--out: {log} is a symbolic link; a trial's log is never written through one: remove it")


def load_space(path: str | None) -> dict[str, Any]:
    if path is None:
        path = str(resources.files("dlrmkit").joinpath("tune_space.yaml"))
    space = load_yaml(path, "search space", MiB) or {}  # bounded: size, nesting, alias expansion
    if not isinstance(space, dict):
        raise DlrmkitError(f"{path}: a search space is a mapping of option: spec")
    from dlrmkit.config import TrainConfig
    from dlrmkit.options import file_value, spec_map

    specs = spec_map(TrainConfig)
    out = {}
    for key, spec in space.items():
        name = str(key).replace("-", "_")
        if name not in specs:
            raise DlrmkitError(f"{path}: unknown train option '{key}'")
        if isinstance(spec, dict) and spec.get("type") not in ("float", "int", "categorical"):
            raise DlrmkitError(f"{path}: option '{key}': type must be float, int or categorical")
        for value in space_values(path, key, spec):  # checked as train checks the option
            file_value(path, str(key), specs[name], value)
        out[name] = spec
    return out


def space_values(path: str, key: Any, spec: Any) -> list[Any]:
    """The values a space entry can give: its choices, its range's ends, or its fixed value."""
    if not isinstance(spec, dict):
        return [spec]
    if spec["type"] == "categorical":
        if not isinstance(spec.get("choices"), list) or not spec["choices"]:
            raise DlrmkitError(f"{path}: option '{key}': categorical needs a non-empty list of choices")
        if not all(c is None or isinstance(c, (str, int, float)) for c in spec["choices"]):
            raise DlrmkitError(f"{path}: option '{key}': choices must be single values (an MLP as text, e.g. '64,32')")
        return list(spec["choices"])
    if "low" not in spec or "high" not in spec:
        raise DlrmkitError(f"{path}: option '{key}': a {spec['type']} range needs low and high")
    check_range(path, key, spec)
    return [spec["low"], spec["high"]]


def check_range(path: str, key: Any, spec: dict[str, Any]) -> None:
    """A float or int range Optuna accepts: numbers of its type, low <= high, log a boolean and
    then low > 0, no other fields (a misspelt one would be ignored)."""
    where = f"{path}: option '{key}'"
    extra = set(spec) - {"type", "low", "high", "log"}
    if extra:
        raise DlrmkitError(f"{where}: unknown field '{sorted(map(str, extra))[0]}' (a range has type, low, high, log)")
    kind = int if spec["type"] == "int" else (int, float)
    low, high, log = spec["low"], spec["high"], spec.get("log", False)
    for name, v in (("low", low), ("high", high)):
        if isinstance(v, bool) or not isinstance(v, kind) or not math.isfinite(v):
            raise DlrmkitError(f"{where}: {name} must be a finite {spec['type']}, got {str(v)[:40]!r}")
    if low > high:
        raise DlrmkitError(f"{where}: low {low} is above high {high}")
    if not isinstance(log, bool) or (log and low <= 0):
        raise DlrmkitError(f"{where}: log must be true or false, and true only with low > 0")


def suggest(trial: Any, space: dict[str, Any]) -> dict[str, Any]:
    params: dict[str, Any] = {}
    for name, spec in space.items():
        if not isinstance(spec, dict):
            params[name] = spec
        elif spec["type"] == "float":
            params[name] = trial.suggest_float(name, float(spec["low"]), float(spec["high"]), log=bool(spec.get("log")))
        elif spec["type"] == "int":
            params[name] = trial.suggest_int(name, int(spec["low"]), int(spec["high"]), log=bool(spec.get("log")))
        else:
            params[name] = trial.suggest_categorical(name, list(spec["choices"]))
    return params


def train_options(params: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """Trial parameters -> train options (dest names); MLP strings get their fixed last layer.
    Tables trained by SGD take no L2 (--embedding-weight-decay needs Adagrad or Adam tables): a
    decay drawn or inherited beside them is left out, so the trial trains instead of failing."""
    from dlrmkit.config import get_preset
    from dlrmkit.optim.names import resolve_embedding_optimizer

    opts = {**base, **params}
    optimizer = opts.get("optimizer") or get_preset(opts["preset"]).optimizer
    tables = resolve_embedding_optimizer(optimizer, opts.get("embedding_optimizer"))
    if opts.get("embedding_weight_decay") and tables not in ("adagrad", "adam"):
        opts["embedding_weight_decay"] = None
    dim = int(opts.get("embedding_dim") or get_preset(opts["preset"]).embedding_dim)
    for key, last in (("bottom_mlp", dim), ("top_mlp", 1)):
        if isinstance(opts.get(key), str):
            opts[key] = [int(x) for x in opts[key].split(",") if x.strip()] + [last]
    if opts.get("embedding_dim") is not None and opts.get("bottom_mlp") is None:
        opts["bottom_mlp"] = list(get_preset(opts["preset"]).bottom_mlp[:-1]) + [dim]
    return opts


def objective_factory(args: argparse.Namespace, space: dict[str, Any], out: str):
    import optuna

    from dlrmkit.config import TrainConfig
    from dlrmkit.train.config_file import dump_config
    from dlrmkit.train.trainer import Trainer

    base = {
        "data": args.data,
        "preset": args.preset,
        "epochs": args.epochs,
        "max_steps": args.max_steps,
        "eval_every": args.eval_every,
        "seed": args.seed,
    }
    if args.preset == "auto":  # the recipe `train` would choose; the space's parameters override it
        from dlrmkit.data.split_binary import open_dataset
        from dlrmkit.train import recipe

        spec, train, _ = open_dataset(args.data)
        chosen = recipe.choose(spec, train).values
        base.update({k: v for k, v in chosen.items() if base.get(k) is None and k not in ("bottom_mlp", "top_mlp")})
        # a trial trains its options as they are; so does `train --config` of its config.yaml or best.yaml,
        # rather than search over candidate recipes again
        base["search_budget"] = 0

    class TrialTrainer(Trainer):
        """Reports every evaluation's AUC to Optuna and stops when the pruner says so."""

        trial: Any = None

        def evaluate(self) -> dict[str, float]:
            result = super().evaluate()
            auc = result["auc"]
            if self.trial is not None and not math.isnan(auc):
                self.trial.report(auc, self.step)
                if not args.no_prune and self.trial.should_prune():
                    why = f"val AUC {auc:.4f} at step {self.step}, below the median of earlier trials there"
                    self.trial.set_user_attr("pruned", why)
                    raise optuna.TrialPruned(why)
            return result

    def objective(trial: Any) -> float:
        opts = train_options(suggest(trial, space), base)
        run = os.path.join(out, f"trial_{trial.number}")
        check_trial_folder(run)
        os.makedirs(run, exist_ok=True)
        dump_config({k: v for k, v in opts.items() if v is not None}, os.path.join(run, "config.yaml"))
        cfg = TrainConfig.of(**{k: v for k, v in opts.items() if v is not None})
        cfg.output.progress, cfg.output.log_jsonl = False, os.path.join(run, "log.jsonl")
        try:
            trainer = TrialTrainer(cfg)
            trainer.trial = trial
            metrics = trainer.fit()
        except DlrmkitError as exc:  # e.g. a diverging lr: a failed trial, not a failed study
            trial.set_user_attr("pruned", str(exc))
            raise optuna.TrialPruned(str(exc)) from None
        trial.set_user_attr("train_options", {k: v for k, v in opts.items() if v is not None})
        trial.set_user_attr("val_logloss", metrics["val_logloss"])
        # kept aside, never compared: only the best trial's (chosen on validation) is ever printed
        trial.set_user_attr("test_auc", metrics["auc"])
        trial.set_user_attr("test_logloss", metrics["logloss"])
        if math.isnan(metrics["val_auc"]):
            raise DlrmkitError("tune needs validation rows (a val mapping, or --val-fraction > 0)")
        return float(metrics["val_auc"])

    return objective


def count_finished(study: Any) -> int:
    return sum(t.state.name in FINISHED for t in study.trials)


def best_table(study: Any, k: int = 5) -> str:
    done = sorted((t for t in study.trials if t.state.name == "COMPLETE"), key=lambda t: -t.value)[:k]
    if not done:
        return "no complete trials yet"
    names = sorted({n for t in done for n in t.params})
    head = ["trial", "val AUC", *names]
    rows = [[str(t.number), f"{t.value:.4f}", *[_applied(t, n) for n in names]] for t in done]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in [head, *rows])


def _applied(trial: Any, name: str) -> str:
    """A trial's drawn value of `name` as the table shows it: '-' where the trial trained without
    it (an --embedding-weight-decay beside SGD tables, train_options)."""
    trained = trial.user_attrs.get("train_options")
    if isinstance(trained, dict) and name.replace("-", "_") not in trained:
        return "-"
    return _fmt(trial.params.get(name))


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else one_line(str(v))  # a shared study's text, escaped


def best_record(trial: Any, url: str) -> tuple[dict[str, Any], float | None, float]:
    """(train options, test AUC or None, test logloss) the best trial recorded, checked: a study
    storage may be shared, so its trials come from elsewhere. The options are checked as
    `train --config` checks the best.yaml written of them; the figures are numbers (NaN too)."""
    from dlrmkit.train.config_file import check_dumped

    where = f"--storage {url}: trial {trial.number}: user attribute"
    if "train_options" not in trial.user_attrs:
        raise DlrmkitError(f"{where} 'train_options' is missing (a trial dlrmkit tune did not run)")
    trained = trial.user_attrs["train_options"]
    check_dumped(f"{where} 'train_options'", trained)
    figures = []
    for name in ("test_auc", "test_logloss"):
        v = trial.user_attrs.get(name, float("nan") if name == "test_logloss" else None)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise DlrmkitError(f"{where} '{name}' is {str(v)[:40]!r}, not a number")
        figures.append(v)
    return trained, figures[0], figures[1]


def write_plots(study: Any, out: str) -> list[str]:
    import warnings

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from optuna.visualization import matplotlib as ovm

    written = []
    for name, fn in (("history.png", ovm.plot_optimization_history), ("importances.png", ovm.plot_param_importances)):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ax = fn(study)
            fig = ax.figure if hasattr(ax, "figure") else ax.flat[0].figure
            fig.set_size_inches(7, 4.5)
            fig.tight_layout()
            path = os.path.join(out, name)
            with atomic_path(path) as tmp:
                fig.savefig(tmp, dpi=100, format="png")
            plt.close(fig)
            written.append(path)
        except (ValueError, RuntimeError) as exc:  # e.g. importances need two complete trials
            print(f"tune: no {name}: {exc}")
    return written


def sqlite_file(url: str) -> str | None:
    """The database file of an SQLite storage URL (`sqlite:///f.db`, `sqlite+pysqlite:///f.db`, any
    case), None for another database or an in-memory one."""
    try:
        from sqlalchemy.engine import make_url

        parsed = make_url(url)
    except Exception:  # noqa: BLE001 - not a URL at all: RDBStorage reports it
        return None
    if parsed.get_backend_name().lower() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return parsed.database


def run(args: argparse.Namespace) -> int:
    from dlrmkit.atomic_io import check_output_file, hold_output_lock

    try:
        import optuna
    except ImportError:
        raise DlrmkitError("tune needs Optuna: pip install 'dlrmkit[tune]'") from None
    from dlrmkit.config import get_preset

    get_preset(args.preset)  # an unknown preset is one line now, not a failure in every trial
    out = args.out or f"tune-{args.study}"
    check_not_inside(out, "--out", {"--data": args.data})
    db = sqlite_file(args.storage) if args.storage else os.path.join(out, "study.db")
    if db:  # a file (any sqlite dialect spelling): never inside the dataset, and written by one process
        check_not_inside(db, "--storage", {"--data": args.data})
        check_output_file(db, "--storage")
        if not args.storage and os.path.islink(db):  # SQLite would write through a link planted in --out
            raise DlrmkitError(f"--out {out}: its study.db is a symbolic link; remove it (the study is written there)")
    check_output_dir(out, "--out")
    check_tune_dir(out)
    if not os.path.isdir(args.data):
        raise DlrmkitError(f"--data {args.data}: no such dataset folder")
    space = load_space(args.space)
    from dlrmkit.data.split_binary import check_held_out, open_dataset

    check_held_out(open_dataset(args.data)[0])  # a bad file or value: one line now, not every trial pruned by it
    hold_output_lock(out, "--out")  # one writer per folder, before any work
    if db and not os.path.lexists(db):  # creating a new study storage: one creator
        hold_output_lock(db, "--storage")
    make_dirs(out, "--out")
    url = args.storage or f"sqlite:///{os.path.join(out, 'study.db')}"
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    import warnings

    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    try:
        storage = optuna.storages.RDBStorage(url, heartbeat_interval=5, grace_period=20)
    except Exception as exc:  # noqa: BLE001 - SQLAlchemy raises many kinds for a bad URL
        raise DlrmkitError(f"--storage {url}: cannot open ({type(exc).__name__}: {str(exc)[:100]})") from None
    sampler = optuna.samplers.TPESampler(seed=args.seed)
    pruner = optuna.pruners.NopPruner() if args.no_prune else optuna.pruners.MedianPruner(n_startup_trials=2)
    from sqlalchemy.exc import SQLAlchemyError

    optuna.logging.set_verbosity(optuna.logging.ERROR)  # its retry warnings on a database of other tables
    try:  # the study and its trials read once: a database of other tables is one line
        study = optuna.create_study(
            study_name=args.study,
            storage=storage,
            sampler=sampler,
            pruner=pruner,
            direction="maximize",
            load_if_exists=True,
        )
        done = count_finished(study)
    except (optuna.exceptions.StorageInternalError, SQLAlchemyError) as exc:
        raise DlrmkitError(
            f"--storage {url}: not an Optuna study storage ({type(exc).__name__}: {str(exc).splitlines()[0][:100]})"
        ) from None
    except (AssertionError, ValueError, LookupError, TypeError) as exc:  # rows Optuna did not write so
        why = f"{type(exc).__name__}: {str(exc).splitlines()[0][:100]}" if str(exc) else type(exc).__name__
        raise DlrmkitError(f"--storage {url}: study '{args.study}' holds a trial Optuna cannot read ({why})") from None
    finally:
        optuna.logging.set_verbosity(optuna.logging.WARNING)
    if [d.name for d in study.directions] != ["MAXIMIZE"]:  # a study of the name made by another tool
        raise DlrmkitError(
            f"--storage {url}: study '{args.study}' has direction(s) {', '.join(d.name.lower() for d in study.directions)}; "
            "a tune study maximizes validation AUC (give another --study)"
        )
    todo = args.trials - done
    print(f"study '{args.study}' in {url}: {done} finished trials, running {max(todo, 0)} more")
    if todo > 0:
        import torch

        torch.set_num_threads(max(1, (os.cpu_count() or 1) // args.parallel))
        study.optimize(
            objective_factory(args, space, out),
            n_trials=todo,
            n_jobs=args.parallel,
            catch=(RuntimeError,),
            gc_after_trial=True,
            timeout=args.budget * 60 if args.budget else None,
        )
    for t in study.trials:  # the trials that ended early, each with why (--no-prune keeps all)
        if t.state.name == "PRUNED":
            print(one_line(f"trial {t.number} pruned: {t.user_attrs.get('pruned', 'stopped by the pruner')}"))
    print(best_table(study))
    complete = [t for t in study.trials if t.state.name == "COMPLETE"]
    if complete:
        best = max(complete, key=lambda t: t.value)
        from dlrmkit.train.config_file import dump_config

        trained, test, test_logloss = best_record(best, url)
        path = os.path.join(out, "best.yaml")
        dump_config(trained, path)
        print(f"best trial {best.number}: val AUC {best.value:.4f}; config {path} (dlrmkit train --config {path})")
        if test is not None:
            print(
                f"best trial {best.number}: test AUC {test:.4f}, test logloss {test_logloss:.4f} "
                "(scored once, after selection on validation)"
            )
    for path in write_plots(study, out):
        print(f"wrote {path}")
    return 0
