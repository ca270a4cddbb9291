"""A run set up on one rank (``set_up``): its mesh, model, optimizer and data (a resumed run's weights,
optimizer state, statistics and history from its newest checkpoint that loads), and the run folder's
files rank 0 starts with; ``Run`` holds them and what the epochs add to."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from drift import comm
from drift._moved import moved_names
from drift._plan import resolve_device
from drift.checkpoint import load_newest, mark_fresh
from drift.data import DataFiles, Trajectories
from drift.jobs.stopping import STOPPED, StopSignals
from drift.jobs.timeouts import PhaseTimeouts
from drift.nn import FNO
from drift.recipes import AUTOREGRESSIVE, Unroll
from drift.train.checks import model_extents
from drift.train.config import META_KEYS, TrainConfig, default_data_path
from drift.train.epoch import EpochSums
from drift.train.model import build_model, make_optimizer
from drift.train.problem import resolve_problem
from drift.train.resume import check_options
from drift.train.sharding import Sharding, datasets, frame_weights, saved_stats


@dataclass
class Run:
    """A run on this rank: its options, signals and phase timeouts, device, data files, mesh, model and
    optimizer, the metric rows of its epochs so far (``history``, a resumed run's first), the meta of the
    checkpoint it resumed from (``saved``), its training and test sets, the loss's frame weights (None for
    ``--loss mse``), ``--loss nrmse``'s field mean and std (``Trajectories.field_tensors``; else None) and
    when it last wrote a checkpoint (``time.monotonic()``)."""

    config: TrainConfig
    stop: StopSignals
    timeouts: PhaseTimeouts
    device: torch.device
    data: str | tuple[str, ...]
    sharding: Sharding
    model: FNO
    optimizer: torch.optim.Optimizer
    history: list[dict]
    saved: dict | None
    train_set: Trajectories
    test_set: Trajectories
    weights: torch.Tensor | None
    physical: tuple[torch.Tensor, torch.Tensor] | None = None
    last_checkpoint: float = 0.0

    @property
    def rank(self) -> int:
        """This process's rank in the default group."""
        return comm.rank()

    @property
    def out(self) -> Path:
        """The run folder."""
        return Path(self.config.out)

    @property
    def start(self) -> int:
        """The whole epochs done before this run started (a resumed run's)."""
        return self.saved["epoch"] if self.saved else 0

    @property
    def count(self) -> int:
        """Elements per trajectory of the model's output."""
        return math.prod(self.train_set.global_shape) * len(self.train_set.fields) * self.train_set.t_out

    def unroll(self, epoch: int, step: int) -> Unroll | None:
        """How an autoregressive run unrolls at ``step`` of ``epoch``: ``--pushforward`` and ``--noise``,
        the noise drawn from a generator seeded by the run's seed, the step and this rank (so a resumed run
        draws what the uninterrupted one would on the same ranks); None for other recipes."""
        config = self.config
        if config.recipe != AUTOREGRESSIVE.name:
            return None
        generator = torch.Generator().manual_seed(hash((config.seed, epoch, step, comm.rank())) % 2**63)
        return Unroll(config.pushforward, config.noise, generator)

    @property
    def every_s(self) -> float:
        """A checkpoint every --checkpoint-every minutes (rank 0's clock decides; the ranks agree at a step)."""
        return math.inf if self.config.checkpoint_every is None else 60 * self.config.checkpoint_every

    def test_files(self) -> list[dict] | None:
        """The record of ``--test-data``'s files (``PDEBenchFiles.record``), None without it."""
        return self.test_set.files.record() if self.config.test_data else None

    def meta(self, epoch: int, sums: EpochSums | None = None) -> dict:
        """A checkpoint's meta: after ``epoch`` whole epochs (and, with ``sums``, steps of the next)."""
        record = dict(
            epoch=epoch,
            world_size=comm.world_size(),
            config=dataclasses.asdict(self.config) | dict(data=self.data),
            files=dict(data=self.train_set.files.record(), test_data=self.test_files()),
            stats=dataclasses.asdict(self.train_set.stats),
            global_shape=list(self.train_set.global_shape),
            channels=dict(inputs=list(self.train_set.inputs), fields=list(self.train_set.fields)),
            history=self.history,
        )
        return record if sums is None else record | dict(partial=sums.saved())


def set_up(config: TrainConfig, stop: StopSignals, timeouts: PhaseTimeouts) -> Run:
    """This rank's ``Run`` of ``config`` (call on every rank): with ``--resume`` from the newest checkpoint
    that loads on every rank (CheckpointError if none does or its options differ); rank 0 marks an older
    run's checkpoints as not this run's (``mark_fresh``, once the data are read) and starts the run folder:
    ``stats.json``, ``metrics.jsonl`` (a resumed run's rows), no ``stopped.json``."""
    device = resolve_device(config.device)
    rank, out = comm.rank(), Path(config.out)
    data = config.data if config.data is not None else str(default_data_path())
    files = DataFiles(data)
    config = resolve_problem(config, files)
    sharding = Sharding.build(config, comm.world_size(), device.type, len(files.grid))
    channels = (files.inputs, files.fields)
    model = build_model(config, device, sharding, model_extents(config, files.grid), channels)
    if rank == 0 and not config.quiet:
        print(f"drift train: {files.describe()}; recipe {config.recipe}", flush=True)
    if rank == 0 and not config.quiet and model.blocks[0].spectral.choice is not None:
        print(f"drift train: method {model.blocks[0].spectral.choice}", flush=True)
    optimizer = make_optimizer(config, model)
    history, saved = [], None
    if config.resume:  # the newest checkpoint that loads on every rank, and its statistics

        def check(path: Path, meta: dict) -> None:
            check_options(config, path, meta)

        _, saved = load_newest(out / "checkpoints", model, optimizer, check=check, keys=META_KEYS)
        history = saved["history"]
    train_set, test_set = datasets(config, files, saved_stats(saved) if saved else None, sharding)
    if rank == 0 and not config.resume:  # the data are good: from here on an older run's checkpoints are not ours
        mark_fresh(out / "checkpoints")
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        (out / STOPPED).unlink(missing_ok=True)
        train_set.stats.save(out / "stats.json")
        (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in history))
    weights = frame_weights(train_set, config.data_parallel, device) if config.loss == "frame-weighted" else None
    physical = train_set.field_tensors(torch.float32, device) if config.loss == "nrmse" else None
    return Run(
        config, stop, timeouts, device, data, sharding, model, optimizer, history, saved, train_set, test_set, weights,
        physical,
    )  # fmt: skip


__getattr__ = moved_names(__name__, {"drift.data": ("FIELDS",)})  # imported here at 0.2.0
