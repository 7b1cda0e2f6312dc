"""Usage errors and early-closed output of the `dlrmkit` command: an unknown option is reported by
its subcommand with the closest known one, abbreviated options are errors, and a reader that
stops early (`| head -1`) ends the command quietly."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from helpers import run_cli
from dlrmkit.cli import SIGPIPE_EXIT


def test_unknown_option_names_the_subcommand_and_the_closest_option(tmp_path):
    r = run_cli("synth", "--out", tmp_path / "x", "--rowz", "5")
    assert r.code == 2
    line = r.err.strip()
    assert line == (
        "dlrmkit synth: error: unrecognized arguments: --rowz 5; did you mean --rows? (see `dlrmkit synth --help`)"
    )
    far = run_cli("synth", "--out", tmp_path / "x", "--zzzz", "5")
    assert far.code == 2 and "dlrmkit synth: error: unrecognized arguments: --zzzz 5 (see" in far.err
    assert "did you mean" not in far.err
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize(
    "argv, full",
    [
        (("train", "--max-step", "2"), "--max-steps"),
        (("synth", "--out", "X", "--row", "5"), "--rows"),
        (("plan", "--world", "2"), "--world-size"),
    ],
)
def test_abbreviated_option_is_an_error_not_the_full_option(tmp_path, argv, full):
    argv = tuple(str(tmp_path / "out") if a == "X" else a for a in argv)
    r = run_cli(*argv, "--data", tmp_path / "none")
    assert r.code == 2
    assert f"dlrmkit {argv[0]}: error: unrecognized arguments: {argv[-2]}" in r.err
    assert f"did you mean {full}?" in r.err
    assert len(r.err.strip().splitlines()) == 1


def reader_gone(argv: list[str], cwd) -> subprocess.CompletedProcess:
    """Run dlrmkit with its standard output a pipe whose reader closed before anything was written."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "dlrmkit", *argv],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    proc.stdout.close()  # the reader stops before the first line, as `| head -0` would
    err = proc.stderr.read()
    proc.wait(timeout=120)
    return subprocess.CompletedProcess(argv, proc.returncode, "", err)


@pytest.mark.parametrize(
    "argv",
    [["validate", "--data", "{data}"], ["plan", "--data", "{data}", "--world-size", "2"]],
    ids=["validate", "plan"],
)
def test_reader_that_stops_early_ends_quietly(tiny_data, tmp_path, argv):
    r = reader_gone([a.format(data=tiny_data) for a in argv], tmp_path)
    assert r.returncode == SIGPIPE_EXIT, r.stderr
    assert r.stderr == ""  # no "error: Broken pipe", no traceback


def test_broken_pipe_elsewhere_is_still_an_error(tmp_path, monkeypatch):
    """Only our own output's reader going away is quiet: a broken pipe to anything else (stdout still
    open) is the usual one-line error."""
    import dlrmkit.commands.validate as validate_cli

    def broken(args):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(validate_cli, "run", broken)
    r = run_cli("validate", "--data", tmp_path)
    assert r.code != 0 and r.code != SIGPIPE_EXIT
    assert "dlrmkit validate: error:" in r.err and "Broken pipe" in r.err
