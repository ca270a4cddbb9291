"""What every format shares: the ``Format`` a layout is read through, the ``FileLayout`` it describes a file
with, and the checks of HDF5 datasets and coordinates that several layouts make."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import h5py
import numpy as np

from drift.data.pdebench import DataError

if TYPE_CHECKING:
    from drift.data.formats.output import Output, Prediction

FLOATS = (np.dtype(np.float32), np.dtype(np.float64))  # the stored dtypes drift reads
AXES = ("x", "y", "z")  # the spatial axes' names in shape texts


class Format:
    """One data layout drift reads. ``matches`` is cheap (keys present, a suffix); ``describe`` validates the
    whole file (DataError naming the path, the key, what was found and what was expected); ``read`` reads one
    channel's block of one trajectory straight into a caller's buffer through a handle ``open`` gave.

    Subclasses are frozen dataclasses: two formats are the same when equal, and they pickle to loader
    workers."""

    name: str

    def matches(self, path: Path) -> bool:
        """Whether ``path`` looks like a file of this format (not validated: ``describe`` does that)."""
        raise NotImplementedError

    def describe(self, path: Path) -> FileLayout:
        """What ``path`` holds, after checking every key the layout reads; DataError otherwise."""
        raise NotImplementedError

    def open(self, path: Path) -> Any:
        """A handle ``read`` reads ``path`` through; opened once per process and kept."""
        raise NotImplementedError

    def read(self, handle: Any, channel: str, trajectory: int, selection: tuple[slice, ...], out: np.ndarray) -> None:
        """Read ``channel``'s ``selection`` (a frames slice, then one slice per spatial dim, steps >= 1) of
        ``trajectory`` (its index in this file) into ``out`` (C-contiguous float32 or float64, the
        selection's shape), converting the dtype. A static problem's channel has one frame: ``slice(0, 1)``;
        a time-invariant channel of a time-dependent file fills every frame asked for."""
        raise NotImplementedError

    def title(self, dims: int) -> str:
        """The layout's name in a run's first line, for a file of ``dims`` spatial dims."""
        return f"{self.name}, {dims}-D"

    def output(self, prediction: Prediction) -> Output:
        """The file of this layout that ``prediction`` writes (``drift.data.formats.output``): for each output
        trajectory the source's input frames then the predicted ones (a static problem: the inputs and the
        predicted output), coordinates at the points read, times continued where the source has fewer, the
        source's attributes. Reads the source's small arrays and attributes; DataError naming the file when
        they do not give what the output needs."""
        raise NotImplementedError


@dataclass(frozen=True)
class FileLayout:
    """What one file holds. ``fields``: the state's channels (time-dependent) or the output's (static), a
    vector field one channel per component; ``inputs``: a static problem's input channels, else ``fields``;
    ``frames`` is 1 for a static problem; ``lengths``: the domain's extent per spatial dim (n * spacing,
    1.0 where the file has no coordinates); ``dtype``: the fields' stored dtype; ``periodic``: per spatial
    dim, whether the boundary is periodic (every dim, unless the file records other boundaries);
    ``constant``: the channels that do not change in time (read into every frame asked for)."""

    format: Format
    fields: tuple[str, ...]
    inputs: tuple[str, ...]
    static: bool
    trajectories: int
    frames: int
    grid: tuple[int, ...]
    lengths: tuple[float, ...]
    dtype: np.dtype
    periodic: tuple[bool, ...] = field(default=())
    constant: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if not self.periodic:
            object.__setattr__(self, "periodic", (True,) * len(self.grid))

    @property
    def dims(self) -> int:
        return len(self.grid)

    @property
    def channels(self) -> tuple[str, ...]:
        """Every channel ``read`` reads: the inputs, then the fields not among them."""
        return (*self.inputs, *(f for f in self.fields if f not in self.inputs))

    def text(self) -> str:
        """One line: the layout, its channels and shape, e.g. "PDEBench 2-D CFD: density, pressure, Vx,
        Vy; 1000 x 21 x 128 x 128" (a static problem: "inputs -> fields; trajectories x grid")."""
        channels = ", ".join(self.fields)
        if self.static:
            channels = f"{', '.join(self.inputs)} -> {channels}"
            shape = (self.trajectories, *self.grid)
        else:
            shape = (self.trajectories, self.frames, *self.grid)
        return f"{self.format.title(self.dims)}: {channels}; {' x '.join(map(str, shape))}"


def hdf5_matches(path: Path, test: Callable[[h5py.File], bool]) -> bool:
    """``test`` of ``path`` opened as HDF5; False when it is no HDF5 file."""
    try:
        with h5py.File(path, "r") as f:
            return bool(test(f))
    except OSError:
        return False


def dataset(f: h5py.Group, path: Path | str, key: str, axes: Sequence[str]) -> h5py.Dataset:
    """``f[key]``, checked to be a float32 or float64 dataset with one dim per name in ``axes``."""
    if key not in f:
        raise DataError(f"{path}: missing dataset {key!r} (has {sorted(f.keys())})")
    d = f[key]
    if not isinstance(d, h5py.Dataset):
        raise DataError(f"{path}: {key!r} is an HDF5 {type(d).__name__.lower()}, not a dataset")
    if d.ndim != len(axes):
        raise DataError(f"{path}: dataset {key!r} has shape {d.shape}, not [{', '.join(axes)}]")
    check_float(path, key, d.dtype)
    return d


def check_float(path: Path | str, key: str, dtype: np.dtype) -> None:
    """DataError unless ``dtype`` is float32 or float64 (either byte order)."""
    if np.dtype(dtype).newbyteorder("=") not in FLOATS:
        raise DataError(
            f"{path}: dataset {key!r} is {dtype}; drift reads float32 or float64 fields (write them as float32)"
        )


def spatial_axes(dims: int) -> tuple[str, ...]:
    return AXES[:dims]


def spatial_dims(f: h5py.Group, key: str, other: int) -> int:
    """The spatial dims of dataset ``key`` holding ``other`` more dims (batch, time, channels): 1 to 3, so
    that ``dataset`` names the expected axes when ``key`` has too few or too many dims (or is missing)."""
    return min(max((ndim(f, key) or other + 1) - other, 1), 3)


def ndim(f: h5py.Group, key: str) -> int | None:
    """The dims of dataset ``key``; None where ``f`` has no such dataset."""
    return f[key].ndim if isinstance(f.get(key), h5py.Dataset) else None


def coordinate_lengths(f: h5py.Group, path: Path | str, keys: Sequence[str], grid: Sequence[int]) -> tuple[float, ...]:
    """The domain's extent per dim from the 1-D coordinate datasets ``keys`` (each must have its dim's
    length): n * spacing."""
    lengths = []
    for key, n in zip(keys, grid, strict=True):
        got = f[key].shape if key in f and isinstance(f[key], h5py.Dataset) else "nothing"
        if got != (n,):
            raise DataError(f"{path}: coordinate {key!r} must have shape ({n},), got {got}")
        lengths.append(extent(f[key][()]))
    return tuple(lengths)


def extent(coordinates: np.ndarray) -> float:
    """n * the mean spacing of ``coordinates``; 1.0 for a single point."""
    c = np.asarray(coordinates, dtype=np.float64)
    if c.size < 2:
        return 1.0
    return float((c[-1] - c[0]) / (c.size - 1) * c.size)


def static_block(selection: tuple[slice, ...], out: np.ndarray) -> np.ndarray:
    """The one frame of a static channel's ``out``: the frames slice must select frame 0 of 1."""
    if len(range(1)[selection[0]]) != 1 or out.shape[0] != 1:
        raise ValueError(f"a static channel has one frame; asked for {selection[0]} into {out.shape[0]} frames")
    return out[0]
