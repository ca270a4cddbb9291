"""Li et al.'s released ``.mat`` files (the FNO paper's data: ``u`` N x X x Y x T, ``a`` N x X x Y).

MATLAB v7.3 files are HDF5 (after a 512-byte header h5py skips). MATLAB stores arrays column-major and
HDF5 row-major, so h5py sees every array with its dims reversed: ``u`` as T x Y x X x N. ``MatFile``
reverses them back, as FNO's own ``MatReader`` does (``np.transpose`` over all axes), so its indices are
MATLAB's and the files' users': ``u[n, i, j, t]`` is MATLAB's ``u(n+1, i+1, j+1, t+1)``. A trajectory is read
by one hyperslab of the stored array (a slice of its last, slowest dim), never the whole file. Older
files (MATLAB v5, ``scipy.io.savemat``'s) are read whole by scipy, already in MATLAB's order.

Writing a v7.3 file (``drift.data.formats.mat``, ``drift.data.synthetic``): an HDF5 file with a
``USERBLOCK``-byte user block that starts with ``header()``, each array stored with its dims reversed and
the attribute ``MATLAB_class`` (``CLASSES``), which MATLAB's ``load`` needs to know the array's type.
"""

from __future__ import annotations

import platform
import time
from pathlib import Path

import h5py
import numpy as np
import scipy.io

from drift.data.pdebench import DataError

USERBLOCK = 512  # bytes before the HDF5 superblock in MATLAB's v7.3 files
CLASSES = {np.dtype(np.float32): np.bytes_(b"single"), np.dtype(np.float64): np.bytes_(b"double")}  # MATLAB_class


def header() -> bytes:
    """The 128 bytes MATLAB writes at the start of a v7.3 file (the MAT-file header, as in v5 files): 116
    bytes of text padded with spaces, 8 bytes of subsystem data offset (zeros: none), the version 0x0200
    and the endian indicator "MI", both written as little-endian 16-bit values (bytes 00 02 and "IM")."""
    created = time.strftime("%a %b %d %H:%M:%S %Y")
    text = f"MATLAB 7.3 MAT-file, Platform: {platform.system()}-drift, Created on: {created} HDF5 schema 1.00 ."
    return text.encode("ascii", "replace")[:116].ljust(116, b" ") + bytes(8) + b"\x00\x02IM"


class MatFile:
    """A ``.mat`` file open for reading (a context manager). ``shape(key)`` and ``read(key, first, stop)``
    speak MATLAB's dim order."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise DataError(f"{self.path}: no such file")
        if h5py.is_hdf5(self.path):
            self._h5: h5py.File | None = h5py.File(self.path, "r")
            self._v5: dict | None = None
        else:
            self._h5 = None
            try:
                self._v5 = scipy.io.loadmat(self.path)
            except (ValueError, OSError, scipy.io.matlab.MatReadError) as exc:  # MatReadError: a short file
                raise DataError(f"{self.path}: neither HDF5 (MATLAB v7.3) nor a MATLAB v5 file: {exc}") from exc

    def keys(self) -> list[str]:
        """The arrays it holds (without MATLAB's ``#refs#`` and scipy's ``__header__``...)."""
        names = self._h5.keys() if self._h5 is not None else self._v5.keys()
        return sorted(k for k in names if not k.startswith(("#", "__")))

    def _array(self, key: str):
        source = self._h5 if self._h5 is not None else self._v5
        if key not in self.keys() or not hasattr(source[key], "shape"):
            raise DataError(f"{self.path}: no array {key!r} (holds {self.keys()})")
        return source[key]

    def shape(self, key: str) -> tuple[int, ...]:
        """``key``'s shape in MATLAB's order (``u``: N x X x Y x T)."""
        shape = tuple(self._array(key).shape)
        return shape[::-1] if self._h5 is not None else shape

    def dtype(self, key: str) -> np.dtype:
        """``key``'s stored dtype."""
        return np.dtype(self._array(key).dtype)

    def select(self, key: str, index: tuple[int | slice, ...]) -> np.ndarray:
        """``key[index]``, ``index`` one int or slice (steps >= 1) per dim in MATLAB's order, the result in
        MATLAB's order too; from a v7.3 file only that hyperslab is read (the index reversed, as stored)."""
        array = self._array(key)
        if self._h5 is None:
            return np.asarray(array[index])
        return array[index[::-1]].transpose()

    def read(self, key: str, first: int = 0, stop: int | None = None) -> np.ndarray:
        """Entries ``first:stop`` of ``key``'s first (MATLAB) dim, in MATLAB's order (``u``: n x X x Y x T)."""
        array = self._array(key)
        if self._h5 is None:
            return np.asarray(array[first:stop])
        return np.ascontiguousarray(array[..., first:stop].transpose())

    def frames(self, first: int = 0, stop: int | None = None) -> np.ndarray:
        """Trajectories ``first:stop`` of ``u`` in drift's order, frames first: n x T x X x Y."""
        return np.ascontiguousarray(np.moveaxis(self.read("u", first, stop), -1, 1))

    def close(self) -> None:
        if self._h5 is not None:
            self._h5.close()

    def __enter__(self) -> MatFile:
        return self

    def __exit__(self, *_) -> None:
        self.close()
