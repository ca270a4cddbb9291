"""``FNO(recompute=True)`` and ``drift.nn.set_recompute``: the blocks' activations recomputed in the backward
pass give the stored path's gradients bitwise, on every method and mesh, and a smaller training step."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from harness import device_for
from meshes import model_mesh_for
from reference import random_tensor

import drift
from drift.layout import to_dtensor
from drift.memory import LiveBytes, empty_cache
from drift.nn import FNO, parallelize, set_recompute

MESHES = {
    "2d-1": ((1, 1), (24, 20), (3, 3)),
    "2d-slab4": ((4, 1), (24, 20), (3, 3)),
    "4d-slab4": ((4, 1, 1, 1), (12, 10, 8, 6), (2, 2, 2, 3)),
    "4d-pencil4": ((2, 2, 1, 1), (12, 10, 8, 6), (2, 2, 2, 3)),
}
OPTIONS = {
    "li": {},
    "neuralop": dict(positional_embedding="grid", lifting_channel_ratio=2, use_channel_mlp=True, norm="group_norm"),
}


pytestmark = pytest.mark.usefixtures("memory_released")


def _gradients(model: torch.nn.Module, x: torch.Tensor, recompute: bool) -> tuple[dict, torch.Tensor]:
    set_recompute(model, recompute)
    model.zero_grad(set_to_none=True)
    leaf = x.detach().clone().requires_grad_(True)
    y = model(leaf)
    (y.to_local() if hasattr(y, "to_local") else y).square().mean().backward()
    grads = {n: p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad for n, p in model.named_parameters()}
    return {n: g.detach().cpu().clone() for n, g in grads.items()}, leaf.grad


def _both_paths(grid, shape, modes, method, options):
    """On this rank: the parameters' and the input's gradients, stored and recomputed."""
    device = device_for(dist.get_rank())
    mesh, placements = model_mesh_for(grid)
    torch.manual_seed(4)
    model = FNO(3, 2, 8, modes, n_layers=3, method=method, device=device, **options)
    parallelize(model, mesh, placements)
    x = random_tensor((2, 3, *shape), torch.float32, 9).to(device)
    local = drift.Layout((2, 3, *shape), mesh, placements).scatter(x)
    xd = to_dtensor(local, mesh, placements, x.shape)
    stored, stored_x = _gradients(model, xd, False)
    recomputed, recomputed_x = _gradients(model, xd, True)
    return stored, recomputed, stored_x.to_local().cpu(), recomputed_x.to_local().cpu()


# Li et al.'s model on every mesh and method; neuraloperator's options (channel MLP, norm, grid embedding,
# two-layer lift) on the pencil.
CASES = [(mesh, method, "li") for mesh in MESHES for method in drift.nn.METHODS] + [
    ("4d-pencil4", method, "neuralop") for method in drift.nn.METHODS
]


@pytest.mark.parametrize(("mesh", "method", "options"), CASES, ids="-".join)
def test_recomputed_gradients_are_the_stored_ones(ranks, mesh, method, options):
    grid, shape, modes = MESHES[mesh]
    size = 1
    for p in grid:
        size *= p
    for stored, recomputed, stored_x, recomputed_x in ranks.run(
        size, _both_paths, grid, shape, modes, method, OPTIONS[options]
    ):
        assert stored.keys() == recomputed.keys()
        for name in stored:
            assert torch.equal(stored[name], recomputed[name]), name
        assert torch.equal(stored_x, recomputed_x)


def test_recompute_on_one_device_with_dropout_is_bitwise():
    """The channel MLP's dropout draws the same mask when the block is recomputed (RNG state kept)."""
    torch.manual_seed(2)
    model = FNO(3, 2, 8, (4, 4), n_layers=3, use_channel_mlp=True, channel_mlp_dropout=0.3)
    x = torch.randn(2, 3, 32, 24)
    torch.manual_seed(11)
    stored, _ = _gradients(model, x, False)
    torch.manual_seed(11)
    recomputed, _ = _gradients(model, x, True)
    for name in stored:
        assert torch.equal(stored[name], recomputed[name]), name


def _step_peak(model: FNO, x: torch.Tensor) -> int:
    empty_cache()
    model.zero_grad(set_to_none=True)
    with LiveBytes() as counted:
        model(x).square().mean().backward()
    return counted.peak


def test_recompute_keeps_less_than_the_stored_step():
    """Four blocks: the stored step keeps two fields a block (its input and pre-activation), the recomputed
    one the block's input alone."""
    torch.manual_seed(0)
    model = FNO(5, 5, 20, (8, 8), n_layers=4)
    x = torch.randn(1, 5, 512, 512)
    stored = _step_peak(model, x)
    set_recompute(model, True)
    recomputed = _step_peak(model, x)
    assert recomputed < 0.8 * stored, (recomputed, stored)


def test_recompute_mlp_keeps_less_than_the_stored_step():
    """neuraloperator's blocks: the stored step keeps each channel MLP's hidden layer, its activation, the
    gated skip and the sum; recomputing the hidden layer keeps the MLP's input alone, and the lift its
    input (drift.cost.memory: about 16.6 fields against 25.5 with four blocks; at 384^2, where the chunk
    buffers per thread are a small share, whatever the thread count)."""
    torch.manual_seed(0)
    model = FNO.neuralop_defaults(5, 5, 20, (8, 8), n_layers=4)
    x = torch.randn(1, 5, 384, 384)
    stored = _step_peak(model, x)
    set_recompute(model, "mlp")
    recomputed = _step_peak(model, x)
    assert recomputed < 0.85 * stored, (recomputed, stored)


def _saved_channels(model: FNO, x: torch.Tensor) -> set[int]:
    """The channel counts of the grid-sized tensors a recorded forward saves for its backward pass."""
    channels = set()

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.dim() == x.dim() and t.shape[2:] == x.shape[2:]:
            channels.add(t.shape[1])
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x).square().mean().backward()
    return channels


def test_recompute_mlp_keeps_no_hidden_layer_of_the_lift():
    """The two-layer lift (twice the width) keeps its hidden layer and that layer's activation for the
    backward pass when stored, and only its input under ``recompute_mlp``, like the projection."""
    torch.manual_seed(0)
    model = FNO.neuralop_defaults(3, 2, 8, (4, 4), n_layers=2)
    x = torch.randn(2, 3, 24, 20)
    assert 16 in _saved_channels(model, x)  # the lift's hidden layer: 2 x width
    set_recompute(model, "mlp")
    assert 16 not in _saved_channels(model, x)


def test_set_recompute():
    model = torch.nn.Sequential(FNO(3, 2, 8, (4, 4)), FNO(2, 1, 8, (4, 4), recompute=True))
    assert set_recompute(model, True) is model
    assert all(fno.recompute and not fno.recompute_mlp for fno in model)
    set_recompute(model, "mlp")
    assert all(fno.recompute_mlp and not fno.recompute for fno in model)
    assert all(block.recompute_mlp for fno in model for block in fno.blocks)
    set_recompute(model, False)
    assert not any(fno.recompute or fno.recompute_mlp for fno in model)
    with pytest.raises(ValueError, match="holds no drift.nn.FNO"):
        set_recompute(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match=r"one of \('blocks', 'mlp'\), got 'hidden'"):
        set_recompute(model, "hidden")


def test_recompute_leaves_the_forward_without_autograd_alone():
    torch.manual_seed(0)
    model = FNO(3, 2, 8, (4, 4), n_layers=2)
    x = torch.randn(2, 3, 32, 24)
    with torch.no_grad():
        y = model(x)
        set_recompute(model, True)
        assert torch.equal(model(x), y)
