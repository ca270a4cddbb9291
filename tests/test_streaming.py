"""The streaming FNO forward (``drift.nn.streaming``): without autograd every block overwrites one field in
place; it equals the recorded forward on every method and mesh, leaves the caller's input alone, and
peaks near the floor ``(in + out + width) x bytes x points`` by ``drift.memory.LiveBytes``."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from harness import device_for
from meshes import model_mesh_for
from reference import TOL, random_tensor, rel_err
from torch.distributed.tensor import DTensor

import drift
from drift.layout import to_dtensor
from drift.memory import LiveBytes, empty_cache
from drift.nn import FNO, NEURALOP_DEFAULTS, parallelize

# (grid of ranks per spatial dim, spatial extents, modes): 2-D and 3D+time, one rank, a slab and a pencil.
MESHES = {
    "2d-1": ((1, 1), (24, 20), (3, 3)),
    "2d-slab4": ((4, 1), (24, 20), (3, 3)),
    "4d-slab4": ((4, 1, 1, 1), (12, 10, 8, 6), (2, 2, 2, 3)),
    "4d-pencil4": ((2, 2, 1, 1), (12, 10, 8, 6), (2, 2, 2, 3)),
}


pytestmark = pytest.mark.usefixtures("memory_released")


def _forwards(grid, shape, modes, method, activations, neuralop=False):
    """This rank's block of the recorded and streaming outputs, the streaming one in ``inference_mode``
    too, and whether the input block came back untouched; ``neuralop``: the model takes neuraloperator's
    options (a two-layer lift, the grid embedding, a channel MLP and a soft-gating skip in every block)."""
    device = device_for(dist.get_rank())
    mesh, placements = model_mesh_for(grid)
    torch.manual_seed(5)
    options = dict(NEURALOP_DEFAULTS) if neuralop else {}
    model = FNO(3, 2, 8, modes, n_layers=3, method=method, device=device, **options)
    if activations is not None:
        model.activations = activations
    parallelize(model, mesh, placements)
    x = random_tensor((2, 3, *shape), torch.float32, 7).to(device)
    layout = drift.Layout((2, 3, *shape), mesh, placements)
    local = layout.scatter(x)
    before = local.clone()
    xd = to_dtensor(local, mesh, placements, x.shape)
    recorded = model(to_dtensor(local.clone().requires_grad_(True), mesh, placements, x.shape))
    with torch.no_grad():
        streamed = model(xd)
    with torch.inference_mode():
        inferred = model(xd)
    local_of = lambda y: (y.to_local() if isinstance(y, DTensor) else y).detach().cpu()  # noqa: E731
    return local_of(recorded), local_of(streamed), local_of(inferred), torch.equal(local, before)


@pytest.mark.parametrize("method", drift.nn.METHODS)
@pytest.mark.parametrize("mesh", MESHES, ids=str)
def test_streaming_forward_equals_the_recorded_one(ranks, mesh, method):
    grid, shape, modes = MESHES[mesh]
    if method == "dfno-pruned" and all(p > 1 for p in grid):
        pytest.skip("dfno-pruned needs a whole dim")
    size = 1
    for p in grid:
        size *= p
    for recorded, streamed, inferred, untouched in ranks.run(size, _forwards, grid, shape, modes, method, None):
        assert untouched
        assert rel_err(streamed, recorded) <= TOL[torch.float32]
        assert torch.equal(inferred, streamed)


@pytest.mark.parametrize("method", drift.nn.METHODS)
@pytest.mark.parametrize("mesh", ["2d-slab4", "4d-pencil4"], ids=str)
def test_streaming_forward_of_neuralop_blocks_equals_the_recorded_one(ranks, mesh, method):
    grid, shape, modes = MESHES[mesh]
    if method == "dfno-pruned" and all(p > 1 for p in grid):
        grid = (4, 1, 1, 1)  # dfno-pruned needs a whole dim
    results = ranks.run(4, _forwards, grid, shape, modes, method, None, True)
    for recorded, streamed, inferred, untouched in results:
        assert untouched
        assert rel_err(streamed, recorded) <= TOL[torch.float32]
        assert torch.equal(inferred, streamed)


def test_neuralop_blocks_stream():
    """A model of neuraloperator's options streams (one resident field after a forward) unless a channel
    MLP draws dropout masks."""
    model = FNO(3, 2, 8, (4, 4), n_layers=2, **NEURALOP_DEFAULTS)
    with torch.no_grad():
        model(torch.randn(1, 3, 64, 64))
    assert any(t.numel() == 8 * 64 * 64 for t in model.executor.resident())
    dropping = FNO(3, 2, 8, (4, 4), n_layers=2, channel_mlp_dropout=0.1, **NEURALOP_DEFAULTS)
    with torch.no_grad():
        dropping(torch.randn(1, 3, 64, 64))
        assert not any(t.numel() == 8 * 64 * 64 for t in dropping.executor.resident())
        dropping.eval()
        dropping(torch.randn(1, 3, 64, 64))
    assert any(t.numel() == 8 * 64 * 64 for t in dropping.executor.resident())


def _floor_bytes(model: FNO, x: torch.Tensor) -> int:
    """The input, the output and one activation, and the parameters (which the forward reads: 0.84 GB for
    the paper's 3D+time modes, 3 MB in 2-D)."""
    points = x[0, 0].numel() * x.shape[0]
    channels = x.shape[1] + model.project_out.weight.shape[0] + model.project_hidden.weight.shape[1]
    return channels * x.element_size() * points + sum(p.nbytes for p in model.parameters())


@pytest.mark.parametrize(
    ("shape", "modes", "options"),
    [
        ((1024, 1024), (8, 8), {}),
        ((48, 48, 24, 30), (8, 8, 8, 16), {}),
        # Its channel MLPs' slab-sized work is a third of the floor at 1024^2.
        ((2048, 2048), (8, 8), NEURALOP_DEFAULTS),
    ],
    ids=["2d", "3d+time", "2d-neuralop"],
)
def test_streaming_forward_peaks_within_1_3x_of_the_floor(shape, modes, options):
    """One rank: the input, the output, one width-20 activation and the parameters at the floor (without
    streaming 1.75x at 1024^2; neuraloperator's blocks 4.8 fields more). Measured on a fresh model, its
    resident buffers included."""
    torch.manual_seed(0)
    model = FNO(5, 5, 20, modes, **options)
    x = torch.randn(1, 5, *shape)
    empty_cache()
    with torch.no_grad(), LiveBytes() as counted:
        y = model(x)
    assert y.shape == (1, 5, *shape)
    assert counted.peak <= 1.3 * _floor_bytes(model, x), counted.peak / _floor_bytes(model, x)


def test_streaming_keeps_one_resident_field():
    """After a forward the FNO holds one field of ``width`` channels (and chunk-sized buffers), in the
    activations' precision."""
    for activations, itemsize in ((None, 4), (torch.bfloat16, 2)):
        model = FNO(3, 2, 8, (4, 4), n_layers=3, activations=activations)
        with torch.no_grad():
            model(torch.randn(2, 3, 1024, 512))  # 32 MB a field of width 8: slabs of 16 MB
        fields = [t for t in model.executor.resident() if t.numel() >= 2 * 8 * 1024 * 512]
        assert [(t.numel(), t.element_size()) for t in fields] == [(2 * 8 * 1024 * 512, itemsize)]


@pytest.mark.parametrize("method", drift.nn.METHODS)
@pytest.mark.parametrize(("shape", "modes"), [((64, 48), (6, 6)), ((16, 16, 8, 12), (4, 4, 4, 6))], ids=["2d", "4d"])
def test_bf16_activations_are_within_their_rounding(method, shape, modes):
    """Fields between blocks in bfloat16 (8 bits of mantissa: 2e-3 per value), float32 in and out."""
    torch.manual_seed(1)
    model = FNO(5, 5, 20, modes, method=method)
    x = torch.randn(1, 5, *shape)
    before = x.clone()
    with torch.no_grad():
        y = model(x)
        model.activations = torch.bfloat16
        y_bf16 = model(x)
    assert y_bf16.dtype == torch.float32 and torch.equal(x, before)
    assert 1e-4 < rel_err(y_bf16, y) < 2e-2


def test_bf16_activations_on_a_mesh(ranks):
    grid, shape, modes = MESHES["4d-pencil4"]
    for recorded, streamed, _, untouched in ranks.run(4, _forwards, grid, shape, modes, "drift", torch.bfloat16):
        assert untouched and rel_err(streamed, recorded) < 2e-2


def test_activations_must_be_a_floating_dtype():
    with pytest.raises(ValueError, match="activations"):
        FNO(3, 2, 8, (4, 4), activations=torch.int8)


@pytest.mark.parametrize("options", [{}, NEURALOP_DEFAULTS], ids=["plain", "neuralop"])
def test_an_empty_batch_passes_through(options):
    # A data-parallel rank's share of a last, short test batch can be empty.
    model = FNO(3, 2, 8, (4, 4), **options)
    with torch.no_grad():
        assert model(torch.randn(0, 3, 16, 16)).shape == (0, 2, 16, 16)
