"""The local DCT-II and its inverse against scipy.fft: values, roundtrip, dtypes, arguments, gradients."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.fft
import torch

from drift.fft._dct import dct2, idct2

# Lengths 1, 2, even, odd and prime along every dim, 1-D to 4-D, plus longer even and prime lengths.
SHAPES = [(7,), (1,), (2,), (8,), (13, 6), (3, 16, 5), (4, 11, 9, 2), (2, 97), (1024,)]
CASES = [(shape, dim) for shape in SHAPES for dim in range(-len(shape), len(shape))]
TOL = {torch.float64: 1e-12, torch.float32: 2e-6}
DTYPES = list(TOL)
NORMS = ["backward", "ortho"]


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    """Relative Frobenius error of ``a`` against the reference ``b``, in float64."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def sample(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, np.ndarray]:
    """A random tensor of ``dtype`` and the same values in float64 for the scipy reference."""
    x = torch.randn(shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed)).to(dtype)
    return x, x.double().numpy()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize(("shape", "dim"), CASES)
@pytest.mark.parametrize(
    ("ours", "ref"),
    [(dct2, scipy.fft.dct), (idct2, scipy.fft.idct)],
    ids=["dct2", "idct2"],
)
def test_matches_scipy(ours, ref, shape, dim, norm, dtype):
    x, x64 = sample(shape, dtype, seed=len(shape) * 10 + dim)
    out = ours(x, dim, norm)
    assert out.dtype == dtype and out.shape == x.shape
    assert rel_err(out.numpy(), ref(x64, type=2, axis=dim, norm=norm)) <= TOL[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize(("shape", "dim"), CASES)
def test_roundtrip(shape, dim, norm, dtype):
    x, x64 = sample(shape, dtype, seed=len(shape) * 10 + dim + 1)
    assert rel_err(idct2(dct2(x, dim, norm), dim, norm).numpy(), x64) <= TOL[dtype]


@pytest.mark.parametrize("norm", NORMS)
def test_non_contiguous_input(norm):
    x, _ = sample((9, 12), torch.float64, seed=3)
    xt = x.t()  # a transposed view: the transformed dim is not the innermost in memory
    ref = scipy.fft.dct(xt.numpy(), type=2, axis=1, norm=norm)
    assert rel_err(dct2(xt, 1, norm).numpy(), ref) <= TOL[torch.float64]


@pytest.mark.parametrize("fn", [dct2, idct2])
def test_bad_norm_raises(fn):
    with pytest.raises(ValueError, match="norm"):
        fn(torch.ones(4), 0, "forward")


@pytest.mark.parametrize("fn", [dct2, idct2])
def test_non_float_input_raises(fn):
    with pytest.raises(TypeError):
        fn(torch.ones(4, dtype=torch.int64), 0)


@pytest.mark.parametrize("n", [5, 6])
@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("fn", [dct2, idct2])
def test_gradcheck(fn, norm, n):
    x, _ = sample((3, n, 4), torch.float64, seed=n)
    assert torch.autograd.gradcheck(lambda t: fn(t, 1, norm), (x.requires_grad_(),))
