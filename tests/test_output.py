"""Output a log can keep: with stdout and stderr not terminals (a batch job's log, a pipe), drift's commands
print whole lines without a carriage return; ``drift train`` prints its line per epoch and final metrics
whatever the progress options, except under ``--quiet``; ``--progress`` asks for the bars anyway."""

import os
import subprocess
import sys

import pytest
from runs import HANG_S, tiny_data

from drift.bench import output
from drift.jobs.console import PROGRESS_ENV, bars_shown, progress_asked

# The tiny model of tests/runs.py, without its --no-progress: what a user's command line would give.
TINY = ["--t-in", "2", "--t-out", "4", "--width", "4", "--modes", "2", "--layers", "2", "--no-plots"]


def _drift(*argv: str) -> subprocess.CompletedProcess:
    """``drift ARGV`` with stdout and stderr captured (pipes, no terminal) and decoded as they are: text
    mode's universal newlines would turn carriage returns into newlines."""
    env = {k: v for k, v in os.environ.items() if k != PROGRESS_ENV} | {"OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "drift", *argv]
    done = subprocess.run(cmd, capture_output=True, timeout=HANG_S, env=env)
    done.stdout, done.stderr = done.stdout.decode(), done.stderr.decode()
    assert done.returncode == 0, done.stderr
    return done


def test_commands_print_whole_lines_off_a_terminal(tmp_path):
    data = tiny_data(tmp_path / "cfd.hdf5")
    run = tmp_path / "run"
    train = ["train", "--data", data, "--out", str(run), *TINY]
    first = _drift(*train, "--epochs", "2")
    assert "\r" not in first.stdout + first.stderr
    lines = first.stdout.splitlines()
    assert [line[:11] for line in lines if line.startswith("epoch")] == ["epoch   1/2", "epoch   2/2"]
    assert lines[-2].startswith("PDEBench metrics (last split): RMSE ") and lines[-1].startswith("done: 2 epochs")
    # --no-progress keeps the lines (it used to drop them); --progress draws the bar on stderr even here.
    assert _drift(*train, "--epochs", "3", "--resume", "--no-progress").stdout.count("epoch   3/3") == 1
    asked = _drift(*train, "--epochs", "4", "--resume", "--progress")
    assert "\r" in asked.stderr and "\r" not in asked.stdout and "epoch   4/4" in asked.stdout
    quiet = _drift(*train, "--epochs", "5", "--resume", "--quiet")
    lines = quiet.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("done: 5 epochs") and "\r" not in quiet.stderr
    predicted = _drift("predict", str(run), "--data", data, "--out", str(tmp_path / "pred.hdf5"))
    assert predicted.stdout.startswith(f"wrote {tmp_path / 'pred.hdf5'}: ") and "\r" not in predicted.stderr
    generated = _drift("generate", "--out", str(tmp_path / "gen.hdf5"), "--samples", "1", "--resolution", "4")
    assert generated.stdout == f"wrote {tmp_path / 'gen.hdf5'}\n" and "\r" not in generated.stderr


@pytest.mark.parametrize("asked", [None, True, False])
def test_bars_need_a_terminal_or_asking(monkeypatch, asked):
    """Under pytest's capture neither stream is a terminal: no bar unless asked, here or (``drift bench
    --progress``) through the environment its ranks inherit."""
    monkeypatch.delenv(PROGRESS_ENV, raising=False)
    assert bars_shown(asked) is bool(asked)
    with progress_asked(asked):
        assert output.progress(range(2), "bench").disable is not bool(asked)
    assert PROGRESS_ENV not in os.environ
