"""A trained model on this job's ranks, as ``drift evaluate``, ``drift predict`` and ``drift export`` load
it: a checkpoint's options with the job's data, method and rank layout (``trained_config``), the grid of
a data file read at a resolution the model holds (``data_grid``), and the model built for that grid and
loaded from the newest checkpoint that loads (``load_trained``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from drift import comm
from drift._plan import resolve_device
from drift.checkpoint import load_newest, read_meta
from drift.data import Stats
from drift.nn import FNO
from drift.train.checks import check_resolution, model_extents
from drift.train.config import META_KEYS, MODEL_OPTIONS, ConfigError, TrainConfig, config_from
from drift.train.model import build_model
from drift.train.resume import check_options, checkpoint_root, find_checkpoint, saved_config
from drift.train.sharding import Sharding, saved_channels, saved_stats


def trained_config(
    checkpoint: str | Path,
    *,
    data: str | Sequence[str] | None = None,
    test_data: Sequence[str] | None = None,
    method: str | None = None,
    grid: Sequence[int] | None = None,
    data_parallel: int = 1,
) -> TrainConfig:
    """The options of the run whose checkpoint ``checkpoint`` names (a run folder, its ``checkpoints``
    folder or one checkpoint; CheckpointError if none is whole), with this job's ``data`` (files or
    folders), ``test_data`` and ``method`` (default: the run's; new ``data`` without ``test_data`` drops
    the run's test files, so that its split is used) and rank layout (``grid``, ``data_parallel``; the
    run's reduction mesh fits its own ranks, so none). Reads files only: no collective."""
    meta = read_meta(find_checkpoint(checkpoint), META_KEYS)
    config = config_from(saved_config(meta), grid=grid, data_parallel=data_parallel, reduction=None)
    config.method = method or config.method
    config.test_data = tuple(test_data) if test_data else None if data else config.test_data
    config.data = data or config.data
    return config


def resolution_stride(extents: Sequence[int], resolution: int | None) -> int:
    """The stride that reads a grid of ``extents`` points per dim at ``resolution`` points per dim
    (1 for None); ConfigError unless every extent is ``resolution`` times it."""
    if resolution is None:
        return 1
    stride = max(1, extents[0] // resolution)
    if any(n != stride * resolution for n in extents):
        raise ConfigError(
            f"--resolution {resolution}: the data's {'x'.join(map(str, extents))} grid is not a multiple of it; "
            f"write a data set at that resolution (drift generate --resolution {resolution}) and pass it as --data"
        )
    return stride


def data_grid(
    config: TrainConfig, extents: Sequence[int], resolution: int | None, world_size: int
) -> tuple[tuple[int, ...], int]:
    """The grid the model sees of ``config.data``'s ``extents`` (x, y, z) read at ``resolution`` points per
    dim (None: all of them) and the stride that reads it. ConfigError naming ``--resolution`` (or
    ``--data``) when the stride does not fit, a rank of the grid would hold no point or the model's modes
    do not fit the grid. No collective."""
    stride = resolution_stride(extents, resolution)
    shape = tuple(n // stride for n in extents)
    data = config.data if isinstance(config.data, str) else " ".join(config.data)
    option = f"--resolution {resolution}" if resolution else f"--data {data}"
    check_resolution(config, shape, world_size, option)
    return shape, stride


@dataclass
class Trained:
    """A checkpoint's model on this rank: the job's options, the checkpoint loaded and its ``meta``, the
    mesh and placements, the model (parallelized over the mesh when there is one) and its device."""

    config: TrainConfig
    checkpoint: Path
    meta: dict
    sharding: Sharding
    model: FNO
    device: torch.device

    @property
    def stats(self) -> Stats:
        """The normalisation statistics of the run's training set."""
        return saved_stats(self.meta)


def load_trained(checkpoint: str | Path, config: TrainConfig, shape: Sequence[int] | None, device) -> Trained:
    """``config``'s model (``trained_config``) for input grids of ``shape`` (spatial extents; None: no grid in view,
    which ``--method auto`` needs to choose), built on ``device``
    and parallelized over the mesh of ``config``'s rank layout, with the weights of the newest checkpoint
    under ``checkpoint`` that loads (``load_newest``: a damaged one is passed over, said on rank 0).
    Call on every rank of the default group (or alone); CheckpointError on every rank when the
    checkpoint's model options differ or none loads."""
    where = resolve_device(device)
    saved = read_meta(find_checkpoint(checkpoint), META_KEYS)
    dims = len(saved["global_shape"])
    sharding = Sharding.build(config, comm.world_size(), where.type, dims)
    extents = None if shape is None else model_extents(config, shape)
    model = build_model(config, where, sharding, extents, saved_channels(saved))

    def check(path: Path, meta: dict) -> None:
        check_options(config, path, meta, names=MODEL_OPTIONS)

    path, meta = load_newest(checkpoint_root(checkpoint), model, check=check, keys=META_KEYS)
    return Trained(config, path, meta, sharding, model, where)
