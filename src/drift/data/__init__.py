"""Data sets: PDEBench's 3D compressible Navier-Stokes layout, and a solver that writes it."""

from drift.data.navier_stokes import generate
from drift.data.pdebench import (
    FIELDS,
    SPLITS,
    DataError,
    PDEBench3D,
    Stats,
    held_out_trajectories,
    read_layout,
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
    "held_out_trajectories",
    "write_pdebench3d",
]
