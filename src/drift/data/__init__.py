"""Data sets: PDEBench's 3D compressible Navier-Stokes layout, and a solver that writes it."""

from drift.data.navier_stokes import generate
from drift.data.pdebench import FIELDS, DataError, PDEBench3D, Stats, read_layout, write_pdebench3d

__all__ = ["FIELDS", "DataError", "PDEBench3D", "Stats", "generate", "read_layout", "write_pdebench3d"]
