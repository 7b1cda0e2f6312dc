"""`dlrmkit train --config run.yaml`: every train option may come from a YAML mapping whose keys
are the flags (`batch-size`, `no-shuffle: true`; `batch_size` is refused, naming `batch-size`),
flat whatever section of TrainConfig holds the option. Keys and values are checked against the
same field definitions as the command line (dlrmkit.options over TrainConfig), so a bad value gets
the same validator's message, and a value of the wrong shape (a mapping, a list where one value
goes) is one line naming the key; flags given on the command line win."""

from __future__ import annotations

import argparse
from typing import Any

import yaml

from dlrmkit.config import TrainConfig
from dlrmkit.errors import DlrmkitError
from dlrmkit.options import flatten, from_mapping, given, spec_map, specs, to_mapping
from dlrmkit.train.options import OUTPUT_PATHS
from dlrmkit.untrusted import MiB, load_yaml

MAX_CONFIG = MiB  # a config file of every option is a few KiB
# where a run writes comes from the command line only: a config file from elsewhere never chooses
# which files are written or replaced (a run's own config.yaml leaves these out, dlrmkit.train.run_dir)
OUTPUT_OPTIONS = OUTPUT_PATHS


def load_config(path: str) -> dict[str, Any]:
    """The YAML file as {TrainConfig option (flat name): checked value}."""
    data = load_yaml(path, "config file", MAX_CONFIG)  # bounded: size, nesting, alias expansion
    if data is None:
        return {}
    return check_config(path, data)


def check_config(where: str, data: Any) -> dict[str, Any]:
    """A config file's mapping (flag keys) as {TrainConfig option (flat name): checked value}."""
    if not isinstance(data, dict):
        raise DlrmkitError(f"{where}: a config file must be a mapping of option: value")
    values = from_mapping(where, TrainConfig, data, "train")
    for name in OUTPUT_OPTIONS:
        if values.get(name) is not None:  # a null (as dump_config writes an unset field) says nothing
            flag = name.replace("_", "-")
            raise DlrmkitError(
                f"{where}: '{flag}' says where the run writes; give --{flag} on the command line "
                "(a config file never chooses which files are written)"
            )
    return values


def check_dumped(where: str, values: Any) -> None:
    """{option (flat name): value} from elsewhere (a shared tune study's trial), checked as the
    file `dump_config` writes of it is checked when `--config` reads it back."""
    if not isinstance(values, dict):
        raise DlrmkitError(f"{where}: must be a mapping of option: value, not {type(values).__name__}")
    unknown = [k for k in values if k not in spec_map(TrainConfig)]
    if unknown:
        raise DlrmkitError(f"{where}: unknown train option {str(unknown[0])[:60]!r}")
    check_config(where, to_mapping(TrainConfig, values))


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """The run's config: field defaults, then the --config file, then the flags given (the parser
    leaves options not given off `args`, so a file value is never hidden by a default)."""
    values = config_values(getattr(args, "config", None), given(TrainConfig, args))
    if not values.get("data"):
        raise DlrmkitError("--data is required (on the command line or in --config)")
    return TrainConfig.of(**values)


def config_values(config: str | None, flags: dict[str, Any]) -> dict[str, Any]:
    """{option (flat name): value} of the --config file `config` (None: none) with the flags given,
    `flags`, over it. A flag also clears the file's value of an option it excludes on the command
    line: `--epochs 1` over a config.yaml holding `max-steps` trains one epoch. `dlrmkit plan
    --config` reads train's options through this too."""
    values = load_config(config) if config else {}
    taken = {s.option.group for s in specs(TrainConfig) if s.option.group and s.name in flags}
    for s in specs(TrainConfig):
        if s.option.group in taken and s.name not in flags:
            values.pop(s.name, None)
    values.update(flags)
    return values


def dump_config(values: TrainConfig | dict[str, Any], path: str) -> None:
    """Write a TrainConfig, or {option (flat name): value}, as YAML that `--config` reads back
    (flat keys as the flags)."""
    from dlrmkit.atomic_io import write_text

    if isinstance(values, TrainConfig):
        values = flatten(values)
    write_text(path, yaml.safe_dump(to_mapping(TrainConfig, values), sort_keys=False))
