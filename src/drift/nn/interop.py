"""Spectral weights to and from neuraloperator's ``SpectralConv`` (v2.0 layout): dense, or Tucker / CP factors.

neuraloperator stores a dense weight ``(in, out, *counts)`` over the kept modes in fftshift order:
along every dim but the last, ``counts[i]`` modes with frequencies ``-(counts[i] // 2) .. counts[i] -
counts[i] // 2 - 1`` in ascending order; along the last dim of a real layer, frequencies
``0 .. counts[-1] - 1``; along the last dim of a complex layer, the first ``counts[-1]`` entries of the
fftshifted spectrum (frequencies ``-(N // 2)`` upwards, which drift keeps only when given explicitly).
Its ``n_modes`` argument gives the count per dim, except that the last entry n of a real layer becomes
``n // 2 + 1``. drift's ``modes=k`` keeps the same set as ``n_modes = 2k`` on the leading dims and
``n_modes = 2k - 2`` (or ``2k - 1``) on the last dim of a real transform, ordered ``0 .. k-1, -k .. -1``:
the functions below permute between the two orders. The layers agree whatever their ``fft_norm``: the
forward and inverse scalings multiply to 1/N either way.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from drift.modes import ModeSpec, mode_lists


def neuralop_n_modes(global_shape: Sequence[int], modes: ModeSpec | Sequence[ModeSpec], real: bool = True) -> tuple:
    """The ``n_modes`` argument of a neuraloperator ``SpectralConv`` that keeps drift's ``modes``."""
    counts = [len(m) for m in mode_lists(modes, tuple(global_shape), real)]
    if real:
        counts[-1] = 2 * counts[-1] - 2
    return tuple(counts)


def _positions(global_shape: Sequence[int], modes, real: bool) -> list[torch.Tensor]:
    """Per dim, where each of drift's kept modes sits in neuraloperator's order."""
    shape = tuple(global_shape)
    ours = mode_lists(modes, shape, real)
    positions = []
    for dim, (kept, n) in enumerate(zip(ours, shape, strict=True)):
        count = len(kept)
        if dim < len(shape) - 1:
            theirs = [(j - count // 2) % n for j in range(count)]
        elif real:
            theirs = list(range(count))
        else:  # neuraloperator v2.0 slices the first entries of the fftshifted last dim
            theirs = [(j - n // 2) % n for j in range(count)]
        if sorted(theirs) != sorted(kept):
            raise ValueError(
                f"dim {dim}: drift keeps frequencies {sorted(kept)}, which no neuraloperator layer keeps "
                f"(with {count} modes it keeps {sorted(theirs)})"
            )
        positions.append(torch.tensor([theirs.index(f) for f in kept]))
    return positions


def from_neuralop_weight(
    weight: torch.Tensor, global_shape: Sequence[int], modes: ModeSpec | Sequence[ModeSpec], real: bool = True
) -> torch.Tensor:
    """A neuraloperator dense spectral weight ``(in, out, *counts)`` as drift's global weight
    ``(in, out, K1, ..., Kd)`` for ``modes`` (load it with ``layer.load_state_dict({"weight": w})``)."""
    out = weight
    for dim, pos in enumerate(_positions(global_shape, modes, real)):
        if out.shape[2 + dim] != len(pos):
            raise ValueError(f"weight has {out.shape[2 + dim]} modes on dim {dim}, drift's modes keep {len(pos)}")
        out = out.index_select(2 + dim, pos.to(out.device))
    return out


def to_neuralop_weight(
    weight: torch.Tensor, global_shape: Sequence[int], modes: ModeSpec | Sequence[ModeSpec], real: bool = True
) -> torch.Tensor:
    """drift's global weight ``(in, out, K1, ..., Kd)`` in neuraloperator's dense layout."""
    out = weight
    for dim, pos in enumerate(_positions(global_shape, modes, real)):
        if out.shape[2 + dim] != len(pos):
            raise ValueError(f"weight has {out.shape[2 + dim]} modes on dim {dim}, drift's modes keep {len(pos)}")
        out = out.index_select(2 + dim, torch.argsort(pos).to(out.device))
    return out


def _factor_positions(global_shape, modes, real: bool, count: int) -> list[torch.Tensor | None]:
    """Per factor of a weight ``(in, out, *modes)``: where drift's mode rows sit in neuraloperator's order
    (None for the channel factors)."""
    positions = _positions(global_shape, modes, real)
    if count != 2 + len(positions):
        raise ValueError(f"weight has {count} factors, drift's modes need {2 + len(positions)}")
    return [None, None, *positions]


def from_neuralop_factors(
    weight, global_shape: Sequence[int], modes: ModeSpec | Sequence[ModeSpec], real: bool = True
) -> dict:
    """A neuraloperator factorized spectral weight (tensorly-torch's ``TuckerTensor`` or ``CPTensor`` of
    shape ``(in, out, *counts)``) as the state dict of drift's ``FactorizedWeight`` for ``modes`` (load
    it with ``layer.weight.load_state_dict(...)``): the same core or weights, the rows of each mode
    factor in drift's order."""
    lead = "core" if hasattr(weight, "core") else "weights"
    state = {lead: getattr(weight, lead).detach()}
    factors = [f.detach() for f in weight.factors]
    positions = _factor_positions(global_shape, modes, real, len(factors))
    for j, (factor, pos) in enumerate(zip(factors, positions, strict=True)):
        if pos is not None:
            if factor.shape[0] != len(pos):
                raise ValueError(f"weight has {factor.shape[0]} modes on dim {j - 2}, drift's modes keep {len(pos)}")
            factor = factor.index_select(0, pos.to(factor.device))
        state[f"factors.{j}"] = factor
    return state


def to_neuralop_factors(
    state: dict, global_shape: Sequence[int], modes: ModeSpec | Sequence[ModeSpec], real: bool = True
) -> dict:
    """The inverse of ``from_neuralop_factors``: a ``FactorizedWeight`` state dict as the state dict of
    neuraloperator's factorized weight (``core`` or ``weights``, ``factors.factor_j``), the rows of each
    mode factor in neuraloperator's order."""
    lead = "core" if "core" in state else "weights"
    out = {lead: state[lead]}
    count = len(state) - 1
    for j, pos in enumerate(_factor_positions(global_shape, modes, real, count)):
        factor = state[f"factors.{j}"]
        if pos is not None:
            factor = factor.index_select(0, torch.argsort(pos).to(factor.device))
        out[f"factors.factor_{j}"] = factor
    return out
