"""Single-process references built on torch.fft, blocks as torch.chunk cuts them, the error measure, and
PDEBench's metrics in numpy."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np
import torch
from torch.distributed.tensor import Shard

from drift import Layout

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


def chunk_block(n: int, parts: Sequence[int], indices: Sequence[int]) -> slice:
    """The slice of ``range(n)`` that ``torch.chunk`` gives block ``indices[0]`` of ``parts[0]``, then block
    ``indices[1]`` of ``parts[1]`` of that, and so on (DTensor's nested ``Shard``); trailing blocks that
    ``torch.chunk`` does not return are empty."""
    held = torch.arange(n)
    for p, i in zip(parts, indices, strict=True):
        blocks = held.chunk(p)
        held = blocks[i] if i < len(blocks) else held[len(held) :]
    start = int(held[0]) if len(held) else n
    return slice(start, start + len(held))


def mesh_block(global_shape, mesh_shape, placements, coordinate) -> tuple[slice, ...]:
    """The block of a field of ``global_shape`` held at mesh ``coordinate`` when mesh dim a splits dim i
    for ``placements[a] == Shard(i)`` (several mesh dims on one dim: nested, in mesh order)."""
    out = []
    for dim, n in enumerate(global_shape):
        axes = [a for a, p in enumerate(placements) if isinstance(p, Shard) and p.dim % len(global_shape) == dim]
        out.append(chunk_block(n, [mesh_shape[a] for a in axes], [coordinate[a] for a in axes]))
    return tuple(out)


def mesh_share(n: int, mesh_shape, placements, coordinate) -> slice:
    """The share of ``range(n)`` held at mesh ``coordinate`` when ``n`` is chunked over every mesh dim that
    splits the field (a ``Shard`` placement), in mesh order."""
    axes = [a for a, p in enumerate(placements) if isinstance(p, Shard)]
    return chunk_block(n, [mesh_shape[a] for a in axes], [coordinate[a] for a in axes])


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


def unfused(x, y, w, b, act):
    """The block tail on whole tensors, in float64, recorded op by op."""
    z = y + torch.einsum("oi,bi...->bo...", w, x)
    if b is not None:
        z = z + b.view(-1, *[1] * (x.dim() - 2))
    return z if act is None else act(z)


def unfused_fno(model, x: torch.Tensor) -> torch.Tensor:
    """An FNO ``model``'s function with every block's tail and the projection written out on whole tensors."""
    layout = Layout(x.shape[2:])
    z = model.lift(x)
    for block in model.blocks:
        act = model.non_linearity if block.activation else None
        z = unfused(z, block.spectral.forward_local(z, layout), block.skip.weight, block.skip.bias, act)
    hidden = unfused(z, 0, model.project_hidden.weight, model.project_hidden.bias, model.non_linearity)
    return unfused(hidden, 0, model.project_out.weight, model.project_out.bias, None)


def pdebench_reference(pred: np.ndarray, true: np.ndarray, low=4, high=12, lengths=None) -> dict:
    """PDEBench's ``metric_func`` formulas on arrays ``(b, *spatial, t, c)`` of 1, 2 or 3 spatial dims, in
    its branch for that many dims, the whole set as one batch; ``lengths``: Lx, Ly, Lz (default 1 each).
    The 3D boundary term is per channel, as in its 1D and 2D branches. The metrics ``NAMES`` (means over
    channels and times) and ``per_frame``: RMSE and nRMSE per time, means over channels."""
    p, u = np.moveaxis(pred, -1, 1), np.moveaxis(true, -1, 1)  # (b, c, *spatial, t)
    nb, nc, *shape, nt = p.shape
    d, n = len(shape), math.prod(shape)
    lengths = (1.0,) * d if lengths is None else lengths
    flat_p, flat_u = p.reshape(nb, nc, -1, nt), u.reshape(nb, nc, -1, nt)
    rms = np.sqrt(np.mean((flat_p - flat_u) ** 2, axis=2))
    per_ct = {
        "rmse": rms.mean(0),
        "nrmse": (rms / np.sqrt(np.mean(flat_u**2, axis=2))).mean(0),
        "crmse": np.sqrt(np.mean((flat_p.sum(2) - flat_u.sum(2)) ** 2, axis=0)) / n,
        "max_error": np.abs(flat_p - flat_u).max(2).max(0),
    }
    e = p - u
    boundary = sum(
        (np.take(e, i, axis=a) ** 2).reshape(nb, nc, -1, nt).sum(2) for a in range(2, 2 + d) for i in (0, -1)
    )
    if d == 1:
        boundary_points = 2
    elif d == 2:
        boundary_points = 2 * shape[0] + 2 * shape[1]
    else:
        nx, ny, nz = shape
        boundary_points = 2 * nx * ny + 2 * ny * nz + 2 * nz * nx
    per_ct["brmse"] = np.sqrt(boundary / boundary_points).mean(0)
    if d == 1:  # the whole rfft half spectrum, one bin per frequency
        per_bin = np.sqrt(np.mean(np.abs(np.fft.rfft(p, axis=2) - np.fft.rfft(u, axis=2)) ** 2, axis=0)) / n
    else:
        axes = tuple(range(2, 2 + d))
        power = np.abs(np.fft.fftn(p, axes=axes) - np.fft.fftn(u, axes=axes)) ** 2
        bins = min(m // 2 for m in shape)
        binned = np.zeros((nb, nc, bins, nt))
        for index in itertools.product(*(range(m // 2) for m in shape)):
            r = math.floor(math.sqrt(sum(i**2 for i in index)))
            if r <= bins - 1:
                binned[:, :, r] += power[(slice(None), slice(None), *index)]
        per_bin = np.sqrt(binned.mean(0)) / n  # (c, bins, t)
    per_bin = per_bin * math.prod(lengths)
    for name, band in (
        ("frmse_low", slice(0, low)),
        ("frmse_mid", slice(low, high)),
        ("frmse_high", slice(high, None)),
    ):
        chosen = per_bin[:, band]
        per_ct[name] = chosen.mean(1) if chosen.shape[1] else None
    result = {name: None if v is None else float(v.mean()) for name, v in per_ct.items()}
    result["per_frame"] = {name: per_ct[name].mean(0).tolist() for name in ("rmse", "nrmse")}
    return result
