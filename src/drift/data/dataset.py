"""``PDEBench3D``: each rank's block of PDEBench 3D trajectories, from one file or several, read straight
into its output and normalised in place."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from drift import comm
from drift.data.files import Data, PDEBenchFiles
from drift.data.pdebench import FIELDS, DataError, Stats
from drift.layout import Layout

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


class PDEBench3D(torch.utils.data.Dataset):
    """This rank's blocks of PDEBench 3D trajectories as (input frames, target frames) pairs.

    Args:
        data: the HDF5 file, a folder of them or a sequence of files and folders, read as one data set
            with trajectories numbered across the files in order (``PDEBenchFiles``; or such an object,
            shared with another data set of the same files).
        mesh, placements: a ``DeviceMesh`` over the default process group (every rank of it, as
            ``drift.grid_mesh`` and ``drift train`` make) and one placement per mesh dim over the
            spatial dims (x, y, z) of the selected grid, as ``drift.Layout`` takes them: ``Shard(i)``
            splits dim i in ``torch.chunk`` blocks, ``Replicate()`` (a data-parallel mesh dim) leaves
            the field whole. None: one process reads every point. ``layout``: the resulting ``Layout``.
        t_in, t_out: frames 0..t_in-1 are the input, the next t_out frames the target (paper: 5 and 16).
        fields: which fields, in channel order.
        split: "train" or "test": which side of the split ``split_rule`` makes; "all": every trajectory
            (a separate test set, or training files that have one).
        split_rule: "last" (the test set is the last ``test_fraction`` of each file's trajectories, at
            least one when the file holds two or more) or "pdebench" (each file's first
            ``int(test_fraction * trajectories)``, as PDEBench's loaders); see ``held_out_trajectories``.
        region: per spatial dim a (start, stop) range of the file's grid (default: all of it).
        stride: keep every stride-th point per dim (an int for all dims, or one per dim): downsampling.
        stats: normalisation; default: computed from the training trajectories (one all-reduce over the
            mesh), also for a test split. Pass the training set's ``stats`` to a test set.

    The trajectories read to compute the statistics (every one of the files) or, with ``stats`` given, this
    set's must be finite: a DataError names each file, trajectory (its index in the file) and field that
    is not, on every rank.

    Item i: ``(x, y)`` new float32 tensors ``(fields, t_in, *local block)`` and ``(fields, t_out, *local
    block)``, normalised per field, read as hyperslabs straight into them (``read_into``): a rank never
    reads more than its block (which may be empty), and no item shares memory with another. Every
    trajectory is readable on every rank: which ones a rank uses (data parallelism) is its training
    loop's choice. Reads may come from another thread than the one that made the data set.

    Example, one process reading every point of a small generated file:

    >>> import tempfile
    >>> from drift.data import PDEBench3D, generate
    >>> path = f"{tempfile.mkdtemp()}/cfd.hdf5"
    >>> generate(path, samples=4, resolution=8, frames=7, seed=1, progress=False)
    >>> train = PDEBench3D(path, t_in=2, t_out=4)
    >>> test = PDEBench3D(path, t_in=2, t_out=4, split="test", stats=train.stats)
    >>> train.trajectories, test.trajectories
    ([0, 1, 2], [3])
    >>> x, y = train[0]
    >>> x.shape, y.shape
    (torch.Size([5, 2, 8, 8, 8]), torch.Size([5, 4, 8, 8, 8]))
    """

    def __init__(
        self,
        data: Data | PDEBenchFiles,
        mesh=None,
        placements: Sequence | None = None,
        *,
        t_in: int = 5,
        t_out: int = 16,
        fields: Sequence[str] = FIELDS,
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
        self.fields, self.t_in, self.t_out, self.mesh = tuple(fields), t_in, t_out, mesh
        self.files = data if isinstance(data, PDEBenchFiles) else PDEBenchFiles(data, self.fields)
        if self.files.fields != self.fields:
            raise ValueError(f"the files are read for fields {self.files.fields}, the data set reads {self.fields}")
        trajectories, frames, *extents = self.files.shape
        if frames < t_in + t_out:
            raise DataError(
                f"{self.files.paths[0]}: {self.fields[0]!r} has {frames} frames, fewer than t_in + t_out = "
                f"{t_in + t_out}"
            )
        region = list(region) if region is not None else [(0, n) for n in extents]
        strides = [stride] * 3 if isinstance(stride, int) else list(stride)
        if len(region) != 3 or len(strides) != 3:
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
        if self.stats.fields != self.fields:
            raise ValueError(f"stats are for fields {self.stats.fields}, the data set reads {self.fields}")
        shape = (-1, 1, 1, 1, 1)
        self._mean = np.asarray(self.stats.mean, dtype=np.float32).reshape(shape)
        self._std = np.asarray(self.stats.std, dtype=np.float32).reshape(shape)

    def _scan(self, scanned: Sequence[int], train: Sequence[int]) -> torch.Tensor:
        """Read the frames used of the ``scanned`` trajectories: the per-field (count, sum, sum of squares)
        over those of them in ``train``, in float64 and in the order scanned, all-reduced over the mesh
        (the default group). Non-finite values are a DataError naming each file, trajectory and field, on
        every rank."""
        sums = torch.zeros(len(self.fields), 3, dtype=torch.float64)
        bad = torch.zeros(len(self.fields), len(scanned), dtype=torch.float64)  # non-finite values
        frames, train = slice(0, self.t_in + self.t_out), set(train)
        block = np.empty((self.t_in + self.t_out, *self.local_shape), dtype=np.float64)  # exact for float32 data
        for i, key in enumerate(self.fields):
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
        """The DataError of ``_scan``: per file, its trajectories ``bad`` marks with their fields."""
        found: dict[int, list[str]] = {}
        for j in bad.any(0).nonzero().flatten().tolist():
            file, local = self.files.locate(scanned[j])
            names = ", ".join(repr(self.fields[i]) for i in bad[:, j].nonzero().flatten().tolist())
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
        """Mean and std per field from ``_scan``'s sums over the training trajectories. A mesh dim that does
        not split the field (data parallel) counts each point once per rank along it, which scales every
        sum alike and leaves the ratios unchanged."""
        count, total, squares = sums.unbind(1)
        mean = total / count.clamp(min=1)
        std = (squares / count.clamp(min=1) - mean.square()).clamp(min=0).sqrt()
        return Stats(self.fields, tuple(mean.tolist()), tuple(max(s, 1e-12) for s in std.tolist()))

    def __len__(self) -> int:
        return len(self.trajectories)

    def read_into(self, index: int, x: torch.Tensor, y: torch.Tensor) -> None:
        """Item ``index`` read straight into ``x`` ``(fields, t_in, *local block)`` and ``y`` ``(fields,
        t_out, *local block)``: C-contiguous float32 CPU tensors (pinned or not; a batch's slices),
        overwritten. Each field's frames go from the file into their place in one read, then each is
        normalised in place: ``(value - mean) / std`` in float32."""
        for name, out, t in (("x", x, self.t_in), ("y", y, self.t_out)):
            shape = (len(self.fields), t, *self.local_shape)
            if tuple(out.shape) != shape or out.dtype != torch.float32 or out.is_cuda or not out.is_contiguous():
                raise ValueError(
                    f"{name} must be a contiguous float32 CPU tensor {shape}, got {out.dtype} {tuple(out.shape)} "
                    f"on {out.device}"
                )
        trajectory = self.trajectories[index]
        for out, frames in ((x, slice(0, self.t_in)), (y, slice(self.t_in, self.t_in + self.t_out))):
            block = out.numpy()
            for i, key in enumerate(self.fields):
                self.files.read(key, trajectory, (frames, *self._slab), block[i])
            np.subtract(block, self._mean, out=block)
            np.divide(block, self._std, out=block)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = frames_tensor((len(self.fields), self.t_in, *self.local_shape))
        y = frames_tensor((len(self.fields), self.t_out, *self.local_shape))
        self.read_into(index, x, y)
        return x, y
