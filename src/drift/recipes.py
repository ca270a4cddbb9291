"""The three ways an FNO learns from data (``Recipe``): how a trajectory's frames become the model's
input, and the model's output the predicted frames, the one convention that training, evaluation,
``drift predict`` and an exported model share.

Every recipe reads an item as ``x`` ``(batch, x channels, x frames, *space)`` and ``y`` ``(batch, y
channels, y frames, *space)`` (``frames`` says which frames) and predicts ``y`` in the target's layout
``(batch, y channels, *space, y frames)`` (``model_target``):

- ``STATIC``: input fields to output fields (Darcy flow: the coefficient to the pressure), one frame
  each; the FNO works on the spatial dims.
- ``ONE_SHOT``: ``t_in`` frames in, the next ``t_out`` frames out at once; the FNO works on the spatial
  dims and time (``model_input``: the input frames as channels repeated along ``t_out`` time
  points, and the time).
- ``AUTOREGRESSIVE``: ``t_in`` frames in (as channels), the next frame out, fed back ``t_out`` times (as
  PDEBench's FNO baselines train); its training options (``Unroll``): the pushforward trick (the first
  steps of the unroll without gradient, the loss over the last ``pushforward`` frames only), noise on
  each step's input and increments (the model predicts the change from the last input frame).

``x`` and ``y`` here are this rank's blocks; ``wrap`` turns a block of the model's input into what the
model takes (a DTensor over the run's mesh, or the block itself on one device).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from drift.layout import local_block

Wrap = Callable[[torch.Tensor], torch.Tensor]


def model_input(x: torch.Tensor, t_out: int) -> torch.Tensor:
    """``(batch, fields, t_in, *block)`` input frames -> the FNO's ``(batch, fields * t_in + 1, *block, t_out)``:
    every input frame repeated along a new last dim of ``t_out`` steps, then one channel holding each step's
    time ``(j + 1) / t_out``."""
    b, f, t_in, *block = x.shape
    frames = x.reshape(b, f * t_in, *block, 1).expand(-1, -1, *block, t_out)
    t = torch.arange(1, t_out + 1, dtype=x.dtype, device=x.device) / t_out
    return torch.cat([frames, t.expand(b, 1, *block, t_out)], dim=1)


def model_target(y: torch.Tensor) -> torch.Tensor:
    """``(batch, fields, t_out, *block)`` target frames -> the FNO's ``(batch, fields, *block, t_out)``."""
    return y.movedim(2, -1)


TARGETS = ("state", "increment")  # what the autoregressive model predicts: the next frame, or its change


@dataclass(frozen=True)
class Unroll:
    """How the autoregressive recipe trains: ``pushforward`` (None: every frame of the unroll counts and
    its gradients flow through every step; K: the first ``t_out - K`` steps run without gradient and the
    loss counts the last K frames, whose gradients flow through those K steps only) and ``noise`` (the
    standard deviation of Gaussian noise added to the model's input at each step, in normalised units,
    drawn from ``generator``)."""

    pushforward: int | None = None
    noise: float = 0.0
    generator: torch.Generator | None = None


class Recipe:
    """A way to train an FNO on trajectories (see the module's notes): one object per recipe."""

    name: str = ""
    time_dim = False  # whether the FNO has a time dim after the spatial ones

    def model_dims(self, space: int) -> int:
        """The FNO's dims for data of ``space`` spatial dims."""
        return space + self.time_dim

    def channels(self, x_channels: int, y_channels: int, t_in: int) -> tuple[int, int]:
        """The FNO's input and output channels."""
        raise NotImplementedError

    def frames(self, t_in: int, t_out: int) -> tuple[slice, slice]:
        """Which frames of a trajectory are read as ``x`` and as ``y``."""
        return slice(0, t_in), slice(t_in, t_in + t_out)

    def frame_counts(self, t_in: int, t_out: int) -> tuple[int, int]:
        """How many frames ``frames`` reads as ``x`` and as ``y``."""
        return tuple(s.stop - s.start for s in self.frames(t_in, t_out))

    def assemble(self, x: torch.Tensor, t_out: int) -> torch.Tensor:
        """``x`` as the batch holds it between its read and the step (the one-shot model's input is made
        where the batch is read, off the step's thread)."""
        return x

    def counted(self, t_out: int, unroll: Unroll | None = None) -> slice:
        """The target frames a training step's loss counts."""
        return slice(0, t_out)

    def predict(self, model: torch.nn.Module, x: torch.Tensor, wrap: Wrap, t_out: int) -> torch.Tensor:
        """This rank's block of the predicted frames ``(batch, y channels, *space, frames)`` from
        ``assemble``'s ``x``."""
        return local_block(model(wrap(x)))

    def train_forward(
        self, model: torch.nn.Module, x: torch.Tensor, wrap: Wrap, t_out: int, unroll: Unroll | None
    ) -> torch.Tensor:
        """A training step's predictions of the ``counted`` frames (gradients as the recipe trains)."""
        return self.predict(model, x, wrap, t_out)

    def __repr__(self) -> str:
        return self.name


class Static(Recipe):
    name = "static"

    def channels(self, x_channels: int, y_channels: int, t_in: int) -> tuple[int, int]:
        return x_channels, y_channels

    def frames(self, t_in: int, t_out: int) -> tuple[slice, slice]:
        return slice(0, 1), slice(0, 1)

    def assemble(self, x: torch.Tensor, t_out: int) -> torch.Tensor:
        return x.select(2, 0)

    def counted(self, t_out: int, unroll: Unroll | None = None) -> slice:
        return slice(0, 1)

    def predict(self, model: torch.nn.Module, x: torch.Tensor, wrap: Wrap, t_out: int) -> torch.Tensor:
        return local_block(model(wrap(x))).unsqueeze(-1)


class OneShot(Recipe):
    name = "one-shot"
    time_dim = True

    def channels(self, x_channels: int, y_channels: int, t_in: int) -> tuple[int, int]:
        return x_channels * t_in + 1, y_channels

    def assemble(self, x: torch.Tensor, t_out: int) -> torch.Tensor:
        return model_input(x, t_out)


class Autoregressive(Recipe):
    """``increments``: the model's output is the change from the last input frame (the target "increment"),
    else the next frame itself ("state")."""

    name = "autoregressive"

    def __init__(self, increments: bool = False) -> None:
        self.increments = increments

    def channels(self, x_channels: int, y_channels: int, t_in: int) -> tuple[int, int]:
        return x_channels * t_in, y_channels

    def counted(self, t_out: int, unroll: Unroll | None = None) -> slice:
        k = unroll.pushforward if unroll is not None else None
        return slice(0, t_out) if k is None else slice(t_out - k, t_out)

    def predict(self, model: torch.nn.Module, x: torch.Tensor, wrap: Wrap, t_out: int) -> torch.Tensor:
        return self._unroll(model, x, wrap, t_out, Unroll(), slice(0, t_out))

    def train_forward(
        self, model: torch.nn.Module, x: torch.Tensor, wrap: Wrap, t_out: int, unroll: Unroll | None
    ) -> torch.Tensor:
        unroll = unroll or Unroll()
        return self._unroll(model, x, wrap, t_out, unroll, self.counted(t_out, unroll))

    def _unroll(
        self, model: torch.nn.Module, x: torch.Tensor, wrap: Wrap, t_out: int, unroll: Unroll, counted: slice
    ) -> torch.Tensor:
        """The frames ``counted`` of a ``t_out``-step rollout from ``x`` ``(batch, channels, t_in, *block)``:
        each step's input is the last ``t_in`` frames, its output the next frame (or its change from the
        last frame, for increments); steps before ``counted`` run without gradient."""
        window, kept = x, []
        for step in range(t_out):
            with torch.set_grad_enabled(torch.is_grad_enabled() and step >= counted.start):
                inputs = window.flatten(1, 2)
                if unroll.noise:
                    noise = torch.randn(inputs.shape, generator=unroll.generator, dtype=inputs.dtype)
                    inputs = inputs + unroll.noise * noise.to(inputs.device)
                out = local_block(model(wrap(inputs)))
                if self.increments:
                    out = window.select(2, -1) + out
            if step >= counted.start:
                kept.append(out)
            window = torch.cat([window.narrow(2, 1, window.shape[2] - 1), out.unsqueeze(2)], 2)
        return torch.stack(kept, -1)


STATIC, ONE_SHOT, AUTOREGRESSIVE = Static(), OneShot(), Autoregressive()
RECIPES = {r.name: r for r in (STATIC, ONE_SHOT, AUTOREGRESSIVE)}


def recipe_named(name: str, target: str = "state") -> Recipe:
    """The recipe called ``name`` (one of ``RECIPES``); an autoregressive one predicting ``target`` (one of
    ``TARGETS``)."""
    if name not in RECIPES or target not in TARGETS:
        raise ValueError(
            f"recipe must be one of {', '.join(RECIPES)} and target one of {TARGETS}, got {name!r}, {target!r}"
        )
    return Autoregressive(target == "increment") if name == AUTOREGRESSIVE.name else RECIPES[name]
