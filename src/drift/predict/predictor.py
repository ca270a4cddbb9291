"""A trained FNO as a map from raw frames to raw predicted frames: the normalisation, the assembly of the
model's input and the de-normalisation around it (``Predictor``), as ``drift predict`` runs it on each
rank's blocks and ``drift.load_exported`` returns it on one device."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from drift.data import Stats, model_input
from drift.layout import local_block
from drift.nn import FNO


class Predictor(nn.Module):
    """``model`` (a trained ``drift.nn.FNO``) between the physical fields and its normalised ones.

    ``forward(frames)``: ``frames`` ``(batch, fields, t_in, x, y, z)``, the first ``t_in`` frames of each
    trajectory's fields (``stats.fields``, in that order) in physical units, any float dtype, on the
    model's device: each field normalised with ``stats`` (``(frames - mean) / std``, in float32, as
    ``drift.data.PDEBench3D`` reads), assembled into the model's input (``drift.data.model_input``: the
    ``fields x t_in`` frames, field-major, each repeated along the ``t_out`` time points, then ``t / t_out``
    for t = 1..t_out) and returned as the ``t_out`` predicted frames ``(batch, fields, t_out, x, y, z)``,
    float32, de-normalised (``y * std + mean``). Any grid the model's modes fit.
    """

    def __init__(self, model: FNO, stats: Stats, t_in: int, t_out: int) -> None:
        super().__init__()
        self.model, self.fields, self.t_in, self.t_out = model, tuple(stats.fields), t_in, t_out
        device = next(model.parameters()).device
        self.register_buffer("mean", torch.tensor(stats.mean, dtype=torch.float32, device=device))
        self.register_buffer("std", torch.tensor(stats.std, dtype=torch.float32, device=device))

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        return self.block(frames)

    def block(self, frames: torch.Tensor, wrap: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
        """``forward`` on this rank's block of the frames, ``(batch, fields, t_in, *block)``, for a model
        parallelized over a mesh: ``wrap`` turns this rank's block of the model's input into what the
        model takes (a DTensor of the global input; None: the block is the whole input). Returns this
        rank's block of the predicted frames."""
        if frames.dim() != 6 or frames.shape[1:3] != (len(self.fields), self.t_in):
            raise ValueError(
                f"Predictor takes frames (batch, {len(self.fields)} fields, {self.t_in} frames, x, y, z), "
                f"got shape {tuple(frames.shape)}"
            )
        shape = (1, -1, 1, 1, 1, 1)
        mean, std = self.mean.view(shape), self.std.view(shape)
        x = model_input((frames.to(torch.float32) - mean) / std, self.t_out)
        y = local_block(self.model(x if wrap is None else wrap(x)))  # (batch, fields, *block, t_out)
        return y.movedim(-1, 2) * std + mean
