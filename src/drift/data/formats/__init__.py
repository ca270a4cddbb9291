"""The data layouts drift reads, one ``Format`` object each, and ``detect``, which picks a file's.

Every format describes a file as a ``FileLayout`` (its channels, trajectories, frames, grid) and reads one
channel's block of one trajectory straight into a caller's buffer; ``drift.data.DataFiles`` reads several
files of one format as one data set through them.
"""

from __future__ import annotations

from pathlib import Path

import h5py

from drift.data.formats.base import FileLayout, Format
from drift.data.formats.mat import LiMat
from drift.data.formats.pdebench import PDEBenchCFD, PDEBenchDarcy, PDEBenchGroups, PDEBenchScalar
from drift.data.formats.tensors import TensorDictionary
from drift.data.formats.well import TheWell
from drift.data.pdebench import DataError, open_file

CFD = {dims: PDEBenchCFD(dims) for dims in (1, 2, 3)}
FORMATS: tuple[Format, ...] = (
    LiMat(),  # first: its suffix decides, and a v7.3 .mat is HDF5 whose keys another layout might claim
    *CFD.values(),
    PDEBenchDarcy(),  # before scalar: a Darcy file holds a ``tensor`` too
    PDEBenchScalar(),
    PDEBenchGroups(),
    TheWell(),
    TensorDictionary(),
)
SHOWN = 8  # top-level keys a DataError lists


def detect(path: str | Path) -> Format:
    """The format ``path`` is of: the first in ``FORMATS`` that matches it. DataError naming the path, what
    it holds and the layouts drift reads when none does."""
    path = Path(path)
    for form in FORMATS:
        if form.matches(path):
            return form
    return _refuse(path)


def _refuse(path: Path) -> Format:
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    with open_file(path) as f:  # DataError for a file that is no HDF5 (nor a .pt the suffix would tell)
        held = [_entry(f, key) for key in sorted(f.keys())[:SHOWN]]
        more = len(f.keys()) - SHOWN
    holds = ", ".join(held) + (f" and {more} more" if more > 0 else "") if held else "nothing"
    names = "; ".join(form.name for form in FORMATS)
    raise DataError(f"{path}: holds {holds}; drift reads {names}")


def _entry(f: h5py.File, key: str) -> str:
    item = f[key]
    return f"{key} {item.shape}" if isinstance(item, h5py.Dataset) else f"{key}/ (group)"


__all__ = [
    "CFD",
    "FORMATS",
    "FileLayout",
    "Format",
    "LiMat",
    "PDEBenchCFD",
    "PDEBenchDarcy",
    "PDEBenchGroups",
    "PDEBenchScalar",
    "TensorDictionary",
    "TheWell",
    "detect",
]
