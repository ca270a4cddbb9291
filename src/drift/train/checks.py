"""The checks of ``drift train``'s options before any rank starts (``ConfigError`` naming the option),
and the rank layout they imply: the spatial grid of ranks and the reduction mesh."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path

import torch

from drift._moved import moved_names
from drift.data import DataFiles
from drift.jobs.launch import launched
from drift.layout import chunk_sizes, split_reduction
from drift.modes import mode_lists
from drift.nn import AUTO, cp_rank, method_named, mode_counts, tucker_rank
from drift.options import first_problem
from drift.train.budget import check_memory
from drift.train.config import HOSTS, ConfigError, TrainConfig
from drift.train.problem import problem_modes, problem_recipe, resolve_problem
from drift.train.resume import resume_point


def check_config(config: TrainConfig, world_size: int, memory: bool = True) -> None:
    """Reject option values that cannot work, before any rank starts (ConfigError naming the option);
    with ``memory``, a training step whose estimated memory exceeds a rank's budget too (``check_memory``:
    once, where the ranks start)."""
    if (problem := first_problem(config)) is not None:  # each option's choices and check (TrainConfig's)
        raise ConfigError(problem)
    if config.device == "cuda":
        gpus = torch.cuda.device_count()
        if gpus < 1:
            raise ConfigError("--device cuda: no CUDA device is available")
        # Ranks this command starts itself see every GPU and need one each (NCCL); under torchrun or a
        # scheduler the launcher has placed them.
        if not launched() and gpus < world_size:
            raise ConfigError(f"--device cuda: {world_size} ranks on this machine need {world_size} GPUs, found {gpus}")
    if config.memory_per_rank is not None and config.device == "cpu" and not Path("/proc/self/statm").exists():
        # The ranks are held to it by reading their private memory, which only Linux's /proc gives.
        raise ConfigError("--memory-per-rank on the CPU needs Linux's /proc, absent here: leave it out")
    if config.reduction is not None:
        check_reduction(config, world_size)
    if config.overlap != 1 and not _takes_reduction(config.method):
        raise ConfigError(f"--overlap {config.overlap} applies to --method drift, not {config.method}")
    if config.resume:
        resume_point(config)
    if config.data is not None:
        files = DataFiles(config.data)
        config = resolve_problem(config, files)
        check_data(config, files, world_size)
        if memory:
            grid = spatial_grid(config, world_size, len(files.grid))
            check_memory(config, files.grid, len(files.inputs), len(files.fields), grid, world_size)
    if config.factorization is not None:
        shape = (config.width, config.width, *mode_counts(problem_modes(config), real=True))
        try:
            (tucker_rank if config.factorization == "tucker" else cp_rank)(shape, config.rank)
        except ValueError as exc:
            raise ConfigError(f"--rank {config.rank}: {exc}") from None


def check_data(config: TrainConfig, files: DataFiles, world_size: int) -> None:
    """ConfigError unless ``config`` (resolved: ``resolve_problem``) fits its data ``files``: the test files'
    layout, fields and grid, the frames, the split, the grid of ranks and the modes."""
    frames = 1 if files.static else config.t_in + config.t_out
    if config.test_data:
        test = DataFiles(config.test_data)
        differ = [
            (what, got, want)
            for what, got, want in (
                ("layout", test.format.name, files.format.name),
                ("fields", test.fields, files.fields),
                ("grid", _shape_text(test.grid), _shape_text(files.grid)),
            )
            if got != want
        ]
        if differ:
            what, got, want = differ[0]
            raise ConfigError(f"--test-data: {test.paths[0]} has the {what} {got}, --data {files.paths[0]} has {want}")
        if test.frames < frames:
            raise ConfigError(
                f"--t-in + --t-out = {frames} exceeds the {test.frames} frames of --test-data {test.paths[0]}"
            )
    else:
        check_split(config.split, files)
    if files.frames < frames:
        raise ConfigError(f"--t-in + --t-out = {frames} exceeds the {files.frames} frames of {_named(files)}")
    check_resolution(config, files.grid, world_size)


def model_extents(config: TrainConfig, extents: Sequence[int]) -> tuple[int, ...]:
    """The model's grid for data of spatial ``extents``: with ``t_out`` time points for a one-shot model."""
    return (*extents, config.t_out) if problem_recipe(config).time_dim else tuple(extents)


def _named(files: DataFiles) -> str:
    """The data files in a message: the one file, or how many and the first."""
    if len(files.paths) == 1:
        return str(files.paths[0])
    return f"the {len(files.paths)} files of --data ({files.paths[0]}, ...)"


def check_split(split: str, files: DataFiles) -> None:
    """ConfigError naming ``--split`` unless its rule, applied to each file, leaves the files' trajectories
    both a training and a test set."""
    trajectories, test = files.trajectories, len(files.held_out(split))
    if test == 0 or test == trajectories:
        rule = "int(0.1 x N) first" if split == "pdebench" else "round(0.1 x N) last (at least one)"
        if len(files.paths) > 1:
            rule += " of each file"
        raise ConfigError(
            f"--split {split}: {_named(files)} holds {trajectories} trajectories, and the {rule} leaves {test} to "
            f"test and {trajectories - test} to train on; PDEBench's rule needs at least 10 (--split last needs 2), "
            "or give a separate test set (--test-data)"
        )


def spatial_grid(config: TrainConfig, world_size: int, dims: int = 3) -> tuple[int, ...]:
    """Ranks per spatial dim of ``dims``-D data: ``--grid``, or a slab of the ``world_size / --data-parallel``
    spatial ranks."""
    if world_size % config.data_parallel:
        raise ConfigError(f"--data-parallel {config.data_parallel} does not divide the {world_size} ranks")
    spatial = world_size // config.data_parallel
    grid = config.grid or (spatial,) + (1,) * (dims - 1)
    if len(grid) != dims or min(grid) < 1 or math.prod(grid) != spatial:
        raise ConfigError(
            f"--grid {'x'.join(map(str, grid))}: needs {dims} positive rank counts (one per spatial dim of the "
            f"data) whose product is the {spatial} spatial ranks ({world_size} ranks / --data-parallel "
            f"{config.data_parallel})"
        )
    return tuple(grid)


def reduction_shape(config: TrainConfig, world_size: int) -> tuple[int, ...] | None:
    """The reduction mesh shape of ``--reduction``: as given, or for ``--reduction hosts`` (HOSTS) the
    spatial ranks as (hosts, ranks a host): torchrun numbers ranks host by host, LOCAL_WORLD_SIZE a host
    (``drift train --nproc``: one host); None when one host holds every spatial rank of a field."""
    if config.reduction != HOSTS:
        return config.reduction
    spatial = world_size // config.data_parallel
    per_host = int(os.environ.get("LOCAL_WORLD_SIZE", world_size)) if launched() else world_size
    if per_host >= spatial:
        return None
    if spatial % per_host:
        raise ConfigError(f"--reduction hosts: {per_host} ranks a host do not divide the {spatial} spatial ranks")
    return (spatial // per_host, per_host)


def _takes_reduction(method: str) -> bool:
    """Whether ``method`` takes drift's --reduction and --overlap (not "auto", which may choose another)."""
    return method != AUTO and method_named(method).takes_reduction


def check_reduction(config: TrainConfig, world_size: int) -> None:
    """ConfigError unless ``--reduction`` splits the grid's split dims in turn (``drift.reduction_mesh``)
    for a "drift" model."""
    if not _takes_reduction(config.method):
        raise ConfigError(f"--reduction {_shape_text(config.reduction)} applies to --method drift, not {config.method}")
    reduction = reduction_shape(config, world_size)
    if reduction is None:
        return
    shape = _shape_text(reduction)
    split = [p for p in spatial_grid(config, world_size, len(config.grid) if config.grid else 1) if p > 1]
    if min(reduction) < 1 or math.prod(reduction) != math.prod(split):
        raise ConfigError(
            f"--reduction {shape}: needs positive entries whose product is the {math.prod(split)} spatial ranks"
        )
    try:
        split_reduction(reduction, split)
    except ValueError as exc:
        raise ConfigError(f"--reduction {shape}: {exc}") from None


def _shape_text(shape: tuple[int, ...] | str) -> str:
    return shape if isinstance(shape, str) else "x".join(map(str, shape))


def check_resolution(config: TrainConfig, extents: Sequence[int], world_size: int, option: str | None = None) -> None:
    """ConfigError unless every rank of the grid holds points of the ``extents`` (spatial) grid
    (``torch.chunk`` blocks) and the modes fit the model's grid (``config`` resolved: ``resolve_problem``);
    a misfit names ``option`` (default: ``--modes``)."""
    grid = spatial_grid(config, world_size, len(extents))
    for dim, (n, p) in enumerate(zip(extents, grid, strict=True)):
        if min(chunk_sizes(n, p)) == 0:
            raise ConfigError(
                f"--grid {'x'.join(map(str, grid))}: {p} ranks on dim {dim} ({n} points, torch.chunk blocks "
                f"of {-(-n // p)}) leave a rank without points"
            )
    try:
        mode_lists(config.modes, model_extents(config, extents), real=True)
    except ValueError as exc:
        raise ConfigError(f"{option or '--modes ' + ','.join(map(str, config.modes))}: {exc}") from None


# The choices this module imported at 0.1.0, now used where the options are declared: their homes.
__getattr__ = moved_names(
    __name__,
    {
        "drift.data": ("SPLITS",),
        "drift.nn": ("FACTORIZATIONS", "METHODS"),
        "drift.train.config": ("LOSSES", "MODELS", "ON_NAN", "SCHEDULES"),
    },
)
