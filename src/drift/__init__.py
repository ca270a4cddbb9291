"""drift: distributed spectral operators for Fourier-domain neural networks."""

from importlib import metadata as _metadata

from drift import _moved, memory, optim
from drift.comm import Collective, CommLog, comm_log
from drift.errors import PlanError
from drift.fft import DistributedFFT
from drift.layout import Layout, grid_mesh, reduction_mesh
from drift.profiling import profile
from drift.truncated import TruncatedFFT

_moved.install()

try:  # the installed distribution's version: pyproject.toml is its one source
    __version__ = _metadata.version("drift-spectral")
except _metadata.PackageNotFoundError:  # a source tree on sys.path, not installed
    __version__ = "0+unknown"


def __getattr__(name: str):
    # drift.load_exported (drift.export.load_exported), imported on first use: it brings drift.train.
    if name == "load_exported":
        from drift.export import load_exported

        return load_exported
    raise AttributeError(f"module 'drift' has no attribute {name!r}")


# In the API reference's order: the transforms, where fields live, then tools.
__all__ = [
    "TruncatedFFT",
    "DistributedFFT",
    "Layout",
    "grid_mesh",
    "reduction_mesh",
    "PlanError",
    "load_exported",
    "profile",
    "comm_log",
    "CommLog",
    "Collective",
    "memory",
    "optim",
]
