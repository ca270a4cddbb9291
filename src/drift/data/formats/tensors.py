"""neuraloperator's tensor dictionaries (``TensorDictionary``): a ``.pt`` file holding a dict with tensors
``x`` (the input) and ``y`` (the output), each ``[sample, [channel,] *grid]`` with 1 to 3 spatial dims;
loaded with ``torch.load(mmap=True, weights_only=True)``, so nothing read from the file runs and a read
copies only the block asked for.

Which dims are spatial: those that ``x`` and ``y`` share at their end (at most 3), less leading ones of
extent 1; what is left between the sample dim and the grid must be one channel dim, or none (as
neuraloperator's darcy files: ``x`` and ``y`` ``(N, 16, 16)``; its ``PTDataset`` adds the channel dim).
Where that rule misreads a file (``x`` and ``y`` with as many channels, e.g. ``(N, 2, 16, 16)`` both,
read as a 2 x 16 x 16 grid), an int entry ``spatial_dims`` in the dict says how many dims are spatial.
Channels: "x" and "y" for one channel, else "x0", "x1", ... and "y0", ...

A prediction's output (``output``) is such a file: ``x`` the inputs read, ``y`` the predicted outputs, with
the source's shapes (at the points read) and dtypes, its ``spatial_dims`` entry if it has one, and the
prediction's record (a str entry). Its blocks are gathered to rank 0, which saves it (``TensorWriter``).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from drift import comm
from drift.data.formats.base import FileLayout, Format, static_block
from drift.data.formats.output import Block, Output, OutputWriter, Prediction, Write
from drift.data.pdebench import DataError
from drift.data.writer import agreed, attempt

SUFFIXES = (".pt", ".pth")
KEYS = ("x", "y")  # the input's and the output's
DTYPES = {torch.float32: np.dtype(np.float32), torch.float64: np.dtype(np.float64)}


def _grid_dims(data: Mapping) -> int:
    """How many trailing dims of ``x`` and ``y`` are spatial (the module's rule)."""
    if "spatial_dims" in data:
        return int(data["spatial_dims"])
    x, y = data["x"].shape[1:], data["y"].shape[1:]
    shared = 0
    while shared < min(len(x), len(y), 3) and x[len(x) - shared - 1] == y[len(y) - shared - 1]:
        shared += 1
    while shared > 1 and x[len(x) - shared] == 1:  # a leading extent-1 dim is a channel dim
        shared -= 1
    return shared


def _channels(key: str, shape: tuple[int, ...], dims: int) -> tuple[str, ...]:
    count = shape[1] if len(shape) == dims + 2 else 1
    return (key,) if count == 1 else tuple(f"{key}{i}" for i in range(count))


@dataclass(frozen=True)
class TensorDictionary(Format):
    """``.pt`` dictionaries of ``x`` and ``y`` tensors (neuraloperator's darcy_train_16.pt and the like)."""

    name = "tensor dictionary (.pt)"

    def matches(self, path: Path) -> bool:
        return Path(path).suffix in SUFFIXES

    def open(self, path: Path) -> Mapping:
        try:
            data = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
        except Exception as exc:  # torch.load raises many kinds (pickle, zip, runtime) on what it cannot load
            raise DataError(f"{path}: not a tensor dictionary torch.load reads with mmap ({exc})") from None
        if not isinstance(data, Mapping):
            raise DataError(f"{path}: holds a {type(data).__name__}, expected a dict with tensors 'x' and 'y'")
        return data

    def describe(self, path: Path) -> FileLayout:
        data = self.open(path)
        for key in KEYS:
            value = data.get(key)
            if not isinstance(value, torch.Tensor):
                got = "nothing" if value is None else type(value).__name__
                raise DataError(f"{path}: {key!r} is {got}, expected a tensor (the dict has {sorted(map(str, data))})")
            if value.dtype not in DTYPES:
                raise DataError(f"{path}: {key!r} is {value.dtype}; drift reads float32 or float64 tensors")
        x, y = data["x"].shape, data["y"].shape
        dims = _grid_dims(data)
        if not 1 <= dims <= 3 or x[-dims:] != y[-dims:] or x[0] != y[0]:
            raise DataError(
                f"{path}: 'x' {tuple(x)} and 'y' {tuple(y)} share no grid of 1 to 3 dims and the sample count; "
                "expected [sample, [channel,] *grid] each, one grid"
            )
        for key, shape in (("x", x), ("y", y)):
            if len(shape) - dims not in (1, 2):
                raise DataError(
                    f"{path}: {key!r} {tuple(shape)} has {len(shape) - dims - 1} dims before its {dims}-D grid "
                    f"{tuple(shape[-dims:])}; expected [sample, [channel,] *grid]"
                )
        grid = tuple(x[-dims:])
        fields, inputs = _channels("y", tuple(y), dims), _channels("x", tuple(x), dims)
        return FileLayout(self, fields, inputs, True, x[0], 1, grid, (1.0,) * dims, DTYPES[data["y"].dtype])

    def read(self, handle: Mapping, channel: str, trajectory: int, selection: tuple, out: np.ndarray) -> None:
        key, dims = channel[:1], _grid_dims(handle)
        if key not in KEYS:
            raise KeyError(channel)
        sample = handle[key][trajectory]
        if sample.ndim > dims:  # the channel dim
            sample = sample[int(channel[1:] or 0)]
        np.copyto(static_block(selection, out), sample[selection[1:]].numpy())

    def output(self, prediction: Prediction) -> Output:
        p, data = prediction, self.open(prediction.source)
        dims = len(p.grid)
        datasets = {key: ((p.count, *data[key].shape[1:-dims], *p.grid), DTYPES[data[key].dtype]) for key in KEYS}
        arrays = {key: data[key] for key in ("spatial_dims",) if key in data}

        def place(block: Block) -> list[Write]:
            key = block.channel[:1]
            channel = (int(block.channel[1:] or 0),) if len(datasets[key][0]) == dims + 2 else ()
            return [(key, (block.trajectory, *channel, *block.space), block.values[0])]

        return Output(datasets, place, arrays, writer=TensorWriter)


class TensorWriter(OutputWriter):
    """A tensor dictionary written by every rank: each ``put``'s blocks are gathered to rank 0, which holds
    the whole output (the files are small) and saves it (``torch.save``) under the temporary name at
    ``commit``, before the rename."""

    entries: dict

    @classmethod
    def start(cls, path: Path, output: Output, attrs: dict[str, dict], replace: bool) -> TensorWriter:
        name = comm.broadcast_object(f"{path.name}.{socket.gethostname()}-{os.getpid()}.partial")
        writer = cls(path, path.with_name(name), replace)
        writer.place = output.place
        held = {key: np.empty(shape, dtype) for key, (shape, dtype) in output.datasets.items()}
        writer.entries = {**attrs.get("", {}), **output.arrays, **held} if comm.rank() == 0 else {}
        return writer

    def put(self, blocks: Sequence[Block]) -> None:
        writes = comm.all_gather_object([w for block in blocks for w in self.place(block)])
        if comm.rank() == 0:
            for key, selection, values in (w for ranks in writes for w in ranks):
                self.entries[key][selection] = values

    def commit(self) -> None:
        def save() -> None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            entries = {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in self.entries.items()}
            torch.save(entries, self.temp)

        self.check(agreed(attempt(save) if comm.rank() == 0 else None))
        super().commit()
