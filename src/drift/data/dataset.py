"""``Trajectories``: each rank's block of a data set's items (input and target frames of a trajectory, or a
static problem's input and output fields), from one file or several of any layout drift reads, read
straight into its output and normalised in place."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from drift import comm
from drift._moved import moved_names
from drift.data.files import Data, DataFiles
from drift.data.pdebench import DataError, Stats
from drift.layout import Layout
from drift.recipes import ONE_SHOT, STATIC, Recipe

SHOWN = 10  # trajectories with non-finite values named in the error
# Which trajectories a data set takes: the training or test side of the split rule, or every one (a
# separate test file, or training files that have one).
PARTS = ("train", "test", "all")


def frames_tensor(shape: Sequence[int], pin: bool = False) -> torch.Tensor:
    """A new float32 CPU tensor of ``shape`` to read frames straight into: pinned (``pin``: for copies to a
    GPU that do not block), else in numpy's memory, which asks Linux for huge pages (``madvise``), so that
    a read into it faults far fewer pages than one into ``torch.empty``'s."""
    if pin:
        return torch.empty(tuple(shape), dtype=torch.float32, pin_memory=True)
    return torch.from_numpy(np.empty(tuple(shape), dtype=np.float32))


class Trajectories(torch.utils.data.Dataset):
    """This rank's blocks of a data set's items as (input, target) pairs, as a recipe reads them.

    Args:
        data: the data files (any layout drift reads), a folder of them or a sequence of files and
            folders, read as one data set with trajectories numbered across the files in order
            (``DataFiles``; or such an object, shared with another data set of the same files).
        mesh, placements: a ``DeviceMesh`` over the default process group (every rank of it, as
            ``drift.grid_mesh`` and ``drift train`` make) and one placement per mesh dim over the
            spatial dims of the selected grid (1 to 3), as ``drift.Layout`` takes them: ``Shard(i)``
            splits dim i in ``torch.chunk`` blocks, ``Replicate()`` (a data-parallel mesh dim) leaves
            the field whole. None: one process reads every point. ``layout``: the resulting ``Layout``.
        t_in, t_out: frames 0..t_in-1 are the input, the next t_out frames the target (paper: 5 and 16);
            a static problem reads its one frame of inputs and outputs instead.
        fields: which of the files' channels, in channel order (default: all of them).
        recipe: how the items are read and predicted (``drift.recipes``; default: static for static data,
            else one-shot). It chooses the frames (``Recipe.frames``): ``x_frames`` and ``y_frames``.
        split: "train" or "test": which side of the split ``split_rule`` makes; "all": every trajectory
            (a separate test set, or training files that have one).
        split_rule: "last" (the test set is the last ``test_fraction`` of each file's trajectories, at
            least one when the file holds two or more) or "pdebench" (each file's first
            ``int(test_fraction * trajectories)``, as PDEBench's loaders); see ``held_out_trajectories``.
        region: per spatial dim a (start, stop) range of the file's grid (default: all of it).
        stride: keep every stride-th point per dim (an int for all dims, or one per dim): downsampling.
        stats: normalisation of ``channels`` (the inputs then the outputs of a static problem, else the
            fields); default: computed from the training trajectories (one all-reduce over the mesh), also
            for a test split. Pass the training set's ``stats`` to a test set.

    The trajectories read to compute the statistics (every one of the files) or, with ``stats`` given, this
    set's must be finite: a DataError names each file, trajectory (its index in the file) and channel that
    is not, on every rank.

    Item i: ``(x, y)`` new float32 tensors ``(len(inputs), t_in, *local block)`` and ``(len(fields), t_out,
    *local block)`` (``t_in = t_out = 1`` for a static problem; ``inputs`` is ``fields`` for time-dependent
    data), normalised per channel, read as hyperslabs straight into them (``read_into``): a rank never
    reads more than its block (which may be empty), and no item shares memory with another. Every
    trajectory is readable on every rank: which ones a rank uses (data parallelism) is its training
    loop's choice. Reads may come from another thread than the one that made the data set.

    Example, one process reading every point of a small generated file:

    >>> import tempfile
    >>> from drift.data import Trajectories, generate
    >>> path = f"{tempfile.mkdtemp()}/cfd.hdf5"
    >>> generate(path, samples=4, resolution=8, frames=7, seed=1, progress=False)
    >>> train = Trajectories(path, t_in=2, t_out=4)
    >>> test = Trajectories(path, t_in=2, t_out=4, split="test", stats=train.stats)
    >>> train.trajectories, test.trajectories
    ([0, 1, 2], [3])
    >>> x, y = train[0]
    >>> x.shape, y.shape
    (torch.Size([5, 2, 8, 8, 8]), torch.Size([5, 4, 8, 8, 8]))
    """

    def __init__(
        self,
        data: Data | DataFiles,
        mesh=None,
        placements: Sequence | None = None,
        *,
        t_in: int = 5,
        t_out: int = 16,
        fields: Sequence[str] | None = None,
        recipe: Recipe | None = None,
        split: str = "train",
        split_rule: str = "last",
        test_fraction: float = 0.1,
        region: Sequence[tuple[int, int]] | None = None,
        stride: int | Sequence[int] = 1,
        stats: Stats | None = None,
    ) -> None:
        if split not in PARTS:
            raise ValueError(f"split must be one of {', '.join(PARTS)}, got {split!r}")
        if t_in < 1 or t_out < 1:
            raise ValueError(f"t_in and t_out must be positive, got {t_in} and {t_out}")
        self.files = data if isinstance(data, DataFiles) else DataFiles(data, fields)
        if fields is not None and self.files.fields != tuple(fields):
            raise ValueError(f"the files are read for fields {self.files.fields}, the data set reads {tuple(fields)}")
        self.recipe = recipe or (STATIC if self.files.static else ONE_SHOT)
        self.fields, self.inputs, self.mesh = self.files.fields, self.files.inputs, mesh
        self.x_frames, self.y_frames = self.recipe.frames(t_in, t_out)
        self.t_in, self.t_out = self.recipe.frame_counts(t_in, t_out)
        # The statistics' channels: a static problem's inputs, then its outputs; else the fields.
        self.channels = (*self.inputs, *self.fields) if self.files.static else self.fields
        trajectories, frames, extents = self.files.trajectories, self.files.frames, self.files.grid
        if self.y_frames.stop > frames:
            raise DataError(
                f"{self.files.paths[0]}: {self.fields[0]!r} has {frames} frames, fewer than t_in + t_out = "
                f"{self.y_frames.stop}"
            )
        dims = len(extents)
        region = list(region) if region is not None else [(0, n) for n in extents]
        strides = [stride] * dims if isinstance(stride, int) else list(stride)
        if len(region) != dims or len(strides) != dims:
            raise ValueError(f"region and stride need one entry per spatial dim, got {region} and {strides}")
        selected = []
        for dim, ((start, stop), step, n) in enumerate(zip(region, strides, extents, strict=True)):
            if not 0 <= start < stop <= n or step < 1:
                raise ValueError(f"region {(start, stop)} with stride {step} does not fit extent {n} of dim {dim}")
            selected.append(range(start, stop, step))
        self.global_shape = tuple(len(r) for r in selected)
        if mesh is not None and mesh.size() != comm.world_size():
            raise ValueError(f"the mesh {tuple(mesh.shape)} must span the default group of {comm.world_size()} ranks")
        self.layout = Layout(self.global_shape, mesh, placements)
        self.local_shape = self.layout.local_shape
        # The file's hyperslab of this rank's block of the selected grid (an empty one for an empty block).
        self._slab = tuple(
            slice(r[s.start], r[s.stop - 1] + 1, r.step) if s.stop > s.start else slice(0, 0)
            for r, s in zip(selected, self.layout.local_slices, strict=True)
        )
        test = set(self.files.held_out(split_rule, test_fraction)) if split != "all" else set()
        train = [t for t in range(trajectories) if t not in test]
        self.trajectories = sorted(test) if split == "test" else train
        # Every trajectory of the files when computing the statistics, else this set's: they must be finite.
        sums = self._scan(range(trajectories) if stats is None else self.trajectories, train)
        self.stats = stats if stats is not None else self._statistics(sums)
        if self.stats.fields != self.channels:
            raise ValueError(f"stats are for fields {self.stats.fields}, the data set reads {self.channels}")
        shape = (-1,) + (1,) * (1 + dims)
        mean = np.asarray(self.stats.mean, dtype=np.float32).reshape(shape)
        std = np.asarray(self.stats.std, dtype=np.float32).reshape(shape)
        # A static problem's inputs and outputs have statistics of their own; time-dependent ones share them.
        first = len(self.inputs) if self.files.static else 0
        self._x_norm = (mean, std) if first == 0 else (mean[:first], std[:first])
        self._y_norm = (mean[first:], std[first:])

    def _scan(self, scanned: Sequence[int], train: Sequence[int]) -> torch.Tensor:
        """Read the frames used of the ``scanned`` trajectories: the per-channel (count, sum, sum of
        squares) over those of them in ``train``, in float64 and in the order scanned, all-reduced over the
        mesh (the default group). Non-finite values are a DataError naming each file, trajectory and
        channel, on every rank."""
        sums = torch.zeros(len(self.channels), 3, dtype=torch.float64)
        bad = torch.zeros(len(self.channels), len(scanned), dtype=torch.float64)  # non-finite values
        train = set(train)
        # The frames the items use: a static problem's one, else the inputs' and the targets'.
        frames = slice(0, 1) if self.files.static else slice(0, self.y_frames.stop)
        block = np.empty((frames.stop, *self.local_shape), dtype=np.float64)  # exact for float32 data
        for i, key in enumerate(self.channels):
            for j, t in enumerate(scanned):
                self.files.read(key, t, (frames, *self._slab), block)
                bad[i, j] = block.size - np.count_nonzero(np.isfinite(block))
                if t in train:
                    sums[i] += torch.tensor([block.size, block.sum(), np.square(block).sum()], dtype=torch.float64)
        if self.mesh is not None and self.mesh.size() > 1:
            sums, bad = comm.all_reduce(torch.cat([sums, bad], 1)).split([3, len(scanned)], 1)
        if bad.any():
            self._non_finite(scanned, train, bad)
        return sums

    def _non_finite(self, scanned: Sequence[int], train: set[int], bad: torch.Tensor) -> None:
        """The DataError of ``_scan``: per file, its trajectories ``bad`` marks with their channels."""
        found: dict[int, list[str]] = {}
        for j in bad.any(0).nonzero().flatten().tolist():
            file, local = self.files.locate(scanned[j])
            names = ", ".join(repr(self.channels[i]) for i in bad[:, j].nonzero().flatten().tolist())
            found.setdefault(file, []).append(
                f"{'training' if scanned[j] in train else 'test'} trajectory {local} ({names})"
            )
        parts, count = [], 0
        for file, entries in found.items():
            shown = entries[: max(0, SHOWN - count)]
            count += len(entries)
            if shown:
                parts.append(f"{self.files.paths[file]}: non-finite values (NaN or inf) in {', '.join(shown)}")
        more = f" and {count - SHOWN} more trajectories" if count > SHOWN else ""
        raise DataError(f"{'; '.join(parts)}{more}")

    def _statistics(self, sums: torch.Tensor) -> Stats:
        """Mean and std per channel from ``_scan``'s sums over the training trajectories. A mesh dim that
        does not split the field (data parallel) counts each point once per rank along it, which scales
        every sum alike and leaves the ratios unchanged."""
        count, total, squares = sums.unbind(1)
        mean = total / count.clamp(min=1)
        std = (squares / count.clamp(min=1) - mean.square()).clamp(min=0).sqrt()
        return Stats(self.channels, tuple(mean.tolist()), tuple(max(s, 1e-12) for s in std.tolist()))

    def __len__(self) -> int:
        return len(self.trajectories)

    def field_stats(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """The mean and std of ``fields`` (the targets' channels), from ``stats``."""
        first = len(self.stats.fields) - len(self.fields)
        return self.stats.mean[first:], self.stats.std[first:]

    def field_tensors(self, dtype: torch.dtype, device) -> tuple[torch.Tensor, torch.Tensor]:
        """``field_stats`` as tensors ``(1, fields, 1, ...)`` that broadcast against a batch of targets
        ``(batch, fields, *block, t)``."""
        shape = (1, -1) + (1,) * (len(self.global_shape) + 1)
        mean, std = (torch.tensor(v, dtype=dtype, device=device).view(shape) for v in self.field_stats())
        return mean, std

    @property
    def x_shape(self) -> tuple[int, ...]:
        """An item's input block: ``(len(inputs), t_in, *local_shape)``."""
        return (len(self.inputs), self.t_in, *self.local_shape)

    @property
    def y_shape(self) -> tuple[int, ...]:
        """An item's target block: ``(len(fields), t_out, *local_shape)``."""
        return (len(self.fields), self.t_out, *self.local_shape)

    def read_into(self, index: int, x: torch.Tensor, y: torch.Tensor) -> None:
        """Item ``index`` read straight into ``x`` (``x_shape``) and ``y`` (``y_shape``): C-contiguous float32
        CPU tensors (pinned or not; a batch's slices), overwritten. Each channel's frames go from the file
        into their place in one read, then each is normalised in place: ``(value - mean) / std`` in
        float32."""
        for name, out, shape in (("x", x, self.x_shape), ("y", y, self.y_shape)):
            if tuple(out.shape) != shape or out.dtype != torch.float32 or out.is_cuda or not out.is_contiguous():
                raise ValueError(
                    f"{name} must be a contiguous float32 CPU tensor {shape}, got {out.dtype} {tuple(out.shape)} "
                    f"on {out.device}"
                )
        trajectory = self.trajectories[index]
        parts = ((x, self.inputs, self.x_frames, self._x_norm), (y, self.fields, self.y_frames, self._y_norm))
        for out, channels, frames, (mean, std) in parts:
            block = out.numpy()
            for i, key in enumerate(channels):
                self.files.read(key, trajectory, (frames, *self._slab), block[i])
            np.subtract(block, mean, out=block)
            np.divide(block, std, out=block)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = frames_tensor(self.x_shape), frames_tensor(self.y_shape)
        self.read_into(index, x, y)
        return x, y


# Renamed after 0.2.0 (the data set reads every layout and dim count); FIELDS was imported here at 0.2.0.
__getattr__ = moved_names(
    __name__,
    {"drift.data.pdebench": ("FIELDS",)},
    renamed={"PDEBench3D": "drift.data.dataset.Trajectories"},
    removed_in="0.4.0",
)
