"""Several PDEBench 3D files read as one data set (``PDEBenchFiles``): their trajectories numbered across
them in a recorded order, the split rule applied to each file, and reads straight into a caller's buffer
that fail with one line naming the file, also when the file changes while a run reads it."""

from __future__ import annotations

import bisect
import os
import threading
from collections.abc import Sequence
from pathlib import Path

import h5py
import numpy as np

from drift.data.pdebench import FIELDS, DataError, held_out_trajectories, open_file, read_layout

SUFFIXES = (".hdf5", ".h5")  # the files a folder given as data contributes

Data = str | Path | Sequence[str | Path]


def data_paths(data: Data) -> list[Path]:
    """The files ``data`` names, in order: a file, a folder (its ``*.hdf5`` and ``*.h5`` files sorted by
    name), or a sequence of files and folders. DataError naming a path that is missing, a folder without
    such files, or a file named twice."""
    given = [data] if isinstance(data, str | Path) else list(data)
    if not given:
        raise DataError("no data files given")
    paths: list[Path] = []
    for entry in map(Path, given):
        if entry.is_dir():
            found = sorted(p for p in entry.iterdir() if p.suffix in SUFFIXES and p.is_file())
            if not found:
                raise DataError(f"{entry}: a folder without {' or '.join(f'*{s}' for s in SUFFIXES)} files")
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


class PDEBenchFiles:
    """PDEBench 3D files read as one data set: trajectory ``g`` is the ``g - offsets[i]``-th of file ``i``,
    the files taken in the order given (``data_paths``). Every file must hold ``fields`` with the same
    frames and (x, y, z) grid (DataError naming the first that does not, against the first file).

    Reads go straight into the caller's arrays (``read``). A file is opened on first read, once per
    process (from any thread: h5py serialises its calls); it must stay as it was when this object was made
    (same inode, size and modification time): a read finding it truncated, replaced or rewritten fails
    with a DataError naming it rather than return what the changed file now holds.
    """

    def __init__(self, data: Data, fields: Sequence[str] = FIELDS) -> None:
        self.paths = tuple(data_paths(data))
        self.fields = tuple(fields)
        self.stamps = tuple(_stamp(p) for p in self.paths)
        shapes = [read_layout(p, self.fields) for p in self.paths]
        for path, shape in zip(self.paths[1:], shapes[1:], strict=True):
            for what, got, want in (("grid", shape[2:], shapes[0][2:]), ("frames", shape[1], shapes[0][1])):
                if got != want:
                    raise DataError(
                        f"{path}: {what} {got} differs from {self.paths[0]}'s {want}; the data files must share "
                        "the fields, frames and grid"
                    )
        self.sizes = tuple(s[0] for s in shapes)  # trajectories per file
        self.offsets = tuple(np.cumsum((0, *self.sizes))[:-1].tolist())
        self.frames, self.grid = shapes[0][1], tuple(shapes[0][2:])
        self._handles: dict[int, h5py.File] = {}
        self._lock = threading.Lock()

    @property
    def trajectories(self) -> int:
        """Trajectories over every file."""
        return sum(self.sizes)

    @property
    def shape(self) -> tuple[int, ...]:
        """``(trajectories, frames, x, y, z)`` over every file, as ``read_layout`` gives one file's."""
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
        """Read dataset ``key``'s ``selection`` (time, x, y, z: slices) of ``trajectory`` straight into ``out``
        (C-contiguous, its shape the selection's; HDF5 converts to its dtype). DataError naming the file
        when the read fails or the file changed since this object was made."""
        i, local = self.locate(trajectory)
        path, failed = self.paths[i], None
        if out.size:
            try:
                self._handle(i)[key].read_direct(out, (local, *selection))
            except (OSError, KeyError, ValueError, TypeError) as exc:
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
        if failed is not None:
            raise DataError(f"{path}: cannot read dataset {key!r} ({failed})") from None

    def _handle(self, i: int) -> h5py.File:
        with self._lock:
            if i not in self._handles:
                self._handles[i] = open_file(self.paths[i])
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
        # Open HDF5 handles and the lock do not travel to loader workers: each opens its own.
        return {**self.__dict__, "_handles": {}, "_lock": None}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _lock=threading.Lock())
