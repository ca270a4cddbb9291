"""Distributed full transforms: ``DistributedFFT``, FFT (complex and real) and DCT-II over slab and pencil
meshes, with autograd, strict resident plans and an in-place low-memory mode.

Its helpers are private: ``_transform`` (the plan) and ``_dct`` (local DCT-II by FFT).
"""

from drift.fft._transform import KINDS, STAGING_BYTES, DistributedFFT, pruned_output_placements
from drift.modes import ModeSpec

__all__ = ["KINDS", "STAGING_BYTES", "DistributedFFT", "ModeSpec", "pruned_output_placements"]
