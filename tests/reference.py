"""Single-process references built on torch.fft, and the error measure the tests use."""

from __future__ import annotations

import torch

TOL = {torch.float64: 1e-12, torch.float32: 2e-6}


def random_tensor(shape, dtype: torch.dtype, seed: int, complex_: bool = False) -> torch.Tensor:
    """A seeded standard normal tensor on the CPU (complex: independent real and imaginary parts)."""
    g = torch.Generator().manual_seed(seed)
    if complex_:
        return torch.complex(torch.randn(shape, generator=g, dtype=dtype), torch.randn(shape, generator=g, dtype=dtype))
    return torch.randn(shape, generator=g, dtype=dtype)


def case_id(shape, grid, *rest) -> str:
    """A readable pytest id: extents, grid, then the remaining parameters."""
    return "-".join(["x".join(map(str, shape)), "grid" + "x".join(map(str, grid)), *map(str, rest)])


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """Relative Frobenius error of ``a`` against the reference ``b`` (compared in float64)."""
    assert a.shape == b.shape, (a.shape, b.shape)
    if b.numel() == 0:
        return 0.0
    a = a.detach().cpu().to(torch.complex128 if a.is_complex() else torch.float64)
    b = b.detach().cpu().to(a.dtype)
    return float((a - b).norm() / b.norm())


def _mode_index(modes, device):
    return torch.meshgrid(*[torch.tensor(m, device=device) for m in modes], indexing="ij")


def truncated_spectrum(x: torch.Tensor, modes, real: bool, norm: str) -> torch.Tensor:
    """``rfftn`` (or ``fftn``) of ``x`` over its last ``len(modes)`` dims, at the retained modes."""
    dims = tuple(range(-len(modes), 0))
    spec = (torch.fft.rfftn if real else torch.fft.fftn)(x, dim=dims, norm=norm)
    return spec[(..., *_mode_index(modes, x.device))]


def zero_filled_inverse(xhat: torch.Tensor, modes, global_shape, real: bool, norm: str) -> torch.Tensor:
    """``irfftn`` (or ``ifftn``) of the spectrum that is ``xhat`` at the retained modes and zero elsewhere."""
    d = len(global_shape)
    batch = xhat.shape[: xhat.dim() - d]
    full = list(global_shape)
    if real:
        full[-1] = global_shape[-1] // 2 + 1
    z = torch.zeros(*batch, *full, dtype=xhat.dtype, device=xhat.device)
    z[(..., *_mode_index(modes, xhat.device))] = xhat
    dims = tuple(range(-d, 0))
    return (torch.fft.irfftn if real else torch.fft.ifftn)(z, s=tuple(global_shape), dim=dims, norm=norm)
