"""Data sets: the data files of every layout drift reads (one file or several), the items a recipe reads
from them (``Trajectories``), a solver of PDEBench's 3D compressible Navier-Stokes that writes its layout,
and reading batches ahead of the step that needs them."""

from drift._moved import moved_names
from drift.data.assembly import model_input, model_target
from drift.data.dataset import Trajectories
from drift.data.files import DataFiles, PDEBenchFiles, data_paths
from drift.data.formats import FORMATS, FileLayout, Format, detect
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
from drift.data.synthetic import LAYOUTS, write_synthetic

__all__ = [
    "FIELDS",
    "FORMATS",
    "LAYOUTS",
    "SPLITS",
    "DataError",
    "DataFiles",
    "FileLayout",
    "Format",
    "PDEBenchFiles",
    "Prefetch",
    "Stats",
    "Trajectories",
    "data_paths",
    "detect",
    "model_input",
    "model_target",
    "generate",
    "read_layout",
    "held_out_trajectories",
    "write_pdebench3d",
    "write_synthetic",
]

# Renamed after 0.2.0: the data set reads every layout and dim count, not only PDEBench's 3D one.
__getattr__ = moved_names(__name__, {}, renamed={"PDEBench3D": "drift.data.dataset.Trajectories"}, removed_in="0.4.0")
