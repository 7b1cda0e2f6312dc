"""The run folder every `dlrmkit train` writes: `config.yaml` (the resolved options, which
`dlrmkit train --config` accepts, so the run can be repeated), `plan.json` (model shape, table
placement), `run.json` (where the log and checkpoints are), `log.jsonl` (JSON-lines metrics),
`checkpoints/` and `metrics.json`. `dlrmkit report RUN` reads it."""

from __future__ import annotations

import contextlib

import json
import os
import time
from dataclasses import asdict, dataclass
from typing import Any

from dlrmkit.atomic_io import (
    hold_output_lock,
    make_dirs,
    nonfinite_keys,
    os_error_text,
    release_output_locks,
    write_json,
    write_text,
)
from dlrmkit.config import RECIPE_FIELDS, TrainConfig
from dlrmkit.errors import DlrmkitError
from dlrmkit.options import specs
from dlrmkit.parallel.options import torchrun_env
from dlrmkit.train.config_file import OUTPUT_OPTIONS, dump_config

# Options that say where a run writes (not what it computes): left out of config.yaml, so
# repeating a run with --config never writes into the old run's folder.
WHERE_OPTIONS = {*OUTPUT_OPTIONS, "resume"}


@dataclass
class RunDir:
    path: str
    log_jsonl: str
    checkpoint_dir: str | None
    # config.yaml's options and run.json's start and command, not yet written: a --resume writes
    # them once its checkpoint is accepted (write_run_files), so a refused one leaves the folder as it was
    pending: tuple[dict[str, Any], dict[str, Any]] | None = None
    made: bool = False  # the folder did not exist before this run (abandon may remove it again)
    made_root: str | None = None  # runs/, where this run made it for its fresh folder (abandon, likewise)

    def file(self, name: str) -> str:
        return os.path.join(self.path, name)


RUN_JSON_FORMAT = 2  # run.json keeps paths inside the run folder relative to it (older ones: absolute)


def stored_path(path: str | None, folder: str) -> str | None:
    """A path as run.json keeps it: relative to the run folder where it lies inside it (the folder
    may be moved or copied whole), absolute where it lies elsewhere (--log-jsonl or --checkpoint-dir
    outside the run folder)."""
    if path is None:
        return None
    full, base = os.path.abspath(path), os.path.abspath(folder)
    return os.path.relpath(full, base) if os.path.commonpath([full, base]) == base else full


def is_rank_zero() -> bool:
    return torchrun_env().rank == 0


def new_run_path(root: str = "runs") -> str:
    """runs/<YYYYmmdd-HHMMSS>[-k]: a fresh folder, never one another process just took."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for k in range(1000):
        path = os.path.join(root, stamp if k == 0 else f"{stamp}-{k}")
        try:
            os.makedirs(path)
            return path
        except FileExistsError:
            if not os.path.isdir(root):
                raise DlrmkitError(
                    f"{root}: is a file; runs are written into a folder of that name (or pass --run-dir)"
                ) from None
            continue
        except OSError as exc:
            raise DlrmkitError(f"{path}: cannot create the run folder ({os_error_text(exc)}); pass --run-dir") from None
    raise DlrmkitError(f"cannot create a fresh run folder under {root}")


RUN_FILES = ("config.yaml", "run.json", "log.jsonl", "plan.json", "metrics.json")


def check_run_dir(path: str | None) -> None:
    """An existing --run-dir that is not a run folder (no run.json) must not hold a file a run
    writes there (config.yaml, log.jsonl, plan.json, metrics.json): it would replace someone
    else's file. Other entries stay as they are. Rank 0 checks: it alone writes those files (other
    ranks may already have made `checkpoints/` in it)."""
    if not path or not os.path.isdir(path) or not is_rank_zero():
        return
    names = set(os.listdir(path))
    taken = sorted(names & set(RUN_FILES))
    if taken and "run.json" not in names:
        raise DlrmkitError(
            f"--run-dir {path}: holds '{taken[0]}' and is not a run folder (no run.json); a run would replace "
            f"it: give a new or empty folder, or move the file"
        )


def only_stopped(path: str) -> bool:
    """The log holds nothing but how its run stopped (run_log.stop_record): a run that failed or was
    interrupted before it logged anything else, which left nothing to continue."""
    from dlrmkit.train.run_log import read_log

    if os.path.getsize(path) > 16 << 10:  # a stop record is a few hundred bytes
        return False
    try:
        records = read_log(path)
    except (DlrmkitError, OSError):  # not a log: another run's file, never reused
        return False
    return bool(records) and all(r.get("event") in ("failed", "interrupted") for r in records)


def check_fresh_log(path: str | None, option: str, folder: str | None = None) -> None:
    """A run without --resume must not append to another run's log: two runs' records (steps from
    1 again, two `end` records) would mix in one file, and `report` would read them as one run.
    Refused, as another run's checkpoints are (dlrmkit.checkpoint.dirs.check_fresh_directory);
    the file is never deleted. An empty log, or one holding only the `failed` or `interrupted`
    record of a run that stopped before its first other record, is reused, and a stream the caller
    opened (/dev/stdout, /dev/fd/N: e.g. `>> file`) is the caller's."""
    if not path or not os.path.isfile(path) or os.path.getsize(path) == 0 or only_stopped(path):
        return
    if os.path.abspath(path).startswith(("/dev/std", "/dev/fd/", "/proc/")):
        return
    if folder is None:
        raise DlrmkitError(
            f"{option} {path}: already holds another run's log; pass --resume to continue that run, "
            f"or choose a new file"
        )
    raise DlrmkitError(
        f"{option} {folder} already holds the log of another run ({os.path.basename(path)}); "
        f"pass --resume to continue it, or give a new or empty {option}"
    )


def lock_outputs(run_dir: str | None, run: RunDir) -> None:
    """One writer per folder: rank 0 holds `<folder>.lock` on --run-dir and on the checkpoint folder
    until the command ends (dlrmkit.atomic_io.output_lock), so a second `train` (or a --resume of
    the same run) writing either stops with one line before any work. A run folder made fresh
    (runs/<time>) is this process's alone already."""
    if not is_rank_zero():
        return
    if run_dir:
        hold_output_lock(run.path, "--run-dir")
    if run.checkpoint_dir:
        make_dirs(os.path.dirname(os.path.abspath(run.checkpoint_dir)) or ".", "--checkpoint-dir")
        hold_output_lock(run.checkpoint_dir, "--checkpoint-dir")


def resolved_options(cfg: TrainConfig) -> dict[str, Any]:
    """Every train option as the run used it (preset defaults filled in), minus output paths."""
    res = cfg.resolved()
    out: dict[str, Any] = {}
    for s in specs(TrainConfig):
        if s.name in WHERE_OPTIONS:
            continue
        value = s.get(cfg)
        if cfg.selection.blend:  # each member fills its own recipe (recipe.member_configs): what was given
            if value is not None:
                out[s.name] = value
            continue
        if s.name in RECIPE_FIELDS and value is None:
            value = s.get(res)
        out[s.name] = value
    return out


def setup(cfg: TrainConfig, argv: list[str]) -> RunDir:
    """Create the run folder, point the config's log and checkpoints into it, write config.yaml
    (its options taken before the folders are filled in, so it holds only what was asked) and
    run.json. With --resume both wait until the checkpoint is accepted (write_run_files): a resume
    refused (another dataset, another model) leaves the run's files as they were."""
    options = resolved_options(cfg)
    ck, out = cfg.checkpoint, cfg.output
    own_checkpoint_dir = ck.checkpoint_dir is not None
    multi_rank = torchrun_env().world_size > 1
    path = out.run_dir
    made = not path or not os.path.lexists(path)
    made_root = "runs" if not path and is_rank_zero() and not os.path.lexists("runs") else None
    if path:
        make_dirs(path, "--run-dir")
    elif multi_rank:
        # ranks must agree on folders; without --run-dir only rank 0 keeps a folder, for the record
        path = new_run_path() if is_rank_zero() else os.path.join("runs", f".rank{torchrun_env().rank}")
    else:
        path = new_run_path()
    if ck.checkpoint_dir is None and not ck.resume and not (multi_rank and not out.run_dir):
        ck.checkpoint_dir = os.path.join(path, "checkpoints")
    elif ck.checkpoint_dir is None and ck.resume and out.run_dir:
        ck.checkpoint_dir = os.path.join(path, "checkpoints")
    if out.log_jsonl is None:
        out.log_jsonl = (
            os.path.join(ck.checkpoint_dir, "log.jsonl") if own_checkpoint_dir else os.path.join(path, "log.jsonl")
        )
    run = RunDir(path, out.log_jsonl, ck.checkpoint_dir, made=made and is_rank_zero(), made_root=made_root)
    lock_outputs(out.run_dir, run)
    log_folder = os.path.dirname(os.path.abspath(run.log_jsonl))
    inside = log_folder in {os.path.abspath(p) for p in (path, run.checkpoint_dir) if p}
    if inside and os.path.islink(run.log_jsonl):  # appended without following links (run_log.append_record)
        raise DlrmkitError(
            f"{run.log_jsonl}: is a symbolic link; a log inside an output folder is never written through one "
            f"(remove the link)"
        )
    if not ck.resume and is_rank_zero() and os.path.dirname(os.path.abspath(run.log_jsonl)) == os.path.abspath(path):
        write_text(run.log_jsonl, "")  # the fresh run's log (another run's was refused: check_fresh_log)
    if is_rank_zero():
        run.pending = (options, {"started": time.strftime("%Y-%m-%dT%H:%M:%S"), "argv": argv})
        if not ck.resume:
            write_run_files(run)
    return run


def abandon(run: RunDir) -> None:
    """A run refused before its first step (a --resume refused, data the model cannot read) leaves
    no folder behind that it made: what setup wrote there (config.yaml, run.json, an empty log, an
    empty checkpoints/) goes, then the folder, if nothing else is in it. A folder that was there
    before is left as it is. The files go while this run holds its folders' locks; the folders after
    the locks are released (a lock file of the checkpoint folder lies in the run folder), and only
    while empty, so another run that took them in between keeps what it wrote; so does `runs/`,
    where this run made it."""
    if not run.made:
        return
    own = [run.file("config.yaml"), run.file("run.json")]
    log = run.file("log.jsonl")
    if os.path.isfile(log) and not os.path.islink(log) and os.path.getsize(log) == 0:
        own.append(log)
    for name in own:
        with contextlib.suppress(FileNotFoundError):
            os.remove(name)
    release_output_locks()  # the command is ending: what it held is released now rather than on return
    for folder in (run.file("checkpoints"), run.path, *([run.made_root] if run.made_root else [])):
        with contextlib.suppress(OSError):  # only an empty folder goes
            os.rmdir(folder)


def run_info(run: RunDir, extra: dict[str, Any]) -> dict[str, Any]:
    """run.json: where the log and checkpoints are (relative to the run folder where inside it)."""
    return {
        "format": RUN_JSON_FORMAT,
        "log_jsonl": stored_path(run.log_jsonl, run.path),
        "checkpoint_dir": stored_path(run.checkpoint_dir, run.path),
        **extra,
    }


def write_run_files(run: RunDir) -> None:
    """config.yaml and run.json, where setup left them to write (rank 0; once)."""
    if run.pending is None or not is_rank_zero():
        return
    options, extra = run.pending
    dump_config(options, run.file("config.yaml"))
    write_json(run.file("run.json"), run_info(run, extra))
    run.pending = None


def update_run_json(run: RunDir, **fields: Any) -> None:
    info_path = run.file("run.json")
    with open(info_path, encoding="utf-8") as f:
        info = json.load(f)
    write_json(info_path, {**info, **fields})


def share_checkpoint_dir(run: RunDir, trainer: Any) -> None:
    """Called once the trainer exists, so a --resume's checkpoint is accepted: its config.yaml and
    run.json are written now (write_run_files). Under torchrun without --run-dir or
    --checkpoint-dir, ranks learn rank 0's run folder (the process group exists now) and
    checkpoint into its `checkpoints/`, as one process does; the ranks must share that folder (one
    machine, or a shared filesystem)."""
    write_run_files(run)
    ck = trainer.cfg.checkpoint
    if ck.checkpoint_dir is not None or ck.resume or trainer.dist.world_size == 1:
        return
    import torch.distributed as dist

    box = [os.path.abspath(run.path) if is_rank_zero() else None]
    dist.broadcast_object_list(box, src=0, group=trainer.dist.cpu_group)
    ck.checkpoint_dir = run.checkpoint_dir = os.path.join(box[0], "checkpoints")
    if is_rank_zero():
        update_run_json(run, checkpoint_dir=stored_path(run.checkpoint_dir, run.path))


def drop_empty_checkpoint_dir(run: RunDir) -> None:
    """The run folder's own checkpoints/ (made at start-up to check it can be written) left empty
    (--no-final-checkpoint, nothing saved on the way) is removed, and run.json says so: no empty
    folder pretends to hold checkpoints. A --checkpoint-dir the user named is left as it is."""
    own = os.path.join(run.path, "checkpoints")
    if not is_rank_zero() or run.checkpoint_dir is None or os.path.abspath(run.checkpoint_dir) != os.path.abspath(own):
        return
    try:
        os.rmdir(own)  # only an empty folder goes
    except FileNotFoundError:
        pass  # never made (a blend whose members saved nothing)
    except OSError:
        return
    update_run_json(run, checkpoint_dir=None)


def write_plan(run: RunDir, trainer: Any) -> None:
    """plan.json: the model shape, and the sharding plan when the trainer has one."""
    if not is_rank_zero():
        return
    plan: dict[str, Any] = {
        "world_size": torchrun_env().world_size,
        "model_config": asdict(trainer.model_cfg),
    }
    sharding = getattr(trainer, "plan", None)
    if sharding is not None:
        plan["sharding_plan"] = sharding.to_dict() if hasattr(sharding, "to_dict") else str(sharding)
    write_json(run.file("plan.json"), plan)


def write_metrics(run: RunDir, metrics: dict[str, Any]) -> None:
    write_run_files(run)  # a --resume's, where nothing wrote them once its checkpoint was accepted
    if is_rank_zero():
        write_metrics_json(run.file("metrics.json"), metrics)


def write_metrics_json(path: str, metrics: dict[str, Any]) -> None:
    """Strict JSON: a NaN or infinite value (e.g. the AUC of a test set holding one class) is
    written as null and named under `nonfinite`."""
    bad = nonfinite_keys(metrics)
    write_json(path, {**metrics, "nonfinite": bad} if bad else metrics)


def read_run(path: str) -> dict[str, Any]:
    """run.json plus config.yaml of a run folder (for `report`), read as untrusted files. The log
    and checkpoint paths come back resolved: one inside the run folder against the folder given
    (a run folder moved or copied reads its own files, never the original's)."""
    from dlrmkit.untrusted import load_json, load_yaml

    info_path = os.path.join(path, "run.json")
    if not os.path.lexists(info_path):
        raise DlrmkitError(f"{path}: not a run folder (no run.json; `dlrmkit train --run-dir` writes one)")
    info = load_json(info_path, "run description", 1 << 20)  # regular file, bounded: a FIFO never blocks
    if not isinstance(info, dict) or not isinstance(info.get("log_jsonl"), str):
        raise DlrmkitError(f'{info_path}: not a run description (needs a "log_jsonl" path)')
    legacy = info.get("format") != RUN_JSON_FORMAT
    info["log_jsonl"] = run_path(info["log_jsonl"], path, info_path, "log_jsonl", legacy)
    ck = info.get("checkpoint_dir")
    info["checkpoint_dir"] = run_path(ck, path, info_path, "checkpoint_dir", legacy) if isinstance(ck, str) else None
    cfg_path = os.path.join(path, "config.yaml")
    info["config"] = {}
    if os.path.lexists(cfg_path):
        cfg = load_yaml(cfg_path, "run config", 1 << 20)
        info["config"] = cfg if isinstance(cfg, dict) else {}
    return info


def run_path(value: str, folder: str, info_path: str, field: str, legacy: bool) -> str:
    """A path from run.json: a relative one lies in the run folder (one that leaves it is refused);
    an absolute one is a log or checkpoint folder outside it, taken as it is. run.json of older
    versions held absolute paths for the run folder's own files too: where such a path lies outside
    the folder given and its last one or two parts (`log.jsonl`, `checkpoints`, `C/log.jsonl`)
    name something inside that folder, the folder's own is read (the folder was moved or copied)."""
    if "\0" in value or not value:
        raise DlrmkitError(f"{info_path}: field '{field}' is {value!r:.80}, not a path")
    if not os.path.isabs(value):
        rel = os.path.normpath(value)
        if rel == os.pardir or rel.startswith(os.pardir + os.sep):
            raise DlrmkitError(f"{info_path}: field '{field}' is {value!r:.80}, a relative path out of the run folder")
        return os.path.join(folder, rel)
    full, base = os.path.normpath(value), os.path.abspath(folder)
    if not legacy or os.path.commonpath([full, base]) == base:
        return full
    parts = full.split(os.sep)
    for k in (1, 2):
        if len(parts) > k + 1 and os.path.lexists(own := os.path.join(folder, *parts[-k:])):
            return own
    return full
