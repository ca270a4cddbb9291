"""Weights to and from neuraloperator's SpectralConv, against neuraloperator itself."""

import pytest
import torch
from reference import rel_err, truncated_spectrum, zero_filled_inverse

from drift.nn import SpectralConv, from_neuralop_weight, neuralop_n_modes, to_neuralop_weight

# A complex neuraloperator layer keeps the first entries of the fftshifted last dim: -5, -4, -3 of 10.
CASES = [((16, 12, 10), (3, 2, 4), True), ((12, 10), (2, [-5, -4, -3]), False), ((16, 12, 10, 8), (2, 2, 3, 3), True)]


@pytest.mark.parametrize(("shape", "modes", "real"), CASES)
def test_weight_roundtrip_and_kept_set(shape, modes, real):
    counts = neuralop_n_modes(shape, modes, real)
    stored = list(counts)
    if real:
        stored[-1] = stored[-1] // 2 + 1  # what neuraloperator keeps of its last n_modes entry
    theirs = torch.randn(2, 3, *stored, dtype=torch.complex128)
    ours = from_neuralop_weight(theirs, shape, modes, real)
    assert torch.equal(to_neuralop_weight(ours, shape, modes, real), theirs)  # exact: values moved, not computed
    if real:  # mode (0, ..., 0) sits at the centre of neuraloperator's leading dims and first in drift's
        centre = tuple(c // 2 for c in stored[:-1]) + (0,)
        zero = (slice(None), slice(None), *([0] * len(shape)))
        assert torch.equal(ours[zero], theirs[(slice(None), slice(None), *centre)])


def test_sets_neuraloperator_cannot_keep_are_rejected():
    with pytest.raises(ValueError, match="which no neuraloperator layer keeps"):
        from_neuralop_weight(torch.zeros(1, 1, 3, 2), (8, 6), ([0, 1, 2], 2))


# Real layers only: neuraloperator 2.0's complex layer un-shifts only the leading dims of its output
# spectrum, so its output carries a (-1)^n factor along the last dim and is no spectral convolution.
@pytest.mark.parametrize(("shape", "modes", "real"), [CASES[0], ((12, 9), (3, 4), True)])
def test_matches_neuraloperator_spectral_conv(shape, modes, real):
    neuralop = pytest.importorskip("neuralop.layers.spectral_convolution", reason="neuraloperator is not installed")
    torch.manual_seed(0)
    theirs = neuralop.SpectralConv(
        3, 2, n_modes=neuralop_n_modes(shape, modes, real), complex_data=not real, bias=False
    )
    dense = theirs.weight.to_tensor() if hasattr(theirs.weight, "to_tensor") else theirs.weight
    ours = SpectralConv(3, 2, modes, real=real)
    w = from_neuralop_weight(dense.detach(), shape, modes, real)
    ours.load_state_dict({"weight": w})
    x = torch.randn(2, 3, *shape, dtype=torch.float32 if real else torch.complex64)
    with torch.no_grad():
        y_theirs, y_ours = theirs(x), ours(x)
    wide = x.to(torch.complex128 if not real else torch.float64)
    spec = truncated_spectrum(wide, ours.modes_at(shape), real, "backward")
    mixed = torch.einsum("bi...,io...->bo...", spec, w.to(torch.complex128))
    reference = zero_filled_inverse(mixed, ours.modes_at(shape), shape, real, "backward")
    assert rel_err(y_ours, reference) <= 2e-6
    assert rel_err(y_theirs, reference) <= 2e-6
