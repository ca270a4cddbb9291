"""Training runs for the tests of ``drift train``: the tiny data set and model, configs and command lines
for it, what a finished run leaves in its folder (metrics rows, checkpoints, plots), and the check that
a command fails with one line.

``run_training`` is a module-level function, so that a rank pool (``harness``) can call it on every rank.
"""

from __future__ import annotations

import dataclasses
import json
import os
import struct
from pathlib import Path

from harness import DEVICE_ENV

from drift.checkpoint import latest_checkpoint
from drift.cli import main
from drift.data import generate
from drift.train import TrainConfig, train

DEVICE = os.environ.get(DEVICE_ENV, "cpu")

# A deadline of a run only catches hangs: far above what any case takes on a loaded two-core machine, and
# below the collective timeouts a hung run would otherwise wait out (drift.jobs.timeouts.FIRST_S, 600 s, for a
# phase not yet timed; drift.jobs.launch.GROUP_TIMEOUT_S, 1800 s, at start-up).
HANG_S = 300.0

# drift train's options for the tiny model of ``train_config`` (one rank, no progress bars, no plots).
TINY = ["--t-in", "2", "--t-out", "4", "--width", "4", "--modes", "2", "--layers", "2", "--no-progress", "--no-plots"]


def tiny_data(path) -> str:
    """Writes the tests' tiny data set to ``path``: 4 trajectories (3 to train on) of 7 frames on 8^3."""
    generate(path, samples=4, resolution=8, frames=7, seed=1, progress=False)
    return str(path)


def train_config(data, out, **changes) -> TrainConfig:
    """The tiny model (``TINY``'s) on ``data`` into ``out``: 3 epochs, batches of 2, lr 0.01, no plots."""
    base = TrainConfig(
        data=data, t_in=2, t_out=4, width=4, modes=(2, 2, 2, 2), layers=2, epochs=3, batch_size=2, lr=1e-2, plots=False
    )
    return dataclasses.replace(base, out=str(out), device=DEVICE, progress=False, **changes)


# The tests of faults compare runs of different --epochs epoch by epoch: a constant learning rate (not the
# default cosine over --epochs) makes their common epochs equal.
def constant_config(data, out, **changes) -> TrainConfig:
    """``train_config`` at a constant learning rate."""
    return train_config(data, out, schedule="constant", **changes)


def train_argv(data: str, out: Path, *args: str) -> list[str]:
    """``drift train`` argv on ``data`` into ``out`` with the tiny model, as ``constant_config`` (lr 0.01,
    constant), then ``args``."""
    return ["train", "--data", data, "--out", str(out), "--lr", "0.01", "--schedule", "constant", *TINY, *args]


def run_training(config: TrainConfig) -> list[dict]:
    """``drift.train.train(config)`` (on every rank of a pool): its history."""
    return train(config)


def checkpoint_names(out: Path) -> tuple[list[str], str]:
    """The complete checkpoint folders of a run and the one ``latest`` names."""
    root = out / "checkpoints"
    names = sorted(p.name for p in root.glob("epoch-*") if (p / "meta.json").is_file())
    return names, latest_checkpoint(root).name


def without_times(rows: list[dict]) -> list[dict]:
    """Metrics rows (a run's history) without their timings: what two equal runs share."""
    return [{k: v for k, v in r.items() if k not in ("seconds", "phase_seconds", "peak_memory_gib")} for r in rows]


def metric_rows(out: Path) -> list[dict]:
    """A run's ``metrics.jsonl`` rows without their timings."""
    return without_times([json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()])


# Runs in other processes agree to float32 round-off, not bit for bit: other CPUs and thread counts round
# the sums in a training step differently (the standards' float32 tolerance, relative).
ROUND_OFF = 2e-6


def assert_same_metrics(got: list[dict], want: list[dict], rtol: float = ROUND_OFF) -> None:
    """Two runs' ``metric_rows`` (of other processes: a resumed run, another launch, another mesh of the
    same sums) agree: the same epochs and counts, their losses and errors to float32 round-off (relative
    ``rtol``; another rank count sums in another order, which training amplifies: 1e-5)."""
    assert [r.keys() for r in got] == [r.keys() for r in want], (got, want)
    for g, w in zip(got, want, strict=True):
        for key, value in w.items():
            if isinstance(value, float):
                assert abs(g[key] - value) <= rtol * abs(value), (key, g, w)
            else:
                assert g[key] == value, (key, g, w)


def fails_with_one_line(capsys, argv, names) -> None:
    """``drift`` fails with exit code 2 and one error line that names ``names``, no traceback."""
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and names in err and "Traceback" not in err, err
    assert len([line for line in err.splitlines() if "error" in line]) == 1, err


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_size(path) -> tuple[int, int]:
    """The (width, height) in pixels of the PNG image ``path``, from its header (AssertionError if the file
    is no PNG image)."""
    head = Path(path).read_bytes()[:24]
    assert head[:8] == PNG_SIGNATURE and head[12:16] == b"IHDR", f"{path} is not a PNG image: {head!r}"
    return struct.unpack(">II", head[16:24])
