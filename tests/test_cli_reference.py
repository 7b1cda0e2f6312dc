"""docs/CLI.md is generated from the option declarations (dlrmkit.cli_reference): it must be what
the generator prints now, and name every option of every command."""

from pathlib import Path

from dlrmkit.cli_reference import REGENERATE, command_parsers, reference

DOC = Path(__file__).resolve().parents[1] / "docs" / "CLI.md"


def test_cli_md_is_what_the_generator_prints():
    assert DOC.read_text(encoding="utf-8") == reference(), f"docs/CLI.md is out of date: run `{REGENERATE}`"


def test_the_reference_names_every_flag_of_every_command():
    text = reference()
    for name, parser in command_parsers().items():
        part = text.split(f"## dlrmkit {name}\n")[1].split("\n## dlrmkit ")[0]
        flags = [f for a in parser._actions for f in a.option_strings if f not in ("-h", "--help")]
        assert flags, name
        for flag in flags:
            assert f"`{flag}`" in part, (name, flag)


def test_train_options_are_grouped_by_their_section():
    text = reference().split("## dlrmkit train\n")[1].split("\n## dlrmkit ")[0]
    for section in ("model", "optimizer", "schedule", "selection", "checkpoint", "output", "device", "parallel"):
        assert f"### {section} options" in text, section
    parallel = text.split("### parallel options")[1]
    assert "`--collective-timeout`" in parallel and "(default 1800)" in parallel
