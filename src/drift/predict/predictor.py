"""A trained FNO as a map from raw frames to raw predicted frames: the normalisation, the assembly of the
model's input and the de-normalisation around it (``Predictor``), as ``drift predict`` runs it on each
rank's blocks and ``drift.load_exported`` returns it on one device."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from drift.data import Stats
from drift.nn import FNO
from drift.recipes import ONE_SHOT, Recipe, Wrap


class Predictor(nn.Module):
    """``model`` (a trained ``drift.nn.FNO``) between the physical fields and its normalised ones.

    ``forward(frames)``: ``frames`` ``(batch, inputs, t_in, *space)``, the first ``t_in`` frames of each
    trajectory's input channels (``inputs``, in that order; a static problem's inputs with ``t_in = 1``) in
    physical units, any float dtype, on the model's device: each channel normalised with ``stats``
    (``(frames - mean) / std``, in float32, as ``drift.data.Trajectories`` reads), predicted as ``recipe``
    says (``drift.recipes``: a one-shot model's input is the ``inputs x t_in`` frames, field-major, each
    repeated along the ``t_out`` time points, then ``t / t_out`` for t = 1..t_out; an autoregressive one
    rolls out ``t_out`` frames) and returned as the ``t_out`` predicted frames ``(batch, fields, t_out,
    *space)`` (one for a static problem), float32, de-normalised (``y * std + mean``). Any grid the model's
    modes fit. ``stats`` holds the statistics of ``inputs`` then those of ``fields`` for a static problem,
    else of the fields (``inputs`` and ``fields`` both: default ``stats.fields``).
    """

    def __init__(
        self,
        model: FNO,
        stats: Stats,
        t_in: int,
        t_out: int,
        recipe: Recipe = ONE_SHOT,
        inputs: Sequence[str] | None = None,
        fields: Sequence[str] | None = None,
    ) -> None:
        super().__init__()
        self.model, self.recipe = model, recipe
        self.fields = tuple(fields or stats.fields)
        self.inputs = tuple(inputs or self.fields)
        self.t_in, self.t_out = recipe.frame_counts(t_in, t_out)
        first = len(stats.fields) - len(self.fields)  # a static problem's inputs come first
        device = next(model.parameters()).device
        for name, values in (("mean", stats.mean), ("std", stats.std)):
            as_tensor = dict(dtype=torch.float32, device=device)
            self.register_buffer(f"x_{name}", torch.tensor(values[: first or None], **as_tensor))
            self.register_buffer(f"y_{name}", torch.tensor(values[first:], **as_tensor))

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        return self.block(frames)

    def block(self, frames: torch.Tensor, wrap: Wrap | None = None) -> torch.Tensor:
        """``forward`` on this rank's block of the frames, ``(batch, inputs, t_in, *block)``, for a model
        parallelized over a mesh: ``wrap`` turns this rank's block of a model input into what the model
        takes (a DTensor of the global input, ``drift.train.Sharding.wrapper``; None: the block is the
        whole input). Returns this rank's block of the predicted frames."""
        if frames.dim() < 4 or frames.shape[1:3] != (len(self.inputs), self.t_in):
            raise ValueError(
                f"Predictor takes frames (batch, {len(self.inputs)} input channels, {self.t_in} frames, *space), "
                f"got shape {tuple(frames.shape)}"
            )
        shape = (1, -1) + (1,) * (frames.dim() - 2)
        x = (frames.to(torch.float32) - self.x_mean.view(shape)) / self.x_std.view(shape)
        x = self.recipe.assemble(x, self.t_out)
        y = self.recipe.predict(self.model, x, wrap or (lambda block: block), self.t_out)
        return y.movedim(-1, 2) * self.y_std.view(shape) + self.y_mean.view(shape)
