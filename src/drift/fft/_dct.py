"""Local (single-process) DCT-II and its inverse along one dim, in O(N log N) through ``torch.fft``.

Makhoul's reordering turns the DCT-II into one real FFT of the same length. With
``v = (x[0], x[2], ..., x[3], x[1])`` (even samples ascending, then odd samples descending) and
``V = rfft(v)``, every coefficient is ``y[k] = Re(c_k w_k V[k])`` with ``w_k = exp(-i pi k / (2N))`` and
``c_k`` the norm's scale; the Hermitian symmetry of ``V`` gives the upper half from the same
``M = N // 2 + 1`` products, ``y[N - k] = -Im(c_k w_k V[k])``. The inverse rebuilds ``V`` from
``y[k]`` and ``y[N - k]`` and undoes the FFT and the reordering.
"""

from __future__ import annotations

import math

import torch

_NORMS = ("backward", "ortho")


def _check(x: torch.Tensor, dim: int, norm: str) -> tuple[int, int]:
    """The length along ``dim`` and ``dim`` made non-negative, after validating the arguments."""
    if norm not in _NORMS:
        raise ValueError(f"norm must be one of {_NORMS}, got {norm!r}")
    if not x.is_floating_point():
        raise TypeError(f"expected a real floating-point tensor, got {x.dtype}")
    n = x.size(dim)  # raises IndexError for a dim out of range
    return n, dim % x.dim()


def _order(n: int, device: torch.device, inverse: bool) -> torch.Tensor:
    """Makhoul's permutation ``v = x[perm]``, or its inverse ``x = v[perm]``."""
    j = torch.arange(n, device=device)
    if inverse:
        return torch.where(j % 2 == 0, j // 2, n - 1 - j // 2)
    return torch.where(j < (n + 1) // 2, 2 * j, 2 * (n - 1 - j) + 1)


def _twiddle(n: int, norm: str, like: torch.Tensor, dim: int, inverse: bool) -> torch.Tensor:
    """``i c_k w_k`` for k < N // 2 + 1 (or its reciprocal), shaped to broadcast along ``dim`` of ``like``.

    The factor i puts the lower coefficients in the imaginary part and the upper ones in the real part
    of the product, so the upper half needs no negation pass. Built in float64 so that float64 inputs
    keep full accuracy, then rounded once to the input's precision.
    """
    k = torch.arange(n // 2 + 1, dtype=torch.float64, device=like.device)
    if norm == "backward":
        scale = torch.full_like(k, 2.0)
    else:
        scale = torch.full_like(k, math.sqrt(2.0 / n))
        scale[0] = math.sqrt(1.0 / n)
    tw = 1j * torch.polar(scale, -math.pi / (2 * n) * k)
    if inverse:
        tw = tw.reciprocal()
    return tw.to(like.dtype.to_complex()).view((-1,) + (1,) * (like.dim() - dim - 1))


def dct2(x: torch.Tensor, dim: int, norm: str = "backward") -> torch.Tensor:
    """DCT-II of real ``x`` along ``dim``, equal to ``scipy.fft.dct(x, type=2, axis=dim, norm=norm)``.

    ``norm`` is ``"backward"`` (unscaled) or ``"ortho"``; the result has the dtype of ``x``.
    """
    n, dim = _check(x, dim, norm)
    # index_select gathers the reordered sequence in a single copy (slicing plus flip would take two).
    v_hat = torch.fft.rfft(x.index_select(dim, _order(n, x.device, inverse=False)), dim=dim)
    z = v_hat * _twiddle(n, norm, x, dim, inverse=False)
    upper = z.real.narrow(dim, 1, (n - 1) // 2).flip(dim)
    return torch.cat([z.imag, upper], dim)


def idct2(y: torch.Tensor, dim: int, norm: str = "backward") -> torch.Tensor:
    """Inverse of :func:`dct2` (a DCT-III), equal to ``scipy.fft.idct(y, type=2, axis=dim, norm=norm)``.

    ``norm`` is ``"backward"`` (scaled by 1 / (2N)) or ``"ortho"``; the result has the dtype of ``y``.
    """
    n, dim = _check(y, dim, norm)
    m = n // 2 + 1
    # The product z[k] = i c_k w_k V[k] is y[N - k] + i y[k]; z[0] has no upper partner, so its real
    # part is an explicit zero rather than relying on irfft discarding the imaginary part of V[0].
    zero = y.new_zeros(y.shape[:dim] + (1,) + y.shape[dim + 1 :])
    upper = torch.cat([zero, y.narrow(dim, n - m + 1, m - 1).flip(dim)], dim)
    v_hat = torch.complex(upper, y.narrow(dim, 0, m)) * _twiddle(n, norm, y, dim, inverse=True)
    v = torch.fft.irfft(v_hat, n=n, dim=dim)
    return v.index_select(dim, _order(n, y.device, inverse=True))
