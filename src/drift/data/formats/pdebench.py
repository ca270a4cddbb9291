"""PDEBench's layouts, as its FNO loaders read them (``FNODatasetSingle``, ``FNODatasetMult``):

* CFD (``PDEBenchCFD``): ``density``, ``pressure``, ``Vx`` [, ``Vy`` [, ``Vz``]], each ``[batch, time, x
  [, y [, z]]]``, one velocity component per spatial dim, with ``x-coordinate`` [...] and ``t-coordinate``.
* scalar (``PDEBenchScalar``): ``tensor`` ``[batch, time, x [, y]]`` (advection, Burgers,
  reaction-diffusion): one channel, "u".
* Darcy (``PDEBenchDarcy``): the input ``nu`` ``[batch, x, y]`` and the output ``tensor`` ``[batch, 1, x,
  y]``: static, channels "nu" -> "u".
* per-sample groups (``PDEBenchGroups``, ``.h5``): one group per trajectory (``0000``, ``0001``, ..., the
  i-th in sorted order is trajectory i), each with ``data`` ``[time, x [, y], channels]`` and ``grid/x``
  [, ``grid/y``], ``grid/t``: channels "c0", "c1", ... (the files do not name them).

A prediction's output (``output``) keeps the layout: CFD, scalar and Darcy files one dataset per channel
with the source's coordinates at the points read and (CFD, scalar) its ``t-coordinate``'s first frames + 1
entries; per-sample files one group per output trajectory (``0000``, ... in output order) with its source
group's grid and times.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import h5py
import numpy as np

from drift.data.formats.base import (
    FileLayout,
    Format,
    check_float,
    coordinate_lengths,
    dataset,
    hdf5_matches,
    ndim,
    spatial_axes,
    spatial_dims,
    static_block,
)
from drift.data.formats.output import Block, Output, Prediction, Write, copied_attrs
from drift.data.pdebench import DataError, open_file

COORDINATES = ("x-coordinate", "y-coordinate", "z-coordinate")
TIMES = "t-coordinate"  # the frames' times: one more entry than frames in PDEBench's files
VELOCITIES = ("Vx", "Vy", "Vz")
SCALAR = "u"  # the one channel of a ``tensor`` file (PDEBench's papers call the solution u)


@dataclass(frozen=True)
class PDEBenchCFD(Format):
    """PDEBench's compressible Navier-Stokes files of ``dims`` spatial dims."""

    dims: int

    @property
    def name(self) -> str:
        return f"PDEBench {self.dims}-D CFD"

    @property
    def fields(self) -> tuple[str, ...]:
        return ("density", "pressure", *VELOCITIES[: self.dims])

    def title(self, dims: int) -> str:
        return self.name

    def matches(self, path: Path) -> bool:
        return hdf5_matches(path, lambda f: ndim(f, "density") == self.dims + 2)  # its dims tell the dims

    def describe(self, path: Path) -> FileLayout:
        axes = ("batch", "time", *spatial_axes(self.dims))
        with open_file(path) as f:
            shape = None
            for key in self.fields:
                d = dataset(f, path, key, axes)
                if shape is not None and d.shape != shape:
                    raise DataError(f"{path}: dataset {key!r} has shape {d.shape}, {self.fields[0]!r} has {shape}")
                shape = d.shape
            lengths = coordinate_lengths(f, path, COORDINATES[: self.dims], shape[2:])
            dtype = f[self.fields[0]].dtype
        return FileLayout(self, self.fields, self.fields, False, shape[0], shape[1], shape[2:], lengths, dtype)

    def open(self, path: Path) -> h5py.File:
        return open_file(path)

    def read(self, handle: h5py.File, channel: str, trajectory: int, selection: tuple, out: np.ndarray) -> None:
        handle[channel].read_direct(out, (trajectory, *selection))

    def output(self, prediction: Prediction) -> Output:
        return _one_dataset_per_channel(prediction, {key: key for key in self.fields}, times=True)


@dataclass(frozen=True)
class PDEBenchScalar(Format):
    """PDEBench's one-channel time-dependent files: ``tensor`` ``[batch, time, x [, y [, z]]]``."""

    name = "PDEBench scalar"

    def matches(self, path: Path) -> bool:
        return hdf5_matches(path, lambda f: "tensor" in f and "nu" not in f)

    def describe(self, path: Path) -> FileLayout:
        with open_file(path) as f:
            dims = spatial_dims(f, "tensor", 2)
            d = dataset(f, path, "tensor", ("batch", "time", *spatial_axes(dims)))
            lengths = coordinate_lengths(f, path, COORDINATES[:dims], d.shape[2:])
            return FileLayout(self, (SCALAR,), (SCALAR,), False, d.shape[0], d.shape[1], d.shape[2:], lengths, d.dtype)

    def open(self, path: Path) -> h5py.File:
        return open_file(path)

    def read(self, handle: h5py.File, channel: str, trajectory: int, selection: tuple, out: np.ndarray) -> None:
        handle["tensor"].read_direct(out, (trajectory, *selection))

    def output(self, prediction: Prediction) -> Output:
        return _one_dataset_per_channel(prediction, {SCALAR: "tensor"}, times=True)


@dataclass(frozen=True)
class PDEBenchDarcy(Format):
    """PDEBench's Darcy flow: the coefficient ``nu`` ``[batch, x, y]`` maps to the solution ``tensor``
    ``[batch, 1, x, y]``."""

    name = "PDEBench Darcy"

    def matches(self, path: Path) -> bool:
        return hdf5_matches(path, lambda f: "tensor" in f and "nu" in f)

    def describe(self, path: Path) -> FileLayout:
        with open_file(path) as f:
            dims = spatial_dims(f, "nu", 1)
            nu = dataset(f, path, "nu", ("batch", *spatial_axes(dims)))
            u = dataset(f, path, "tensor", ("batch", "time", *spatial_axes(dims)))
            if u.shape != (nu.shape[0], 1, *nu.shape[1:]):
                raise DataError(
                    f"{path}: dataset 'tensor' has shape {u.shape}, expected {(nu.shape[0], 1, *nu.shape[1:])} "
                    f"(one frame of 'nu''s {nu.shape})"
                )
            lengths = coordinate_lengths(f, path, COORDINATES[:dims], nu.shape[1:])
            return FileLayout(self, (SCALAR,), ("nu",), True, nu.shape[0], 1, nu.shape[1:], lengths, u.dtype)

    def open(self, path: Path) -> h5py.File:
        return open_file(path)

    def read(self, handle: h5py.File, channel: str, trajectory: int, selection: tuple, out: np.ndarray) -> None:
        if channel == "nu":
            handle["nu"].read_direct(static_block(selection, out), (trajectory, *selection[1:]))
        elif channel == SCALAR:
            handle["tensor"].read_direct(out, (trajectory, *selection))
        else:
            raise KeyError(channel)

    def output(self, prediction: Prediction) -> Output:
        return _one_dataset_per_channel(prediction, {"nu": "nu", SCALAR: "tensor"}, times=False)


def _one_dataset_per_channel(prediction: Prediction, stored: dict[str, str], times: bool) -> Output:
    """A PDEBench file holding each channel in dataset ``stored[channel]``, ``[batch, time, *grid]`` (or
    ``[batch, *grid]`` where the source's has no time dim: Darcy's ``nu``), with the source's coordinates,
    attributes and (``times``) its ``t-coordinate``."""
    p, dims = prediction, len(prediction.grid)
    with open_file(p.source) as f:
        timed = {key: f[key].ndim == dims + 2 for key in stored.values()}
        datasets = {key: ((p.count, *(p.frames,) * timed[key], *p.grid), f[key].dtype) for key in stored.values()}
        arrays = {key: p.points(f[key][()]) for key in COORDINATES[:dims] if key in f}
        if times and isinstance(f.get(TIMES), h5py.Dataset) and f[TIMES].ndim == 1:
            arrays[TIMES] = p.times(f[TIMES][()], p.frames + 1, repr(TIMES))
        attrs = {"": copied_attrs(f)}

    def place(block: Block) -> list[Write]:
        key = stored[block.channel]
        if timed[key]:
            return [(key, (block.trajectory, block.frames, *block.space), block.values)]
        return [(key, (block.trajectory, *block.space), block.values[0])]

    return Output(datasets, place, arrays, attrs)


class Groups(NamedTuple):
    """An open per-sample file and its groups' names in sorted order (trajectory i is the i-th)."""

    file: h5py.File
    names: list[str]


@dataclass(frozen=True)
class PDEBenchGroups(Format):
    """PDEBench's per-sample files: group ``k`` holds ``data`` ``[time, x [, y [, z]], channels]``."""

    name = "PDEBench per-sample groups"

    def matches(self, path: Path) -> bool:
        def first_is_a_sample(f: h5py.File) -> bool:
            names = sorted(f.keys())
            return bool(names) and isinstance(f[names[0]], h5py.Group) and "data" in f[names[0]]

        return hdf5_matches(path, first_is_a_sample)

    def describe(self, path: Path) -> FileLayout:
        with open_file(path) as f:
            names = sorted(f.keys())
            first = f[names[0]]
            dims = spatial_dims(first, "data", 2)
            axes = ("time", *spatial_axes(dims), "channels")
            shape = dataset(first, f"{path}: group {names[0]!r}", "data", axes).shape
            for name in names:
                data = f[name].get("data") if isinstance(f[name], h5py.Group) else None
                got = data.shape if isinstance(data, h5py.Dataset) else "nothing"
                if got != shape:
                    raise DataError(f"{path}: {name!r}/data has shape {got}, expected {shape} (as {names[0]!r}/data)")
                check_float(path, f"{name}/data", data.dtype)
            grid = first.get("grid")
            if not isinstance(grid, h5py.Group):
                raise DataError(f"{path}: group {names[0]!r} has no group 'grid' (has {sorted(first.keys())})")
            lengths = coordinate_lengths(grid, f"{path}: {names[0]!r}/grid", spatial_axes(dims), shape[1:-1])
            channels = tuple(f"c{i}" for i in range(shape[-1]))
            dtype = first["data"].dtype
        return FileLayout(self, channels, channels, False, len(names), shape[0], shape[1:-1], lengths, dtype)

    def open(self, path: Path) -> Groups:
        f = open_file(path)
        return Groups(f, sorted(f.keys()))

    def read(self, handle: Groups, channel: str, trajectory: int, selection: tuple, out: np.ndarray) -> None:
        if channel[:1] != "c" or not channel[1:].isdigit():
            raise KeyError(channel)
        handle.file[handle.names[trajectory]]["data"].read_direct(out, (*selection, int(channel[1:])))

    def output(self, prediction: Prediction) -> Output:
        p, axes = prediction, spatial_axes(len(prediction.grid))
        names = [f"{i:0{max(4, len(str(p.count - 1)))}d}" for i in range(p.count)]  # sorted as numbered
        datasets, arrays, attrs = {}, {}, {}
        with p.opened() as located:
            attrs[""] = copied_attrs(located[0][0])
            for name, (f, local) in zip(names, located, strict=True):
                group = f[sorted(f.keys())[local]]
                datasets[f"{name}/data"] = ((p.frames, *p.grid, group["data"].shape[-1]), group["data"].dtype)
                for axis in axes:
                    arrays[f"{name}/grid/{axis}"] = p.points(group["grid"][axis][()])
                if isinstance(group["grid"].get("t"), h5py.Dataset):
                    arrays[f"{name}/grid/t"] = p.times(group["grid/t"][()], p.frames, f"{group.name}/grid/t")
                if group.attrs:
                    attrs[name] = copied_attrs(group)

        def place(block: Block) -> list[Write]:
            selection = (block.frames, *block.space, int(block.channel[1:]))
            return [(f"{names[block.trajectory]}/data", selection, block.values)]

        return Output(datasets, place, arrays, attrs)
