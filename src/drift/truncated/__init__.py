"""The Distributed Truncated Spectral Transform (the DRIFT paper's DTST): ``TruncatedFFT``, a resident plan
for the retained Fourier modes of a field sharded over a DeviceMesh, and ``transform_flops``, its cost.

Its helpers are private: ``_transform`` (the plan), ``_stages`` (the bases applied one dim at a time),
``_contraction`` (the order of the dims and its FLOPs) and ``_overlap`` (collectives in pieces, each
overlapping the next piece's transform).
"""

from drift.modes import ModeSpec, PaddingSpec
from drift.truncated._contraction import transform_flops
from drift.truncated._transform import OTHER_DEVICES_WORK_BYTES, WORK_BYTES, TruncatedFFT

__all__ = ["OTHER_DEVICES_WORK_BYTES", "WORK_BYTES", "ModeSpec", "PaddingSpec", "TruncatedFFT", "transform_flops"]
