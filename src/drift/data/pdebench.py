"""PDEBench's 3D compressible Navier-Stokes layout: reading each rank's block, writing new files.

A file holds the datasets ``density``, ``pressure``, ``Vx``, ``Vy``, ``Vz``, each float32 shaped
``[batch, time, x, y, z]``, the cell-centre coordinates ``x-coordinate``, ``y-coordinate``,
``z-coordinate`` (length n each) and ``t-coordinate`` (one more entry than frames), and the attributes
``eta``, ``zeta`` and ``M``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import h5py
import numpy as np
import torch

from drift import comm
from drift.layout import Layout

FIELDS = ("density", "pressure", "Vx", "Vy", "Vz")
COORDINATES = ("x-coordinate", "y-coordinate", "z-coordinate")
SHOWN = 10  # trajectories with non-finite values named in the error
# Which trajectories form the test set: the last round(10%) (at least one), or PDEBench's first int(10%).
SPLITS = ("last", "pdebench")


class DataError(ValueError):
    """A data file that cannot be read as PDEBench 3D data; the message names the file and the key."""


@dataclass(frozen=True)
class Stats:
    """Per-field mean and standard deviation (over the training trajectories, every frame and point)."""

    fields: tuple[str, ...]
    mean: tuple[float, ...]
    std: tuple[float, ...]

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, path: str | Path) -> Stats:
        d = json.loads(Path(path).read_text())
        return cls(tuple(d["fields"]), tuple(d["mean"]), tuple(d["std"]))


def write_pdebench3d(
    path: str | Path, fields: dict[str, np.ndarray], *, t_end: float = 1.0, attrs: dict[str, float] | None = None
) -> None:
    """Write ``fields`` (name -> ``[batch, time, x, y, z]`` array) in PDEBench's 3D layout on the unit cube,
    with cell-centre coordinates and, as PDEBench's files, ``time + 1`` times: frame k at
    ``k * t_end / (time - 1)`` (the first frame at 0, the last at ``t_end``) and one more step after it."""
    shapes = {name: np.shape(a) for name, a in fields.items()}
    if len(set(shapes.values())) != 1 or len(next(iter(shapes.values()))) != 5:
        raise ValueError(f"every field must share one [batch, time, x, y, z] shape, got {shapes}")
    _, frames, *extents = next(iter(shapes.values()))
    if frames < 2:
        raise ValueError(f"the fields need at least 2 frames (times 0 and t_end), got {frames}")
    with h5py.File(path, "w") as f:
        for name, array in fields.items():
            f.create_dataset(name, data=np.asarray(array, dtype=np.float32))
        for name, n in zip(COORDINATES, extents, strict=True):
            f.create_dataset(name, data=(np.arange(n, dtype=np.float32) + 0.5) / n)
        f.create_dataset("t-coordinate", data=(np.arange(frames + 1) * (t_end / (frames - 1))).astype(np.float32))
        for key, value in (attrs or {}).items():
            f.attrs[key] = value


def held_out_trajectories(trajectories: int, rule: str = "last", fraction: float = 0.1) -> range:
    """The test trajectories of a file holding ``trajectories``; the others are the training set.

    ``rule``: "last": the last ``round(fraction * trajectories)``, at least one when the file holds two or
    more (drift's split). "pdebench": the first ``int(trajectories * fraction)``, as PDEBench's FNO and
    U-Net loaders take them (``test_idx = int(num_samples * test_ratio)``): none below 10 trajectories.
    """
    if rule == "pdebench":
        return range(int(trajectories * fraction))
    if rule == "last":
        n_test = max(1, round(trajectories * fraction)) if trajectories > 1 else 0
        return range(trajectories - n_test, trajectories)
    raise ValueError(f"split rule must be one of {', '.join(SPLITS)}, got {rule!r}")


def _open(path: Path) -> h5py.File:
    try:
        return h5py.File(path, "r")
    except OSError as exc:
        raise DataError(f"{path}: not a readable HDF5 file ({exc})") from None


def read_layout(path: str | Path, fields: Sequence[str] = FIELDS) -> tuple[int, ...]:
    """The ``(trajectories, frames, x, y, z)`` shape of ``fields`` in a PDEBench 3D file, after checking
    that every field and coordinate is there with a consistent shape (``DataError`` otherwise)."""
    path = Path(path)
    with _open(path) as f:
        shape = None
        for key in fields:
            if key not in f:
                raise DataError(f"{path}: missing dataset {key!r} (has {sorted(f.keys())})")
            if not isinstance(f[key], h5py.Dataset):
                raise DataError(f"{path}: {key!r} is an HDF5 {type(f[key]).__name__.lower()}, not a dataset")
            if f[key].ndim != 5:
                raise DataError(f"{path}: dataset {key!r} has shape {f[key].shape}, not [batch, time, x, y, z]")
            if f[key].dtype.newbyteorder("=") not in (np.float32, np.float64):  # either byte order
                raise DataError(
                    f"{path}: dataset {key!r} is {f[key].dtype}; drift reads float32 or float64 fields "
                    "(write the file's fields as float32)"
                )
            if shape is not None and f[key].shape != shape:
                raise DataError(f"{path}: dataset {key!r} has shape {f[key].shape}, {fields[0]!r} has {shape}")
            shape = f[key].shape
        for key, n in zip(COORDINATES, shape[2:], strict=True):
            if key not in f or f[key].shape != (n,):
                got = f[key].shape if key in f else "nothing"
                raise DataError(f"{path}: coordinate {key!r} must have shape ({n},), got {got}")
    return tuple(shape)


class PDEBench3D(torch.utils.data.Dataset):
    """This rank's blocks of PDEBench 3D trajectories as (input frames, target frames) pairs.

    Args:
        path: the HDF5 file.
        mesh, placements: a ``DeviceMesh`` over the default process group (every rank of it, as
            ``drift.grid_mesh`` and ``drift train`` make) and one placement per mesh dim over the
            spatial dims (x, y, z) of the selected grid, as ``drift.Layout`` takes them: ``Shard(i)``
            splits dim i in ``torch.chunk`` blocks, ``Replicate()`` (a data-parallel mesh dim) leaves
            the field whole. None: one process reads every point. ``layout``: the resulting ``Layout``.
        t_in, t_out: frames 0..t_in-1 are the input, the next t_out frames the target (paper: 5 and 16).
        fields: which fields, in channel order.
        split: "train" or "test": which side of the split ``split_rule`` makes.
        split_rule: "last" (the test set is the last ``test_fraction`` of the trajectories, at least one
            when the file holds two or more) or "pdebench" (the first ``int(test_fraction * trajectories)``,
            as PDEBench's loaders); see ``held_out_trajectories``.
        region: per spatial dim a (start, stop) range of the file's grid (default: all of it).
        stride: keep every stride-th point per dim (an int for all dims, or one per dim): downsampling.
        stats: normalisation; default: computed from the training trajectories (one all-reduce over the
            mesh), also for a test split. Pass the training set's ``stats`` to a test set.

    The trajectories read to compute the statistics (every one of the file) or, with ``stats`` given, this
    split's must be finite: a DataError names each trajectory and field that is not, on every rank.

    Item i: ``(x, y)`` float tensors ``(fields, t_in, *local block)`` and ``(fields, t_out, *local block)``,
    normalised per field, read as hyperslabs: a rank never reads more than its block (which may be
    empty). Every trajectory is readable on every rank: which ones a rank uses (data parallelism) is
    its training loop's choice.
    """

    def __init__(
        self,
        path: str | Path,
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
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        if t_in < 1 or t_out < 1:
            raise ValueError(f"t_in and t_out must be positive, got {t_in} and {t_out}")
        self.path, self.fields, self.t_in, self.t_out, self.mesh = Path(path), tuple(fields), t_in, t_out, mesh
        self._file: h5py.File | None = None  # opened on first read, in the process that reads
        trajectories, frames, *extents = read_layout(self.path, self.fields)
        if frames < t_in + t_out:
            raise DataError(
                f"{self.path}: {self.fields[0]!r} has {frames} frames, fewer than t_in + t_out = {t_in + t_out}"
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
        test = held_out_trajectories(trajectories, split_rule, test_fraction)
        train = [t for t in range(trajectories) if t not in test]
        self.trajectories = train if split == "train" else list(test)
        # Every trajectory of the file when computing the statistics, else this split's: they must be finite.
        sums = self._scan(range(trajectories) if stats is None else self.trajectories, train)
        self.stats = stats if stats is not None else self._statistics(sums)
        if self.stats.fields != self.fields:
            raise ValueError(f"stats are for fields {self.stats.fields}, the data set reads {self.fields}")

    def _read(self, key: str, trajectory: int, frames: slice) -> np.ndarray:
        if self._file is None:
            self._file = _open(self.path)
        try:
            return self._file[key][(trajectory, frames, *self._slab)]
        except (OSError, KeyError) as exc:
            raise DataError(f"{self.path}: cannot read dataset {key!r} ({exc})") from None

    def _scan(self, scanned: Sequence[int], train: Sequence[int]) -> torch.Tensor:
        """Read the frames used of the ``scanned`` trajectories: the per-field (count, sum, sum of squares)
        over those of them in ``train``, all-reduced over the mesh (the default group). Non-finite values
        are a DataError naming each trajectory and field, on every rank."""
        sums = torch.zeros(len(self.fields), 3, dtype=torch.float64)
        bad = torch.zeros(len(self.fields), len(scanned), dtype=torch.float64)  # non-finite values
        frames, train = slice(0, self.t_in + self.t_out), set(train)
        for i, key in enumerate(self.fields):
            for j, t in enumerate(scanned):
                block = self._read(key, t, frames).astype(np.float64)
                bad[i, j] = block.size - np.count_nonzero(np.isfinite(block))
                if t in train:
                    sums[i] += torch.tensor([block.size, block.sum(), np.square(block).sum()], dtype=torch.float64)
        if self.mesh is not None and self.mesh.size() > 1:
            sums, bad = comm.all_reduce(torch.cat([sums, bad], 1)).split([3, len(scanned)], 1)
        if bad.any():
            found = [
                f"{'training' if scanned[j] in train else 'test'} trajectory {scanned[j]} "
                f"({', '.join(repr(self.fields[i]) for i in bad[:, j].nonzero().flatten().tolist())})"
                for j in bad.any(0).nonzero().flatten().tolist()
            ]
            more = f" and {len(found) - SHOWN} more trajectories" if len(found) > SHOWN else ""
            raise DataError(f"{self.path}: non-finite values (NaN or inf) in {', '.join(found[:SHOWN])}{more}")
        return sums

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

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        t = self.trajectories[index]
        frames = slice(0, self.t_in + self.t_out)
        data = np.stack([self._read(key, t, frames) for key in self.fields]).astype(np.float32)
        mean = np.asarray(self.stats.mean, dtype=np.float32).reshape(-1, 1, 1, 1, 1)
        std = np.asarray(self.stats.std, dtype=np.float32).reshape(-1, 1, 1, 1, 1)
        data = torch.from_numpy((data - mean) / std)
        return data[:, : self.t_in].contiguous(), data[:, self.t_in :].contiguous()

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_file": None}  # an open HDF5 handle does not travel to loader workers
