"""Train a DLRM on a FeatureSpec dataset: BCE loss, SGD or Adagrad (sparse row updates for the
embedding tables), the MLPerf LR schedule, AUC/log-loss evaluation, early stop at a target AUC,
checkpoints that --resume continues from, and a JSON summary of the run."""

from __future__ import annotations

import argparse
import math
import os
import sys
from dataclasses import dataclass
from typing import Any, Iterable

from dlrmkit import cli_types as ct
from dlrmkit.config import AUTO, TrainConfig
from dlrmkit.errors import DlrmkitError, Interrupted, RunEnded
from dlrmkit.options import add_options, option


@dataclass
class ConfigFile:
    """train's one option outside TrainConfig: the file the others may come from."""

    config: str | None = option(
        None,
        "YAML file of options (keys as the flags, e.g. batch-size: 512); flags given here win",
        parse=ct.small_file,
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Train's options come from TrainConfig's fields; options not given stay off the namespace,
    so `--config` can fill them and flags given win (config_file.config_from_args)."""
    add_options(p, TrainConfig, unset_absent=True)
    add_options(p, ConfigFile)


def check_outputs(cfg: TrainConfig, config: str | None = None) -> None:
    """Every path this run will write: creatable and writable, a file or a folder as needed,
    none inside an input (--data, --config, --plan), no two the same file, and no folder
    holding another run's checkpoints or log (without --resume): all before the run folder is written."""
    from dlrmkit.atomic_io import check_distinct, check_not_inside, check_output_dir, check_output_file
    from dlrmkit.checkpoint.dirs import check_fresh_directory
    from dlrmkit.train.run_dir import check_fresh_log, check_run_dir

    out, ck = cfg.output, cfg.checkpoint

    inputs = {"--data": cfg.data, "--config": config, "--plan": cfg.parallel.plan}
    for flag, path in (
        ("--metrics-json", out.metrics_json),
        ("--log-jsonl", out.log_jsonl),
        ("--checkpoint-dir", ck.checkpoint_dir),
        ("--run-dir", out.run_dir),
        ("--tensorboard", out.tensorboard),
    ):
        check_not_inside(path, flag, inputs)
    check_output_file(out.metrics_json, "--metrics-json")
    check_output_file(out.log_jsonl, "--log-jsonl", append=True)
    check_output_dir(ck.checkpoint_dir, "--checkpoint-dir")
    check_output_dir(out.run_dir, "--run-dir")
    check_run_dir(out.run_dir)
    check_output_dir(out.tensorboard, "--tensorboard")
    if not out.run_dir:
        check_output_dir("runs", "the default run folder (runs/; or pass --run-dir)")
    checkpoints = ck.checkpoint_dir or (os.path.join(out.run_dir, "checkpoints") if out.run_dir else None)
    log = out.log_jsonl or (os.path.join(ck.checkpoint_dir or out.run_dir, "log.jsonl") if checkpoints else None)
    run_files = ("config.yaml", "run.json", "plan.json") if out.run_dir else ()
    check_distinct(
        {
            **{f"--run-dir's {name}": os.path.join(out.run_dir or "", name) for name in run_files},
            ("--log-jsonl" if out.log_jsonl else "the log (log.jsonl)"): log,
            "--metrics-json": out.metrics_json,
        }
    )
    if not ck.resume:  # another run's checkpoints or log: refused, never mixed with this run's
        if ck.checkpoint_dir:
            check_fresh_directory(ck.checkpoint_dir)
        elif checkpoints:  # <run folder>/checkpoints: named by the option given
            check_fresh_directory(checkpoints, "--run-dir", out.run_dir)
        if out.log_jsonl:
            check_fresh_log(out.log_jsonl, "--log-jsonl")
        elif ck.checkpoint_dir:
            check_fresh_log(log, "--checkpoint-dir", ck.checkpoint_dir)
        elif out.run_dir:
            check_fresh_log(log, "--run-dir", out.run_dir)
    if ck.resume and not (ck.checkpoint_dir or out.run_dir):  # before the run folder is made
        raise DlrmkitError("--resume needs --checkpoint-dir (or the --run-dir of the run to continue)")
    from dlrmkit.train.blend import is_blend

    if ck.resume and checkpoints and is_blend(checkpoints):  # written at its end: the run ended
        raise RunEnded(
            f"--resume: the run ended: {checkpoints} holds its blend (blend.yaml), the model it scored (its figures: "
            f"the run's metrics.json); nothing to resume (`dlrmkit evaluate --checkpoint {checkpoints}` scores it again)"
        )
    check_plan_file(cfg.parallel.plan)
    if not os.path.isdir(cfg.data):
        raise DlrmkitError(f"--data {cfg.data}: no such dataset folder")


def check_plan_file(path: str | None) -> None:
    """A --plan file parses and is a valid plan before any work, in one process too (where it is
    not used) and on every rank before the process group forms (where it is)."""
    if not path:
        return
    if not os.path.exists(path):
        raise DlrmkitError(f"--plan {path}: no such file")
    from dlrmkit.parallel.plan import ShardingPlan

    ShardingPlan.load(path)


def check_one_process_options(cfg: TrainConfig, config: str | None, flags: Iterable[str]) -> None:
    """A torchrun-only option (the parallel section's) set in one process, or --table-placement
    host on the CPU, would do nothing: one line naming it (and the --config file, for a value
    from there: not in `flags`)."""
    from dlrmkit.options import spec_map
    from dlrmkit.parallel.options import refuse_outside_torchrun, torchrun_only

    given, by_name = set(flags), spec_map(TrainConfig)

    def shown(name: str) -> str:
        s = by_name[name]
        value = s.get(cfg)
        if name in given:
            return s.flag if s.kind == "switch" else f"{s.flag} {value}"
        file_value = (not value if s.option.negate else value) if s.kind == "switch" else value
        return f"{config}: '{s.key}: {file_value}'"

    refuse_outside_torchrun((shown(name), by_name[name].get(cfg) != by_name[name].default) for name in torchrun_only())
    if cfg.device.device == "cpu" and cfg.device.table_placement == "host":
        raise DlrmkitError(
            f"{shown('table_placement')} needs --device cuda (on the CPU every table is in host memory already)"
        )


def check_tables_fit(cfg: TrainConfig) -> None:
    """The embedding tables (and their optimizer state) of this process fit in memory, or one line."""
    from dlrmkit.data.feature_spec import FeatureSpec
    from dlrmkit.resources import check_memory

    res = cfg.resolved()
    if cfg.optimizer.lamb_lr is not None and res.optimizer.optimizer != "lamb":  # it would be ignored
        raise DlrmkitError(f"--lamb-lr applies with --optimizer lamb (this run's optimizer: {res.optimizer.optimizer})")
    rows = sum(FeatureSpec.from_yaml(cfg.data).cardinalities)
    state = 2 if "adagrad" in f"{res.optimizer.optimizer} {res.optimizer.embedding_optimizer}" else 1
    from dlrmkit.parallel.options import torchrun_env

    world = torchrun_env().world_size
    dim = int(res.model.embedding_dim)
    check_memory(rows * dim * 4 * state // world, f"{cfg.data}: {rows:,} table rows x --embedding-dim {dim}")
    bottom, top = list(res.model.bottom_mlp or []), list(res.model.top_mlp or [])
    widths = [16, *bottom, 1 << 12, *top]  # the MLPs' widths (inputs rounded up): weights, gradients, state
    check_memory(sum(a * b for a, b in zip(widths, widths[1:])) * 4 * 4, "--bottom-mlp/--top-mlp")


def summary_line(m: dict) -> str:
    val = f"val AUC {m['val_auc']:.4f}  " if not math.isnan(m.get("val_auc", float("nan"))) else ""
    trained = (  # no loss: no step in this process (a resume of a finished run, a regression at its start)
        f"samples/s {m['samples_per_s']:,.0f}  train loss {m['train_loss']:.4f}"
        if not math.isnan(m["train_loss"])
        else "(no training step in this run)"
    )
    line = f"steps {m['steps']}  {trained}  {val}test logloss {m['logloss']:.4f}  test AUC {m['auc']:.4f}"
    if math.isnan(m["auc"]):
        line += "  (AUC undefined: the test mapping has no rows or one class only)"
    if "optimal_auc" in m and not math.isnan(m["auc"]):
        line += f"  (optimal {m['optimal_auc']:.4f}, gap {m['optimal_auc'] - m['auc']:.4f})"
    return line


def run(args: argparse.Namespace) -> int:
    from dlrmkit.train.config_file import config_from_args
    from dlrmkit.parallel.options import torchrun_env

    env = torchrun_env()  # a garbage RANK or WORLD_SIZE: one line now, not from process-group setup
    cfg = config_from_args(args)
    try:
        return _run(args, cfg, env)
    except KeyboardInterrupt:
        raise Interrupted(where_to_resume(cfg)) from None
    except RunEnded as ended:  # --resume of a run that ended: nothing trained, scored or written
        from dlrmkit.parallel.dist import shutdown

        if env.rank == 0:
            print(ended, file=sys.stderr)
        shutdown()
        return 0


def where_to_resume(cfg: TrainConfig) -> str:
    """What an interrupted run leaves: the newest checkpoint --resume continues, or none."""
    from dlrmkit.checkpoint.dirs import latest_or_none

    folder = cfg.checkpoint.checkpoint_dir
    newest = latest_or_none(folder) if folder and os.path.isdir(folder) else None
    if newest is None:
        return " before any checkpoint was saved (--checkpoint-every N saves along the way)"
    return f"; the newest checkpoint is {newest}: --resume with the same --run-dir or --checkpoint-dir continues it"


def _run(args: argparse.Namespace, cfg: TrainConfig, env: Any) -> int:
    from dlrmkit.data.feature_spec import FeatureSpec
    from dlrmkit.data.split_binary import check_held_out
    from dlrmkit.train.trainer import Trainer

    from dlrmkit.train import run_dir
    from dlrmkit.options import given
    from dlrmkit.train.selection import check_selection_options, selection_options_on

    # options the user gave that would do nothing: before a recipe fills its own, and before any work
    check_selection_options(cfg, getattr(args, "config", None), given(TrainConfig, args))
    check_outputs(cfg, getattr(args, "config", None))  # before any work: a bad path is found now, not after training
    check_one_process_options(cfg, getattr(args, "config", None), given(TrainConfig, args))
    check_held_out(FeatureSpec.from_yaml(cfg.data))  # a bad val or test file found now, not after training
    if cfg.device.precision == "fp16" and env.rank == 0:
        from dlrmkit.device import resolve_device

        if resolve_device(cfg.device.device).type == "cpu":
            print("note: --precision fp16 on the CPU: most CPUs do fp16 arithmetic in software, several times "
                  "slower than fp32; bf16 is the CPU's half precision", file=sys.stderr)  # fmt: skip
    # members: a blend's, chosen by the search or named by --blend; searched: the search's run of its one choice
    recipe_text, members, searched = choose_recipe(cfg)
    check_tables_fit(cfg)
    if cfg.output.tensorboard:
        from dlrmkit.train.run_log import summary_writer_class

        summary_writer_class()  # a missing package is an error before training, not after
    run_folder = run_dir.setup(cfg, list(getattr(args, "_argv", None) or []))
    if members:  # each member trained as a run of its own, then their weighted mean scored
        from dlrmkit.train.blend import train_blend

        print(recipe_text)
        return finish(cfg, run_folder, train_blend(cfg, run_folder, members))
    from dlrmkit.train.refit import refit, skipped as refit_skipped, wanted as refit_wanted

    # the search trained this very run (outputs off): with a refit to come, it is taken over, not trained again
    taken = None
    try:
        if searched is not None and cfg.selection.refit and refit_skipped(cfg, parallel=False) is None:
            taken = searched[0].take_over(cfg, searched[2])  # None where cfg would train something else
        trainer = searched[0] if taken is not None else Trainer(cfg)
        del searched
        run_dir.share_checkpoint_dir(run_folder, trainer)
    except (DlrmkitError, RunEnded):  # refused before the first step, or a --resume of a run that ended:
        run_dir.abandon(run_folder)  # no folder it made is left behind, the run's files stay as they are
        raise
    if trainer.dist.rank == 0:
        print(recipe_text + "\n" if recipe_text else "", end="")
        print(f"validation rows: {trainer.val_source}")
        idle = [shown.split()[0] for _, shown in selection_options_on(cfg)]
        if trainer.val_set is None and idle:  # e.g. too few train rows to hold any out
            print(f"note: {', '.join(idle)} select nothing without validation rows: the last weights are kept")
        raw = raw_numerical_note(trainer)
        if raw:
            print(raw)
    run_dir.write_plan(run_folder, trainer)
    refitting = trainer.val_set is not None and refit_wanted(cfg, trainer.par is not None, trainer.dist.rank == 0)
    if refitting:  # the refit reads the test rows, once
        trainer.test_set = trainer.test_set.window(0, 0, "test")
    try:
        metrics = taken or trainer.fit(save=not refitting)
        if refitting:
            epochs = metrics["selected_step"] / len(trainer.loader)
            print(f"refit on the training and validation rows: {epochs:.2f} epochs, as selection chose (step "
                  f"{metrics['selected_step']})", flush=True)  # fmt: skip
            trainer, _, metrics = refit(trainer, metrics, read_test=True)
    except RuntimeError as exc:  # a dead or stopped peer: one line naming the collective
        from dlrmkit.faults import collective_failure

        message = collective_failure(exc, cfg.parallel.collective_timeout)
        if message is None:
            raise
        raise DlrmkitError(message) from None
    finish(cfg, run_folder, metrics, trainer.dist.rank)
    from dlrmkit.parallel.dist import shutdown

    if trainer.par is not None:
        trainer.par.close()
    shutdown()
    return 0


def raw_numerical_note(trainer) -> str:
    """A note where large numerical values reach the model as they are (a preset's recipe, not the
    auto one, which transforms them): a run that then diverges says only that its loss is NaN/Inf."""
    from dlrmkit.data.split_binary import RAW_NUMERICAL, numerical_scale

    mc = trainer.model_cfg
    if mc.numerical_transform != "none" or mc.numerical_mean is not None:
        return ""
    scale = numerical_scale(trainer.train_set)
    if not scale > RAW_NUMERICAL:
        return ""
    seen = "beyond float16's range" if math.isinf(scale) else f"up to {scale:,.0f}"
    return (
        f"note: numerical values {seen} reach the model raw (--numerical-transform none, --standardize-numerical "
        "false); --numerical-transform signed-log and --standardize-numerical true, as the auto recipe sets them, "
        "keep such values from stalling or diverging the training"
    )


def finish(cfg: TrainConfig, run_folder, metrics: dict, rank: int = 0) -> int:
    """The run's metrics written (metrics.json, --metrics-json), its summary and lift printed."""
    from dlrmkit.train import run_dir

    run_dir.write_metrics(run_folder, metrics)
    run_dir.drop_empty_checkpoint_dir(run_folder)
    if rank == 0:  # under torchrun only rank 0 writes and prints
        if cfg.output.metrics_json:
            run_dir.write_metrics_json(cfg.output.metrics_json, metrics)
        print(summary_line(metrics))
        lift = baseline_lift(cfg.data, metrics)
        if lift:
            print(lift)
        if cfg.output.tensorboard:
            from dlrmkit.train.run_log import read_log, since_restart, tensorboard

            tensorboard(since_restart(read_log(cfg.output.log_jsonl))[0], cfg.output.tensorboard)
    return 0


def choose_recipe(cfg: TrainConfig) -> tuple[str, list, tuple | None]:
    """--preset auto: fill unset options from the dataset's recipe (they reach config.yaml, so
    `train --config` repeats the run); returns what was chosen and why, for rank 0 to print, a
    blend's members, and the search's run of its one choice (recipe.select), all before the run
    folder is made."""
    if cfg.preset != AUTO:
        from dlrmkit.train.selection import cross_folds

        if cross_folds(cfg):
            raise DlrmkitError(
                f"--folds K trains one model per fold, the candidates of --preset auto's search; this run has --preset "
                f"{cfg.preset}: give --fold I too, to train the one model that fold I validates"
            )
        if cfg.selection.blend:
            raise DlrmkitError(
                f"--blend names candidates of --preset auto's search; this run has --preset {cfg.preset}"
            )
        return "", [], None
    from dlrmkit.train import recipe

    return recipe.select(cfg)  # a search over candidate recipes on the validation rows, where it can


def baseline_lift(data: str, metrics: dict) -> str:
    """The line comparing this run with `dlrmkit baseline` on the same dataset, when one was run."""
    from dlrmkit.data.feature_spec import FeatureSpec
    from dlrmkit.data.fingerprint import dataset_fingerprint
    from dlrmkit.train.baseline_result import read_baseline

    base = read_baseline(data, dataset_fingerprint(FeatureSpec.from_yaml(data)))
    if base is None or math.isnan(metrics["auc"]):
        return ""
    if base["stale"]:
        return (
            f"logistic-regression baseline ({base['path']}): not for this dataset as it is now (its files "
            f"changed, or an older dlrmkit wrote it); no lift printed: run `dlrmkit baseline --data {data}` again"
        )
    if metrics.get("refit") or metrics.get("folds"):  # the regression refitted as this run was, where the baseline has it
        auc = base.get("refit_test_auc")
        as_this = "as this run was" if metrics.get("refit") else "as this run's fold models saw them all"
        if not isinstance(auc, (int, float)) or math.isnan(auc):
            return (
                f"logistic-regression baseline ({base['path']}): no refit on the train and validation rows in it, "
                f"{as_this}; no lift printed: run `dlrmkit baseline --data {data}` again"
            )
        return (
            f"logistic-regression baseline ({base['path']}), refitted on the train and validation rows {as_this}: "
            f"test AUC {auc:.4f}, lift {metrics['auc'] - auc:+.4f} AUC"
        )
    return (
        f"logistic-regression baseline ({base['path']}): test AUC {base['test_auc']:.4f}, "
        f"lift {metrics['auc'] - base['test_auc']:+.4f} AUC"
    )
