"""Li et al.'s ``.mat`` files (``LiMat``), the FNO paper's released data (``NavierStokes_V1e-3_N5000_T50.mat``
and the like): ``u`` N x X x T (1-D) or N x X x Y x T (2-D), the solution at the times ``t`` (1 x T, where
the file has it), in MATLAB's dim order (``drift.data.mat``: v7.3 files are HDF5 with the dims reversed,
v5 files are read by scipy).

drift reads ``u`` only, as one channel "u" of T frames: Li's protocol feeds the model the first 10 frames of
``u`` and has it predict the rest (``--t-in 10 --t-out 40`` on the T = 50 file). The initial field ``a`` (the
vorticity at t = 0, before ``u``'s first frame) is not read. The domain is the unit square (Li's), periodic.

A prediction's output (``output``) is a MATLAB v7.3 file whatever the source's version: ``u`` (count x X x Y
x frames in MATLAB's order, stored reversed, the source's dtype) with ``MATLAB_class``, and ``t``, the
source's first ``frames`` times continued at their last spacing, where the source has it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from drift.data.formats.base import FileLayout, Format, check_float
from drift.data.formats.output import Block, Output, Prediction, Write
from drift.data.mat import CLASSES, MatFile, header
from drift.data.pdebench import DataError

FIELD = "u"  # the one channel, and the array it is read from
TIMES = "t"
SUFFIX = ".mat"


@dataclass(frozen=True)
class LiMat(Format):
    """Li et al.'s FNO ``.mat`` files: ``u`` N x X [x Y] x T, one channel "u" (see the module's notes).
    Every ``.mat`` file is taken for one (the suffix is the layout's mark, as ``.pt`` is a tensor
    dictionary's), so that one that is not gets ``describe``'s error naming what it holds."""

    name = "Li et al. .mat (FNO)"

    def matches(self, path: Path) -> bool:
        return Path(path).suffix == SUFFIX

    def describe(self, path: Path) -> FileLayout:
        with MatFile(path) as mat:
            shape = mat.shape(FIELD)  # DataError naming what the file holds when it has no u
            if len(shape) not in (3, 4):  # N, the grid (1-D or 2-D), T
                raise DataError(
                    f"{path}: array {FIELD!r} is {' x '.join(map(str, shape))} (MATLAB's order); drift reads u as "
                    "N x X x T (1-D) or N x X x Y x T (2-D)"
                )
            dtype = mat.dtype(FIELD)
            check_float(path, FIELD, dtype)
        grid = shape[1:-1]  # Li's domain: the unit interval or square
        return FileLayout(self, (FIELD,), (FIELD,), False, shape[0], shape[-1], grid, (1.0,) * len(grid), dtype)

    def open(self, path: Path) -> MatFile:
        return MatFile(path)

    def read(self, handle: MatFile, channel: str, trajectory: int, selection: tuple, out: np.ndarray) -> None:
        if channel != FIELD:
            raise KeyError(channel)
        frames, *space = selection
        # MATLAB's order puts the frames last: u(n, x, y, t); a v7.3 file reads just this hyperslab.
        out[...] = np.moveaxis(handle.select(FIELD, (trajectory, *space, frames)), -1, 0)

    def output(self, prediction: Prediction) -> Output:
        p, dims = prediction, len(prediction.grid)
        with MatFile(p.source) as mat:
            dtype = mat.dtype(FIELD).newbyteorder("=")
            names = mat.keys()
            times = mat.read(TIMES) if TIMES in names else None
        # MATLAB's count x X [x Y] x frames, stored reversed as HDF5 sees a MATLAB array.
        datasets = {FIELD: ((p.frames, *p.grid[::-1], p.count), dtype)}
        attrs = {FIELD: {"MATLAB_class": CLASSES[dtype]}}
        arrays = {}
        # Li's t is a 1 x T row of doubles; another t (a matrix, text) is the source's own business: not kept.
        if times is not None and times.ndim == 2 and 1 in times.shape and times.dtype.newbyteorder("=") in CLASSES:
            values = p.times(times.ravel().astype(times.dtype.newbyteorder("=")), p.frames, repr(TIMES))
            row = (1, -1) if times.shape[0] == 1 else (-1, 1)  # the source's orientation, in MATLAB's order
            arrays[TIMES] = values.reshape(row).transpose()
            attrs[TIMES] = {"MATLAB_class": CLASSES[values.dtype]}
        reverse = (0, *range(dims, 0, -1))  # frames first, then the grid's dims reversed

        def place(block: Block) -> list[Write]:
            selection = (block.frames, *block.space[::-1], block.trajectory)
            return [(FIELD, selection, block.values.transpose(reverse))]

        return Output(datasets, place, arrays, attrs, userblock=header())
