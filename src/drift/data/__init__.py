"""Data sets: PDEBench's 3D compressible Navier-Stokes layout."""

from drift.data.pdebench import FIELDS, DataError, PDEBench3D, Stats, write_pdebench3d

__all__ = ["FIELDS", "DataError", "PDEBench3D", "Stats", "write_pdebench3d"]
