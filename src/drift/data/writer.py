"""One HDF5 file written by every rank of a job, each rank its own hyperslabs, without parallel HDF5.

h5py as drift installs it is built without MPI (``h5py.get_config().mpi`` is False), so no two processes
may have the file open for writing at once. ``TurnWriter`` therefore: rank 0 creates the file under a
temporary name next to the output (``<name>.<host>-<pid>.partial``) with every dataset and the small
arrays and attributes, and closes it; then for each ``write`` the ranks take turns in rank order (a
barrier between turns), each opening the file, writing its hyperslabs and closing it, so every open sees
the previous writer's closed file; ``commit`` has rank 0 fsync the file and rename it to its name.

The datasets are contiguous, as PDEBench's (readers map them straight), with their storage allocated at
creation and never filled: the file has its full size and every address from the start (sparse until
written), so a rank's turn writes raw data and no metadata. The turns write with HDF5's sieve buffer off,
so a write that fails (a full disk) fails in that call, not in a later flush. A half-written output therefore never
has the output's name; any failure (a full disk, a permission, an I/O error) on any rank is agreed on
by every rank, the temporary file is removed, and every rank raises one ``OutputError`` naming the file
and the errno. Writes are serialised (one rank at a time); the ranks' other work is not.

The file must be on a filesystem every rank sees (one folder shared by the hosts); ``create`` checks that.
"""

from __future__ import annotations

import errno
import os
import re
import socket
from collections.abc import Callable, Sequence
from pathlib import Path

import h5py
import numpy as np

from drift import comm


class OutputError(RuntimeError):
    """Writing an output file failed, or it may not be written; the message names the file."""


def write_failure(exc: BaseException) -> str:
    """A write failure in a few words: the errno's name and text when there is one (HDF5 puts it in its
    message as ``errno = N``), else the error's type and first line."""
    number = exc.errno if isinstance(exc, OSError) and exc.errno else None
    if number is None and (found := re.search(r"errno = (\d+)", str(exc))):
        number = int(found.group(1))
    if number:
        return f"{errno.errorcode.get(number, 'errno')} ({os.strerror(number)})"
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0][:300] if lines else ''}"


def attempt(fn: Callable[[], None]) -> str | None:
    """Call ``fn()``: None, or what it raised, in a few words."""
    try:
        fn()
    except Exception as exc:
        return write_failure(exc)
    return None


def agreed(failure: str | None) -> tuple[int, str] | None:
    """The lowest rank that failed and its failure, the same on every rank (None when no rank did)."""
    return next(((r, f) for r, f in enumerate(comm.all_gather_object(failure)) if f is not None), None)


def opened(path: Path, create: bool = False, userblock: int = 0) -> h5py.File:
    """``path`` opened for writing (``create``: a new file, which must not exist, with a user block of
    ``userblock`` bytes, 0 or a power of two >= 512, before HDF5's superblock) with HDF5's sieve buffer off,
    so that a raw-data write that fails raises in that call."""
    access = h5py.h5p.create(h5py.h5p.FILE_ACCESS)
    access.set_sieve_buf_size(0)
    access.set_fclose_degree(h5py.h5f.CLOSE_STRONG)
    name = os.fsencode(path)
    if create:
        creation = h5py.h5p.create(h5py.h5p.FILE_CREATE)
        creation.set_userblock(userblock)
        return h5py.File(h5py.h5f.create(name, h5py.h5f.ACC_EXCL, fcpl=creation, fapl=access))
    return h5py.File(h5py.h5f.open(name, h5py.h5f.ACC_RDWR, fapl=access))


class TurnWriter:
    """An HDF5 file at ``path`` being written by every rank of the default group (see the module's notes);
    ``temp`` is where it is until ``commit``. Use as a context manager: leaving the block by an exception
    removes the temporary file."""

    def __init__(self, path: Path, temp: Path, replace: bool) -> None:
        self.path, self.temp, self.replace = path, temp, replace

    @classmethod
    def create(
        cls,
        path: str | Path,
        datasets: dict[str, tuple[Sequence[int], np.dtype]],
        arrays: dict[str, np.ndarray],
        attrs: dict,
        *,
        replace: bool = False,
        userblock: bytes = b"",
    ) -> TurnWriter:
        """Every rank: rank 0 creates the temporary file (and ``path``'s folder) with ``datasets`` (name ->
        (shape, dtype), unwritten), ``arrays`` (name -> values) and the root's ``attrs``; ``replace``: the
        ``commit`` may replace an existing ``path``; ``userblock``: bytes the file starts with, in an HDF5
        user block (512 bytes, or the power of two that holds them; zeros after them) that HDF5 readers
        skip, as MATLAB's v7.3 header (``drift.data.mat``). OutputError on every rank when it fails or some
        rank does not see the file."""
        path = Path(path)
        name = comm.broadcast_object(f"{path.name}.{socket.gethostname()}-{os.getpid()}.partial")
        writer = cls(path, path.with_name(name), replace)

        def make() -> None:
            path.parent.mkdir(parents=True, exist_ok=True)
            dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
            dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)
            dcpl.set_fill_time(h5py.h5d.FILL_TIME_NEVER)
            size = max(512, 1 << (len(userblock) - 1).bit_length()) if userblock else 0
            with opened(writer.temp, create=True, userblock=size) as f:
                f.attrs.update(attrs)
                for key, values in arrays.items():  # first: the small arrays and the metadata at the front
                    f.create_dataset(key, data=values)
                f.flush()
                for key, (shape, dtype) in datasets.items():
                    f.create_dataset(key, shape=tuple(shape), dtype=dtype, dcpl=dcpl)
            if userblock:  # HDF5 leaves the user block to the application: written once the file is closed
                with open(writer.temp, "r+b") as raw:
                    raw.write(userblock)

        made = agreed(attempt(make) if comm.rank() == 0 else None)
        writer.check(made)
        unseen = agreed(None if writer.temp.is_file() else f"does not see {writer.temp}")
        if unseen is not None:
            writer.abort()
            raise OutputError(
                f"cannot write {path}: rank {unseen[0]} {unseen[1]}, which rank 0 created: the ranks must share "
                "the output's folder"
            )
        return writer

    def write(self, blocks: Sequence[tuple[str, tuple, np.ndarray]]) -> None:
        """Every rank: write this rank's ``blocks`` (dataset name, selection, values; none is fine) in its
        turn. OutputError on every rank (the temporary file removed) when a write fails on any rank."""

        def put() -> None:
            with opened(self.temp) as f:
                for key, selection, values in blocks:
                    f[key][selection] = values
                f.flush()

        failure = None
        for turn in range(comm.world_size()):
            if turn == comm.rank() and blocks:
                failure = attempt(put)
            if turn < comm.world_size() - 1:
                comm.barrier()
        self.check(agreed(failure))

    def commit(self) -> None:
        """Every rank, after the last ``write``: rank 0 puts the file on disk (fsync) and renames it to its
        name. OutputError on every rank when that fails, or when ``path`` appeared meanwhile without
        ``replace``."""

        def publish() -> None:
            if not self.replace and self.path.exists():
                raise FileExistsError(errno.EEXIST, f"{self.path} appeared while it was written")
            with open(self.temp, "rb+") as f:
                os.fsync(f.fileno())
            os.replace(self.temp, self.path)

        self.check(agreed(attempt(publish) if comm.rank() == 0 else None))

    def check(self, failure: tuple[int, str] | None) -> None:
        if failure is not None:
            self.abort()
            rank, why = failure
            where = f" on rank {rank}" if comm.world_size() > 1 else ""
            raise OutputError(f"cannot write {self.path}: {why}{where}; the partial file is removed")

    def abort(self) -> None:
        """Rank 0: remove the temporary file (if it is there)."""
        if comm.rank() == 0:
            self.temp.unlink(missing_ok=True)

    def __enter__(self) -> TurnWriter:
        return self

    def __exit__(self, kind: type | None, *_) -> None:
        if kind is not None:
            self.abort()
