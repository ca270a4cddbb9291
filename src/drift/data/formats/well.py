"""The Well's HDF5 layout (``TheWell``), as its ``WellDataset`` reads it.

A file records ``n_spatial_dims`` and ``n_trajectories`` in its attributes; ``dimensions`` holds one
coordinate dataset per name in its ``spatial_dims`` attribute and ``time``; ``t0_fields``, ``t1_fields`` and
``t2_fields`` hold scalar, vector and rank-2 tensor fields (named in each group's ``field_names``), each
``[trajectory] [time] x y [z] [component [component]]`` where its ``sample_varying`` and ``time_varying``
attributes say whether the leading dims are there; ``boundary_conditions`` holds one group per boundary with
its ``bc_type`` and ``associated_dims``.

Channels are named as ``WellDataset`` flattens them: a scalar field by its name, a vector field's
components ``name_x``, ``name_y``, ..., a tensor field's ``name_xx``, ``name_xy``, ... (the spatial dims'
names, in C order). The time-varying channels come first, then the constant ones (``FileLayout.constant``:
read into every frame asked for); a field shared by every trajectory is read for each. Fields constant
along a spatial dim and non-uniform grids are refused; non-periodic boundaries are recorded
(``FileLayout.periodic``).

A prediction's output (``output``) is a file of The Well that its ``WellDataset`` reads: the source's
attributes (``n_trajectories`` the output's), groups and their attributes; each time-varying field
``[trajectory, time, *grid, *components]`` (``sample_varying`` then, whatever the source's), each constant
field copied from the source's input frame (per output trajectory where it varies by trajectory); the
spatial coordinates and boundary masks at the points read, the times the source's first ones (continued at
its spacing where it has fewer), the scalars of the trajectories predicted.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import h5py
import numpy as np

from drift.data.formats.base import FileLayout, Format, check_float, extent, hdf5_matches
from drift.data.formats.output import Block, Output, Prediction, Write, copied_attrs
from drift.data.pdebench import DataError, open_file

GROUPS = ("t0_fields", "t1_fields", "t2_fields")  # by tensor order


class Channel(NamedTuple):
    """Where a channel is stored: its dataset, which leading dims it has, its component's indices."""

    key: str
    sample_varying: bool
    time_varying: bool
    component: tuple[int, ...]


class WellFile(NamedTuple):
    """An open file of The Well and where each of its channels is stored."""

    file: h5py.File
    channels: dict[str, Channel]


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _names(value) -> list[str]:
    """An attribute holding one name or an array of them, as a list of names."""
    if isinstance(value, str | bytes):
        return [_text(value)]
    return [_text(v) for v in np.atleast_1d(value)]


def _datasets(f: h5py.File) -> Iterator[tuple[int, str, h5py.Dataset | None]]:
    """Each field's tensor order, name and dataset (None where missing), in ``WellDataset``'s order."""
    for order, group in enumerate(GROUPS):
        if group in f:
            for name in _names(f[group].attrs.get("field_names", [])):
                yield order, name, f[group].get(name)


def _channels(f: h5py.File) -> dict[str, Channel]:
    """Every channel of ``f``: the time-varying ones, then the constant ones."""
    axes = _names(f["dimensions"].attrs["spatial_dims"])
    varying, constant = {}, {}
    for order, name, d in _datasets(f):
        time_varying = bool(d.attrs["time_varying"])
        target = varying if time_varying else constant
        for component in itertools.product(range(len(axes)), repeat=order):
            suffix = "".join(axes[i] for i in component)
            channel = f"{name}_{suffix}" if suffix else name
            sample_varying = bool(d.attrs["sample_varying"])
            target[channel] = Channel(f"{GROUPS[order]}/{name}", sample_varying, time_varying, component)
    return {**varying, **constant}


@dataclass(frozen=True)
class TheWell(Format):
    """The Well's files (``the_well`` package, ``WellDataset``)."""

    name = "The Well"

    def matches(self, path: Path) -> bool:
        return hdf5_matches(path, lambda f: "n_spatial_dims" in f.attrs and "dimensions" in f and "t0_fields" in f)

    def describe(self, path: Path) -> FileLayout:
        with open_file(path) as f:
            for key in ("n_spatial_dims", "n_trajectories"):
                if key not in f.attrs:
                    raise DataError(f"{path}: no attribute {key!r} (The Well's files record it)")
            axes, grid, lengths = _space(f, path)
            if "time" not in f["dimensions"]:
                raise DataError(f"{path}: no dataset 'dimensions/time' (has {sorted(f['dimensions'].keys())})")
            trajectories, frames = int(f.attrs["n_trajectories"]), f["dimensions"]["time"].shape[-1]
            dtypes = [
                _check_field(path, f"{GROUPS[order]}/{name}", d, trajectories, frames, grid, order)
                for order, name, d in _datasets(f)
            ]
            channels = _channels(f)
            if not any(c.time_varying for c in channels.values()):
                raise DataError(f"{path}: no time-varying field in {', '.join(GROUPS)}; drift learns how fields evolve")
            constant = tuple(name for name, c in channels.items() if not c.time_varying)
            periodic = _periodic(f, axes)
        fields = tuple(channels)
        return FileLayout(
            self, fields, fields, False, trajectories, frames, grid, lengths, dtypes[0], periodic, constant
        )

    def open(self, path: Path) -> WellFile:
        f = open_file(path)
        return WellFile(f, _channels(f))

    def read(self, handle: WellFile, channel: str, trajectory: int, selection: tuple, out: np.ndarray) -> None:
        c = handle.channels[channel]
        d = handle.file[c.key]
        index = (trajectory,) if c.sample_varying else ()
        if c.time_varying:
            d.read_direct(out, (*index, *selection, *c.component))
        else:
            d.read_direct(out[0], (*index, *selection[1:], *c.component))
            out[1:] = out[0]

    def output(self, prediction: Prediction) -> Output:
        p = prediction
        datasets, arrays = {}, {}
        with p.opened() as located:
            f = located[0][0]
            channels = _channels(f)
            attrs = {"": copied_attrs(f, n_trajectories=p.count)}
            for order, name, d in _datasets(f):
                key, varying = f"{GROUPS[order]}/{name}", bool(d.attrs["time_varying"])
                leading = (p.count, p.frames) if varying else (p.count,) * bool(d.attrs["sample_varying"])
                datasets[key] = ((*leading, *p.grid, *(len(p.grid),) * order), d.dtype)
                attrs[key] = copied_attrs(d, sample_varying=varying or bool(d.attrs["sample_varying"]))
            for group in (*GROUPS, "scalars", "boundary_conditions"):
                if group in f:
                    attrs[group] = copied_attrs(f[group])
            _dimensions(p, f, arrays, attrs)
            for name, bc in f.get("boundary_conditions", {}).items():
                attrs[f"boundary_conditions/{name}"] = copied_attrs(bc)
                for key, d in bc.items():  # a mask marks the boundary's points: at the points read
                    arrays[f"boundary_conditions/{name}/{key}"] = p.points(d[()]) if key == "mask" else d[()]
            _scalars(p, located, arrays, attrs)

        def place(block: Block) -> list[Write]:
            c = channels[block.channel]
            if c.time_varying:
                return [(c.key, (block.trajectory, block.frames, *block.space, *c.component), block.values)]
            if block.frames.start:  # a constant field's predicted frames: the file keeps the source's field
                return []
            index = (block.trajectory,) if c.sample_varying else ()
            return [(c.key, (*index, *block.space, *c.component), block.values[0])]

        return Output(datasets, place, arrays, attrs)


def _dimensions(p: Prediction, f: h5py.File, arrays: dict, attrs: dict) -> None:
    """The output's ``dimensions``: each spatial coordinate (the first trajectory's, at the points read)
    and the times, shared by every trajectory."""
    dims = f["dimensions"]
    attrs["dimensions"] = copied_attrs(dims)
    for axis in _names(dims.attrs["spatial_dims"]):
        arrays[f"dimensions/{axis}"] = p.points(np.reshape(dims[axis][()], (-1, dims[axis].shape[-1]))[0])
        attrs[f"dimensions/{axis}"] = copied_attrs(dims[axis], sample_varying=False)
    time = np.reshape(dims["time"][()], (-1, dims["time"].shape[-1]))[0]
    arrays["dimensions/time"] = p.times(time, p.frames, "'dimensions/time'")
    attrs["dimensions/time"] = copied_attrs(dims["time"], sample_varying=False)


def _scalars(p: Prediction, located: list[tuple[h5py.File, int]], arrays: dict, attrs: dict) -> None:
    """The output's ``scalars``: each the predicted trajectories' where it varies by trajectory, its first
    frames where it varies in time (the last repeated where the source has fewer)."""
    if "scalars" not in located[0][0]:
        return
    for name in _names(located[0][0]["scalars"].attrs.get("field_names", [])):
        key = f"scalars/{name}"
        d = located[0][0][key]
        values = np.stack([f[key][local] for f, local in located]) if d.attrs["sample_varying"] else d[()]
        if d.attrs["time_varying"]:
            values = values[..., np.minimum(np.arange(p.frames), values.shape[-1] - 1)]
        arrays[key] = values
        attrs[key] = copied_attrs(d)


def _space(f: h5py.File, path: Path) -> tuple[list[str], tuple[int, ...], tuple[float, ...]]:
    """The spatial dims' names, extents and lengths; DataError for a non-uniform or trajectory-dependent
    grid, naming the dimension."""
    dims = f["dimensions"]
    axes = _names(dims.attrs.get("spatial_dims", []))
    if len(axes) != int(f.attrs["n_spatial_dims"]) or not 1 <= len(axes) <= 3:
        raise DataError(
            f"{path}: 'dimensions' names spatial dims {axes}, the file has n_spatial_dims "
            f"{f.attrs['n_spatial_dims']}; drift reads 1 to 3 named dims"
        )
    grid, lengths = [], []
    for axis in axes:
        if not isinstance(dims.get(axis), h5py.Dataset):
            raise DataError(f"{path}: no coordinate dataset 'dimensions/{axis}' (has {sorted(dims.keys())})")
        c = dims[axis][()]
        rows = np.reshape(c, (-1, c.shape[-1]))
        if not (rows == rows[0]).all():
            raise DataError(f"{path}: dimension {axis!r}'s coordinates differ by trajectory; drift reads one grid")
        spacing = np.diff(rows[0].astype(np.float64))
        if spacing.size and np.ptp(spacing) > 8 * np.finfo(c.dtype).eps * np.abs(rows[0]).max():
            raise DataError(
                f"{path}: dimension {axis!r} is not uniformly spaced (spacing {spacing.min():.6g} to "
                f"{spacing.max():.6g}); drift reads uniform grids"
            )
        grid.append(c.shape[-1])
        lengths.append(extent(rows[0]))
    return axes, tuple(grid), tuple(lengths)


def _check_field(
    path: Path, key: str, d: h5py.Dataset | None, trajectories: int, frames: int, grid: tuple[int, ...], order: int
) -> np.dtype:
    """Check field ``key``'s shape against its attributes; its dtype."""
    if d is None:
        raise DataError(f"{path}: missing field {key!r} (its group's field_names lists it)")
    if not isinstance(d, h5py.Dataset):
        raise DataError(f"{path}: {key!r} is an HDF5 {type(d).__name__.lower()}, not a dataset")
    for attribute in ("sample_varying", "time_varying", "dim_varying"):
        if attribute not in d.attrs:
            raise DataError(f"{path}: field {key!r} has no attribute {attribute!r}")
    if not np.all(d.attrs["dim_varying"]):
        raise DataError(
            f"{path}: field {key!r} is constant along a spatial dim (dim_varying {list(d.attrs['dim_varying'])}); "
            "drift reads fields that vary along every dim"
        )
    leading = (trajectories,) * bool(d.attrs["sample_varying"]) + (frames,) * bool(d.attrs["time_varying"])
    expected = (*leading, *grid, *(len(grid),) * order)
    if d.shape != expected:
        raise DataError(f"{path}: field {key!r} has shape {d.shape}, expected {expected} (from its attributes)")
    check_float(path, key, d.dtype)
    return d.dtype


def _periodic(f: h5py.File, axes: list[str]) -> tuple[bool, ...]:
    """Per spatial dim: whether every boundary condition on it is periodic (and there is one)."""
    kinds: dict[str, set[str]] = {axis: set() for axis in axes}
    for bc in f.get("boundary_conditions", {}).values():
        for axis in _names(bc.attrs.get("associated_dims", [])):
            kinds.setdefault(axis, set()).add(_text(bc.attrs.get("bc_type", "")).upper())
    return tuple(kinds[axis] == {"PERIODIC"} for axis in axes)
