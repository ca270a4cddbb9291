"""Neural-operator layers and models: single-device modules that ``parallelize`` makes distributed."""

from drift.nn.factorized import FACTORIZATIONS, FactorizedWeight
from drift.nn.fno import FNO, PointwiseLinear, fno_block
from drift.nn.interop import from_neuralop_factors, from_neuralop_weight, neuralop_n_modes, to_neuralop_weight
from drift.nn.parallel import parallelize
from drift.nn.spectral import METHODS, SpectralConv, spectral_weight

__all__ = [
    "FACTORIZATIONS",
    "FNO",
    "FactorizedWeight",
    "METHODS",
    "PointwiseLinear",
    "SpectralConv",
    "fno_block",
    "from_neuralop_factors",
    "from_neuralop_weight",
    "neuralop_n_modes",
    "parallelize",
    "spectral_weight",
    "to_neuralop_weight",
]
