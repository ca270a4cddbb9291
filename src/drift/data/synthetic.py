"""Small synthetic files in every layout drift reads (``write_synthetic``), their fields a known learnable
map: the trainer's test data.

Time-dependent layouts: frame 0 of each channel is a smooth periodic random field (a few Fourier modes, plus
a per-channel offset), and every frame the next by ``advance``: the field rolled by ``SHIFT`` cells along
every spatial dim (``np.roll``), then each Fourier mode with integer wavenumbers ``k`` scaled by
``exp(-DAMPING * |k|^2)``. Static layouts (``darcy``, ``pt``): the output is ``smooth`` of the input, each
Fourier mode scaled by ``exp(-SMOOTHING * |k|^2)``. Both maps are linear, exact up to the stored dtype's
round-off, and act on each channel alone.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from pathlib import Path

import h5py
import numpy as np
import torch

from drift.data.mat import CLASSES, USERBLOCK, header

LAYOUTS = ("cfd", "scalar", "darcy", "groups", "well", "pt", "mat")
SHIFT = 1  # cells per frame, along every spatial dim
DAMPING = 0.01  # per frame: mode k scaled by exp(-DAMPING |k|^2)
SMOOTHING = 0.05  # static layouts: y's mode k is x's scaled by exp(-SMOOTHING |k|^2)
MODES = 3  # the initial fields' wavenumbers: |k_i| <= MODES per dim
AXES = ("x", "y", "z")


def _wavenumbers(grid: Sequence[int]) -> list[np.ndarray]:
    """Each dim's integer wavenumbers, shaped to broadcast over the grid."""
    return [
        np.reshape(np.fft.fftfreq(n, 1.0 / n), [n if j == i else 1 for j in range(len(grid))])
        for i, n in enumerate(grid)
    ]


def _squared(grid: Sequence[int]) -> np.ndarray:
    return sum(k**2 for k in _wavenumbers(grid))


def _filtered(field: np.ndarray, dims: int, factor: np.ndarray) -> np.ndarray:
    axes = tuple(range(-dims, 0))
    return np.real(np.fft.ifftn(np.fft.fftn(field, axes=axes) * factor, axes=axes))


def advance(field: np.ndarray, dims: int) -> np.ndarray:
    """The next frame of ``field`` (its last ``dims`` axes spatial), in float64: rolled by ``SHIFT`` cells
    along every spatial dim, then each Fourier mode k scaled by ``exp(-DAMPING |k|^2)``."""
    axes = tuple(range(-dims, 0))
    rolled = np.roll(np.asarray(field, dtype=np.float64), (SHIFT,) * dims, axes)
    return _filtered(rolled, dims, np.exp(-DAMPING * _squared(field.shape[-dims:])))


def smooth(field: np.ndarray, dims: int) -> np.ndarray:
    """A static layout's output for input ``field`` (its last ``dims`` axes spatial), in float64: each Fourier
    mode k scaled by ``exp(-SMOOTHING |k|^2)``."""
    return _filtered(np.asarray(field, dtype=np.float64), dims, np.exp(-SMOOTHING * _squared(field.shape[-dims:])))


def _initial(rng: np.random.Generator, samples: int, grid: tuple[int, ...]) -> np.ndarray:
    """``samples`` smooth periodic random fields: random complex amplitudes on the modes up to ``MODES``
    (fewer on a coarse grid), about unit size."""
    spectrum = np.zeros((samples, *grid), dtype=np.complex128)
    for k in itertools.product(*(range(-min(MODES, (n - 1) // 2), min(MODES, (n - 1) // 2) + 1) for n in grid)):
        spectrum[(slice(None), *k)] = rng.standard_normal(samples) + 1j * rng.standard_normal(samples)
    fields = np.real(np.fft.ifftn(spectrum, axes=tuple(range(1, len(grid) + 1))))
    return fields / np.maximum(fields.std(axis=tuple(range(1, len(grid) + 1)), keepdims=True), 1e-300)


def _trajectories(rng: np.random.Generator, samples: int, frames: int, grid: tuple[int, ...], offset: float):
    """``(samples, frames, *grid)`` float64: frame 0 random, each next ``advance`` of the one before, computed
    in Fourier space from frame 0 (so round-off does not pile up)."""
    dims = len(grid)
    axes = tuple(range(-dims, 0))
    spectrum = np.fft.fftn(_initial(rng, samples, grid), axes=axes)
    shift = sum(k * SHIFT / n for k, n in zip(_wavenumbers(grid), grid, strict=True))
    step = np.exp(-2j * np.pi * shift - DAMPING * _squared(grid))  # np.roll by SHIFT, then the damping
    out = np.stack([np.real(np.fft.ifftn(spectrum * step**t, axes=axes)) for t in range(frames)], axis=1)
    return out + offset


def _centres(n: int) -> np.ndarray:
    """Cell-centre coordinates on [0, 1]: n * spacing = 1."""
    return (np.arange(n) + 0.5) / n


def write_synthetic(
    path: str | Path,
    layout: str,
    *,
    samples: int = 4,
    resolution: int | Sequence[int] = 16,
    frames: int = 6,
    dims: int = 2,
    seed: int = 0,
    dtype: str | np.dtype = "float32",
) -> Path:
    """Write a small file in ``layout`` (one of ``LAYOUTS``) at ``path`` and return the path.

    ``samples`` trajectories (or input/output pairs), ``frames`` frames each (time-dependent layouts),
    ``dims`` spatial dims (1 to 3) of ``resolution`` cells each (or one extent per dim), fields stored as
    ``dtype`` (float32 or float64), the same bits for the same arguments. The layouts, with the
    coordinates and attributes the real files have (on the unit domain, cell centres):

    * "cfd": PDEBench CFD: ``density`` (offset 1), ``pressure`` (offset 1), ``Vx`` .. one velocity per dim.
    * "scalar": PDEBench ``tensor`` ``[samples, frames, *grid]`` (one channel).
    * "darcy": PDEBench Darcy: ``nu`` (offset 2) and ``tensor`` = ``smooth(nu)`` ``[samples, 1, *grid]``.
    * "groups": PDEBench per-sample groups ``0000``, ...: ``data`` ``[frames, *grid, 2]``, ``grid/x``, ...
    * "well": The Well: ``t0_fields/tracer`` and ``t1_fields/velocity`` (one component per dim), periodic
      boundaries.
    * "pt": a dict of tensors ``x`` and ``y`` = ``smooth(x)``, each ``[samples, *grid]`` (``torch.save``).
    * "mat": Li et al.'s MATLAB v7.3 ``.mat`` (1 or 2 spatial dims): ``u`` ``samples x *grid x frames`` in
      MATLAB's order (stored reversed, after MATLAB's 512-byte header), ``a`` its frame before the first
      (as Li's initial vorticity) and ``t`` = 1, ..., frames (``1 x frames``).

    Time-dependent fields: frame t + 1 is ``advance`` of frame t (before rounding to ``dtype``).
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    grid = (resolution,) * dims if isinstance(resolution, int) else tuple(resolution)
    if not 1 <= len(grid) <= 3 or min(grid) < 1 or samples < 1 or frames < 2:
        raise ValueError(f"need 1 to 3 spatial dims, positive extents and samples, 2 frames; got {grid}, {samples}")
    if layout == "mat" and len(grid) > 2:
        raise ValueError(f"layout mat holds 1 or 2 spatial dims (Li's u: N x X [x Y] x T), got {len(grid)}")
    dtype = np.dtype(dtype)
    if dtype not in (np.float32, np.float64):
        raise ValueError(f"dtype must be float32 or float64, got {dtype}")
    path = Path(path)
    WRITERS[layout](path, np.random.default_rng(seed), samples, frames, grid, dtype)
    return path


def _pdebench_coordinates(f: h5py.File, grid: tuple[int, ...], frames: int | None) -> None:
    for axis, n in zip(AXES, grid, strict=False):
        f.create_dataset(f"{axis}-coordinate", data=_centres(n).astype(np.float32))
    if frames is not None:  # as PDEBench's files: one time more than frames, frame t at t * dt
        f.create_dataset("t-coordinate", data=(np.arange(frames + 1) / (frames - 1)).astype(np.float32))


def _cfd(path: Path, rng, samples: int, frames: int, grid: tuple[int, ...], dtype: np.dtype) -> None:
    names = ("density", "pressure", *("Vx", "Vy", "Vz")[: len(grid)])
    with h5py.File(path, "w") as f:
        for name in names:
            offset = 1.0 if name in ("density", "pressure") else 0.0
            f.create_dataset(name, data=_trajectories(rng, samples, frames, grid, offset).astype(dtype))
        _pdebench_coordinates(f, grid, frames)


def _scalar(path: Path, rng, samples: int, frames: int, grid: tuple[int, ...], dtype: np.dtype) -> None:
    with h5py.File(path, "w") as f:
        f.create_dataset("tensor", data=_trajectories(rng, samples, frames, grid, 0.0).astype(dtype))
        _pdebench_coordinates(f, grid, frames)


def _darcy(path: Path, rng, samples: int, frames: int, grid: tuple[int, ...], dtype: np.dtype) -> None:
    nu = _initial(rng, samples, grid) + 2.0
    with h5py.File(path, "w") as f:
        f.create_dataset("nu", data=nu.astype(dtype))
        f.create_dataset("tensor", data=smooth(nu, len(grid))[:, None].astype(dtype))
        _pdebench_coordinates(f, grid, None)


def _groups(path: Path, rng, samples: int, frames: int, grid: tuple[int, ...], dtype: np.dtype) -> None:
    channels = np.stack([_trajectories(rng, samples, frames, grid, 0.0) for _ in range(2)], axis=-1)
    with h5py.File(path, "w") as f:
        for i in range(samples):
            group = f.create_group(f"{i:04d}")
            group.create_dataset("data", data=channels[i].astype(dtype))
            for axis, n in zip(AXES, grid, strict=False):
                group.create_dataset(f"grid/{axis}", data=_centres(n).astype(np.float32))
            group.create_dataset("grid/t", data=(np.arange(frames) / (frames - 1)).astype(np.float32))


def _well(path: Path, rng, samples: int, frames: int, grid: tuple[int, ...], dtype: np.dtype) -> None:
    axes = AXES[: len(grid)]
    tracer = _trajectories(rng, samples, frames, grid, 0.0)
    velocity = np.stack([_trajectories(rng, samples, frames, grid, 0.0) for _ in axes], axis=-1)
    with h5py.File(path, "w") as f:
        f.attrs.update(dataset_name="drift_synthetic", grid_type="cartesian", n_spatial_dims=len(grid))
        f.attrs.update(n_trajectories=samples, simulation_parameters=[])
        dimensions = f.create_group("dimensions")
        dimensions.attrs["spatial_dims"] = list(axes)
        for axis, n in zip(axes, grid, strict=True):
            dimensions.create_dataset(axis, data=_centres(n).astype(np.float32))
        dimensions.create_dataset("time", data=(np.arange(frames) / (frames - 1)).astype(np.float32))
        for name in dimensions:
            dimensions[name].attrs.update(sample_varying=False, time_varying=name == "time")
        boundaries = f.create_group("boundary_conditions")
        for axis, n in zip(axes, grid, strict=True):
            bc = boundaries.create_group(f"{axis}_periodic")
            bc.attrs.update(associated_dims=[axis], associated_fields=[], bc_type="PERIODIC")
            bc.attrs.update(sample_varying=False, time_varying=False)
            bc.create_dataset("mask", data=np.eye(1, n, 0, dtype=bool)[0] | np.eye(1, n, n - 1, dtype=bool)[0])
        f.create_group("scalars").attrs["field_names"] = []
        for group, name, data in (("t0_fields", "tracer", tracer), ("t1_fields", "velocity", velocity)):
            fields = f.create_group(group)
            fields.attrs["field_names"] = [name]
            d = fields.create_dataset(name, data=data.astype(dtype))
            d.attrs.update(dim_varying=[True] * len(grid), sample_varying=True, time_varying=True)
        f.create_group("t2_fields").attrs["field_names"] = []


def _pt(path: Path, rng, samples: int, frames: int, grid: tuple[int, ...], dtype: np.dtype) -> None:
    x = _initial(rng, samples, grid)
    pair = {"x": torch.from_numpy(x.astype(dtype)), "y": torch.from_numpy(smooth(x, len(grid)).astype(dtype))}
    torch.save(pair, path)


def _mat(path: Path, rng, samples: int, frames: int, grid: tuple[int, ...], dtype: np.dtype) -> None:
    states = _trajectories(rng, samples, frames + 1, grid, 0.0).astype(dtype)  # a, then u's frames
    arrays = {"u": np.moveaxis(states[:, 1:], 1, -1), "a": states[:, 0], "t": np.arange(1.0, frames + 1)[None]}
    with h5py.File(path, "w", userblock_size=USERBLOCK) as f:
        for key, values in arrays.items():  # in MATLAB's order; HDF5 holds a MATLAB array reversed
            f.create_dataset(key, data=values.transpose()).attrs["MATLAB_class"] = CLASSES[values.dtype]
    with open(path, "r+b") as raw:  # the user block is the application's, written after HDF5 closed the file
        raw.write(header())


WRITERS: dict[str, Callable[..., None]] = dict(
    cfd=_cfd, scalar=_scalar, darcy=_darcy, groups=_groups, well=_well, pt=_pt, mat=_mat
)
