"""A prediction's output file in its source's layout: what it holds and where each channel's block goes.

``Format.output(prediction)`` describes the file a prediction of ``prediction``'s trajectories writes
(``Output``): its large datasets (written in blocks, each rank its own), its small arrays and attributes
(copied or derived from the source when the file is created), and ``place``, which maps a channel's block
of one output trajectory (``Block``) to the dataset selections it fills. ``Output.open`` makes the writer
every rank writes through: HDF5 layouts write in turns into one file (``drift.data.writer.TurnWriter``),
a ``.pt`` dictionary is gathered to rank 0, which saves it (``drift.data.formats.tensors``); either way
under a temporary name, renamed into place by ``commit``, and removed on any failure.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import h5py
import numpy as np

from drift import comm
from drift.data.pdebench import DataError, open_file
from drift.data.writer import TurnWriter, agreed, attempt, opened

if TYPE_CHECKING:
    from drift.data.files import DataFiles


@dataclass(frozen=True)
class Prediction:
    """What a prediction writes: source ``files`` (one layout; the output's coordinates, times and
    attributes are the first file's, or the trajectory's own where the layout keeps them per trajectory),
    the source ``trajectories`` predicted (numbered across the files, in output order), ``frames`` per
    output trajectory (``t_in + t_out``; 1 for a static problem), the ``grid`` read and the ``stride``
    that reads it from the source's."""

    files: DataFiles
    trajectories: tuple[int, ...]
    frames: int
    grid: tuple[int, ...]
    stride: int

    @property
    def source(self) -> Path:
        return self.files.paths[0]

    @property
    def count(self) -> int:
        """Output trajectories."""
        return len(self.trajectories)

    @contextmanager
    def opened(self) -> Iterator[list[tuple[h5py.File, int]]]:
        """Each output trajectory's source file (HDF5, each opened once) and the trajectory's index there."""
        with ExitStack() as stack:
            handles: dict[int, h5py.File] = {}
            located = []
            for i, local in map(self.files.locate, self.trajectories):
                if i not in handles:
                    handles[i] = stack.enter_context(open_file(self.files.paths[i]))
                located.append((handles[i], local))
            yield located

    def points(self, values: np.ndarray, axes: int | None = None) -> np.ndarray:
        """``values`` at the points read: every ``stride``-th along its last ``axes`` dims (default: all)."""
        axes = values.ndim if axes is None else axes
        return values[(..., *(slice(None, None, self.stride),) * axes)] if axes else values

    def times(self, values: np.ndarray, count: int, what: str) -> np.ndarray:
        """The first ``count`` of the times ``values`` (1-D), continued at the spacing of their last two
        where there are fewer; DataError naming ``what`` when there are fewer than two to continue from."""
        if len(values) >= count:
            return values[:count]
        if len(values) < 2:
            raise DataError(f"{self.source}: {what} has {len(values)} entries, {count} needed (or 2 to continue)")
        more = values[-1] + (values[-1] - values[-2]) * np.arange(1, count - len(values) + 1)
        return np.concatenate([values, more.astype(values.dtype)])


class Block(NamedTuple):
    """One channel's block of one output trajectory: ``values`` ``(frames, *block)`` for the output's
    ``frames`` (the copied input frames, or the predicted ones) at the points ``space`` of the grid read."""

    channel: str
    trajectory: int
    frames: slice
    space: tuple[slice, ...]
    values: np.ndarray


Write = tuple[str, tuple, np.ndarray]  # a dataset, a selection of it and the values it takes
Datasets = dict[str, tuple[tuple[int, ...], np.dtype]]


@dataclass(frozen=True)
class Output:
    """An output file (see the module's notes): ``datasets`` (name -> shape and stored dtype, written by
    ``place``'s writes), ``arrays`` (name -> values, written whole at creation), ``attrs`` (object path ->
    attributes; "" the root, a group created where missing) and ``place`` (a block -> the writes it makes;
    none for a block the file does not keep). ``writer``: how the ranks write it. ``userblock``: bytes an
    HDF5 output starts with, before HDF5's superblock (MATLAB's header of a v7.3 ``.mat`` file). A ``.pt``
    dictionary's entries are its datasets and arrays, its root attributes further entries."""

    datasets: Datasets
    place: Callable[[Block], list[Write]]
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    attrs: dict[str, dict] = field(default_factory=dict)
    writer: type[OutputWriter] | None = None
    userblock: bytes = b""

    @property
    def dtype(self) -> np.dtype:
        """The dtype that holds every dataset's values exactly (the widest stored one)."""
        return np.result_type(*(dtype for _, dtype in self.datasets.values()))

    def open(self, path: Path, record: dict, *, replace: bool = False) -> OutputWriter:
        """Every rank: the writer of this file at ``path`` (under a temporary name until ``commit``), with
        the root attributes ``record`` besides. OutputError on every rank when it cannot be created."""
        attrs = {**self.attrs, "": {**self.attrs.get("", {}), **record}}
        return (self.writer or HDF5Writer).start(Path(path), self, attrs, replace)


class OutputWriter(TurnWriter):
    """A file every rank writes its blocks into (``write``), published by ``commit``; leaving its ``with``
    block by an exception removes the temporary file."""

    place: Callable[[Block], list[Write]]

    @classmethod
    def start(cls, path: Path, output: Output, attrs: dict[str, dict], replace: bool) -> OutputWriter:
        raise NotImplementedError

    def put(self, blocks: Sequence[Block]) -> None:
        """Every rank: write this rank's ``blocks`` (none is fine). OutputError on every rank (the temporary
        file removed) when a write fails on any rank."""
        raise NotImplementedError


class HDF5Writer(OutputWriter):
    """An HDF5 output written by every rank in turns (``TurnWriter``)."""

    @classmethod
    def start(cls, path: Path, output: Output, attrs: dict[str, dict], replace: bool) -> HDF5Writer:
        root = attrs.get("", {})
        writer = cls.create(path, output.datasets, output.arrays, root, replace=replace, userblock=output.userblock)
        writer.place = output.place
        rest = {key: values for key, values in attrs.items() if key}

        def annotate() -> None:
            with opened(writer.temp) as f:
                for key, values in rest.items():
                    (f[key] if key in f else f.require_group(key)).attrs.update(values)
                f.flush()

        writer.check(agreed(attempt(annotate) if comm.rank() == 0 and rest else None))
        return writer

    def put(self, blocks: Sequence[Block]) -> None:
        self.write([w for block in blocks for w in self.place(block)])


def copied_attrs(item: h5py.HLObject, **changes) -> dict:
    """``item``'s attributes, with ``changes``."""
    return {**dict(item.attrs), **changes}
