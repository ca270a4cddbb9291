"""Neural-operator layers and models: single-device modules that ``parallelize`` makes distributed."""

from drift.cost import Machine
from drift.nn.block import FNOBlock
from drift.nn.executor import fno_block
from drift.nn.factorized import FACTORIZATIONS, FactorizedWeight, cp_rank, tucker_rank
from drift.nn.fno import ACTIVATION_DTYPES, FNO, NEURALOP_DEFAULTS, set_recompute
from drift.nn.interop import (
    from_neuralop_factors,
    from_neuralop_weight,
    neuralop_n_modes,
    to_neuralop_factors,
    to_neuralop_weight,
)
from drift.nn.methods import method_named
from drift.nn.neuralop import from_neuralop, to_neuralop
from drift.nn.norm import GlobalNorm
from drift.nn.parallel import clip_grad_norm_, parallelize
from drift.nn.pointwise import ChannelMLP, PointwiseLinear, SoftGating, skip_connection
from drift.nn.replicated import Replicated
from drift.nn.spectral import AUTO, METHODS, SpectralConv, mode_counts, resolve_methods, spectral_weight

# In the API reference's order: parallelize and the models first, then their parts.
__all__ = [
    "ACTIVATION_DTYPES",
    "parallelize",
    "FNO",
    "FNOBlock",
    "set_recompute",
    "SpectralConv",
    "NEURALOP_DEFAULTS",
    "METHODS",
    "AUTO",
    "resolve_methods",
    "method_named",
    "from_neuralop",
    "to_neuralop",
    "clip_grad_norm_",
    "FACTORIZATIONS",
    "FactorizedWeight",
    "ChannelMLP",
    "GlobalNorm",
    "Machine",
    "PointwiseLinear",
    "Replicated",
    "SoftGating",
    "cp_rank",
    "fno_block",
    "from_neuralop_factors",
    "from_neuralop_weight",
    "mode_counts",
    "neuralop_n_modes",
    "skip_connection",
    "spectral_weight",
    "to_neuralop_factors",
    "to_neuralop_weight",
    "tucker_rank",
]
