"""`dlrmkit train --config run.yaml`: every CLI option may come from a YAML mapping whose keys
are the option names (`batch-size` or `batch_size`). The YAML values become the parser's
defaults and the command line is parsed again, so flags given on the command line win."""

from __future__ import annotations

import argparse
from typing import Any

import yaml

from dlrmkit.errors import DlrmkitError

# Keys that only say where a run writes, or that would recurse; never read from or written to YAML.
NOT_IN_CONFIG = {"config", "help"}


def _actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {a.dest: a for a in parser._actions if a.dest not in NOT_IN_CONFIG and not a.dest.startswith("_")}


def _convert(path: str, key: str, action: argparse.Action, value: Any) -> Any:
    """Check one YAML value as argparse would check the flag's text."""
    if value is None:
        return None
    if action.nargs == 0:  # store_true / store_false
        if not isinstance(value, bool):
            raise DlrmkitError(f"{path}: option '{key}' must be true or false, got {value!r}")
        return value if isinstance(action, argparse._StoreTrueAction) else not value
    if isinstance(value, (list, tuple)):
        value = ",".join(str(v) for v in value)
    if action.type is not None:
        try:
            value = action.type(value if isinstance(value, str) else str(value))
        except (ValueError, TypeError, argparse.ArgumentTypeError) as exc:
            raise DlrmkitError(f"{path}: option '{key}': invalid value {value!r} ({exc})") from None
    if action.choices is not None and value not in action.choices:
        raise DlrmkitError(f"{path}: option '{key}': {value!r} is not one of {', '.join(map(str, action.choices))}")
    return value


def load_config(path: str, parser: argparse.ArgumentParser) -> dict[str, Any]:
    """The YAML file as {dest: value}, validated against `parser`'s options."""
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except OSError as exc:
        raise DlrmkitError(f"{path}: cannot read config ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise DlrmkitError(f"{path}: not UTF-8 text") from None
    except yaml.YAMLError as exc:
        raise DlrmkitError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise DlrmkitError(f"{path}: a config file must be a mapping of option: value")
    actions = _actions(parser)
    out: dict[str, Any] = {}
    for key, value in data.items():
        dest = str(key).replace("-", "_")
        if dest not in actions:
            raise DlrmkitError(f"{path}: unknown option '{key}' (see `dlrmkit train --help`)")
        action = actions[dest]
        if action.nargs == 0 and not isinstance(action, argparse._StoreTrueAction):
            raise DlrmkitError(f"{path}: option '{key}' is not supported in a config file")
        out[dest] = _convert(path, str(key), action, value)
    return out


def apply_config(args: argparse.Namespace) -> argparse.Namespace:
    """Re-parse the command line with the config file's values as defaults (flags win)."""
    parser: argparse.ArgumentParser = args._parser
    values = load_config(args.config, parser)
    parser.set_defaults(**values)
    argv = list(getattr(args, "_argv", None) or [])
    # argv[0] is the subcommand ("train"); the top-level parser has no options of its own.
    new = parser.parse_args(argv[1:] if argv and not argv[0].startswith("-") else argv)
    new._argv = argv
    return new


def dump_config(values: dict[str, Any], path: str) -> None:
    """Write {dest: value} as YAML that `--config` reads back (keys with dashes, as on the CLI)."""
    from dlrmkit.atomic_io import write_text

    data = {k.replace("_", "-"): v for k, v in values.items()}
    write_text(path, yaml.safe_dump(data, sort_keys=False))
