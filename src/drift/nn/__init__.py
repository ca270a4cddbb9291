"""Neural-operator layers and models: single-device modules that ``parallelize`` makes distributed."""

from drift.nn.factorized import FACTORIZATIONS, FactorizedWeight
from drift.nn.fno import FNO, NEURALOP_DEFAULTS, fno_block
from drift.nn.interop import (
    from_neuralop_factors,
    from_neuralop_weight,
    neuralop_n_modes,
    to_neuralop_factors,
    to_neuralop_weight,
)
from drift.nn.neuralop import from_neuralop, to_neuralop
from drift.nn.norm import GlobalNorm
from drift.nn.parallel import clip_grad_norm_, parallelize
from drift.nn.pointwise import ChannelMLP, PointwiseLinear, SoftGating, skip_connection
from drift.nn.replicated import Replicated
from drift.nn.spectral import METHODS, SpectralConv, spectral_weight

__all__ = [
    "FACTORIZATIONS",
    "FNO",
    "FactorizedWeight",
    "METHODS",
    "NEURALOP_DEFAULTS",
    "ChannelMLP",
    "GlobalNorm",
    "PointwiseLinear",
    "Replicated",
    "SoftGating",
    "SpectralConv",
    "clip_grad_norm_",
    "fno_block",
    "from_neuralop",
    "from_neuralop_factors",
    "from_neuralop_weight",
    "neuralop_n_modes",
    "parallelize",
    "skip_connection",
    "spectral_weight",
    "to_neuralop",
    "to_neuralop_factors",
    "to_neuralop_weight",
]
