"""The CLI imports only the chosen command's module: `dlrmkit preprocess` (pure Arrow/numpy)
starts without importing torch, a second of start-up on every data job."""

import subprocess
import sys

from dlrmkit.cli import COMMANDS, build_parser


def imports_torch(code: str) -> bool:
    out = subprocess.run(
        [sys.executable, "-c", f"import sys\n{code}\nprint('torch' in sys.modules)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return out.strip().splitlines()[-1] == "True"


def test_preprocess_parser_does_not_import_torch():
    assert not imports_torch(
        "from dlrmkit.cli import build_parser\nbuild_parser(['preprocess', 'criteo', '--input', 'x'])"
    )
    assert imports_torch("from dlrmkit.cli import build_parser\nbuild_parser(['bench'])")  # the check can fail


def test_full_parser_still_knows_every_command():
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert set(sub.choices) == set(COMMANDS)
    lean = next(a for a in build_parser(["validate"])._actions if a.dest == "command")
    assert set(lean.choices) == set(COMMANDS)
