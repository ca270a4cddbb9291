"""The options of ``drift train``: their values (``TrainConfig``), the choices some take, the options a
checkpoint pins, and the default data set."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from drift.data import generate

# The small data set `drift train` writes when --data is not given.
DEFAULT_DATA = dict(samples=256, resolution=16, frames=21, seed=0)
# Options that define the model: a resumed run or an evaluation must use the checkpoint's.
MODEL_OPTIONS = ("model", "width", "modes", "layers", "seed", "t_in", "t_out", "factorization", "rank")
# Options of the optimisation a resumed run must share with the checkpoint's.
OPTIMIZER_OPTIONS = ("method", "lr", "weight_decay", "schedule", "batch_size", "split", "loss")
# --model: Li et al.'s plain FNO, or neuraloperator 2.0's default options (FNO.neuralop_defaults).
MODELS = ("plain", "neuralop")
# --schedule: the learning rate over the run's steps, constant or cosine-annealed to 0.
SCHEDULES = ("constant", "cosine")
# What a checkpoint's meta.json holds (one without all of them is passed over as damaged).
META_KEYS = ("epoch", "world_size", "config", "stats", "global_shape", "history")
# --loss: the MSE of the normalised fields, or each (field, predicted frame) weighted by the inverse of its
# variance over the training trajectories (``frame_weights``), so that late, decayed frames count as much.
LOSSES = ("mse", "frame-weighted")
# What a non-finite loss or gradient norm does: stop the run, or skip that batch.
ON_NAN = ("stop", "skip-batch")
# Options checkpoints written before the option existed were trained with.
LEGACY_OPTIONS = dict(
    split="last", factorization=None, rank=1.0, model="plain", weight_decay=0.0, schedule="constant", loss="mse"
)


class ConfigError(ValueError):
    """An option value that cannot work; the message names the option."""


HOSTS = "hosts"  # --reduction hosts: drift's spectra reduced within each host first, then across hosts


@dataclass
class TrainConfig:
    """The options of ``drift train`` (see ``drift train --help``)."""

    data: str | tuple[str, ...] | None = None  # a file, or several files and folders read as one data set
    test_data: tuple[str, ...] | None = None  # a separate test set (every trajectory of these files)
    grid: tuple[int, int, int] | None = None
    data_parallel: int = 1
    reduction: tuple[int, ...] | str | None = None  # a mesh shape, or HOSTS
    overlap: int = 1
    method: str = "drift"
    model: str = "neuralop"
    width: int = 20
    modes: tuple[int, int, int, int] = (3, 3, 3, 4)
    factorization: str | None = None
    rank: float = 1.0
    layers: int = 4
    epochs: int = 4
    lr: float = 3e-3
    weight_decay: float = 1e-4
    schedule: str = "cosine"
    loss: str = "frame-weighted"
    batch_size: int = 2
    seed: int = 0
    device: str = "cpu"
    out: str = "runs/train"
    nproc: int = 1
    resume: bool = False
    t_in: int = 5
    t_out: int = 16
    progress: bool = True
    plots: bool = True
    on_nan: str = "stop"
    split: str = "last"
    checkpoint_every: float | None = None
    collective_timeout: float | None = None
    prefetch: bool = True  # read the next batch in a background thread during the step


def config_from(options: dict, **changes) -> TrainConfig:
    """A ``TrainConfig`` from parsed command-line options (unknown keys and None values are skipped)."""
    names = {f.name for f in dataclasses.fields(TrainConfig)}
    known = {k: tuple(v) if isinstance(v, list) else v for k, v in options.items() if k in names and v is not None}
    return TrainConfig(**{**known, **changes})


def default_data_path(**changes: int) -> Path:
    """Where the default data set (``DEFAULT_DATA``, with ``changes``) is cached: ``$DRIFT_CACHE`` or
    ``~/.cache/drift``."""
    cache = Path(os.environ.get("DRIFT_CACHE", Path.home() / ".cache" / "drift"))
    d = DEFAULT_DATA | changes
    return cache / f"cfd3d_n{d['resolution']}_b{d['samples']}_f{d['frames']}_seed{d['seed']}.hdf5"


def ensure_default_data(progress: bool = True, device: torch.device | str = "cpu", **changes: int) -> Path:
    """The default data set (with ``changes`` to ``DEFAULT_DATA``: ``resolution``, ``samples``, ...),
    generated first if absent (its solver on ``device``; written under a temporary name, then renamed)."""
    path = default_data_path(**changes)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        generate(tmp, **(DEFAULT_DATA | changes), progress=progress, device=device)
        os.replace(tmp, path)
    return path
