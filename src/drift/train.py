"""Training and evaluating a distributed 3D+time FNO on PDEBench-layout compressible Navier-Stokes data.

The problem: from ``t_in`` frames of the five fields predict the next ``t_out`` frames. The FNO works
on the 4-D grid ``(x, y, z, t)`` with ``t_out`` time points: its input channels are the ``fields x t_in``
input frames, repeated along t, and the normalised time ``t / t_out``; its output channels are the
fields at each of the ``t_out`` times.

The ranks form a device mesh (``Sharding``): ``data_parallel`` ranks along a "data" mesh dim (when
above 1), each taking its ``torch.chunk`` share of every batch's trajectories, times the spatial ranks
of ``grid`` (default: a slab along x), one mesh dim per split spatial dim ("x", "y", "z"); time is never
split. Each rank reads, computes and stores only its block of its trajectories. The model is built on
one device from ``torch.manual_seed(seed)`` and then parallelized over the mesh (it takes and returns
DTensors), so the same seed gives the same run on any number of ranks and any mesh.

Model: neuraloperator 2.0's FNO options (``--model neuralop``, ``FNO.neuralop_defaults``) or Li et al.'s
plain FNO (``--model plain``). Optimizer: AdamW with ``--weight-decay`` (Adam at 0; ``drift.optim``'s
fused step), its learning rate ``--lr`` constant or cosine-annealed to 0 over the run's optimizer steps
(``--schedule``).

Loss: the mean squared error over the global batch (each rank's loss is its share of the sum, so
their sum is the global loss, torch.distributed's convention; drift sums the gradients over the mesh
itself), by default (``--loss frame-weighted``) each field and predicted frame weighted by the inverse
of its variance over the training trajectories (``frame_weights``), or unweighted (``--loss mse``).
Test metric: the relative L2 error ``||pred - true|| / ||true||`` of each test trajectory over its whole
normalised field (every field, time and point), averaged over the trajectories; after the last epoch and
in ``evaluate`` also PDEBench's metrics (``drift.metrics``) on the physical fields.
The test set is the last 10% of the file's trajectories (``split="last"``) or PDEBench's first 10%
(``split="pdebench"``); the run records it, and a resumed run or an evaluation uses the same.

Guards: rank 0 holds the run folder's lock for the whole run (``drift.checkpoint.folder_lock``); every
step all-reduces one flag for a non-finite loss or gradient norm on any rank, and before the optimizer
step (so before any checkpoint could hold the result) the run stops with ``NonFiniteError`` naming the
epoch, step and trajectories, or (``on_nan="skip-batch"``) skips the batch and counts it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.nn import functional as F
from tqdm import tqdm

from drift import comm, optim
from drift._plan import resolve_device
from drift.checkpoint import (
    CheckpointError,
    FolderInUse,
    complete_checkpoints,
    folder_lock,
    latest_checkpoint,
    load_newest,
    mark_fresh,
    read_meta,
    save_checkpoint,
    usable_checkpoint,
)
from drift.cluster import Cluster, PeersLost, describe
from drift.data import FIELDS, SPLITS, PDEBench3D, Stats, generate, held_out_trajectories, read_layout
from drift.launch import GROUP_TIMEOUT_S, launched, process_group, rank_device
from drift.layout import chunk_sizes, chunk_slice, device_mesh, reduction_mesh, split_reduction, to_dtensor
from drift.metrics import PDEBenchMetrics
from drift.nn import FACTORIZATIONS, FNO, METHODS, parallelize
from drift.nn.auto import Machine
from drift.nn.factorized import cp_rank, tucker_rank
from drift.nn.spectral import AUTO, mode_counts
from drift.stopping import STOPPED, Stopped, StopSignals
from drift.timeouts import PhaseTimeouts
from drift.truncated import mode_lists

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

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


class NonFiniteError(RuntimeError):
    """A non-finite loss or gradient norm stopped training; the message names the epoch, step and trajectories."""


HOSTS = "hosts"  # --reduction hosts: drift's spectra reduced within each host first, then across hosts


@dataclass
class TrainConfig:
    """The options of ``drift train`` (see ``drift train --help``)."""

    data: str | None = None
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


def check_config(config: TrainConfig, world_size: int) -> None:
    """Reject option values that cannot work, before any rank starts (ConfigError naming the option)."""
    for name in ("width", "layers", "epochs", "batch_size", "nproc", "t_in", "t_out", "data_parallel", "overlap"):
        if getattr(config, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(config, name)}")
    if not config.lr > 0:
        raise ConfigError(f"--lr must be positive, got {config.lr}")
    for name in ("checkpoint_every", "collective_timeout"):
        value = getattr(config, name)
        if value is not None and not 0 < value < math.inf:
            raise ConfigError(f"--{name.replace('_', '-')} must be positive, got {value}")
    if not config.weight_decay >= 0:
        raise ConfigError(f"--weight-decay must be non-negative, got {config.weight_decay}")
    if config.model not in MODELS:
        raise ConfigError(f"--model must be one of {', '.join(MODELS)}, got {config.model!r}")
    if config.schedule not in SCHEDULES:
        raise ConfigError(f"--schedule must be one of {', '.join(SCHEDULES)}, got {config.schedule!r}")
    if config.method not in (*METHODS, AUTO):
        raise ConfigError(f"--method must be one of {', '.join((*METHODS, AUTO))}, got {config.method!r}")
    if config.factorization is not None:
        if config.factorization not in FACTORIZATIONS:
            raise ConfigError(
                f"--factorization must be one of {', '.join(FACTORIZATIONS)}, got {config.factorization!r}"
            )
        shape = (config.width, config.width, *mode_counts(config.modes, real=True))
        try:
            (tucker_rank if config.factorization == "tucker" else cp_rank)(shape, config.rank)
        except ValueError as exc:
            raise ConfigError(f"--rank {config.rank}: {exc}") from None
    if config.loss not in LOSSES:
        raise ConfigError(f"--loss must be one of {', '.join(LOSSES)}, got {config.loss!r}")
    if config.on_nan not in ON_NAN:
        raise ConfigError(f"--on-nan must be one of {', '.join(ON_NAN)}, got {config.on_nan!r}")
    if config.split not in SPLITS:
        raise ConfigError(f"--split must be one of {', '.join(SPLITS)}, got {config.split!r}")
    if config.device not in ("cpu", "cuda"):
        raise ConfigError(f"--device must be cpu or cuda, got {config.device!r}")
    if config.device == "cuda":
        gpus = torch.cuda.device_count()
        if gpus < 1:
            raise ConfigError("--device cuda: no CUDA device is available")
        # Ranks this command starts itself see every GPU and need one each (NCCL); under torchrun or a
        # scheduler the launcher has placed them.
        if not launched() and gpus < world_size:
            raise ConfigError(f"--device cuda: {world_size} ranks on this machine need {world_size} GPUs, found {gpus}")
    if config.reduction is not None:
        check_reduction(config, world_size)
    if config.overlap != 1 and config.method != "drift":
        raise ConfigError(f"--overlap {config.overlap} applies to --method drift, not {config.method}")
    if config.resume:
        resume_point(config)
    if config.data is None:
        return
    trajectories, frames, *extents = read_layout(config.data)
    check_split(config.split, trajectories, config.data)
    if frames < config.t_in + config.t_out:
        raise ConfigError(
            f"--t-in + --t-out = {config.t_in + config.t_out} exceeds the {frames} frames of {config.data}"
        )
    check_resolution(config, extents, world_size)


def check_split(split: str, trajectories: int, data: str | Path) -> None:
    """ConfigError naming ``--split`` unless its rule leaves ``data``'s trajectories both a training and a
    test set."""
    test = len(held_out_trajectories(trajectories, split))
    if test == 0 or test == trajectories:
        rule = "int(0.1 x N) first" if split == "pdebench" else "round(0.1 x N) last (at least one)"
        raise ConfigError(
            f"--split {split}: {data} holds {trajectories} trajectories, and the {rule} leaves {test} to test and "
            f"{trajectories - test} to train on; PDEBench's rule needs at least 10 (--split last needs 2)"
        )


def spatial_grid(config: TrainConfig, world_size: int) -> tuple[int, ...]:
    """Ranks per spatial dim: ``--grid``, or a slab of the ``world_size / --data-parallel`` spatial ranks."""
    if world_size % config.data_parallel:
        raise ConfigError(f"--data-parallel {config.data_parallel} does not divide the {world_size} ranks")
    spatial = world_size // config.data_parallel
    grid = config.grid or (spatial, 1, 1)
    if len(grid) != 3 or min(grid) < 1 or math.prod(grid) != spatial:
        raise ConfigError(
            f"--grid {'x'.join(map(str, grid))}: needs three positive rank counts whose product is the "
            f"{spatial} spatial ranks ({world_size} ranks / --data-parallel {config.data_parallel})"
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


def check_reduction(config: TrainConfig, world_size: int) -> None:
    """ConfigError unless ``--reduction`` splits the grid's split dims in turn (``drift.reduction_mesh``)
    for a "drift" model."""
    if config.method != "drift":
        raise ConfigError(f"--reduction {_shape_text(config.reduction)} applies to --method drift, not {config.method}")
    reduction = reduction_shape(config, world_size)
    if reduction is None:
        return
    shape = _shape_text(reduction)
    split = [p for p in spatial_grid(config, world_size) if p > 1]
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
    """ConfigError unless every rank of the grid holds points of the ``extents`` (x, y, z) grid
    (``torch.chunk`` blocks) and the modes fit it; a misfit names ``option`` (default: ``--modes``)."""
    grid = spatial_grid(config, world_size)
    for dim, (n, p) in enumerate(zip(extents, grid, strict=True)):
        if min(chunk_sizes(n, p)) == 0:
            raise ConfigError(
                f"--grid {'x'.join(map(str, grid))}: {p} ranks on dim {dim} ({n} points, torch.chunk blocks "
                f"of {-(-n // p)}) leave a rank without points"
            )
    try:
        mode_lists(config.modes, (*extents, config.t_out), real=True)
    except ValueError as exc:
        raise ConfigError(f"{option or '--modes ' + ','.join(map(str, config.modes))}: {exc}") from None


@dataclass(frozen=True)
class Sharding:
    """Where a run's tensors live: its device mesh (None on one rank) and the placements of the FNO's
    inputs ``(batch, channels, x, y, z, t)`` over it (``Shard(0)`` on the "data" mesh dim)."""

    mesh: DeviceMesh | None
    placements: tuple

    @classmethod
    def build(cls, config: TrainConfig, world_size: int, device_type: str) -> Sharding:
        """A "data" mesh dim of ``--data-parallel`` ranks (when above 1), then one mesh dim per spatial
        dim that the grid splits; call on every rank of the default group."""
        grid = spatial_grid(config, world_size)
        dims = [("data", config.data_parallel, Shard(0))] if config.data_parallel > 1 else []
        dims += [(name, p, Shard(2 + i)) for i, (name, p) in enumerate(zip("xyz", grid, strict=True)) if p > 1]
        if not dims:
            return cls(None, ())
        mesh = device_mesh([p for _, p, _ in dims], [n for n, _, _ in dims], device_type, timeout_s=GROUP_TIMEOUT_S)
        return cls(mesh, tuple(placement for *_, placement in dims))

    def field_placements(self) -> tuple:
        """The placements over the spatial dims (x, y, z) alone, as ``PDEBench3D`` and ``Layout`` take them."""
        return tuple(Replicate() if p.dim == 0 else Shard(p.dim - 2) for p in self.placements)

    def share(self, indices: Sequence[int]) -> list[int]:
        """This rank's ``torch.chunk`` share of a batch's trajectories (all of them without a data dim)."""
        indices = list(indices)
        if Shard(0) not in self.placements:
            return indices
        axis = self.placements.index(Shard(0))
        return indices[chunk_slice(len(indices), self.mesh.size(axis), self.mesh.get_coordinate()[axis])]

    def wrap(self, local: torch.Tensor, global_shape: Sequence[int]) -> torch.Tensor:
        """This rank's block of a model input as the model takes it: a DTensor on a mesh, else itself."""
        return local if self.mesh is None else to_dtensor(local, self.mesh, self.placements, global_shape)


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def model_input(x: torch.Tensor, t_out: int) -> torch.Tensor:
    """``(batch, fields, t_in, *block)`` input frames -> the FNO's ``(batch, fields * t_in + 1, *block, t_out)``."""
    b, f, t_in, *block = x.shape
    frames = x.reshape(b, f * t_in, *block, 1).expand(-1, -1, *block, t_out)
    t = torch.arange(1, t_out + 1, dtype=x.dtype, device=x.device) / t_out
    return torch.cat([frames, t.expand(b, 1, *block, t_out)], dim=1)


def model_target(y: torch.Tensor) -> torch.Tensor:
    """``(batch, fields, t_out, *block)`` target frames -> the FNO's ``(batch, fields, *block, t_out)``."""
    return y.movedim(2, -1)


def build_model(
    config: TrainConfig, device, sharding: Sharding | None = None, global_shape: Sequence[int] | None = None
) -> FNO:
    """The FNO for ``config``, its parameters drawn from ``torch.manual_seed(config.seed)`` (without
    touching the caller's random state), parallelized over ``sharding``'s mesh when it has one.
    ``global_shape``: the model's input extents (x, y, z, t_out), which ``--method auto`` chooses by."""
    fields = len(FIELDS)
    constructor = FNO.neuralop_defaults if config.model == "neuralop" else FNO
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        model = constructor(
            fields * config.t_in + 1,
            fields,
            config.width,
            config.modes,
            config.layers,
            method=config.method,
            factorization=config.factorization,
            rank=config.rank,
            device=device,
        )
    if sharding is not None and sharding.mesh is not None:
        reduction = reduction_shape(config, sharding.mesh.size())
        if reduction is not None:
            spatial = [a for a, p in enumerate(sharding.placements) if p.dim >= 2]
            reduction = reduction_mesh(sharding.mesh, spatial, reduction, timeout_s=GROUP_TIMEOUT_S)
        options = dict(reduction=reduction, overlap=config.overlap, global_shape=global_shape)
        parallelize(model, sharding.mesh, sharding.placements, **options)
    elif config.method == AUTO and global_shape is not None:
        for layer in model.spectral:
            layer.choose_method(global_shape, (1,) * len(global_shape), Machine.default(torch.device(device).type))
    return model


def _batch(
    dataset: PDEBench3D, indices: Sequence[int], sharding: Sharding, device
) -> tuple[torch.Tensor, torch.Tensor]:
    """The model input of the trajectories ``indices`` (this rank's share and block of them, wrapped as
    the model takes it) and this rank's target block."""
    pairs = [dataset[i] for i in sharding.share(indices)]
    if pairs:
        x, y = (torch.stack([p[k] for p in pairs]).to(device) for k in (0, 1))
    else:  # a data rank without trajectories in this batch still joins the collectives
        x = torch.empty(0, len(dataset.fields), dataset.t_in, *dataset.local_shape, device=device)
        y = torch.empty(0, len(dataset.fields), dataset.t_out, *dataset.local_shape, device=device)
    x = model_input(x, dataset.t_out)
    global_shape = (len(indices), x.shape[1], *dataset.global_shape, dataset.t_out)
    return sharding.wrap(x, global_shape), model_target(y)


def _global_sum(t: torch.Tensor) -> torch.Tensor:
    return comm.all_reduce(t) if comm.world_size() > 1 else t


def frame_weights(dataset: PDEBench3D, data_parallel: int, device) -> torch.Tensor:
    """``--loss frame-weighted``'s weights ``(1, fields, 1, 1, 1, t_out)``: per field and predicted frame,
    the inverse of the normalised target's variance over ``dataset``'s trajectories and points, scaled to
    a mean of 1. Every rank sums its block of every trajectory (in float64), and one all-reduce joins
    them (each block counted once per data-parallel replica). ConfigError, on every rank, where a field
    is constant at a frame or its normalised values are not finite."""
    sums = torch.zeros(2, len(dataset.fields), dataset.t_out, dtype=torch.float64, device=device)
    for i in range(len(dataset)):
        y = dataset[i][1].to(device=device, dtype=torch.float64)  # (fields, t_out, *block)
        sums[0] += y.sum(tuple(range(2, y.dim())))
        sums[1] += y.square().sum(tuple(range(2, y.dim())))
    sums = _global_sum(sums) / (data_parallel * len(dataset) * math.prod(dataset.global_shape))
    variance = sums[1] - sums[0].square()
    # Rounding leaves a constant frame a variance of order 1e-16 of its mean square, not 0.
    constant = variance <= 1e-10 * sums[1]
    for bad, what in ((~torch.isfinite(variance), "holds a non-finite value"), (constant, "is constant")):
        if bool(bad.any()):
            field, frame = (int(i) for i in bad.nonzero()[0])
            raise ConfigError(
                f"--loss frame-weighted: the normalised field {dataset.fields[field]!r} {what} over the training "
                f"trajectories at predicted frame {frame + 1} (--loss mse does not weight frames)"
            )
    weights = 1 / variance
    return (weights / weights.mean()).to(torch.float32).view(1, len(dataset.fields), 1, 1, 1, dataset.t_out)


def pdebench_metrics(dataset: PDEBench3D, device) -> PDEBenchMetrics:
    """An accumulator of PDEBench's metrics over ``dataset``'s trajectories, laid out as its blocks."""
    return PDEBenchMetrics(dataset.layout, dataset.fields, dataset.t_out, len(dataset), device=device)


@torch.no_grad()
def relative_l2(
    model: FNO,
    dataset: PDEBench3D,
    sharding: Sharding,
    batch_size: int,
    device,
    pdebench: PDEBenchMetrics | None = None,
) -> float:
    """Mean over ``dataset``'s trajectories of ``||pred - true|| / ||true||`` over each whole field. The
    same pass gives ``pdebench`` (when given) the physical fields: prediction and truth de-normalised
    with the data set's statistics, in float64."""
    sums = torch.zeros(len(dataset), 2, dtype=torch.float64, device=device)
    shape = (1, -1, 1, 1, 1, 1)
    mean, std = (
        torch.tensor(v, dtype=torch.float64, device=device).view(shape) for v in (dataset.stats.mean, dataset.stats.std)
    )
    for start in range(0, len(dataset), batch_size):
        indices = range(start, min(start + batch_size, len(dataset)))
        x, y = _batch(dataset, indices, sharding, device)
        pred = _local(model(x))
        err = (pred - y).square().flatten(1).sum(1, dtype=torch.float64)
        sums[sharding.share(indices)] += torch.stack([err, y.square().flatten(1).sum(1, dtype=torch.float64)], 1)
        if pdebench is not None:
            pdebench.update(pred.double() * std + mean, y.double() * std + mean, sharding.share(indices))
    total = _global_sum(sums)
    return float((total[:, 0] / total[:, 1]).sqrt().mean())


def _stats(meta: dict) -> Stats:
    return Stats(**{k: tuple(v) for k, v in meta["stats"].items()})


def _datasets(
    config: TrainConfig, data: Path, stats: Stats | None, sharding: Sharding, stride: int = 1
) -> tuple[PDEBench3D, PDEBench3D]:
    check_split(config.split, read_layout(data)[0], data)
    options = dict(t_in=config.t_in, t_out=config.t_out, stride=stride, split_rule=config.split)
    where = (sharding.mesh, sharding.field_placements())
    train_set = PDEBench3D(data, *where, stats=stats, **options)
    test_set = PDEBench3D(data, *where, split="test", stats=train_set.stats, **options)
    return train_set, test_set


def saved_config(meta: dict) -> dict:
    """The options a checkpoint's run was trained with (``LEGACY_OPTIONS`` for options it predates)."""
    return {**LEGACY_OPTIONS, **meta["config"]}


def _check_options(
    config: TrainConfig,
    path: Path,
    meta: dict,
    advice: str = "",
    names: Sequence[str] = (*MODEL_OPTIONS, *OPTIMIZER_OPTIONS),
) -> None:
    """CheckpointError naming the first of ``names`` the checkpoint at ``path`` was trained with otherwise."""
    saved = saved_config(meta)
    for name in names:
        option = f"--{name.replace('_', '-')}"
        if name not in saved:
            raise CheckpointError(f"{path}: the run was trained without {option} (by an older drift){advice}")
        if json.loads(json.dumps(getattr(config, name))) != saved[name]:
            raise CheckpointError(
                f"{path}: {option} is {getattr(config, name)}, the run was trained with {saved[name]}{advice}"
            )


def resumed_data(config: TrainConfig) -> TrainConfig:
    """``config`` with ``--resume``'s data: the file the run in ``--out`` trained on where ``--data`` is not
    given. Another file (the data moved, or were mended) must have the run's grid, ConfigError otherwise;
    it is read with the run's statistics. CheckpointError as ``resume_point`` when none can be resumed."""
    if not config.resume:
        return config
    _, meta = resume_point(config)
    trained_on = meta["config"].get("data")
    if config.data is None:
        return dataclasses.replace(config, data=trained_on)
    grid = tuple(read_layout(config.data)[2:])
    if grid != tuple(meta["global_shape"]):
        raise ConfigError(
            f"--resume continues the run trained on the {tuple(meta['global_shape'])} grid of {trained_on}; "
            f"--data {config.data} has {grid} (train on it into another --out)"
        )
    return config


def resume_point(config: TrainConfig) -> tuple[Path, dict]:
    """The checkpoint ``--resume`` continues from (unless DCP then fails to load it: see ``load_newest``)
    and its meta: ``latest``'s, or the newest older complete one when that one is damaged. CheckpointError
    if none is whole or the run's options differ."""
    path = usable_checkpoint(Path(config.out) / "checkpoints", META_KEYS)
    meta = read_meta(path, META_KEYS)
    _check_options(config, path, meta)
    return path, meta


def check_fresh_run(config: TrainConfig) -> None:
    """For ``drift train`` without ``--resume``: CheckpointError naming the option if ``--out`` holds
    checkpoints trained with other options (the fresh run would replace them at its first checkpoint, as
    it replaces those of a run with the same options and damaged ones)."""
    if config.resume:
        return
    root = Path(config.out) / "checkpoints"
    advice = f"; a fresh run would replace its checkpoints: use another --out, or delete {root}"
    for path in complete_checkpoints(root):
        try:
            meta = read_meta(path, META_KEYS)
        except CheckpointError:
            continue
        _check_options(config, path, meta, advice)


def slurm_requeued() -> bool:
    """Whether this is a SLURM job that was requeued (``SLURM_RESTART_COUNT`` > 0)."""
    return os.environ.get("SLURM_RESTART_COUNT", "0") not in ("", "0")


def restarted(config: TrainConfig) -> TrainConfig:
    """The config of a restarted job (``drift train --max-restarts``, torchrun's ``--max-restarts``): it
    resumes from the latest checkpoint that looks whole when ``--out`` holds one of this run, else starts
    fresh again (a fresh run marks an older run's checkpoints as not its own: ``mark_fresh``)."""
    if config.resume:
        return config
    try:
        usable_checkpoint(Path(config.out) / "checkpoints", META_KEYS)
    except CheckpointError:
        return config
    return dataclasses.replace(config, resume=True)


@contextlib.contextmanager
def _one_writer(out: Path) -> Iterator[None]:
    """Rank 0 holds ``out``'s lock inside the block; FolderInUse on every rank when another run holds it."""
    with contextlib.ExitStack() as stack:
        refused = None
        if comm.rank() == 0:
            try:
                stack.enter_context(folder_lock(out))
            except FolderInUse as exc:
                refused = str(exc)
        refused = comm.broadcast_object(refused)
        if refused is not None:
            raise FolderInUse(refused)
        yield


class PhaseClock:
    """Rank-local seconds per phase of an epoch (``with clock("forward"): ...``), summed over its steps;
    on CUDA each phase ends with a synchronisation, so that its kernels count in it."""

    def __init__(self, device: torch.device) -> None:
        self.device, self.seconds = device, {}

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        began = time.perf_counter()
        yield
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - began


def make_optimizer(config: TrainConfig, model: FNO) -> torch.optim.Optimizer:
    """Adam at ``--lr``, or AdamW (decoupled weight decay, as neuraloperator's trainer) when
    ``--weight-decay`` is above 0: torch's, stepped by its fused kernel on the complex spectral weights
    too (``drift.optim``)."""
    if config.weight_decay > 0:
        return optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    return optim.Adam(model.parameters(), lr=config.lr)


def learning_rate(config: TrainConfig, step: int, total: int) -> float:
    """The learning rate of optimizer step ``step`` (from 0) of a run of ``total`` steps: ``--lr``, or
    with ``--schedule cosine`` ``lr (1 + cos(pi step / total)) / 2`` (torch's ``CosineAnnealingLR`` with
    ``T_max = total``, stepped per batch)."""
    if config.schedule == "constant":
        return config.lr
    return config.lr * (1 + math.cos(math.pi * step / total)) / 2


def set_learning_rate(optimizer: torch.optim.Optimizer, config: TrainConfig, step: int, total: int) -> None:
    """Set ``optimizer``'s rate for step ``step`` of ``total`` (``learning_rate``)."""
    # A function of the step, not a scheduler's state: a resumed run needs none saved.
    for group in optimizer.param_groups:
        group["lr"] = learning_rate(config, step, total)


# The flags the ranks agree on after each step's backward, in one all-reduce.
_FLAGS = ("loss", "gradient norm", "stop", "checkpoint")


def _step_flags(loss: torch.Tensor, model: FNO, stop: bool, checkpoint: bool) -> dict[str, bool]:
    """What holds on any rank after a step's backward: a non-finite loss or gradient norm (of its share of
    the loss, the norm of its blocks of the gradients), a stop requested (a signal) or a checkpoint due;
    one all-reduce."""
    norms = [torch.linalg.vector_norm(_local(p.grad)).double() for p in model.parameters() if p.grad is not None]
    local = [~torch.isfinite(loss.detach()), ~torch.isfinite(torch.stack(norms).sum())]
    flags = torch.stack([*local, *(torch.tensor(f, device=loss.device) for f in (stop, checkpoint))]).double()
    return {name: bool(flag) for name, flag in zip(_FLAGS, _global_sum(flags).tolist(), strict=True)}


@dataclass
class _Epoch:
    """An epoch's running sums on this rank: its share of the loss summed over the trained trajectories,
    and the batches trained and skipped; ``step`` is the last step done."""

    total: float = 0.0
    trained: int = 0
    skipped: int = 0
    step: int = 0

    def saved(self) -> dict:
        """What a mid-epoch checkpoint records of it: every rank's loss sum (all-gathered), the counts."""
        totals = comm.all_gather_object(self.total)
        return dict(totals=totals, trained=self.trained, skipped=self.skipped, step=self.step)

    @classmethod
    def resumed(cls, saved: dict | None) -> _Epoch:
        """The sums of a mid-epoch checkpoint's ``saved()``: each rank's own at the same rank count (the
        same sums in the same order as the uninterrupted run), else their sum on rank 0."""
        if saved is None:
            return cls()
        totals = saved["totals"]
        if len(totals) == comm.world_size():
            total = totals[comm.rank()]
        else:
            total = math.fsum(totals) if comm.rank() == 0 else 0.0
        return cls(total, saved["trained"], saved["skipped"], saved["step"])


def train(config: TrainConfig, stop: StopSignals | None = None) -> list[dict]:
    """Train on this rank's blocks (call on every rank of the default group, or alone); returns the
    per-epoch metrics (the same on every rank). Rank 0 holds ``config.out``'s lock (FolderInUse if
    another run does) and writes ``metrics.jsonl``, ``stats.json``, ``checkpoints/``, and at the end
    ``loss.png``, ``slice.png`` and ``test_metrics.json`` (the final model's relative L2 and PDEBench
    metrics, after a run that reached its last epoch). A non-finite loss or gradient norm raises
    NonFiniteError before the optimizer step, or with ``on_nan="skip-batch"`` skips the batch
    (``skipped_batches`` per epoch).

    Across hosts: ClusterError when the hosts run other drift or torch versions or do not share
    ``config.out``; each phase's collectives time out after a bound that fits it (``PhaseTimeouts``), and
    a peer that stops answering ends every rank with ``PeersLost`` naming its node and address. SIGTERM or
    SIGUSR1 (``drift.stopping``) stops every rank at the next step boundary with a mid-epoch checkpoint:
    ``Stopped``; ``stop``: signals already being caught (by default from here on)."""
    cluster = Cluster.join() if comm.world_size() > 1 else None
    timeouts = PhaseTimeouts(config.collective_timeout)
    try:
        if cluster is not None:
            cluster.check_shared(config.out)
        with contextlib.ExitStack() as stack:
            stop = stop or stack.enter_context(StopSignals())
            stack.enter_context(_one_writer(Path(config.out)))
            return _train(config, stop, timeouts)
    except RuntimeError as exc:
        # A collective that failed (Gloo raises a plain RuntimeError): which peers stopped answering?
        if cluster is None or not (type(exc) is RuntimeError or isinstance(exc, torch.distributed.DistError)):
            raise
        silent = cluster.silent()
        if not silent:
            raise
        raise PeersLost(
            f"{describe(silent)} stopped answering during {timeouts.doing()}; the newest checkpoint: "
            f"{_newest(Path(config.out))}"
        ) from exc
    finally:
        if cluster is not None:
            cluster.close()


def _newest(out: Path) -> str:
    """The checkpoint ``latest`` names under ``out``, or ``none``."""
    try:
        return str(latest_checkpoint(out / "checkpoints"))
    except CheckpointError:
        return "none"


def _train(config: TrainConfig, stop: StopSignals, timeouts: PhaseTimeouts) -> list[dict]:
    device = resolve_device(config.device)
    rank, out = comm.rank(), Path(config.out)
    data = Path(config.data) if config.data is not None else default_data_path()
    sharding = Sharding.build(config, comm.world_size(), device.type)
    model = build_model(config, device, sharding, (*read_layout(data)[2:], config.t_out))
    if rank == 0 and config.progress and model.spectral[0].choice is not None:
        print(f"drift train: method {model.spectral[0].choice}", flush=True)
    optimizer = make_optimizer(config, model)
    start, history, saved, final = 0, [], None, None
    if config.resume:  # the newest checkpoint that loads on every rank, and its statistics

        def check(path: Path, meta: dict) -> None:
            _check_options(config, path, meta)

        _, saved = load_newest(out / "checkpoints", model, optimizer, check=check, keys=META_KEYS)
        start, history = saved["epoch"], saved["history"]
    train_set, test_set = _datasets(config, data, _stats(saved) if saved else None, sharding)
    if rank == 0 and not config.resume:  # the data are good: from here on an older run's checkpoints are not ours
        mark_fresh(out / "checkpoints")
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        (out / STOPPED).unlink(missing_ok=True)
        train_set.stats.save(out / "stats.json")
        (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in history))
    count = math.prod(train_set.global_shape) * len(FIELDS) * config.t_out  # elements per trajectory
    weights = frame_weights(train_set, config.data_parallel, device) if config.loss == "frame-weighted" else None
    bar = tqdm(
        range(start, config.epochs),
        desc=f"{config.method} P={comm.world_size()}",
        unit="epoch",
        disable=rank != 0 or not config.progress,
        initial=start,
        total=config.epochs,
    )
    # A checkpoint every --checkpoint-every minutes (rank 0's clock decides; the ranks agree at a step).
    every_s = math.inf if config.checkpoint_every is None else 60 * config.checkpoint_every
    last_checkpoint = time.monotonic()

    def meta(epoch: int, sums: _Epoch | None = None) -> dict:
        """A checkpoint's meta: after ``epoch`` whole epochs (and, with ``sums``, steps of the next)."""
        record = dict(
            epoch=epoch,
            world_size=comm.world_size(),
            config=dataclasses.asdict(config) | dict(data=str(data)),
            stats=dataclasses.asdict(train_set.stats),
            global_shape=list(train_set.global_shape),
            history=history,
        )
        return record if sums is None else record | dict(partial=sums.saved())

    for epoch in bar:
        began = time.perf_counter()
        # The same permutation on every rank: each reads its block of its share of the same batches.
        order = torch.randperm(len(train_set), generator=torch.Generator().manual_seed(config.seed * 100_003 + epoch))
        sums = _Epoch.resumed(saved.get("partial") if saved and epoch == start else None)
        clock = PhaseClock(device)
        steps = -(-len(order) // config.batch_size)
        for step, first in enumerate(range(0, len(order), config.batch_size), 1):
            if step <= sums.step:  # done before the mid-epoch checkpoint this run resumed from
                continue
            indices = order[first : first + config.batch_size].tolist()
            set_learning_rate(optimizer, config, epoch * steps + step - 1, config.epochs * steps)
            with timeouts("step", f"epoch {epoch + 1}, step {step}"):
                with clock("data"):
                    x, y = _batch(train_set, indices, sharding, device)
                with clock("forward"):
                    # This rank's share of the global batch's loss: the ranks' losses sum to it.
                    pred = _local(model(x))
                    error = (
                        F.mse_loss(pred, y, reduction="sum")
                        if weights is None
                        else ((pred - y).square() * weights).sum()
                    )
                    loss = error / (count * len(indices))
                with clock("backward"):
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    due = rank == 0 and time.monotonic() - last_checkpoint >= every_s
                    flags = _step_flags(loss, model, stop.received is not None, due)
                bad = [what for what in ("loss", "gradient norm") if flags[what]]
                if bad:
                    trajectories = [train_set.trajectories[i] for i in indices]
                    where = f"epoch {epoch + 1}, step {step}, training trajectories {trajectories}"
                    if config.on_nan == "stop":
                        raise NonFiniteError(
                            f"non-finite {' and '.join(bad)} at {where}; stopped before the optimizer step "
                            f"(last checkpoint: {_newest(out)}); --on-nan skip-batch skips such batches"
                        )
                    optimizer.zero_grad(set_to_none=True)
                    sums.skipped += 1
                else:
                    with clock("optimizer"):
                        optimizer.step()
                    sums.trained += len(indices)
                    sums.total += float(loss.detach()) * len(indices)
            sums.step = step
            if flags["stop"] or flags["checkpoint"]:
                with timeouts("checkpoint", f"epoch {epoch + 1}, step {step}"):
                    record = meta(epoch, sums)
                    path = save_checkpoint(out / "checkpoints", epoch + 1, model, optimizer, record, step=step)
                last_checkpoint = time.monotonic()
                if flags["stop"]:
                    raise _stopped(out, stop.received, path, epoch, step)
        if not sums.trained:
            raise NonFiniteError(f"epoch {epoch + 1}: every batch had a non-finite loss or gradient norm")
        train_loss = float(_global_sum(torch.tensor(sums.total, dtype=torch.float64, device=device))) / sums.trained
        # The last epoch's test pass also gives PDEBench's metrics of the final model.
        final = pdebench_metrics(test_set, device) if epoch == config.epochs - 1 else None
        with clock("test"), timeouts("test", f"epoch {epoch + 1}, the test pass"):
            test_l2 = relative_l2(model, test_set, sharding, config.batch_size, device, final)
        seconds = time.perf_counter() - began
        row = dict(
            epoch=epoch + 1,
            train_loss=train_loss,
            test_rel_l2=test_l2,
            seconds=seconds,
            phase_seconds=clock.seconds,
            skipped_batches=sums.skipped,
        )
        history.append(row)
        with timeouts("checkpoint", f"epoch {epoch + 1}, its checkpoint"):
            path = save_checkpoint(out / "checkpoints", epoch + 1, model, optimizer, meta(epoch + 1))
        last_checkpoint = time.monotonic()
        if rank == 0:
            with open(out / "metrics.jsonl", "a") as f:
                f.write(json.dumps(row) + "\n")
            bar.set_postfix(loss=f"{train_loss:.4g}", test_l2=f"{test_l2:.4f}", s_per_epoch=f"{seconds:.1f}")
            if config.progress:
                bar.write(
                    f"epoch {epoch + 1:3d}/{config.epochs}  loss {train_loss:.5f}  "
                    f"test rel L2 {test_l2:.4f}  {seconds:5.1f} s"
                )
        # A signal during the test pass or the write: stop now, on this epoch's checkpoint.
        if epoch + 1 < config.epochs and _global_sum(torch.tensor(float(stop.received is not None), device=device)):
            raise _stopped(out, stop.received, path, epoch + 1, None)
    bar.close()
    if final is not None:
        _write_test_metrics(out, config.split, history[-1]["epoch"], test_l2, final.compute(), config.progress)
    if history and config.plots:
        _plots(out, history, model, test_set, sharding, device, config.method)
    return history


def _stopped(out: Path, received: str | None, path: Path, epoch: int, step: int | None) -> Stopped:
    """The ``Stopped`` of a run stopped at ``epoch`` (whole epochs done) and ``step`` of the next, with
    its checkpoint at ``path`` (call on every rank); rank 0 writes ``<out>/stopped.json``. ``received``
    is this rank's signal (None where only a peer received one)."""
    where = f"after epoch {epoch}" if step is None else f"at epoch {epoch + 1}, step {step}"
    signal = next(name for name in comm.all_gather_object(received) if name is not None)
    if comm.rank() == 0:
        record = dict(signal=signal, checkpoint=str(path), epoch=epoch, step=step)
        (out / STOPPED).write_text(json.dumps(record) + "\n")
    return Stopped(f"stopped by {signal} {where}: checkpoint {path}; continue with --resume")


TEST_METRICS = "test_metrics.json"


def _write_test_metrics(out: Path, split: str, epoch: int, test_l2: float, pdebench: dict, show: bool) -> None:
    """Rank 0: ``<out>/test_metrics.json`` (the final model's test metrics) and, if ``show``, a line of them."""
    if comm.rank() != 0:
        return
    record = dict(epoch=epoch, split=split, test_rel_l2=test_l2, pdebench=pdebench)
    (out / TEST_METRICS).write_text(json.dumps(record, indent=2) + "\n")
    if show:
        print(f"PDEBench metrics ({split} split): {format_pdebench(pdebench)}")


def format_pdebench(metrics: dict) -> str:
    """PDEBench's metrics on one line (``n/a`` for a Fourier band the grid has no bins in)."""

    def value(name: str) -> str:
        v = metrics[name]
        return "n/a" if v is None else f"{v:.4g}"

    return (
        f"RMSE {value('rmse')}  nRMSE {value('nrmse')}  cRMSE {value('crmse')}  max error {value('max_error')}  "
        f"bRMSE {value('brmse')}  fRMSE low {value('frmse_low')} mid {value('frmse_mid')} high {value('frmse_high')}"
    )


def train_rank(config: TrainConfig) -> list[dict] | Stopped:
    """One rank of ``drift train`` (an entry point for ``drift.launch.run_ranks`` or torchrun): join the
    process group, make sure the data exist (rank 0 generates the default set), check, train. Returns
    the history, or the ``Stopped`` a signal ended the run with."""
    # From the start: a scheduler's warning while the group forms or the data load still stops the run.
    with StopSignals() as stop, process_group(config.device):
        if config.data is None:
            if comm.rank() == 0:
                ensure_default_data(config.progress, rank_device())
            comm.barrier()
            config = dataclasses.replace(config, data=str(default_data_path()))
        check_config(config, comm.world_size())
        try:
            return train(config, stop)
        except Stopped as stopped:
            return stopped


def _checkpoint_root(where: str | Path) -> Path:
    """The folder of checkpoints (or the checkpoint folder) a run folder, its ``checkpoints`` folder or a
    checkpoint folder names."""
    root = Path(where)
    return root / "checkpoints" if (root / "checkpoints").is_dir() else root


def find_checkpoint(where: str | Path) -> Path:
    """The checkpoint a run folder (its latest, or the newest older complete one when that one is
    damaged), its ``checkpoints`` folder or a checkpoint folder names; CheckpointError if none is whole."""
    return usable_checkpoint(_checkpoint_root(where), META_KEYS)


def evaluate(
    checkpoint: str | Path,
    *,
    data: str | None = None,
    resolution: int | None = None,
    method: str | None = None,
    grid=None,
    data_parallel: int = 1,
    device="cpu",
    batch_size: int = 2,
) -> dict:
    """Relative L2 and PDEBench's metrics (``drift.metrics``, on the de-normalised fields) of a checkpoint's
    model on its run's test split (the run's ``split``), on however many ranks call this.

    ``checkpoint``: a run folder (its latest checkpoint), its ``checkpoints`` folder or one checkpoint.
    ``data`` defaults to the file the run trained on, at its own resolution or at ``resolution``
    points per spatial dim (every (N / resolution)-th point of a file with N points per dim): the
    same weights at any resolution, zero-shot super-resolution above the training one. ``method``
    defaults to the run's (any method loads any other's checkpoint: the weights are the same global
    ones); ``grid`` and ``data_parallel`` lay out the ranks as for training. A damaged latest checkpoint
    is passed over for the newest older one that loads (``load_newest``). Returns a dict: the checkpoint,
    where it was trained, ``split``, ``test_rel_l2`` and ``pdebench`` (``PDEBenchMetrics.compute``'s).
    """
    meta = read_meta(find_checkpoint(checkpoint), META_KEYS)
    # The run's reduction mesh fits its own ranks; evaluation reduces once per mesh dim.
    config = config_from(saved_config(meta), grid=grid, data_parallel=data_parallel, reduction=None)
    config.method = method or config.method
    config.data = data or config.data
    where = resolve_device(device)
    _, _, *extents = read_layout(config.data)
    stride = resolution_stride(extents, resolution)
    option = f"--resolution {resolution}" if resolution else f"--data {config.data}"
    check_resolution(config, [n // stride for n in extents], comm.world_size(), option)
    sharding = Sharding.build(config, comm.world_size(), where.type)
    model = build_model(config, where, sharding, (*(n // stride for n in extents), config.t_out))

    def check(path: Path, meta: dict) -> None:
        _check_options(config, path, meta, names=MODEL_OPTIONS)

    path, meta = load_newest(_checkpoint_root(checkpoint), model, check=check, keys=META_KEYS)
    _, test_set = _datasets(config, Path(config.data), _stats(meta), sharding, stride)
    pdebench = pdebench_metrics(test_set, where)
    l2 = relative_l2(model, test_set, sharding, batch_size, where, pdebench)
    return dict(
        checkpoint=str(path),
        epoch=meta["epoch"],
        trained_on=meta["world_size"],
        trained_resolution=meta["global_shape"],
        resolution=list(test_set.global_shape),
        ranks=comm.world_size(),
        method=config.method,
        split=config.split,
        test_rel_l2=l2,
        test_trajectories=len(test_set),
        pdebench=pdebench.compute(),
    )


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


def _plots(
    out: Path, history: list[dict], model: FNO, test_set: PDEBench3D, sharding: Sharding, device, method: str
) -> None:
    """Rank 0: ``loss.png`` (loss and test relative L2 per epoch) and ``slice.png`` (density on the
    mid-z plane of the first test trajectory at the first and the last predicted time: prediction, truth,
    difference)."""
    with torch.no_grad():
        x, y = _batch(test_set, [0], sharding, device)
        pred, true = model(x), sharding.wrap(y, x.shape[:1] + y.shape[1:2] + x.shape[2:])
    pred, true = (t.full_tensor() if isinstance(t, DTensor) else t for t in (pred, true))
    pred, true = pred[0, 0], true[0, 0]
    if comm.rank() != 0:
        return
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    epochs = [r["epoch"] for r in history]
    fig, ax = plt.subplots(1, 2, figsize=(9, 3.5), constrained_layout=True)
    ax[0].semilogy(epochs, [r["train_loss"] for r in history], "o-")
    ax[0].set(xlabel="epoch", ylabel="training loss (MSE, normalised)", title=f"{method}: loss")
    ax[1].plot(epochs, [r["test_rel_l2"] for r in history], "o-", color="C1")
    ax[1].set(xlabel="epoch", ylabel="relative L2", title="test relative L2")
    fig.savefig(out / "loss.png", dpi=120)
    plt.close(fig)
    z, t_out = true.shape[2] // 2, true.shape[-1]
    fig, ax = plt.subplots(2, 3, figsize=(11, 7), constrained_layout=True)
    # The error grows with the lead time: the first predicted frame, then the last.
    for row, t in zip(ax, (0, t_out - 1), strict=True):
        truth, guess = true[:, :, z, t], pred[:, :, z, t]
        lo, hi = float(truth.min()), float(truth.max())
        panels = [("predicted", guess), ("true", truth), ("difference", guess - truth)]
        for a, (title, image) in zip(row, panels, strict=True):
            limits = dict(vmin=lo, vmax=hi) if title != "difference" else {}
            shown = a.imshow(image.cpu().numpy().T, origin="lower", cmap="viridis", **limits)
            a.set(title=f"density, {title}, step {t + 1}/{t_out}", xlabel="x", ylabel="y")
            fig.colorbar(shown, ax=a, shrink=0.8)
    fig.savefig(out / "slice.png", dpi=120)
    plt.close(fig)
