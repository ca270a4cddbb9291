"""Where a run's tensors live and what each rank reads: the device mesh and placements (``Sharding``), a
batch's share and block on this rank (read straight into the batch's tensors, ahead of the step that needs
it, and assembled as ``drift.data.model_input`` says), and the training and test sets with their statistics
and the loss's frame weights."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch.distributed.tensor import Replicate, Shard

from drift import comm
from drift.data import PDEBench3D, PDEBenchFiles, Prefetch, Stats, model_input, model_target
from drift.data.dataset import frames_tensor
from drift.data.files import Data
from drift.jobs.launch import GROUP_TIMEOUT_S
from drift.layout import chunk_slice, device_mesh, to_dtensor
from drift.train.checks import check_split, spatial_grid
from drift.train.config import ConfigError, TrainConfig

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh


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


def _on_host(device) -> bool:
    """Whether a batch bound for ``device`` is assembled into the model's input where it is read: on the
    CPU (the reader's thread does it, off the step's), not for a GPU (its frames cross to the device
    first, ``t_out`` times fewer bytes than the input they expand to)."""
    return torch.device(device).type == "cpu"


def read_batch(
    dataset: PDEBench3D, indices: Sequence[int], sharding: Sharding, device
) -> tuple[torch.Tensor, torch.Tensor]:
    """The host's part of a batch: this rank's share of the trajectories ``indices`` (``Sharding.share``),
    its block of each read straight into new CPU tensors ``(share, fields, t_in, *block)`` and ``(share,
    fields, t_out, *block)`` (``PDEBench3D.read_into``), pinned when ``device`` is a GPU; for the CPU the
    first then assembled into the model's input ``(share, fields * t_in + 1, *block, t_out)``
    (``model_input``). A data rank without trajectories in the batch gets empty ones."""
    share = sharding.share(indices)
    pin = torch.device(device).type == "cuda"
    x, y = (
        frames_tensor((len(share), len(dataset.fields), t, *dataset.local_shape), pin)
        for t in (dataset.t_in, dataset.t_out)
    )
    for b, i in enumerate(share):
        dataset.read_into(i, x[b], y[b])
    return (model_input(x, dataset.t_out) if _on_host(device) else x), y


def batch_input(
    dataset: PDEBench3D, batch: tuple[torch.Tensor, torch.Tensor], size: int, sharding: Sharding, device
) -> tuple[torch.Tensor, torch.Tensor]:
    """A ``read_batch`` of a batch of ``size`` trajectories as the model takes it on ``device``: the model
    input (wrapped) and this rank's target block. For a GPU the frames are copied without blocking (from
    pinned memory: the copies overlap what the host does next) and assembled there."""
    x, y = (t.to(device, non_blocking=True) for t in batch)
    if not _on_host(device):
        x = model_input(x, dataset.t_out)
    global_shape = (size, x.shape[1], *dataset.global_shape, dataset.t_out)
    return sharding.wrap(x, global_shape), model_target(y)


def load_batch(
    dataset: PDEBench3D, indices: Sequence[int], sharding: Sharding, device
) -> tuple[torch.Tensor, torch.Tensor]:
    """The model input of the trajectories ``indices`` (this rank's share and block of them, wrapped as
    the model takes it) and this rank's target block: ``read_batch`` then ``batch_input``."""
    return batch_input(dataset, read_batch(dataset, indices, sharding, device), len(indices), sharding, device)


def prefetched_batches(
    dataset: PDEBench3D, batches: Sequence[Sequence[int]], sharding: Sharding, device, ahead: bool = True
) -> Prefetch:
    """A ``Prefetch`` of ``read_batch`` over ``batches`` (lists of trajectory indices) in order: while the
    caller works on one batch the next is read in a background thread (``ahead``; else each in ``take()``).
    Host memory: at most two batches of this rank's blocks at once (the one taken and the next)."""
    return Prefetch(lambda indices: read_batch(dataset, indices, sharding, device), batches, ahead=ahead)


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
    sums = comm.all_reduce(sums) / (data_parallel * len(dataset) * math.prod(dataset.global_shape))
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


def saved_stats(meta: dict) -> Stats:
    """The statistics a checkpoint's meta records (its run's training set's)."""
    return Stats(**{k: tuple(v) for k, v in meta["stats"].items()})


def datasets(
    config: TrainConfig, data: Data | PDEBenchFiles, stats: Stats | None, sharding: Sharding, stride: int = 1
) -> tuple[PDEBench3D, PDEBench3D]:
    """This rank's blocks of the training and test sets, read at ``stride``, normalised with ``stats``
    (None: computed from the training trajectories). Without ``--test-data`` both are sides of
    ``data``'s split under ``config.split`` (applied to each file; ConfigError as ``check_split``); with
    it every trajectory of ``data`` trains and every one of the test files tests."""
    files = data if isinstance(data, PDEBenchFiles) else PDEBenchFiles(data)
    if not config.test_data:
        check_split(config.split, files)
    options = dict(t_in=config.t_in, t_out=config.t_out, stride=stride, split_rule=config.split)
    split = "all" if config.test_data else "train"
    train_set = PDEBench3D(files, sharding.mesh, sharding.field_placements(), split=split, stats=stats, **options)
    test_files = PDEBenchFiles(config.test_data) if config.test_data else files
    return train_set, test_dataset(config, test_files, train_set.stats, sharding, stride)


def test_dataset(
    config: TrainConfig, files: PDEBenchFiles, stats: Stats, sharding: Sharding, stride: int = 1
) -> PDEBench3D:
    """This rank's blocks of the test set, read at ``stride`` and normalised with ``stats``: every
    trajectory of ``files`` when they are ``--test-data``'s, else the test side of their split."""
    options = dict(t_in=config.t_in, t_out=config.t_out, stride=stride, split_rule=config.split)
    split = "all" if config.test_data else "test"
    if not config.test_data:
        check_split(config.split, files)
    return PDEBench3D(files, sharding.mesh, sharding.field_placements(), split=split, stats=stats, **options)
