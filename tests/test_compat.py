"""drift._compat's exit: the exit handlers run and the code is kept, with Python's private handler runner
and with the public ``sys.exit`` it falls back to. (Its storage count and fused Adam are tested with the
pool, tests/test_memory.py, and the optimizer, tests/test_optim.py, on both paths.)"""

from __future__ import annotations

import subprocess
import sys

import pytest

SCRIPT = """
import atexit, sys
from pathlib import Path
from drift import _compat
if {remove}:
    del atexit._run_exitfuncs
atexit.register(lambda: Path({path!r}).write_text("handlers ran"))
print("flushed", end="")
_compat.exit_now(3)
print("not reached")
"""


@pytest.mark.parametrize("remove", [False, True], ids=["private", "public"])
def test_exit_now_runs_the_exit_handlers_and_keeps_the_code(tmp_path, remove):
    path = tmp_path / "ran"
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(remove=remove, path=str(path))],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 3, done.stderr
    assert done.stdout == "flushed" and path.read_text() == "handlers ran"
