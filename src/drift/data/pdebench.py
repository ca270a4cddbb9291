"""PDEBench's 3D compressible Navier-Stokes layout: checking a file's layout, the split rules, the
normalisation statistics, writing new files.

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


def open_file(path: Path) -> h5py.File:
    """``path`` opened for reading; DataError naming it when it is no readable HDF5 file."""
    try:
        return h5py.File(path, "r")
    except OSError as exc:
        raise DataError(f"{path}: not a readable HDF5 file ({exc})") from None


def read_layout(path: str | Path, fields: Sequence[str] = FIELDS) -> tuple[int, ...]:
    """The ``(trajectories, frames, x, y, z)`` shape of ``fields`` in a PDEBench 3D file, after checking
    that every field and coordinate is there with a consistent shape (``DataError`` otherwise)."""
    path = Path(path)
    with open_file(path) as f:
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
