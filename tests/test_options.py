"""Options defined once on TrainConfig's fields (dlrmkit.options): the command line and a
`--config` file refuse a bad value with the same validator's message, a file's unknown key or
non-boolean switch is one line, flags beat the file, config.yaml reads back to the same config,
and the commands sharing train's options share its checks."""

import dataclasses

import pytest
import yaml

from helpers import run_cli
from dlrmkit.cli import build_parser
from dlrmkit.config import TrainConfig
from dlrmkit.errors import DlrmkitError
from dlrmkit.options import sections, spec_map, specs, to_mapping
from dlrmkit.train.config_file import config_from_args, dump_config, load_config


def parse(*argv: str):
    """The namespace `dlrmkit ARGV` parses to (no command runs)."""
    argv = [str(a) for a in argv]
    return build_parser(argv).parse_args(argv)


def write(tmp_path, text: str):
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    "flag, value, message",
    [
        ("batch-size", "0", "must be >= 1, got 0"),
        ("lr", "-0.5", "must be > 0, got -0.5"),
        ("val-fraction", "1", "must be < 1, got 1"),
        ("keep", "0", "must be >= 1, got 0"),
        ("bottom-mlp", "0,16", "every size must be in [1, 65536], got 0"),
        ("wide", "maybe", "expected true or false, got 'maybe'"),
    ],
)
def test_a_range_is_refused_with_the_same_message_from_the_command_line_and_a_file(tmp_path, flag, value, message):
    cli = run_cli("train", "--data", tmp_path, f"--{flag}", value)
    assert cli.code == 2 and message in cli.err and f"--{flag}" in cli.err
    cfg = write(tmp_path, f"data: {tmp_path}\n{flag}: {value}\n")
    from_file = run_cli("train", "--config", cfg)
    assert from_file.code == 2 and message in from_file.err
    assert f"{cfg}: option '{flag}'" in from_file.err and len(from_file.err.strip().splitlines()) == 1


def test_a_choice_outside_the_list_is_refused_from_a_file(tmp_path):
    with pytest.raises(
        DlrmkitError, match=r"option 'optimizer': 'rmsprop' is not one of sgd, adagrad, split-sgd, lamb, adam, adamw"
    ):
        load_config(write(tmp_path, "optimizer: rmsprop\n"))


def test_an_unknown_key_names_the_file_and_the_key(tmp_path):
    path = write(tmp_path, "batch-size: 64\nshuffle: false\n")  # the field's name is not a key: the flag is
    with pytest.raises(DlrmkitError) as err:
        load_config(path)
    assert str(err.value) == f"{path}: unknown option 'shuffle' (see `dlrmkit train --help`)"
    with pytest.raises(DlrmkitError, match="unknown option 'config'"):  # no file names another file
        load_config(write(tmp_path, "config: other.yaml\n"))


def test_an_underscore_key_is_refused_with_the_flag_it_means(tmp_path):
    path = write(tmp_path, "data: D\nbatch_size: 5\n")
    with pytest.raises(DlrmkitError) as err:
        load_config(path)
    assert str(err.value) == f"{path}: unknown option 'batch_size' (keys are the flags: did you mean 'batch-size'?)"
    with pytest.raises(DlrmkitError, match="did you mean 'no-shuffle'"):
        load_config(write(tmp_path, "no_shuffle: true\n"))


def test_written_configs_use_the_flags_as_keys(tmp_path):
    """What dlrmkit writes (a run's config.yaml, tune's best.yaml: dump_config) reads back: no underscore keys."""
    values = {s.name: s.default for s in specs(TrainConfig)}
    path = tmp_path / "all.yaml"
    dump_config(values, str(path))
    keys = list(yaml.safe_load(path.read_text()))
    assert keys and not [k for k in keys if "_" in k]


def test_booleans_from_a_file(tmp_path):
    values = load_config(write(tmp_path, "wide: yes\nrestore-best: false\nno-shuffle: true\nresume: true\n"))
    assert values == {"wide": True, "restore_best": False, "shuffle": False, "resume": True}
    assert load_config(write(tmp_path, "no-progress: false\n")) == {"progress": True}
    with pytest.raises(DlrmkitError, match=r"option 'no-shuffle' must be true or false, got 'yes'"):
        load_config(write(tmp_path, "no-shuffle: 'yes'\n"))
    with pytest.raises(DlrmkitError, match=r"option 'data': invalid value"):
        load_config(write(tmp_path, "data: {a: 1}\n"))


def test_flags_given_on_the_command_line_beat_the_file_and_the_file_beats_defaults(tmp_path):
    path = write(tmp_path, "data: D\nbatch-size: 128\nlr: 0.5\nno-shuffle: true\nkeep: 5\nbottom-mlp: [32, 8]\n")
    cfg = config_from_args(parse("train", "--config", path, "--lr", "0.25", "--keep", "2"))
    assert cfg.optimizer.lr == 0.25 and cfg.checkpoint.keep_checkpoints == 2  # flags win, even one equal to the default
    assert cfg.schedule.batch_size == 128 and cfg.shuffle is False and cfg.model.bottom_mlp == [32, 8]  # from the file
    assert cfg.selection.eval_batch_size == 16384 and cfg.device.precision == "fp32"  # neither: the field's default
    with pytest.raises(DlrmkitError, match="--data is required"):
        config_from_args(parse("train", "--lr", "0.1"))


def test_a_flag_clears_the_file_value_it_excludes(tmp_path):
    """A run's config.yaml holds both epochs (the preset's) and max-steps; --epochs on the command
    line wins over both, as it would over a --max-steps given beside it there."""
    path = write(tmp_path, "data: D\nepochs: 6\nmax-steps: 60\n")
    cfg = config_from_args(parse("train", "--config", path, "--epochs", "1"))
    assert cfg.schedule.epochs == 1 and cfg.schedule.max_steps is None
    cfg = config_from_args(parse("train", "--config", path, "--max-steps", "5"))
    assert cfg.schedule.max_steps == 5 and cfg.schedule.epochs is None
    cfg = config_from_args(parse("train", "--config", path, "--lr", "0.1"))
    assert cfg.schedule.epochs == 6 and cfg.schedule.max_steps == 60


def test_the_dumped_config_reads_back_to_the_same_config(tmp_path):
    cfg = TrainConfig.of(
        data="D",
        preset="small",
        batch_size=64,
        max_steps=9,
        lr=0.3,
        optimizer="adagrad",
        embedding_optimizer="rowwise-adagrad",
        val_fraction=0.2,
        restore_best=False,
        wide=True,
        numerical_transform="signed-log",
        keep_checkpoints=4,
        final_checkpoint=False,
        shuffle=False,
        progress=False,
        seed=7,
        bottom_mlp=[32, 16],
        top_mlp=[8, 1],
        checkpoint_every_seconds=2.5,
        sharding="row_wise",
        threads=3,
    )
    path = tmp_path / "config.yaml"
    dump_config(cfg, str(path))
    text = yaml.safe_load(path.read_text())
    assert text["no-shuffle"] is True and text["keep"] == 4 and text["no-final-checkpoint"] is True
    assert TrainConfig.of(**load_config(path)) == cfg
    assert config_from_args(parse("train", "--config", path)) == cfg


def test_every_train_field_is_an_option_checked_as_text():
    names = {f.name for f in dataclasses.fields(TrainConfig) if f.name not in sections(TrainConfig)}
    names |= {f.name for inner in sections(TrainConfig).values() for f in dataclasses.fields(inner)}
    assert set(spec_map(TrainConfig)) == names  # nothing in TrainConfig or its sections escapes the command line
    for s in specs(TrainConfig):
        assert s.option.help, s.name
        if s.kind == "value" and s.default is not None and s.option.choices is None and s.parse is not None:
            assert s.parse(str(s.default)) == s.default, s.name  # the default passes its own check
        if s.option.choices is not None and s.default is not None:
            assert s.default in s.option.choices, s.name
    flags = [s.flag for s in specs(TrainConfig)]
    assert len(flags) == len(set(flags))
    assert to_mapping(TrainConfig, {"shuffle": True, "keep_checkpoints": 3}) == {"keep": 3, "no-shuffle": False}


@pytest.mark.parametrize(
    "argv",
    [
        ("bench", "--lr", "0"),
        ("plan", "--world-size", "2", "--batch-size", "0"),
        ("tune", "--data", "D", "--trials", "1", "--seed", "-1"),
    ],
)
def test_commands_sharing_train_options_share_its_checks(capsys, argv):
    flag = argv[-2]
    with pytest.raises(SystemExit):
        parse("train", flag, argv[-1])
    train_err = capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse(*argv)
    err = capsys.readouterr().err
    assert err.split(f"argument {flag}:")[1] == train_err.split(f"argument {flag}:")[1].replace("train", argv[0])


def test_shared_options_keep_each_command_default_and_narrower_choices(capsys):
    bench = parse("bench")
    assert (bench.batch_size, bench.lr, bench.optimizer, bench.precision) == (2048, 0.01, "sgd", "fp32")
    with pytest.raises(SystemExit):
        parse("bench", "--precision", "fp16")  # train has fp16; bench does not time it
    assert "invalid choice: 'fp16'" in capsys.readouterr().err
    assert parse("plan", "--dim", "8").embedding_dim == 8
    evaluate = parse("evaluate", "--data", "D", "--checkpoint", "C")
    assert (evaluate.sharding, evaluate.loader, evaluate.plan, evaluate.backend) == ("auto", "exchange", None, None)


def test_choices_kept_torch_free_agree_with_the_modules_that_use_them():
    """The parser is built before torch is imported, so a few choice lists live beside the
    fields; they must name exactly what the torch-side code accepts."""
    from dlrmkit.parallel.options import SHARDINGS
    from dlrmkit.optim import build
    from dlrmkit.parallel.sharding import STRATEGIES
    from dlrmkit.precision import PRECISIONS

    by_name = spec_map(TrainConfig)
    assert by_name["precision"].option.choices == PRECISIONS
    assert set(SHARDINGS) == {"auto", *STRATEGIES} and by_name["sharding"].option.choices == SHARDINGS
    assert by_name["optimizer"].option.choices == build.OPTIMIZERS
    assert by_name["embedding_optimizer"].option.choices == build.EMBEDDING_OPTIMIZERS


@pytest.mark.parametrize(
    "text, key, shape",
    [
        ("bottom-mlp: [[32], [8]]\n", "bottom-mlp", "a nested list or mapping"),  # not silently 32,8
        ("top-mlp: [64, {a: 1}]\n", "top-mlp", "a nested list or mapping"),
        ("batch-size: {a: 1}\n", "batch-size", "a mapping"),  # a mapping where a number goes
        ("lr: [0.1, 0.2]\n", "lr", "a list"),  # a list where one number goes
        ("data: [a, b]\n", "data", "a list"),  # a list where a string goes
        ("optimizer: [sgd]\n", "optimizer", "a list"),
        ("wide: [true]\n", "wide", "a list"),
        ("bottom-mlp: {a: 1}\n", "bottom-mlp", "a mapping"),
    ],
)
def test_a_value_of_the_wrong_shape_is_one_line_naming_the_key(tmp_path, text, key, shape):
    path = write(tmp_path, text)
    with pytest.raises(DlrmkitError) as err:
        load_config(path)
    message = str(err.value)
    assert message.startswith(f"{path}: option '{key}': invalid value") and f"got {shape})" in message
    assert "\n" not in message


def test_a_wrong_shape_from_the_command_line_config_exits_2_with_one_line(tmp_path):
    path = write(tmp_path, f"data: {tmp_path}\nbottom-mlp: [[32], [8]]\n")
    cli = run_cli("train", "--config", path)
    assert cli.code == 2 and f"{path}: option 'bottom-mlp'" in cli.err
    assert len(cli.err.strip().splitlines()) == 1
    assert load_config(write(tmp_path, "bottom-mlp: [32, 8]\ntop-mlp: 64,1\n")) == {
        "bottom_mlp": [32, 8],
        "top_mlp": [64, 1],
    }  # a flat list or the flag's text: both fine


@pytest.mark.parametrize("text, key", [("dcn-layers: 100000\n", "dcn-layers"), ("dcn-rank: 70000\n", "dcn-rank")])
def test_a_value_past_the_models_bounds_names_the_config_file_and_key(tmp_path, text, key):
    path = write(tmp_path, text)
    with pytest.raises(DlrmkitError) as err:
        load_config(path)
    assert str(err.value).startswith(f"{path}: option '{key}': invalid value"), str(err.value)
