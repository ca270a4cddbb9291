"""Distributed neural-operator layers and models."""

from drift.nn.fno import FNO, PointwiseLinear
from drift.nn.spectral import METHODS, SpectralConv, spectral_weight

__all__ = ["FNO", "METHODS", "PointwiseLinear", "SpectralConv", "spectral_weight"]
