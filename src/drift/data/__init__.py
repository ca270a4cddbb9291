"""Data sets: PDEBench's 3D compressible Navier-Stokes layout, and a solver that writes it."""

from drift.data.navier_stokes import generate
from drift.data.pdebench import (
    FIELDS,
    SPLITS,
    DataError,
    PDEBench3D,
    Stats,
    read_layout,
    test_trajectories,
    write_pdebench3d,
)

__all__ = [
    "FIELDS",
    "SPLITS",
    "DataError",
    "PDEBench3D",
    "Stats",
    "generate",
    "read_layout",
    "test_trajectories",
    "write_pdebench3d",
]
