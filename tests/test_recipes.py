"""The recipes (``drift.recipes``) against what each promises: a rollout feeds each output back as the
newest frame, the pushforward trick backpropagates through exactly the last K steps, increments add to the
last frame, the static and one-shot recipes call the model once on the input their convention makes."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from torch import nn

from drift.data import model_input
from drift.recipes import AUTOREGRESSIVE, ONE_SHOT, STATIC, Autoregressive, Unroll, recipe_named


def identity(block: torch.Tensor) -> torch.Tensor:
    return block


class LastPlusOne(nn.Module):
    """Maps the autoregressive input ``(batch, fields * t_in, *space)`` to its last frame plus 1 (or, as an
    increment model, to 1), counting its calls and backward passes."""

    def __init__(self, fields: int, increment: bool = False) -> None:
        super().__init__()
        self.fields, self.increment = fields, increment
        self.scale = nn.Parameter(torch.ones(()))
        self.calls = self.backwards = 0
        self.register_full_backward_hook(self._backward)

    def _backward(self, *_) -> None:
        self.backwards += 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        frames = x.unflatten(1, (self.fields, -1))
        one = self.scale * torch.ones_like(frames[:, :, -1])
        return one if self.increment else frames[:, :, -1] * self.scale + one


def frames(batch=2, fields=3, t_in=4, space=(5, 6), seed=0) -> torch.Tensor:
    """Whole numbers (so that adding 1 k times is x + k exactly) as float32 frames."""
    shape = (batch, fields, t_in, *space)
    return torch.randint(-50, 50, shape, generator=torch.Generator().manual_seed(seed)).float()


@pytest.mark.parametrize("increments", [False, True])
def test_a_rollout_of_x_plus_one_gives_x_plus_k_at_step_k(increments):
    x = frames()
    recipe = Autoregressive(increments)
    model = LastPlusOne(x.shape[1], increment=increments)
    rolled = recipe.predict(model, x, identity, 7)
    assert rolled.shape == (2, 3, 5, 6, 7)
    for k in range(1, 8):
        assert torch.equal(rolled[..., k - 1], x[:, :, -1] + k)  # the same additions in the same order
    assert model.calls == 7


def test_each_step_sees_the_last_t_in_frames():
    """The window slides: step j's input is frames j..j+t_in-1 of the input and the outputs so far."""
    x = frames(t_in=3)
    seen = []

    class Spy(nn.Module):
        def forward(self, inputs):
            seen.append(inputs.unflatten(1, (3, -1)).clone())
            return inputs.unflatten(1, (3, -1))[:, :, 0] * 0 + len(seen) * 100.0

    AUTOREGRESSIVE.predict(Spy(), x, identity, 4)
    assert torch.equal(seen[0], x)
    assert torch.equal(seen[1][:, :, :2], x[:, :, 1:]) and bool((seen[1][:, :, 2] == 100).all())
    assert torch.equal(seen[2][:, :, :1], x[:, :, 2:]) and bool((seen[2][:, :, 1] == 100).all())
    assert bool((seen[3][:, :, 0] == 100).all()) and bool((seen[3][:, :, 2] == 300).all())


@pytest.mark.filterwarnings("ignore:Full backward hook is firing")
@pytest.mark.parametrize("pushforward", [None, 1, 3, 6])
def test_pushforward_backpropagates_through_the_last_k_steps(pushforward):
    x = frames()
    model = LastPlusOne(x.shape[1])
    unroll = Unroll(pushforward=pushforward)
    pred = AUTOREGRESSIVE.train_forward(model, x, identity, 6, unroll)
    counted = AUTOREGRESSIVE.counted(6, unroll)
    k = 6 if pushforward is None else pushforward
    assert counted == slice(6 - k, 6) and pred.shape[-1] == k
    pred.square().sum().backward()
    assert model.calls == 6 and model.backwards == k
    # The loss's frames are the rollout's last k, whatever ran without gradient before them.
    assert torch.equal(pred.detach(), AUTOREGRESSIVE.predict(model, x, identity, 6)[..., 6 - k :])


def test_noise_is_added_to_each_steps_input():
    x = frames()
    model = LastPlusOne(x.shape[1])
    quiet = AUTOREGRESSIVE.predict(model, x, identity, 3)
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        noisy = AUTOREGRESSIVE.train_forward(model, x, identity, 3, Unroll(noise=0.1, generator=generator))
    expected = torch.Generator().manual_seed(5)
    window = x.flatten(1, 2)
    first = window + 0.1 * torch.randn(window.shape, generator=expected)
    assert torch.equal(noisy[..., 0], first.unflatten(1, (3, -1))[:, :, -1] + 1)
    assert not torch.equal(noisy, quiet)
    assert float((noisy - quiet)[..., 0].std()) == pytest.approx(0.1, rel=0.2)


def test_static_and_one_shot_call_the_model_once_on_their_input():
    x = frames(t_in=1)
    seen = []

    def model(inputs):
        seen.append(inputs)
        return inputs[:, :2] * 2

    out = STATIC.predict(model, STATIC.assemble(x, 1), identity, 1)
    assert torch.equal(seen[0], x[:, :, 0]) and torch.equal(out, (x[:, :2, 0] * 2).unsqueeze(-1))
    x = frames(t_in=2)
    assembled = ONE_SHOT.assemble(x, 5)
    assert torch.equal(assembled, model_input(x, 5))
    assert torch.equal(ONE_SHOT.predict(model, assembled, identity, 5), assembled[:, :2] * 2)
    assert (STATIC.frames(4, 9), ONE_SHOT.frames(4, 9)) == ((slice(0, 1), slice(0, 1)), (slice(0, 4), slice(4, 13)))


def test_channels_and_dims_per_recipe():
    assert STATIC.channels(1, 1, 5) == (1, 1) and STATIC.model_dims(2) == 2
    assert ONE_SHOT.channels(5, 5, 4) == (21, 5) and ONE_SHOT.model_dims(3) == 4
    assert AUTOREGRESSIVE.channels(4, 4, 10) == (40, 4) and AUTOREGRESSIVE.model_dims(1) == 1
    assert recipe_named("autoregressive", "increment").increments
    with pytest.raises(ValueError, match="recipe must be one of"):
        recipe_named("teacher-forcing")


def test_the_relative_l2_loss_has_the_global_losss_value_and_gradient():
    """One rank holding every trajectory whole: its loss is the batch's mean relative L2, its gradient that
    of the formula (the multi-rank case is tests/test_problems.py's, against one rank)."""
    from drift.train.losses import relative_l2

    g = torch.Generator().manual_seed(1)
    y = torch.randn(3, 2, 5, 4, generator=g, dtype=torch.float64)
    pred = (y + 0.3 * torch.randn(y.shape, generator=g, dtype=torch.float64)).requires_grad_()
    direct = ((pred - y).flatten(1).norm(dim=1) / y.flatten(1).norm(dim=1)).mean()
    (want,) = torch.autograd.grad(direct, pred)
    loss = relative_l2(pred, y, [0, 1, 2], 3, 1)
    loss.backward()
    assert abs(float(loss) - float(direct)) <= 1e-15 and float((pred.grad - want).abs().max()) <= 1e-15


def test_the_nrmse_loss_is_pdebenchs_nrmse_of_the_physical_fields():
    """``--loss nrmse`` on one rank holding every trajectory whole: the mean over trajectories and fields of
    each field's relative L2 error in physical units, and that formula's gradient."""
    from drift.train.losses import relative_l2

    g = torch.Generator().manual_seed(2)
    mean, std = (1.5, 0.0, -2.0), (0.1, 2.0, 0.5)
    y = torch.randn(3, 3, 5, 4, generator=g, dtype=torch.float64)
    pred = (y + 0.3 * torch.randn(y.shape, generator=g, dtype=torch.float64)).requires_grad_()
    m, s = (torch.tensor(v, dtype=torch.float64).view(1, 3, 1, 1) for v in (mean, std))
    physical = [t * s + m for t in (pred, y)]
    direct = ((physical[0] - physical[1]).flatten(2).norm(dim=2) / physical[1].flatten(2).norm(dim=2)).mean()
    (want,) = torch.autograd.grad(direct, pred)
    loss = relative_l2(pred, y, [0, 1, 2], 3, 1, (m, s))
    loss.backward()
    assert abs(float(loss) - float(direct)) <= 1e-15 and float((pred.grad - want).abs().max()) <= 1e-15
    # Not the normalised fields' relative L2: the density-like field's mean dwarfs its error.
    assert abs(float(loss) - float(relative_l2(pred.detach(), y, [0, 1, 2], 3, 1))) > 0.1


@pytest.mark.parametrize("module", ["drift.recipes", "drift.data.assembly", "drift.data"])
def test_each_module_imports_first(module):
    # The recipes and the data sets import each other's names: each must import in a fresh interpreter.
    subprocess.run([sys.executable, "-c", f"import {module}"], check=True, capture_output=True, timeout=120)
