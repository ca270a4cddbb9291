"""neuraloperator's "grid" positional embedding, made by each rank for its own block."""

from __future__ import annotations

import torch

from drift.layout import Layout

EMBEDDINGS = ("grid", None)


def grid_embedding(x: torch.Tensor, layout: Layout) -> torch.Tensor:
    """``x`` ``(b, c, *layout.local_shape)`` with d coordinate channels appended: on dim i the point at
    global index j holds ``j / N_i`` (the unit cube, origin at index 0, as neuraloperator's
    ``GridEmbeddingND``). A rank computes its block's coordinates from its offsets: no communication."""
    axes = [
        torch.arange(s.start, s.stop, dtype=torch.float64, device=x.device) / n
        for s, n in zip(layout.local_slices, layout.global_shape, strict=True)
    ]
    grids = torch.meshgrid(*axes, indexing="ij")
    coords = torch.stack(grids).to(x.dtype).expand(x.shape[0], -1, *layout.local_shape)
    return torch.cat((x, coords), dim=1)


def grid_coordinates(layout: Layout, start: int, stop: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The coordinate channels ``grid_embedding`` appends, ``(d, stop - start)``, for the points ``start`` to
    ``stop`` of this rank's block in row-major order (the streaming lift takes them a chunk at a time)."""
    flat = torch.arange(start, stop, device=device)
    index = torch.unravel_index(flat, tuple(layout.local_shape))
    axes = [
        (i + s.start).to(torch.float64) / n
        for i, s, n in zip(index, layout.local_slices, layout.global_shape, strict=True)
    ]
    return torch.stack(axes).to(dtype)
