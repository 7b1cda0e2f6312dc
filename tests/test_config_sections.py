"""TrainConfig in sections owned by their components: each option in one section (or TrainConfig's
own few), flat names and file keys unchanged, the manifest of a checkpoint holding the options in
the flat form earlier checkpoints hold, the torchrun-only options and the collective timeout's
default taken from the parallel section, and the sections' modules free of torch."""

import dataclasses
import inspect
import subprocess
import sys

import pytest

from dlrmkit.config import TrainConfig
from dlrmkit.options import build, flatten, sections, spec_map, specs
from dlrmkit.parallel.options import COLLECTIVE_TIMEOUT_S, ParallelOptions, torchrun_only

# the options of TrainConfig when it was one flat dataclass (later options add to them): a
# checkpoint's manifest holds them so
FLAT_OPTIONS = (
    "data preset batch_size epochs max_steps lr optimizer embedding_optimizer lamb_lr precision comm_dtype "
    "warmup_steps decay_start decay_steps eval_every val_fraction patience restore_best embedding_weight_decay "
    "wide embedding_init_scale numerical_transform eval_batch_size target_auc checkpoint_dir checkpoint_every "
    "checkpoint_every_seconds collective_timeout keep_checkpoints final_checkpoint skip_nonfinite resume "
    "metrics_json log_jsonl seed shuffle threads progress run_dir tensorboard log_every embedding_dim bottom_mlp "
    "top_mlp device table_placement sharding plan loader backend bind_cores "
    "interaction dcn_layers dcn_rank evals_per_epoch"
).split()


def test_every_option_sits_in_one_section_with_its_flat_name_kept():
    assert set(sections(TrainConfig)) == {
        "model",
        "optimizer",
        "schedule",
        "selection",
        "checkpoint",
        "output",
        "device",
        "parallel",
    }
    by_name = spec_map(TrainConfig)
    assert set(FLAT_OPTIONS) <= set(by_name)  # every earlier name kept, flat
    own = sorted(name for name, s in by_name.items() if s.section is None)
    assert own == ["data", "preset", "seed", "shuffle"]
    assert by_name["collective_timeout"].section == "parallel" and by_name["lr"].section == "optimizer"
    assert by_name["keep_checkpoints"].key == "keep"  # the file key is still the flag


def test_flat_names_build_the_nested_config_and_back():
    cfg = TrainConfig.of(data="D", batch_size=64, lr=0.5, keep_checkpoints=3, sharding="row_wise", shuffle=False)
    assert cfg.schedule.batch_size == 64 and cfg.optimizer.lr == 0.5 and cfg.checkpoint.keep_checkpoints == 3
    assert cfg.parallel.sharding == "row_wise" and cfg.shuffle is False
    assert build(TrainConfig, flatten(cfg)) == cfg
    with pytest.raises(TypeError, match="learning_rate"):
        TrainConfig.of(data="D", learning_rate=1.0)


def test_a_checkpoint_manifest_holds_the_options_flat_as_before():
    """Checkpoints written before the sections hold `train_config` flat; new ones hold the same
    form, so readers of either (predict's `train_config.data`) see one shape."""
    from dlrmkit.checkpoint.state import checkpoint_meta
    from dlrmkit.model.config import ModelConfig

    cfg = TrainConfig.of(data="D", batch_size=64)
    meta = checkpoint_meta(ModelConfig(1, [4]), flatten(cfg), step=1)
    assert list(meta["train_config"]) == [s.name for s in specs(TrainConfig)]
    assert set(FLAT_OPTIONS) <= set(meta["train_config"]) and not any(
        isinstance(v, dict) for v in meta["train_config"].values()
    )
    assert meta["train_config"]["data"] == "D" and meta["train_config"]["batch_size"] == 64


def test_torchrun_only_options_are_the_parallel_section():
    assert torchrun_only() == tuple(f.name for f in dataclasses.fields(ParallelOptions))
    assert {"sharding", "plan", "loader", "backend", "comm_dtype", "collective_timeout", "bind_cores"} == set(
        torchrun_only()
    )


def test_the_collective_timeout_default_is_written_once():
    from dlrmkit.parallel.dist import init_distributed

    assert ParallelOptions().collective_timeout == COLLECTIVE_TIMEOUT_S
    assert inspect.signature(init_distributed).parameters["timeout_s"].default == COLLECTIVE_TIMEOUT_S
    assert spec_map(TrainConfig)["collective_timeout"].help().endswith(f"(default {COLLECTIVE_TIMEOUT_S:g})")


def test_setup_parallel_takes_the_typed_section():
    from dlrmkit.parallel.hybrid import setup_parallel

    source = inspect.getsource(setup_parallel)
    assert "getattr(" not in source
    assert inspect.signature(setup_parallel).parameters["opts"].annotation in ("ParallelOptions", ParallelOptions)


def test_the_sections_import_no_torch():
    code = "import sys\nimport dlrmkit.config, dlrmkit.train.config_file\nprint('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
