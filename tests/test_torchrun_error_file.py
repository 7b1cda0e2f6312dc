"""The error file a rank leaves for torchrun's agent (TORCHELASTIC_ERROR_FILE): torch's own reader
parses it, an existing file is never written over, and a rank stopped while writing it leaves no
file at the path (torchrun SIGTERMs the other ranks when one fails, then reads each error file: an
empty one made the agent itself fail instead of restarting the worker group)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest
from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

from dlrmkit import cli


@pytest.fixture
def error_file(tmp_path, monkeypatch):
    path = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(path))
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    return path


def test_torchrun_reads_the_ranks_one_line_error(error_file):
    cli.tell_torchrun("dlrmkit train: error: lost rank 1")
    failure = ProcessFailure(local_rank=0, pid=1, exitcode=2, error_file=str(error_file))
    assert failure.message["message"] == "dlrmkit train: error: lost rank 1"  # the ErrorHandler's format
    assert failure.timestamp > 0
    assert [p.name for p in error_file.parent.iterdir()] == ["error.json"]  # no draft left beside it


def test_an_existing_error_file_stays_as_it_is(error_file):
    error_file.write_text('{"message": "written first"}')
    cli.tell_torchrun("dlrmkit train: error: second")
    assert json.loads(error_file.read_text()) == {"message": "written first"}
    assert [p.name for p in error_file.parent.iterdir()] == ["error.json"]


def test_a_rank_stopped_while_writing_leaves_no_error_file(error_file, monkeypatch):
    def stopped_halfway(obj, fp):
        fp.write('{"message": ')
        fp.flush()
        raise SystemExit(143)  # as SIGTERM ends a rank inside atomic_io.removed_if_interrupted

    monkeypatch.setattr(json, "dump", stopped_halfway)
    with pytest.raises(SystemExit):
        cli.tell_torchrun("dlrmkit train: error: lost rank 1")
    assert not error_file.exists()
    # torch's reader then makes up its own message instead of failing on a half-written file
    assert ProcessFailure(local_rank=0, pid=1, exitcode=-15, error_file=str(error_file)).message


def test_no_error_file_outside_torchrun(tmp_path, monkeypatch):
    path = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(path))
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    cli.tell_torchrun("dlrmkit train: error: x")
    assert not path.exists()


def test_error_files_are_whole_when_a_signal_stops_the_writer(tmp_path):
    """A real SIGTERM at an arbitrary moment, as torchrun sends it: a process writing error files
    one after another is stopped, and every file at an error-file path parses (drafts beside them
    may stay, in torchrun's own temporary folder)."""
    writer = (
        "import os\n"
        "from dlrmkit import cli\n"
        "os.environ.update(WORLD_SIZE='2', RANK='0')\n"
        "print('ready', flush=True)\n"
        "for i in range(1_000_000):\n"
        f"    os.environ['TORCHELASTIC_ERROR_FILE'] = os.path.join({str(tmp_path)!r}, f'error{{i}}.json')\n"
        "    cli.tell_torchrun('dlrmkit train: error: ' + 'x' * 200_000)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", writer], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "ready\n"
    deadline = time.monotonic() + 60
    while not (tmp_path / "error0.json").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)  # then stop it wherever it is
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == -signal.SIGTERM
    written = sorted(tmp_path.glob("error*.json"))
    assert written, "the writer wrote no error file before the signal"
    for path in written:
        assert json.loads(path.read_text())["message"]["message"].startswith("dlrmkit train: error: "), path
    assert len(list(tmp_path.iterdir())) <= len(written) + 1  # at most the one draft the signal stopped
