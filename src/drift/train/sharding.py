"""Where a run's tensors live and what each rank reads: the device mesh and placements (``Sharding``), a
batch's share and block on this rank (read straight into the batch's tensors, ahead of the step that needs
it, and assembled as the run's recipe says), and the training and test sets with their statistics
and the loss's frame weights."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch.distributed.tensor import Replicate, Shard

from drift import comm
from drift.data import FIELDS, DataFiles, Prefetch, Stats, Trajectories, model_target
from drift.data.dataset import frames_tensor
from drift.data.files import Data
from drift.jobs.launch import GROUP_TIMEOUT_S
from drift.layout import chunk_slice, device_mesh, to_dtensor
from drift.recipes import Wrap
from drift.train.checks import check_split, spatial_grid
from drift.train.config import ConfigError, TrainConfig
from drift.train.problem import run_recipe

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh


@dataclass(frozen=True)
class Sharding:
    """Where a run's tensors live: its device mesh (None on one rank) and the placements of the FNO's
    inputs ``(batch, channels, *space[, t])`` over it (``Shard(0)`` on the "data" mesh dim)."""

    mesh: DeviceMesh | None
    placements: tuple

    @classmethod
    def build(cls, config: TrainConfig, world_size: int, device_type: str, dims: int = 3) -> Sharding:
        """A "data" mesh dim of ``--data-parallel`` ranks (when above 1), then one mesh dim per spatial
        dim of the ``dims``-D data that the grid splits; call on every rank of the default group."""
        grid = spatial_grid(config, world_size, dims)
        dims = [("data", config.data_parallel, Shard(0))] if config.data_parallel > 1 else []
        dims += [
            (name, p, Shard(2 + i)) for i, (name, p) in enumerate(zip("xyz"[: len(grid)], grid, strict=True)) if p > 1
        ]
        if not dims:
            return cls(None, ())
        mesh = device_mesh([p for _, p, _ in dims], [n for n, _, _ in dims], device_type, timeout_s=GROUP_TIMEOUT_S)
        return cls(mesh, tuple(placement for *_, placement in dims))

    def field_placements(self) -> tuple:
        """The placements over the spatial dims alone, as ``Trajectories`` and ``Layout`` take them."""
        return tuple(Replicate() if p.dim == 0 else Shard(p.dim - 2) for p in self.placements)

    @property
    def spatial_ranks(self) -> int:
        """The ranks that hold blocks of one trajectory: the mesh's spatial dims' (1 without a mesh)."""
        return math.prod(self.mesh.size(a) for a, p in enumerate(self.placements) if p != Shard(0)) if self.mesh else 1

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

    def wrapper(self, size: int, space: Sequence[int]) -> Wrap:
        """``wrap`` for the model inputs of a batch of ``size`` trajectories on the ``space`` grid: blocks
        ``(share, channels, *block, *rest)`` of inputs ``(size, channels, *space, *rest)`` (dims after the
        spatial ones are never split)."""

        def wrap(local: torch.Tensor) -> torch.Tensor:
            return self.wrap(local, (size, local.shape[1], *space, *local.shape[2 + len(space) :]))

        return wrap


def _on_host(device) -> bool:
    """Whether a batch bound for ``device`` is assembled into the model's input where it is read: on the
    CPU (the reader's thread does it, off the step's), not for a GPU (its frames cross to the device
    first, ``t_out`` times fewer bytes than the input they expand to)."""
    return torch.device(device).type == "cpu"


def read_batch(
    dataset: Trajectories, indices: Sequence[int], sharding: Sharding, device
) -> tuple[torch.Tensor, torch.Tensor]:
    """The host's part of a batch: this rank's share of the trajectories ``indices`` (``Sharding.share``),
    its block of each read straight into new CPU tensors ``(share, *dataset.x_shape)`` and ``(share,
    *dataset.y_shape)`` (``Trajectories.read_into``), pinned when ``device`` is a GPU; for the CPU the
    first then assembled as the data set's recipe says (``Recipe.assemble``; a one-shot model's input
    ``(share, fields * t_in + 1, *block, t_out)``). A data rank without trajectories in the batch gets
    empty ones."""
    share = sharding.share(indices)
    pin = torch.device(device).type == "cuda"
    x, y = (frames_tensor((len(share), *shape), pin) for shape in (dataset.x_shape, dataset.y_shape))
    for b, i in enumerate(share):
        dataset.read_into(i, x[b], y[b])
    return (dataset.recipe.assemble(x, dataset.t_out) if _on_host(device) else x), y


def batch_input(
    dataset: Trajectories, batch: tuple[torch.Tensor, torch.Tensor], size: int, sharding: Sharding, device
) -> tuple[torch.Tensor, torch.Tensor, Wrap]:
    """A ``read_batch`` of a batch of ``size`` trajectories as the recipe takes it on ``device``: this
    rank's block of the assembled input, its target block ``(share, fields, *block, frames)`` and the
    ``wrap`` of the model's inputs (``Sharding.wrapper``). For a GPU the frames are copied without
    blocking (from pinned memory: the copies overlap what the host does next) and assembled there."""
    x, y = (t.to(device, non_blocking=True) for t in batch)
    if not _on_host(device):
        x = dataset.recipe.assemble(x, dataset.t_out)
    return x, model_target(y), sharding.wrapper(size, dataset.global_shape)


def load_batch(
    dataset: Trajectories, indices: Sequence[int], sharding: Sharding, device
) -> tuple[torch.Tensor, torch.Tensor, Wrap]:
    """``batch_input`` of the trajectories ``indices`` (this rank's share and block of them): ``read_batch``
    then ``batch_input``."""
    return batch_input(dataset, read_batch(dataset, indices, sharding, device), len(indices), sharding, device)


def prefetched_batches(
    dataset: Trajectories, batches: Sequence[Sequence[int]], sharding: Sharding, device, ahead: bool = True
) -> Prefetch:
    """A ``Prefetch`` of ``read_batch`` over ``batches`` (lists of trajectory indices) in order: while the
    caller works on one batch the next is read in a background thread (``ahead``; else each in ``take()``).
    Host memory: at most two batches of this rank's blocks at once (the one taken and the next)."""
    return Prefetch(lambda indices: read_batch(dataset, indices, sharding, device), batches, ahead=ahead)


def frame_weights(dataset: Trajectories, data_parallel: int, device) -> torch.Tensor:
    """``--loss frame-weighted``'s weights ``(1, fields, 1 per spatial dim, t_out)``: per field and predicted frame,
    the inverse of the normalised target's variance over ``dataset``'s trajectories and points, scaled to
    a mean of 1. Every rank sums its block of every trajectory (in float64), and one all-reduce joins
    them (each block counted once per data-parallel replica). ConfigError, on every rank, where a field
    is constant at a frame or its normalised values are not finite."""
    sums = torch.zeros(2, len(dataset.fields), dataset.t_out, dtype=torch.float64, device=device)
    space = (1,) * len(dataset.global_shape)
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
    return (weights / weights.mean()).to(torch.float32).view(1, len(dataset.fields), *space, dataset.t_out)


def saved_stats(meta: dict) -> Stats:
    """The statistics a checkpoint's meta records (its run's training set's)."""
    return Stats(**{k: tuple(v) for k, v in meta["stats"].items()})


def saved_channels(meta: dict) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The input and output channels a checkpoint's run read (``FIELDS`` both, before runs recorded them)."""
    channels = meta.get("channels") or dict(inputs=FIELDS, fields=FIELDS)
    return tuple(channels["inputs"]), tuple(channels["fields"])


def datasets(
    config: TrainConfig, data: Data | DataFiles, stats: Stats | None, sharding: Sharding, stride: int = 1
) -> tuple[Trajectories, Trajectories]:
    """This rank's blocks of the training and test sets, read at ``stride``, normalised with ``stats``
    (None: computed from the training trajectories). Without ``--test-data`` both are sides of
    ``data``'s split under ``config.split`` (applied to each file; ConfigError as ``check_split``); with
    it every trajectory of ``data`` trains and every one of the test files tests."""
    files = data if isinstance(data, DataFiles) else DataFiles(data)
    if not config.test_data:
        check_split(config.split, files)
    options = dict(t_in=config.t_in, t_out=config.t_out, stride=stride, split_rule=config.split)
    options["recipe"] = run_recipe(config, files)
    split = "all" if config.test_data else "train"
    train_set = Trajectories(files, sharding.mesh, sharding.field_placements(), split=split, stats=stats, **options)
    test_files = DataFiles(config.test_data) if config.test_data else files
    return train_set, test_dataset(config, test_files, train_set.stats, sharding, stride)


def test_dataset(
    config: TrainConfig, files: DataFiles, stats: Stats, sharding: Sharding, stride: int = 1
) -> Trajectories:
    """This rank's blocks of the test set, read at ``stride`` and normalised with ``stats``: every
    trajectory of ``files`` when they are ``--test-data``'s, else the test side of their split."""
    options = dict(t_in=config.t_in, t_out=config.t_out, stride=stride, split_rule=config.split)
    options["recipe"] = run_recipe(config, files)
    split = "all" if config.test_data else "test"
    if not config.test_data:
        check_split(config.split, files)
    return Trajectories(files, sharding.mesh, sharding.field_placements(), split=split, stats=stats, **options)
