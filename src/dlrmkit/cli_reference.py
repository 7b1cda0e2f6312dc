"""The command-line reference, docs/CLI.md, generated from the option declarations: every
command's parser is built (dlrmkit.cli, from each command's option dataclasses) and each option is
written with its flags, value, choices and help. `train`'s options are grouped by the section of
TrainConfig that declares them. Regenerate with

    python -m dlrmkit.cli_reference > docs/CLI.md

(tests/test_cli_reference.py fails when docs/CLI.md differs from what this prints)."""

from __future__ import annotations

import argparse
import sys

from dlrmkit.cli import COMMANDS, build_parser

REGENERATE = "python -m dlrmkit.cli_reference > docs/CLI.md"
BOOLEAN_PAIR_SUFFIX = " (default: %(default)s)"  # what some Pythons append to a --x/--no-x help


def command_parsers() -> dict[str, argparse.ArgumentParser]:
    """Each command's parser, as `dlrmkit COMMAND` builds it."""
    top = build_parser()
    sub = next(a for a in top._actions if a.dest == "command")
    return {name: sub.choices[name] for name in COMMANDS}


def help_text(action: argparse.Action) -> str:
    """The help as --help prints it (argparse's %% and %(default)s filled), on one line."""
    text = action.help or ""
    if isinstance(action, argparse.BooleanOptionalAction) and text.endswith(BOOLEAN_PAIR_SUFFIX):
        text = text[: -len(BOOLEAN_PAIR_SUFFIX)]
    text = text % {"default": action.default, "prog": "dlrmkit"}
    return " ".join(text.split()).replace("|", "\\|")


def value_of(action: argparse.Action) -> str:
    """What follows the flag: the choices, the metavar (repeated for nargs '+'), or nothing."""
    if action.nargs == 0:
        return ""
    if action.choices is not None:
        shown = "{" + ",".join(str(c) for c in action.choices) + "}"
    else:
        shown = action.metavar or action.dest.upper()
    return f"{shown} [{shown} ...]" if action.nargs == "+" else shown


def option_row(action: argparse.Action) -> str:
    flags = ", ".join(f"`{f}`" for f in action.option_strings) or f"`{action.metavar or action.dest}`"
    value = value_of(action)
    notes = " (required)" if action.required and action.option_strings else ""
    return f"| {flags} | {f'`{value}`' if value and action.option_strings else ''} | {help_text(action)}{notes} |"


def exclusive_groups(parser: argparse.ArgumentParser) -> list[str]:
    return [
        "- at most one of " + ", ".join(f"`{a.option_strings[0]}`" for a in g._group_actions) + "."
        for g in parser._mutually_exclusive_groups
    ]


def train_sections() -> dict[str, str]:
    """dest -> the TrainConfig section declaring it ('' for TrainConfig's own options)."""
    from dlrmkit.config import TrainConfig
    from dlrmkit.options import specs

    return {s.name: s.section or "" for s in specs(TrainConfig)}


def table(actions: list[argparse.Action]) -> list[str]:
    return ["| option | value | meaning |", "|---|---|---|", *(option_row(a) for a in actions)]


def command_section(name: str, parser: argparse.ArgumentParser) -> list[str]:
    description = (parser.description or COMMANDS[name][1]).strip()
    lines = [f"## dlrmkit {name}", "", " ".join(description.split("\n\n")[0].split()), ""]
    actions = [a for a in parser._actions if not isinstance(a, argparse._HelpAction)]
    if name == "train":
        where = train_sections()
        groups: dict[str, list[argparse.Action]] = {}
        for a in actions:
            groups.setdefault(where.get(a.dest, ""), []).append(a)
        for section, members in groups.items():
            lines += [f"### {section or 'run'} options", ""]
            lines += [*table(members), ""]
    else:
        lines += [*table(actions), ""]
    extra = exclusive_groups(parser)
    if extra:
        lines += [*extra, ""]
    return lines


def reference() -> str:
    lines = [
        "# dlrmkit command-line reference",
        "",
        f"Generated from the option declarations by `{REGENERATE}`; do not edit by hand.",
        "Every `train` option may also come from a `--config` YAML file whose keys are the flags",
        "without their dashes (`batch-size: 512`, `no-shuffle: true`).",
        "",
    ]
    for name, parser in command_parsers().items():
        lines += command_section(name, parser)
    return "\n".join(lines).rstrip("\n") + "\n"


if __name__ == "__main__":
    sys.stdout.write(reference())
