"""Options defined once, on dataclass fields. A config dataclass declares each option with
`option(...)` (default, help, validator, choices); from those fields this module builds the
argparse options, reads and checks config files, and writes them back. So the command line, a
`--config` YAML file and the dataclass cannot disagree on a name, a default or a range: there is
one definition of each. Imports no torch: parsers are built before a command is chosen."""

from __future__ import annotations

import argparse
import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from dlrmkit.cli_types import boolean
from dlrmkit.errors import DlrmkitError

_KEY = "dlrmkit.option"


@dataclass(frozen=True)
class Option:
    """What a field needs to be an option besides its name, type and default."""

    help: str
    parse: Callable[[str], Any] | None = None  # a dlrmkit.cli_types validator: range checks live there
    choices: tuple[str, ...] | None = None
    flag: str | None = None  # default: --field-name
    negate: bool = False  # a bool that is True unless `flag` (e.g. --no-shuffle) is given
    group: str | None = None  # options sharing a group exclude each other on the command line
    metavar: str | None = None


def option(default: Any = dataclasses.MISSING, help: str = "", **kw: Any) -> Any:
    """A dataclass field that is also a command-line option and a config-file key."""
    return field(default=default, metadata={_KEY: Option(help, **kw)})


@dataclass(frozen=True)
class Spec:
    """One field's option, resolved from its annotation: `switch` (a flag without a value),
    `bool` (true/false as text, for options a recipe may set either way) or `value`."""

    name: str
    option: Option
    default: Any
    kind: str

    @property
    def flag(self) -> str:
        return self.option.flag or "--" + self.name.replace("_", "-")

    @property
    def key(self) -> str:
        """Its key in a config file: the flag without dashes in front (`batch-size`, `no-shuffle`)."""
        return self.flag[2:]

    @property
    def parse(self) -> Callable[[str], Any] | None:
        return boolean if self.kind == "bool" else self.option.parse


def specs(cls: type) -> list[Spec]:
    """The options of dataclass `cls`, in field order (the --help order)."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        opt = f.metadata.get(_KEY)
        if opt is None:
            continue
        kind = {bool: "switch", bool | None: "bool"}.get(hints[f.name], "value")
        default = None if f.default is dataclasses.MISSING else f.default
        out.append(Spec(f.name, opt, default, kind))
    return out


def spec_map(cls: type) -> dict[str, Spec]:
    """Field name -> Spec."""
    return {s.name: s for s in specs(cls)}


def add_options(
    parser: argparse.ArgumentParser,
    cls: type,
    changes: Mapping[str, Mapping[str, Any]] | None = None,
    *,
    unset_absent: bool = False,
) -> None:
    """Add `cls`'s options to `parser`: all of them, or only the fields named in `changes`, each
    with what means something else in that command (`help`, `default`, a narrower `choices`,
    `required`, `aliases`); its type, validator and flag stay the field's.
    `unset_absent`: an option not given is left off the namespace (so a config file can fill it,
    and `given` tells what the command line set)."""
    groups: dict[str, Any] = {}
    for s in specs(cls):
        if changes is not None and s.name not in changes:
            continue
        change = dict((changes or {}).get(s.name, {}))
        target: Any = parser
        if s.option.group:
            if s.option.group not in groups:
                groups[s.option.group] = parser.add_mutually_exclusive_group()
            target = groups[s.option.group]
        default = change.pop("default", s.default)
        kw: dict[str, Any] = {
            "dest": s.name,
            "help": change.pop("help", s.option.help),
            "default": argparse.SUPPRESS if unset_absent else default,
        }
        flags = [s.flag, *change.pop("aliases", ())]
        if s.kind == "switch":
            kw["action"] = "store_false" if s.option.negate else "store_true"
        else:
            choices = change.pop("choices", s.option.choices)
            if s.parse is not None:
                kw["type"] = s.parse
            if choices is not None:
                kw["choices"] = list(choices)
            else:
                kw["metavar"] = "BOOL" if s.kind == "bool" else s.option.metavar or s.key.replace("-", "_").upper()
        target.add_argument(*flags, **kw, **change)


def given(cls: type, args: argparse.Namespace) -> dict[str, Any]:
    """The fields of `cls` that `args` holds (under `unset_absent`: those given on the command line)."""
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in vars(args).items() if k in names}


def file_value(where: str, key: str, s: Spec, value: Any) -> Any:
    """One config-file value checked as its flag's text is checked on the command line (the same
    validator, so the same message); null means the option's default."""
    if value is None:
        return s.default
    if s.kind == "switch":
        if not isinstance(value, bool):
            raise DlrmkitError(f"{where}: option '{key}' must be true or false, got {value!r}")
        return not value if s.option.negate else value
    if isinstance(value, dict):
        raise DlrmkitError(f"{where}: option '{key}': invalid value {value!r} (expected one value or a list)")
    text = ",".join(str(v) for v in value) if isinstance(value, (list, tuple)) else str(value)
    parsed: Any = text
    if s.parse is not None:
        try:
            parsed = s.parse(text)
        except (ValueError, TypeError, argparse.ArgumentTypeError) as exc:
            raise DlrmkitError(f"{where}: option '{key}': invalid value {value!r} ({exc})") from None
    if s.option.choices is not None and parsed not in s.option.choices:
        raise DlrmkitError(f"{where}: option '{key}': {value!r} is not one of {', '.join(s.option.choices)}")
    return parsed


def from_mapping(
    where: str, cls: type, data: Mapping[Any, Any], command: str, skip: Iterable[str] = ()
) -> dict[str, Any]:
    """A config file's mapping -> {field name: checked value}. Keys are the flags exactly
    (`batch-size`): an unknown key is one line, and `batch_size` names the key meant."""
    skipped = set(skip)
    by_key = {s.key: s for s in specs(cls) if s.name not in skipped}
    out: dict[str, Any] = {}
    for key, value in data.items():
        s = by_key.get(str(key))
        if s is None:
            dashed = by_key.get(str(key).replace("_", "-"))
            if dashed is not None:
                raise DlrmkitError(
                    f"{where}: unknown option '{key}' (keys are the flags: did you mean '{dashed.key}'?)"
                )
            raise DlrmkitError(f"{where}: unknown option '{key}' (see `dlrmkit {command} --help`)")
        out[s.name] = file_value(where, str(key), s, value)
    return out


def to_mapping(cls: type, values: Mapping[str, Any]) -> dict[str, Any]:
    """{field name: value} -> {file key: value} in field order: what `from_mapping` reads back."""
    by_name = spec_map(cls)
    unknown = set(values) - set(by_name)
    if unknown:
        raise ValueError(f"not options of {cls.__name__}: {', '.join(sorted(unknown))}")
    out: dict[str, Any] = {}
    for name, s in by_name.items():
        if name in values:
            v = values[name]
            if s.kind == "switch" and s.option.negate and v is not None:
                v = not v
            out[s.key] = list(v) if isinstance(v, tuple) else v
    return out
