"""Data sets: PDEBench's 3D compressible Navier-Stokes layout (one file or several), a solver that writes
it, and reading batches ahead of the step that needs them."""

from drift.data.assembly import model_input, model_target
from drift.data.dataset import PDEBench3D
from drift.data.files import PDEBenchFiles, data_paths
from drift.data.navier_stokes import generate
from drift.data.pdebench import (
    FIELDS,
    SPLITS,
    DataError,
    Stats,
    held_out_trajectories,
    read_layout,
    write_pdebench3d,
)
from drift.data.prefetch import Prefetch

__all__ = [
    "FIELDS",
    "SPLITS",
    "DataError",
    "PDEBench3D",
    "PDEBenchFiles",
    "Prefetch",
    "Stats",
    "data_paths",
    "model_input",
    "model_target",
    "generate",
    "read_layout",
    "held_out_trajectories",
    "write_pdebench3d",
]
