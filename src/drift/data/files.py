"""Several data files read as one data set (``DataFiles``; ``PDEBenchFiles`` for PDEBench's 3-D CFD files):
their trajectories numbered across them in a recorded order, each file's format detected (one for all),
the split rule applied to each file, and reads straight into a caller's buffer that fail with one line
naming the file, also when the file changes while a run reads it."""

from __future__ import annotations

import bisect
import dataclasses
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from drift.data.formats import CFD, FileLayout, Format, detect
from drift.data.formats.tensors import SUFFIXES as TENSOR_SUFFIXES
from drift.data.pdebench import FIELDS, DataError, held_out_trajectories

HDF5_SUFFIXES = (".hdf5", ".h5")
SUFFIXES = (*HDF5_SUFFIXES, *TENSOR_SUFFIXES)  # the files a folder given as data contributes

Data = str | Path | Sequence[str | Path]


def data_paths(data: Data, suffixes: Sequence[str] = SUFFIXES) -> list[Path]:
    """The files ``data`` names, in order: a file, a folder (its files with one of ``suffixes``, sorted by
    name), or a sequence of files and folders. DataError naming a path that is missing, a folder without
    such files, or a file named twice."""
    given = [data] if isinstance(data, str | Path) else list(data)
    if not given:
        raise DataError("no data files given")
    paths: list[Path] = []
    for entry in map(Path, given):
        if entry.is_dir():
            found = sorted(p for p in entry.iterdir() if p.suffix in suffixes and p.is_file())
            if not found:
                raise DataError(f"{entry}: a folder without {' or '.join(f'*{s}' for s in suffixes)} files")
            paths += found
        elif entry.exists():
            paths.append(entry)
        else:
            raise DataError(f"{entry}: no such file or folder")
    seen: set[Path] = set()
    for path in paths:
        if path.resolve() in seen:
            raise DataError(f"{path}: named twice in the data files")
        seen.add(path.resolve())
    return paths


def _stamp(path: Path) -> tuple[int, int, int]:
    """What tells a file changed: its inode, size and modification time."""
    s = os.stat(path)
    return s.st_ino, s.st_size, s.st_mtime_ns


class DataFiles:
    """Data files of one format read as one data set: trajectory ``g`` is the ``g - offsets[i]``-th of file
    ``i``, the files taken in the order given (``data_paths``). Each file's format is detected
    (``drift.data.formats.detect``); every file must be of the first's format with its fields, inputs,
    frames and grid (DataError naming the first that is not, what differs, against the first file).
    ``fields`` picks the channels read and their order (default: every field of the layout).

    Reads go straight into the caller's arrays (``read``). A file is opened on first read, once per
    process (from any thread: h5py serialises its calls); it must stay as it was when this object was made
    (same inode, size and modification time): a read finding it truncated, replaced or rewritten fails
    with a DataError naming it rather than return what the changed file now holds.
    """

    suffixes: tuple[str, ...] = SUFFIXES  # what a folder contributes

    def __init__(self, data: Data, fields: Sequence[str] | None = None) -> None:
        self.paths = tuple(data_paths(data, self.suffixes))
        self.stamps = tuple(_stamp(p) for p in self.paths)
        layouts = [self._describe(p) for p in self.paths]
        for path, layout in zip(self.paths[1:], layouts[1:], strict=True):
            _check_alike(path, layout, self.paths[0], layouts[0])
        self.layout: FileLayout = layouts[0]
        self.fields = self._select(fields)
        self.sizes = tuple(layout.trajectories for layout in layouts)  # trajectories per file
        self.offsets = tuple(np.cumsum((0, *self.sizes))[:-1].tolist())
        self.frames, self.grid = self.layout.frames, self.layout.grid
        self._channels = frozenset(self.layout.channels)
        self._handles: dict[int, Any] = {}
        self._lock = threading.Lock()

    def _describe(self, path: Path) -> FileLayout:
        return detect(path).describe(path)

    def _select(self, fields: Sequence[str] | None) -> tuple[str, ...]:
        if fields is None:
            return self.layout.fields
        for name in fields:
            if name not in self.layout.fields:
                raise DataError(
                    f"{self.paths[0]}: no field {name!r} in its {self.layout.format.name} layout "
                    f"(has {', '.join(self.layout.fields)})"
                )
        return tuple(fields)

    @property
    def format(self) -> Format:
        return self.layout.format

    @property
    def inputs(self) -> tuple[str, ...]:
        """A static problem's input channels; the fields read for a time-dependent one."""
        return self.layout.inputs if self.static else self.fields

    @property
    def static(self) -> bool:
        return self.layout.static

    @property
    def lengths(self) -> tuple[float, ...]:
        return self.layout.lengths

    @property
    def periodic(self) -> tuple[bool, ...]:
        return self.layout.periodic

    @property
    def dims(self) -> int:
        return len(self.grid)

    def describe(self) -> str:
        """The line a run prints at its start: the layout, the fields read and the shape over every file,
        e.g. "PDEBench 2-D CFD: density, pressure, Vx, Vy; 1000 x 21 x 128 x 128 (4 files)"."""
        whole = dataclasses.replace(self.layout, fields=self.fields, inputs=self.inputs, trajectories=self.trajectories)
        return whole.text() + (f" ({len(self.paths)} files)" if len(self.paths) > 1 else "")

    @property
    def trajectories(self) -> int:
        """Trajectories over every file."""
        return sum(self.sizes)

    @property
    def shape(self) -> tuple[int, ...]:
        """``(trajectories, frames, *grid)`` over every file."""
        return (self.trajectories, self.frames, *self.grid)

    def locate(self, trajectory: int) -> tuple[int, int]:
        """The file (its index) holding ``trajectory`` and the trajectory's index in it."""
        if not 0 <= trajectory < self.trajectories:
            raise IndexError(f"trajectory {trajectory} of {self.trajectories}")
        i = bisect.bisect_right(self.offsets, trajectory) - 1
        return i, trajectory - self.offsets[i]

    def held_out(self, rule: str = "last", fraction: float = 0.1) -> list[int]:
        """The test trajectories: ``held_out_trajectories``'s rule applied to each file on its own (as
        PDEBench splits each file), numbered across the files."""
        return [
            o + t
            for o, n in zip(self.offsets, self.sizes, strict=True)
            for t in held_out_trajectories(n, rule, fraction)
        ]

    def read(self, key: str, trajectory: int, selection: tuple, out: np.ndarray) -> None:
        """Read channel ``key``'s ``selection`` (frames, then each spatial dim: slices, steps >= 1) of
        ``trajectory`` straight into ``out`` (C-contiguous float32 or float64, its shape the selection's;
        the read converts to its dtype). A static problem's channels have one frame (``slice(0, 1)``).
        DataError naming the file when the read fails or the file changed since this object was made."""
        if key not in self._channels:
            raise DataError(f"{self.paths[0]}: no channel {key!r} (has {', '.join(self.layout.channels)})")
        i, local = self.locate(trajectory)
        path, failed = self.paths[i], None
        if out.size:
            try:
                self.format.read(self._handle(i), key, local, selection, out)
            except (OSError, KeyError, ValueError, TypeError, RuntimeError, IndexError) as exc:
                failed = exc
        try:
            changed = _stamp(path) != self.stamps[i]
        except OSError:
            changed = True
        if changed:  # a read of a changed file may fail, or read zeros past a truncated end
            raise DataError(
                f"{path}: the file changed (truncated, replaced or rewritten) while it was being read; "
                "start the run again on the file as it is now"
            )
        if isinstance(failed, DataError):
            raise failed
        if failed is not None:
            raise DataError(f"{path}: cannot read {key!r} ({failed})") from None

    def _handle(self, i: int) -> Any:
        with self._lock:
            if i not in self._handles:
                self._handles[i] = self.format.open(self.paths[i])
            return self._handles[i]

    def record(self) -> list[dict]:
        """What a run records of the files, in order: each one's path, trajectories, size in bytes and
        modification time (``changed_since`` compares them)."""
        return [
            dict(path=str(p), trajectories=n, bytes=s[1], mtime_ns=s[2])
            for p, n, s in zip(self.paths, self.sizes, self.stamps, strict=True)
        ]

    @staticmethod
    def changed_since(record: Sequence[dict]) -> str | None:
        """How the files ``record`` lists differ from those on disk now (the first difference, naming the
        file), or None when each is there with the recorded size and modification time."""
        for entry in record:
            path = Path(entry["path"])
            try:
                _, size, mtime_ns = _stamp(path)
            except OSError:
                return f"{path} is gone"
            if size != entry["bytes"]:
                return f"{path} holds {size} bytes, the run recorded {entry['bytes']}"
            if mtime_ns != entry["mtime_ns"]:
                return f"{path} was modified since the run recorded it"
        return None

    def __getstate__(self) -> dict:
        # Open handles and the lock do not travel to loader workers: each opens its own.
        return {**self.__dict__, "_handles": {}, "_lock": None}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _lock=threading.Lock())


def _check_alike(path: Path, layout: FileLayout, first: Path, want: FileLayout) -> None:
    """DataError naming ``path`` when its layout differs from the first file's in what a run shares."""
    for what in ("format", "fields", "inputs", "grid", "frames"):
        got, expected = getattr(layout, what), getattr(want, what)
        if what == "format":
            got, expected = got.title(layout.dims), expected.title(want.dims)
        if got != expected:
            raise DataError(
                f"{path}: {what} {got} differs from {first}'s {expected}; the data files must share the format, "
                "fields, frames and grid"
            )


class PDEBenchFiles(DataFiles):
    """PDEBench 3-D CFD files read as one data set (``DataFiles`` of that format only): ``fields`` default to
    the five ``FIELDS``; a file of another layout is refused naming what it lacks."""

    suffixes = HDF5_SUFFIXES

    def __init__(self, data: Data, fields: Sequence[str] = FIELDS) -> None:
        super().__init__(data, fields)

    def _describe(self, path: Path) -> FileLayout:
        return CFD[3].describe(path)
