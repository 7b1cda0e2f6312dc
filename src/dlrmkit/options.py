"""Options defined once, on dataclass fields. A config dataclass declares each option with
`option(...)` (default, help, validator, choices); a larger config composes such dataclasses as
`section(...)` fields (TrainConfig: model, optimizer, schedule, ... each owned by its component).
From those fields this module builds the argparse options, reads and checks config files, and
writes them back. So the command line, a config file and the dataclass cannot disagree on a
name, a default or a range: there is one definition of each.

Every option has one flat name (its field's name, unique across the sections of a config): the
argparse `dest`, the key of the {name: value} mappings `given`, `from_mapping` and `flatten`
return, and what `build` takes back. A config file's key is the flag without its dashes.
Imports no torch: parsers are built before a command is chosen."""

from __future__ import annotations

import argparse
import dataclasses
import typing
from dataclasses import dataclass, field
from functools import cache
from typing import Any, Callable, Iterable, Mapping

from dlrmkit.cli_types import boolean
from dlrmkit.errors import DlrmkitError

_KEY = "dlrmkit.option"
_SECTION = "dlrmkit.section"


@dataclass(frozen=True)
class Option:
    """What a field needs to be an option besides its name, type and default."""

    help: str
    parse: Callable[[str], Any] | None = None  # a dlrmkit.cli_types validator: range checks live there
    # the values allowed; a callable gives them when the parser is built (a registry, e.g. bench's models)
    choices: tuple[str, ...] | Callable[[], tuple[str, ...]] | None = None
    flag: str | None = None  # default: --field-name
    negate: bool = False  # a bool that is True unless `flag` (e.g. --no-shuffle) is given
    group: str | None = None  # options sharing a group exclude each other on the command line
    metavar: str | None = None
    required: bool = False  # must be given on the command line
    nargs: str | None = None  # "+": one or more values after the flag (a list field)
    positional: bool = False  # given without a flag, in field order
    paired: bool = False  # a switch with its --no- twin (argparse.BooleanOptionalAction)


def option(default: Any = dataclasses.MISSING, help: str = "", **kw: Any) -> Any:
    """A dataclass field that is also a command-line option and a config-file key. A list
    default is copied for each instance."""
    meta = {_KEY: Option(help, **kw)}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


def section(cls: type) -> Any:
    """A dataclass field holding a section: a dataclass of options, its defaults its own."""
    return field(default_factory=cls, metadata={_SECTION: cls})


@dataclass(frozen=True)
class Spec:
    """One field's option, resolved from its annotation: `switch` (a flag without a value),
    `bool` (true/false as text, for options a recipe may set either way) or `value`.
    `section`: the attribute of the composing config that holds the field (None: its own)."""

    name: str
    option: Option
    default: Any
    kind: str
    section: str | None = None
    many: bool = False  # its value is a list (`list[...]` annotation)

    @property
    def flag(self) -> str:
        return self.option.flag or "--" + self.name.replace("_", "-")

    @property
    def key(self) -> str:
        """Its key in a config file: the flag without dashes in front (`batch-size`, `no-shuffle`)."""
        return self.flag.lstrip("-") if not self.option.positional else self.name.replace("_", "-")

    @property
    def parse(self) -> Callable[[str], Any] | None:
        return boolean if self.kind == "bool" else self.option.parse

    @property
    def choices(self) -> tuple[str, ...] | None:
        c = self.option.choices
        return tuple(c()) if callable(c) else c

    def help(self, text: str | None = None, default: Any = dataclasses.MISSING) -> str:
        """The help text (or `text`, a command's own) with `{default}` replaced by the default
        (or `default`, a command's own): a default is written once, in the field."""
        value = self.default if default is dataclasses.MISSING else default
        return (self.option.help if text is None else text).replace("{default}", shown(value))

    def get(self, config: Any) -> Any:
        """This option's value in a config instance."""
        return getattr(getattr(config, self.section) if self.section else config, self.name)

    def set(self, config: Any, value: Any) -> None:
        setattr(getattr(config, self.section) if self.section else config, self.name, value)


def shown(value: Any) -> str:
    """A default as help text and the CLI reference show it: 1800 not 1800.0, true, 64,16."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return str(value)


def sections(cls: type) -> dict[str, type]:
    """Attribute -> section class, for the `section(...)` fields of `cls`."""
    return {f.name: f.metadata[_SECTION] for f in dataclasses.fields(cls) if _SECTION in f.metadata}


@cache
def _specs(cls: type) -> tuple[Spec, ...]:
    out: list[Spec] = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        inner = f.metadata.get(_SECTION)
        if inner is not None:
            out += [dataclasses.replace(s, section=f.name) for s in _specs(inner)]
            continue
        opt = f.metadata.get(_KEY)
        if opt is None:
            continue
        hint = hints[f.name]
        kind = {bool: "switch", bool | None: "bool"}.get(hint, "value")
        many = list in {typing.get_origin(hint), *(typing.get_origin(a) for a in typing.get_args(hint))}
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = None
        out.append(Spec(f.name, opt, default, kind, many=many))
    names = [s.name for s in out]
    flags = [s.flag for s in out if not s.option.positional]
    if len(set(names)) != len(names) or len(set(flags)) != len(flags):
        twice = sorted({n for n in names + flags if (names + flags).count(n) > 1})
        raise TypeError(f"{cls.__name__}: options named twice: {', '.join(twice)}")
    return tuple(out)


def specs(cls: type) -> list[Spec]:
    """The options of dataclass `cls`, its sections' included, in field order (the --help order)."""
    return list(_specs(cls))


def spec_map(cls: type) -> dict[str, Spec]:
    """Flat name -> Spec."""
    return {s.name: s for s in _specs(cls)}


def build(cls: type, values: Mapping[str, Any] = {}) -> Any:
    """An instance of `cls` from {flat name: value}; options not named keep their defaults."""
    by_name = spec_map(cls)
    unknown = set(values) - set(by_name)
    if unknown:
        raise TypeError(f"not options of {cls.__name__}: {', '.join(sorted(unknown))}")
    own = {s.name: values[s.name] for s in by_name.values() if s.section is None and s.name in values}
    parts = {
        attr: inner(**{s.name: values[s.name] for s in by_name.values() if s.section == attr and s.name in values})
        for attr, inner in sections(cls).items()
    }
    return cls(**own, **parts)


def flatten(config: Any) -> dict[str, Any]:
    """{flat name: value} of a config instance: what `build` turns back into it."""
    return {s.name: s.get(config) for s in _specs(type(config))}


def assign(config: Any, values: Mapping[str, Any]) -> None:
    """Set options of a config instance by flat name."""
    by_name = spec_map(type(config))
    for name, value in values.items():
        by_name[name].set(config, value)


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
    for s in _specs(cls):
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
            "help": s.help(change.pop("help", None), default),
            "default": argparse.SUPPRESS if unset_absent else default,
        }
        if s.option.positional:
            flags = [s.name]
            if s.option.nargs:
                kw["nargs"] = s.option.nargs
        else:
            flags = [s.flag, *change.pop("aliases", ())]
            kw["dest"] = s.name
            if s.option.required or change.get("required"):
                kw["required"] = change.pop("required", True)
                kw.pop("default")
            if s.option.nargs:
                kw["nargs"] = s.option.nargs
        if s.kind == "switch" and s.option.paired:
            kw["action"] = argparse.BooleanOptionalAction
        elif s.kind == "switch":
            kw["action"] = "store_false" if s.option.negate else "store_true"
        else:
            choices = change.pop("choices", s.choices)
            if s.parse is not None:
                kw["type"] = s.parse
            if choices is not None:
                kw["choices"] = list(choices)
            if choices is None or s.option.metavar:
                kw["metavar"] = "BOOL" if s.kind == "bool" else s.option.metavar or s.key.replace("-", "_").upper()
            if s.option.positional and choices is None and not s.option.metavar:
                kw.pop("metavar")
        target.add_argument(*flags, **kw, **change)


def given(cls: type, args: argparse.Namespace) -> dict[str, Any]:
    """The options of `cls` that `args` holds (under `unset_absent`: those given on the command
    line), by flat name."""
    names = set(spec_map(cls))
    return {k: v for k, v in vars(args).items() if k in names}


def _shape_error(where: str, key: str, value: Any, s: Spec) -> str | None:
    """Why `value` has the wrong shape for option `s`, or None: a mapping never fits; a list fits
    only a list option, and only as a list of plain values."""
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, (list, tuple)):
        if not s.many:
            return "a list"
        if any(isinstance(v, (list, tuple, dict)) for v in value):
            return "a nested list or mapping"
    return None


def file_value(where: str, key: str, s: Spec, value: Any) -> Any:
    """One config-file value checked as its flag's text is checked on the command line (the same
    validator, so the same message); null means the option's default. A value of the wrong shape
    (a mapping, a list where one value goes, a list of lists) is one line naming the key."""
    if value is None:
        return s.default
    if s.kind == "switch":
        if not isinstance(value, bool):
            raise DlrmkitError(f"{where}: option '{key}' must be true or false, got {value!r}")
        return not value if s.option.negate else value
    shape = _shape_error(where, key, value, s)
    if shape is not None:
        wanted = "a list of values" if s.many else "one value"
        raise DlrmkitError(f"{where}: option '{key}': invalid value {value!r} (expected {wanted}, got {shape})")
    text = ",".join(str(v) for v in value) if isinstance(value, (list, tuple)) else str(value)
    parsed: Any = text
    if s.parse is not None:
        try:
            parsed = s.parse(text)
        except (ValueError, TypeError, argparse.ArgumentTypeError) as exc:
            raise DlrmkitError(f"{where}: option '{key}': invalid value {value!r} ({exc})") from None
    if s.choices is not None and parsed not in s.choices:
        raise DlrmkitError(f"{where}: option '{key}': {value!r} is not one of {', '.join(s.choices)}")
    return parsed


def from_mapping(
    where: str, cls: type, data: Mapping[Any, Any], command: str, skip: Iterable[str] = ()
) -> dict[str, Any]:
    """A config file's mapping -> {flat name: checked value}. Keys are the flags exactly
    (`batch-size`): an unknown key is one line, and `batch_size` names the key meant."""
    skipped = set(skip)
    by_key = {s.key: s for s in _specs(cls) if s.name not in skipped}
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
    """{flat name: value} -> {file key: value} in field order: what `from_mapping` reads back."""
    by_name = spec_map(cls)
    unknown = set(values) - set(by_name)
    if unknown:
        raise ValueError(f"not options of {cls.__name__}: {', '.join(sorted(unknown))}")
    out: dict[str, Any] = {}
    for name, s in by_name.items():
        if name in values:
            v = values[name]
            if s.kind == "switch" and s.option.negate and isinstance(v, bool):  # another value: refused on reading
                v = not v
            out[s.key] = list(v) if isinstance(v, tuple) else v
    return out
