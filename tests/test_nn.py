"""SpectralConv and FNO: every method on every mesh computes the single-device function of the same weights."""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist
from harness import device_for
from reference import TOL, random_tensor, rel_err, truncated_spectrum, zero_filled_inverse
from torch.distributed.tensor import DTensor, Replicate, Shard

import drift
from drift.cost import Machine, choose_method, method_costs
from drift.layout import to_dtensor
from drift.nn import FNO, SpectralConv, clip_grad_norm_, parallelize
from drift.truncated import _contraction as contraction

_MESHES: dict = {}


def _mesh(grid=None, data: int = 0):
    """This worker's mesh (made once per process) and the placements of ``(batch, channels, *spatial)``
    inputs: spatial dim i over ``grid[i]`` ranks, and with ``data`` a data-parallel mesh dim first."""
    key = (tuple(grid or ()), data)
    if key not in _MESHES:
        device = device_for(dist.get_rank()).type
        if data:
            from torch.distributed.device_mesh import init_device_mesh

            spatial = [(i, p) for i, p in enumerate(grid) if p > 1] or [(0, 1)]
            mesh = init_device_mesh(device, (data, *(p for _, p in spatial)))
            placements = (Shard(0), *(Shard(2 + i) for i, _ in spatial))
        else:
            mesh, placements = drift.grid_mesh(grid, device)
            placements = tuple(Shard(p.dim + 2) if isinstance(p, Shard) else p for p in placements)
        _MESHES[key] = mesh, placements
    return _MESHES[key]


def _distribute(x: torch.Tensor, mesh, placements, device) -> tuple[DTensor, torch.Tensor]:
    """A DTensor of ``x`` (given whole on every rank) and its local block, a leaf that records its gradient."""
    from torch.distributed.tensor import distribute_tensor

    local = distribute_tensor(x.to(device), mesh, placements, src_data_rank=None).to_local()
    local = local.detach().clone().requires_grad_(True)
    return to_dtensor(local, mesh, placements, x.shape), local


def _whole(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's full value (a plain tensor as it is), detached on the CPU."""
    return (t.full_tensor() if isinstance(t, DTensor) else t).detach().cpu()


def _full(local: torch.Tensor, like: DTensor) -> torch.Tensor:
    return to_dtensor(local, like.device_mesh, like.placements, like.shape).full_tensor()


def reference_conv(x, w, modes, shape, real):
    """The single-device spectral convolution: rfftn, keep the modes, mix channels, zero-fill, irfftn."""
    spec = truncated_spectrum(x, modes, real, "backward")
    return zero_filled_inverse(torch.einsum("bi...,io...->bo...", spec, w), modes, shape, real, "backward")


def reference_fno(model: FNO, x: torch.Tensor) -> torch.Tensor:
    """Li et al.'s FNO formula with ``model``'s (single-device) parameters, on torch.fft, in float64;
    autograd differentiates it with respect to them."""

    def pointwise(layer, t):
        bias = layer.bias.double().view(-1, *[1] * (t.dim() - 2))
        return torch.einsum("oi,bi...->bo...", layer.weight.double(), t) + bias

    x = pointwise(model.lift, x.double())
    for i, block in enumerate(model.blocks):
        modes = block.spectral.modes_at(x.shape[2:])
        k = reference_conv(x, block.spectral.weight.to(torch.complex128), modes, x.shape[2:], True)
        x = k + pointwise(block.skip, x)
        if i < len(model.blocks) - 1:
            x = torch.nn.functional.gelu(x)
    return pointwise(model.project_out, torch.nn.functional.gelu(pointwise(model.project_hidden, x)))


def _loss(out, seed):
    """A rank's loss: a fixed random linear functional of its (real or complex) output block."""
    real = torch.view_as_real(out) if out.is_complex() else out
    return (real * random_tensor(real.shape, torch.float64, seed).to(real.device)).sum()


def _check_conv(shape, grid, modes, method, real, dtype):
    rank, device = dist.get_rank(), device_for(dist.get_rank())
    torch.manual_seed(5)
    layer = SpectralConv(3, 2, modes, method=method, real=real, dtype=dtype, device=device)
    w = layer.weight.detach().cpu().clone()
    torch.manual_seed(5)
    # Exact: this process draws both; parallelize and load_state_dict then move values, computing none.
    assert torch.equal(w, drift.nn.spectral_weight(3, 2, layer.mode_shape, dtype)), "the seed draws the weight"
    mesh, placements = _mesh(grid)
    parallelize(layer, mesh, placements)
    assert torch.equal(layer.weight.full_tensor().cpu(), w), "parallelize keeps the weight"
    x = random_tensor((2, 3, *shape), torch.float64, 6, complex_=not real).to(
        real and drift._plan.real_dtype(w.dtype) or w.dtype
    )
    xd, x_local = _distribute(x, mesh, placements, device)
    with drift.comm_log() as log:
        y = layer(xd)
    assert isinstance(y, DTensor) and y.placements == xd.placements and y.shape == (2, 2, *shape)
    _loss(y.to_local().double() if real else y.to_local().to(torch.complex128), 100 + rank).backward()

    wide = torch.complex128 if x.is_complex() else torch.float64
    x_ref, w_ref = x.to(wide).requires_grad_(True), w.to(torch.complex128).requires_grad_(True)
    full = reference_conv(x_ref, w_ref, layer.modes_at(shape), shape, real)
    assert rel_err(y.full_tensor(), full) <= TOL[dtype]
    # The reference loss: every rank's functional of its own block, summed.
    layout = drift.Layout(shape, mesh, [Shard(p.dim - 2) if isinstance(p, Shard) else p for p in placements])
    coords = [None] * dist.get_world_size()
    dist.all_gather_object(coords, layout.local_slices)
    sum(_loss(full[(..., *b)], 100 + r) for r, b in enumerate(coords)).backward()
    assert rel_err(_full(x_local.grad, xd), x_ref.grad) <= TOL[dtype]
    assert rel_err(layer.weight.grad.full_tensor(), w_ref.grad) <= TOL[dtype]

    # A single-device state dict loads into the parallelized layer and reads back whole.
    w2 = random_tensor((3, 2, *layer.mode_shape), torch.float64, 7, complex_=True).to(w.dtype)
    layer.load_state_dict({"weight": w2})
    assert torch.equal(layer.weight.full_tensor().cpu(), w2)
    return log.kinds(), log.bytes


CONV_CASES = [
    ((12, 10), (2, 1), (3, 3), True),
    ((10, 12), (1, 2), (2, 4), False),
    ((9, 8, 6), (3, 1, 1), (2, 2, 3), True),
    ((5, 8, 6), (4, 1, 1), (2, 2, 3), True),  # uneven and empty shards: 5 over 4 is 2, 2, 1, 0
    ((8, 9, 6), (2, 2, 1), (2, [0, 3, -2], 2), True),
    ((6, 5, 4, 6), (1, 2, 1, 2), (2, 2, 1, 3), True),
    ((7, 6, 5, 6), (2, 1, 2, 1), (2, 2, 2, 2), False),
]


@pytest.mark.parametrize("method", drift.nn.METHODS)
@pytest.mark.parametrize("case", CONV_CASES, ids=lambda c: f"{'x'.join(map(str, c[0]))}-grid{'x'.join(map(str, c[1]))}")
def test_spectral_conv_matches_single_device(ranks, case, method):
    shape, grid, modes, real = case
    dtype = torch.float32 if len(shape) == 3 else torch.float64
    results = ranks.run(math.prod(grid), _check_conv, shape, grid, modes, method, real, dtype)
    kinds = results[0][0]
    if method == "drift":
        split = len([p for p in grid if p > 1])  # one reduce-scatter, then one all-gather, per spatial mesh dim
        assert kinds == ["reduce_scatter"] * split + ["all_gather"] * split
    else:
        assert kinds and set(kinds) == {"all_to_all"}


def test_single_device_conv_matches_reference():
    """The plain module on one device, no process group: the formula, and no collective."""
    torch.manual_seed(0)
    layer = SpectralConv(3, 2, (3, [0, 2, -1], 2), dtype=torch.float64)
    x = random_tensor((2, 3, 12, 7, 6), torch.float64, 1)
    with drift.comm_log() as log:
        y = layer(x)
    assert log.calls == []
    want = reference_conv(x, layer.weight.detach(), layer.modes_at((12, 7, 6)), (12, 7, 6), True)
    assert rel_err(y, want) <= 1e-12


def _drift_bytes(shape):
    torch.manual_seed(1)
    layer = SpectralConv(4, 4, (2, 2, 3))
    mesh, placements = _mesh((4, 1, 1))
    parallelize(layer, mesh, placements)
    x, _ = _distribute(torch.randn(2, 4, *shape), mesh, placements, device_for(dist.get_rank()))
    with drift.comm_log() as log:
        layer(x)
    return [(c.kind, c.bytes) for c in log.calls], layer.mode_shape


def test_drift_payload_depends_on_modes_not_grid(ranks):
    small = ranks.run(4, _drift_bytes, (12, 10, 8))
    large = ranks.run(4, _drift_bytes, (48, 40, 30))
    assert small == large
    calls, (k1, k2, k3) = small[0]
    padded_share = -(-k1 // 4) * k2 * k3  # a chunk of the first mode dim, padded to the largest chunk
    # reduce-scatter of 2 samples x 4 channels x 4 padded shares, all-gather of one share (complex64)
    assert calls == [("reduce_scatter", 4 * 2 * 4 * padded_share * 8), ("all_gather", 2 * 4 * padded_share * 8)]


def _fno_forward(shape, grid, data, method):
    rank, device = dist.get_rank(), device_for(dist.get_rank())
    torch.manual_seed(3)
    model = FNO(2, 1, 6, (2, 2, 3), n_layers=2, method=method, dtype=torch.float64, device=device)
    mesh, placements = _mesh(grid, data)
    parallelize(model, mesh, placements)
    x = random_tensor((2, 2, *shape), torch.float64, 8)
    xd, _ = _distribute(x, mesh, placements, device)
    with torch.no_grad():
        unrecorded = model(xd).full_tensor().cpu()
    y = model(xd)
    _loss(y.to_local(), 200 + rank).backward()
    grads = {n: _whole(p.grad) for n, p in model.named_parameters()}
    state = {k: _whole(v) for k, v in model.state_dict().items()}
    layout = drift.Layout((2, 1, *shape), mesh, placements)  # this rank's block of the output
    return y.full_tensor().detach().cpu(), grads, state, (layout.local_slices, rank), unrecorded


@pytest.mark.parametrize(
    ("grid", "data", "method"),
    [
        ((2, 1, 1), 0, "drift"),
        ((1, 2, 2), 0, "drift"),
        ((2, 2, 1), 0, "dfno"),
        ((3, 1, 1), 0, "dfno-pruned"),
        ((2, 1, 1), 2, "drift"),  # 2 data x 2 spatial
        ((2, 1, 1), 2, "dfno-pruned"),
    ],
)
def test_fno_is_the_same_function_on_every_mesh(ranks, grid, data, method):
    shape = (9, 8, 6)
    torch.manual_seed(3)
    single = FNO(2, 1, 6, (2, 2, 3), n_layers=2, dtype=torch.float64)
    x = random_tensor((2, 2, *shape), torch.float64, 8)
    y_ref = single(x)
    assert rel_err(y_ref, reference_fno(single, x)) <= 1e-12
    results = ranks.run(math.prod(grid) * max(data, 1), _fno_forward, shape, grid, data, method)
    sum(_loss(y_ref[slices], 200 + r) for _, _, _, (slices, r), _ in results).backward()
    for y, grads, state, _, unrecorded in results:
        assert rel_err(y, y_ref) <= 1e-12 and rel_err(unrecorded, y_ref) <= 1e-12
        for name, p in single.named_parameters():
            assert rel_err(grads[name], p.grad) <= 1e-12, name
        for name, value in single.state_dict().items():  # drawn in the rank's process: to round-off
            assert rel_err(state[name], value) <= 1e-12, name


def _clipped(grid, data, max_norm, norm_type):
    rank, device = dist.get_rank(), device_for(dist.get_rank())
    torch.manual_seed(3)
    model = FNO(2, 1, 6, (2, 2, 3), n_layers=2, dtype=torch.float64, device=device)
    mesh, placements = _mesh(grid, data)
    parallelize(model, mesh, placements)
    xd, _ = _distribute(random_tensor((2, 2, 9, 8, 6), torch.float64, 8), mesh, placements, device)
    _loss(model(xd).to_local(), 200 + rank).backward()
    norm = clip_grad_norm_(model.parameters(), max_norm, norm_type)
    layout = drift.Layout((2, 1, 9, 8, 6), mesh, placements)
    return norm.item(), {n: _whole(p.grad) for n, p in model.named_parameters()}, (layout.local_slices, rank)


@pytest.mark.parametrize(("grid", "data", "norm_type"), [((2, 1, 1), 2, 2.0), ((1, 2, 2), 0, math.inf)])
def test_clip_grad_norm_of_a_parallelized_model_is_torch_s_of_one_process(ranks, grid, data, norm_type):
    """Sharded spectral weights and replicated parameters together: the global norm, and the same
    clipped gradients as ``torch.nn.utils.clip_grad_norm_`` on one process (which refuses the mix)."""
    max_norm = 1e-3
    results = ranks.run(math.prod(grid) * max(data, 1), _clipped, grid, data, max_norm, norm_type)
    torch.manual_seed(3)
    single = FNO(2, 1, 6, (2, 2, 3), n_layers=2, dtype=torch.float64)
    y_ref = single(random_tensor((2, 2, 9, 8, 6), torch.float64, 8))
    sum(_loss(y_ref[slices], 200 + r) for _, _, (slices, r) in results).backward()
    want = torch.nn.utils.clip_grad_norm_(single.parameters(), max_norm, norm_type).item()
    assert want > 10 * max_norm  # the gradients are clipped
    for norm, grads, _ in results:
        assert abs(norm - want) <= 1e-12 * want
        for name, p in single.named_parameters():
            assert rel_err(grads[name], p.grad) <= 1e-12, name


def _channel_mlp_on_a_y_split(method):
    device = device_for(dist.get_rank())
    mesh, placements = _mesh((1, 2, 1))
    torch.manual_seed(3)
    model = FNO(2, 1, 6, (2, 2, 3), 2, method=method, use_channel_mlp=True, dtype=torch.float64, device=device)
    parallelize(model, mesh, placements)
    with torch.no_grad():
        x, _ = _distribute(random_tensor((2, 2, 9, 8, 6), torch.float64, 8), mesh, placements, device)
        return model(x).full_tensor().cpu()


@pytest.mark.parametrize("method", ["dfno", "dfno-pruned"])
def test_unrecorded_blocks_take_a_strided_spectral_output(ranks, method):
    """On a y split the dfno methods return strided blocks; a block outside autograd (no resident output
    buffer with a channel MLP) writes its pointwise part and activation into a contiguous copy of it."""
    torch.manual_seed(3)
    single = FNO(2, 1, 6, (2, 2, 3), 2, method=method, use_channel_mlp=True, dtype=torch.float64)
    want = single(random_tensor((2, 2, 9, 8, 6), torch.float64, 8))  # recorded: no block written in place
    for y in ranks.run(2, _channel_mlp_on_a_y_split, method):
        assert rel_err(y, want) <= 1e-12


def _train_steps(grid, data, state, steps):
    """``steps`` Adam steps of the parallelized model from ``state``; the final state, whole."""
    device = device_for(dist.get_rank())
    model = FNO(2, 1, 6, (2, 2, 3), n_layers=2, dtype=torch.float64, device=device)
    model.load_state_dict(state)
    mesh, placements = _mesh(grid, data)
    parallelize(model, mesh, placements)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for step in range(steps):
        x, _ = _distribute(random_tensor((4, 2, 9, 8, 6), torch.float64, 20 + step), mesh, placements, device)
        target, _ = _distribute(random_tensor((4, 1, 9, 8, 6), torch.float64, 40 + step), mesh, placements, device)
        loss = ((model(x) - target) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return {k: _whole(v) for k, v in model.state_dict().items()}


@pytest.mark.parametrize(("grid", "data"), [((2, 1, 1), 2), ((2, 2, 1), 0)])
def test_data_x_spatial_training_equals_one_process(ranks, grid, data):
    torch.manual_seed(6)
    single = FNO(2, 1, 6, (2, 2, 3), n_layers=2, dtype=torch.float64)
    state = {k: v.clone() for k, v in single.state_dict().items()}
    optimizer = torch.optim.Adam(single.parameters(), lr=1e-2)
    for step in range(3):
        x = random_tensor((4, 2, 9, 8, 6), torch.float64, 20 + step)
        target = random_tensor((4, 1, 9, 8, 6), torch.float64, 40 + step)
        loss = ((single(x) - target) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    results = ranks.run(math.prod(grid) * max(data, 1), _train_steps, grid, data, state, 3)
    for trained in results:
        for name, value in single.state_dict().items():
            assert rel_err(trained[name], value) <= 1e-12, name


def _pencil_in_data(state):
    """2 data x (2 x 1) spatial: a 3-D mesh whose last dim has one rank."""
    from torch.distributed.device_mesh import init_device_mesh

    device = device_for(dist.get_rank())
    key = ("pencil-in-data",)
    if key not in _MESHES:
        _MESHES[key] = init_device_mesh(device.type, (2, 2, 1)), (Shard(0), Shard(2), Shard(3))
    mesh, placements = _MESHES[key]
    model = FNO(2, 1, 6, (2, 2, 3), n_layers=2, dtype=torch.float64, device=device)
    model.load_state_dict(state)
    parallelize(model, mesh, placements)
    x, _ = _distribute(random_tensor((4, 2, 9, 8, 6), torch.float64, 20), mesh, placements, device)
    loss = (model(x) ** 2).mean()
    loss.backward()
    return {n: _whole(p.grad) for n, p in model.named_parameters()}


def test_pencil_in_data_gradients_equal_one_process(ranks):
    torch.manual_seed(6)
    single = FNO(2, 1, 6, (2, 2, 3), n_layers=2, dtype=torch.float64)
    state = {k: v.clone() for k, v in single.state_dict().items()}
    (single(random_tensor((4, 2, 9, 8, 6), torch.float64, 20)) ** 2).mean().backward()
    for grads in ranks.run(4, _pencil_in_data, state):
        for name, p in single.named_parameters():
            assert rel_err(grads[name], p.grad) <= 1e-12, name


@torch.no_grad()
def _super_resolution(state, size):
    device = device_for(dist.get_rank())
    model = FNO(2, 1, 4, (3, 3, 3), n_layers=2, dtype=torch.float64, device=device)
    model.load_state_dict(state)
    x = random_tensor((1, 2, 32, 32, 32), torch.float64, 30)
    if size == 1:
        return model(x.to(device)).cpu()
    mesh, placements = _mesh((size, 1, 1))
    parallelize(model, mesh, placements)
    xd, _ = _distribute(x, mesh, placements, device)
    return model(xd).full_tensor().cpu()


def test_super_resolution_trained_coarse_evaluated_fine(ranks):
    """Trained at 16^3 (a few Adam steps), the same weights evaluated at 32^3 on 1 and 4 ranks equal the
    FNO formula at 32^3."""
    torch.manual_seed(7)
    model = FNO(2, 1, 4, (3, 3, 3), n_layers=2, dtype=torch.float64)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for step in range(3):
        x = random_tensor((2, 2, 16, 16, 16), torch.float64, 50 + step)
        loss = (model(x) - x[:, :1]).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    want = reference_fno(model, random_tensor((1, 2, 32, 32, 32), torch.float64, 30))
    for size in (1, 4):
        (y,) = ranks.run(size, _super_resolution, state, size)[:1]
        assert rel_err(y, want) <= 1e-12, size


def test_module_conversions_keep_the_forward_exact():
    """``.double()``, ``.to(torch.float64)``, ``.float()`` and ``.to(device)`` convert weights and plans."""
    torch.manual_seed(8)
    x = random_tensor((2, 2, 9, 8, 6), torch.float64, 9)
    for convert in (lambda m: m.double(), lambda m: m.to(torch.float64), lambda m: m.to("cpu", torch.float64)):
        model = FNO(2, 1, 6, (2, 2, 3), n_layers=2, method="drift")
        model(x.float())  # builds the float32 plans first
        convert(model)
        assert model.blocks[0].spectral.weight.dtype == torch.complex128
        assert rel_err(model(x), reference_fno(model, x)) <= 1e-12
    model.float()
    assert model.blocks[0].spectral.weight.dtype == torch.complex64 and model(x.float()).dtype == torch.float32
    assert rel_err(model(x.float()), reference_fno(model, x)) <= 2e-6
    device = device_for(0)
    model.to(device)
    assert all(b.device == device for b in model.buffers())
    with pytest.raises(drift.PlanError, match="the model's parameters are torch.float32"):
        model(x.to(device))
    model.half()
    with pytest.raises(drift.PlanError, match="complex32 weight is not supported.*autocast"):
        model(x.half().to(device))


def test_each_parameter_trained_alone_gets_its_gradient():
    """Fine-tuning a subset (here each parameter alone, the others frozen) gives the gradients of training
    them all: a block runs its recorded path when any of its pointwise parameters trains."""
    torch.manual_seed(12)
    model = FNO(2, 1, 6, (2, 2, 3), n_layers=2, dtype=torch.float64)
    x = random_tensor((2, 2, 9, 8, 6), torch.float64, 13)
    model(x).square().sum().backward()
    every = {name: p.grad.clone() for name, p in model.named_parameters()}
    for name, param in model.named_parameters():
        for p in model.parameters():
            p.requires_grad_(p is param)
            p.grad = None
        model(x).square().sum().backward()
        assert rel_err(param.grad, every[name]) <= 1e-12, name


def test_meta_init_and_shared_memory_keep_complex_weights():
    """``to_empty`` materialises a model built on the meta device, and ``share_memory`` shares its complex
    spectral weights as it does the real parameters."""
    torch.manual_seed(14)
    built = FNO(2, 1, 6, (2, 2, 3), n_layers=2, factorization="tucker", rank=0.5)
    deferred = FNO(2, 1, 6, (2, 2, 3), n_layers=2, factorization="tucker", rank=0.5, device="meta")
    deferred.to_empty(device="cpu").load_state_dict(built.state_dict())
    x = random_tensor((1, 2, 9, 8, 6), torch.float32, 15)
    assert rel_err(deferred(x), built(x)) == 0
    plain = FNO(2, 1, 6, (2, 2, 3), n_layers=1).share_memory()
    assert plain.blocks[0].spectral.weight.is_complex()
    assert all(p.is_shared() for p in [*built.share_memory().parameters(), *plain.parameters()])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_runs_the_transform_in_float32(dtype):
    torch.manual_seed(9)
    model = FNO(2, 1, 8, (3, 3, 3), n_layers=2)
    x = random_tensor((2, 2, 12, 10, 8), torch.float32, 10)
    with torch.autocast("cpu", dtype=dtype):
        y = model(x)
        spectral = model.blocks[0].spectral(model.lift(x))
    assert y.dtype == dtype and spectral.dtype == torch.float32
    # Half-precision pointwise layers: the difference to float32 is at the half precision's scale.
    bound = {torch.bfloat16: 4e-2, torch.float16: 4e-3}[dtype]
    assert rel_err(y.float(), model(x)) <= bound
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(5):
        with torch.autocast("cpu", dtype=dtype):
            loss = (model(x).float() - x[:, :1]).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert all(math.isfinite(v) for v in losses) and losses[-1] < losses[0]


def test_compile_matches_eager():
    torch.manual_seed(10)
    model = FNO(2, 1, 6, (2, 2, 3), n_layers=2)
    x = random_tensor((2, 2, 9, 8, 6), torch.float32, 11)
    eager = model(x)
    compiled = torch.compile(model, backend="aot_eager")(x)
    assert rel_err(compiled, eager) <= 2e-6


COMPILED = {
    "drift": ({}, "aot_eager"),
    "neuralop options": (
        dict(positional_embedding="grid", lifting_channel_ratio=2, use_channel_mlp=True, norm="instance_norm"),
        "eager",
    ),
    "dfno-pruned, tucker": (dict(method="dfno-pruned", factorization="tucker", rank=0.5), "eager"),
}


@pytest.mark.parametrize("case", COMPILED.values(), ids=COMPILED.keys())
def test_compile_traces_the_model_as_one_graph(case):
    """After an eager call at the resolution (which builds its plans), ``torch.compile(fullgraph=True)``
    traces the model whole, recorded and unrecorded, with the eager values and gradients; "aot_eager"
    traces the backward too."""
    options, backend = case
    torch.manual_seed(10)
    model = FNO(2, 1, 6, (2, 2, 3), n_layers=1, dtype=torch.float64, **options)
    x = random_tensor((2, 2, 9, 8, 6), torch.float64, 11)
    eager = model(x)
    want = torch.autograd.grad(eager.square().sum(), list(model.parameters()))
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    y = compiled(x)
    got = torch.autograd.grad(y.square().sum(), list(model.parameters()))
    with torch.no_grad():
        unrecorded = compiled(x)
    reference = reference_fno(model, x) if not options else eager
    assert rel_err(y, reference) <= 1e-12 and rel_err(unrecorded, reference) <= 1e-12
    scale = max(float(w.norm()) for w in want)
    for (name, _), g, w in zip(model.named_parameters(), got, want, strict=True):
        if w.norm() <= 1e-9 * scale:  # zero but for round-off (a bias right before an instance norm)
            assert g.norm() <= 1e-9 * scale, name
        else:
            assert rel_err(g, w) <= 1e-12, name


def _compiled_on_ranks():
    device = device_for(dist.get_rank())
    mesh, placements = _mesh((2, 1, 1))
    torch.manual_seed(10)
    model = parallelize(FNO(2, 1, 6, (2, 2, 3), n_layers=1, dtype=torch.float64, device=device), mesh, placements)
    x, _ = _distribute(random_tensor((2, 2, 9, 8, 6), torch.float64, 11), mesh, placements, device)
    eager = model(x)
    want = torch.autograd.grad(eager.to_local().square().sum(), list(model.parameters()))
    y = torch.compile(model, backend="aot_eager")(x)
    got = torch.autograd.grad(y.to_local().square().sum(), list(model.parameters()))
    return rel_err(y.full_tensor(), eager.full_tensor()), max(
        rel_err(_whole(g), _whole(w)) for g, w in zip(got, want, strict=True)
    )


def test_compile_on_ranks_matches_eager(ranks):
    """Several ranks: the graph breaks at the collectives, and the values and gradients are eager's."""
    for out, grads in ranks.run(2, _compiled_on_ranks):
        assert out <= 1e-12 and grads <= 1e-12


def _bad_inputs():
    torch.manual_seed(0)
    mesh, placements = _mesh((4, 1, 1))
    model = parallelize(FNO(2, 1, 4, (2, 2, 2), n_layers=1), mesh, placements)
    embedded = parallelize(FNO(2, 1, 4, (2, 2, 2), n_layers=1, positional_embedding="grid"), mesh, placements)
    device = device_for(dist.get_rank())
    x = torch.randn(2, 2, 8, 8, 6)
    errors = {}
    cases = {
        "not parallelized": lambda: FNO(2, 1, 4, (2, 2, 2), n_layers=1)(_distribute(x, mesh, placements, device)[0]),
        "plain": lambda: model(x.to(device)),
        "channels": lambda: model(_distribute(x, mesh, (Shard(1),), device)[0]),
        "placements": lambda: model(_distribute(x, mesh, (Shard(3),), device)[0]),
        "modes": lambda: model(_distribute(torch.randn(2, 2, 3, 8, 6), mesh, placements, device)[0]),
        # Blocks of 3, 3, 1, 1 rows where torch.chunk cuts 2 each, into the grid embedding's concatenation.
        "blocks": lambda: embedded(
            DTensor.from_local(
                x[:, :, :1].repeat(1, 1, [3, 3, 1, 1][dist.get_rank()], 1, 1).to(device),
                mesh,
                placements,
                run_check=False,
                shape=x.shape,
                stride=x.stride(),
            )
        ),
    }
    for name, run in cases.items():
        with drift.comm_log() as log:
            try:
                run()
            except (ValueError, drift.PlanError) as exc:
                errors[name] = f"{type(exc).__name__}: {exc}"
        assert log.calls == [], name
    return errors


def test_bad_inputs_raise_before_any_collective(ranks):
    errors = ranks.run(4, _bad_inputs)[0]
    assert "needs a parallelized module" in errors["not parallelized"]
    assert "give it a DTensor" in errors["plain"]
    assert "placements (Shard(dim=1),)" in errors["channels"]
    assert "placements (Shard(dim=3),)" in errors["placements"]
    assert "resolution (3, 8, 6)" in errors["modes"] and "2k = 4 exceeds the extent 3" in errors["modes"]
    assert "PlanError: expected a block ending in (2, 8, 6), got shape (2, 2, " in errors["blocks"]


def test_bad_parallelize_placements(ranks):
    assert ranks.run(2, _bad_parallelize) == [True, True]


def _bad_parallelize():
    mesh, _ = _mesh((2, 1, 1))
    for placements, match in [
        ((Shard(1),), "mesh dim 0 .* has placement Shard\\(dim=1\\)"),
        ((Replicate(),), "mesh dim 0 .* has placement Replicate"),
        ((Shard(2), Shard(3)), "need one entry per dim"),
        ((Shard(5),), "Shard\\(dim=5\\) is out of range for inputs of 5 dims"),
    ]:
        with pytest.raises(ValueError, match=match):
            parallelize(FNO(1, 1, 4, (2, 2, 2), n_layers=1), mesh, placements)
    model = parallelize(FNO(1, 1, 4, (2, 2, 2), n_layers=1), mesh, (Shard(2),))
    with pytest.raises(ValueError, match="already parallelized"):
        parallelize(model, mesh, (Shard(2),))
    return True


def test_bad_layer_arguments():
    with pytest.raises(ValueError, match="method must be one of"):
        SpectralConv(2, 2, (2, 2), method="fft")
    with pytest.raises(ValueError, match=r"one entry per spatial dim \(1 to 4 dims\)"):
        SpectralConv(2, 2, (1,) * 5)
    with pytest.raises(ValueError, match=r"one entry per spatial dim \(1 to 4 dims\), got 2"):
        SpectralConv(2, 2, 2)
    with pytest.raises(ValueError, match="k = 0 must be at least 1"):
        SpectralConv(2, 2, (2, 0))
    layer = SpectralConv(2, 3, (2, 2))
    with pytest.raises(ValueError, match=r"expects \(batch, 2, 2 spatial dims\)"):
        layer(torch.randn(1, 3, 8, 8))
    with pytest.raises(drift.PlanError, match=r"resolution \(3, 8\).*2k = 4 exceeds the extent 3"):
        layer(torch.randn(1, 2, 3, 8))
    with pytest.raises(RuntimeError, match="size mismatch for weight"):
        layer.load_state_dict({"weight": torch.zeros(2, 3, 4, 3, dtype=torch.complex64)})


def test_plans_are_cached_per_resolution():
    torch.manual_seed(0)
    layer = SpectralConv(2, 2, (2, 2), dtype=torch.float64)
    for n in (8, 9, 10, 11, 8, 12):
        x = random_tensor((1, 2, n, 6), torch.float64, n)
        want = reference_conv(x, layer.weight.detach(), layer.modes_at((n, 6)), (n, 6), True)
        assert rel_err(layer(x), want) <= 1e-12
    # At most MAX_PLANS, the least recently used dropped first.
    assert list(layer.plans.keys()) == ["10x6_rr", "11x6_rr", "8x6_rr", "12x6_rr"]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_channel_mixing_and_its_gradients_match_einsum(dtype):
    """mix_channels's own backward (both gradients as vectorised multiply-adds) equals autograd of einsum,
    and its backward is differentiable (gradgradcheck)."""
    from drift.nn.spectral import mix_channels

    cdtype = torch.complex128 if dtype == torch.float64 else torch.complex64
    x = random_tensor((3, 4, 5, 2, 3), dtype, 12, complex_=True).to(cdtype).requires_grad_(True)
    w = random_tensor((4, 6, 5, 2, 3), dtype, 13, complex_=True).to(cdtype).requires_grad_(True)
    g = random_tensor((3, 6, 5, 2, 3), dtype, 14, complex_=True).to(cdtype)
    y = mix_channels(x, w)
    ref = torch.einsum("bi...,io...->bo...", x, w)
    for got, want in zip(torch.autograd.grad(y, (x, w), g), torch.autograd.grad(ref, (x, w), g), strict=True):
        assert rel_err(got, want) <= TOL[dtype]
    assert rel_err(y, ref) <= TOL[dtype]
    empty = x[:0].detach().requires_grad_(True)  # a data-parallel rank without a trajectory of the batch
    mix_channels(empty, w).sum().abs().backward()
    assert empty.grad.shape == empty.shape and torch.equal(w.grad, torch.zeros_like(w))  # no term: exactly 0
    if dtype == torch.float64:
        small = (x[:2, :2, :2].detach().requires_grad_(True), w[:2, :3, :2].detach().requires_grad_(True))
        assert torch.autograd.gradcheck(mix_channels, small) and torch.autograd.gradgradcheck(mix_channels, small)


@pytest.mark.parametrize("modes", [(2, 2, 3), ([1, -1], 2, 3)], ids=["with-dc", "without-dc"])
@pytest.mark.parametrize("method", drift.nn.METHODS)
def test_spectral_conv_into_a_preallocated_tensor(method, modes):
    """``forward_local(out=, constant=)``: the convolution plus its bias and ``constant`` at every point;
    "drift" adds both to the constant mode when it is kept (``folds_constants``), the others add them."""
    torch.manual_seed(6)
    conv = SpectralConv(2, 3, modes, method=method, bias=True, dtype=torch.float64)
    x = random_tensor((2, 2, 9, 8, 6), torch.float64, 11)
    constant = random_tensor((3,), torch.float64, 12)
    expected = conv(x)
    layout = drift.Layout((9, 8, 6))
    assert conv.folds_constants(layout) == (method == "drift" and modes[0] == 2)
    out = torch.full_like(expected, float("nan")).detach()
    with torch.no_grad():
        assert conv.forward_local(x, layout, out=out) is out
        assert rel_err(out, expected) <= 1e-12
        assert conv.forward_local(x, layout, out=out, constant=constant) is out
        assert rel_err(out, expected + constant.view(-1, 1, 1, 1)) <= 1e-12
        with pytest.raises(drift.PlanError, match="constant= is for outputs written into out="):
            conv.forward_local(x, layout, constant=constant)
    if method == "drift" and modes[0] != 2:
        with pytest.raises(drift.PlanError, match="lack frequency 0"):
            conv.plan(layout).add_constant_(torch.zeros(1, 3, *conv.mode_shape, dtype=torch.complex128), constant)


@pytest.mark.parametrize("non_linearity", [torch.nn.functional.gelu, torch.tanh], ids=["gelu", "tanh"])
def test_fno_without_autograd_matches(monkeypatch, non_linearity):
    """Unrecorded, the blocks overwrite one resident activation in place, drift's inverse through a slab
    buffer (``drift.nn.streaming``), and the projection runs through three resident buffers (its input over
    a row of ones, its hidden layer, its output), in chunks (here pieces of 5 points, one a thread, a
    ragged last chunk); outputs never alias those buffers."""
    import drift.nn.chunked as chunked

    torch.manual_seed(4)
    model = FNO(2, 1, 6, (2, 2, 3), n_layers=3, dtype=torch.float64, non_linearity=non_linearity)
    x = random_tensor((2, 2, 9, 8, 6), torch.float64, 9)
    monkeypatch.setattr(chunked, "PIECE_BYTES", model.project_hidden.weight.shape[0] * 8 * 5)
    recorded = model(x)
    with torch.no_grad():
        unrecorded = model(x)
        buffers = [b.data_ptr() for b in model.executor.resident()]
        again = model(2 * x)
        assert [b.data_ptr() for b in model.executor.resident()] == buffers and len(buffers) == 5
    with torch.inference_mode():
        inference = model(x)
    model(x)  # a recorded forward releases the resident buffers
    assert not model.executor.resident()
    assert recorded.requires_grad and not unrecorded.requires_grad
    assert rel_err(unrecorded, recorded) <= 1e-12 and rel_err(inference, recorded) <= 1e-12
    assert rel_err(again, model(2 * x)) <= 1e-12 and not torch.equal(again, unrecorded)
    if non_linearity is torch.nn.functional.gelu:
        assert rel_err(unrecorded, reference_fno(model, x)) <= 1e-12
    model.float()
    with torch.no_grad():
        assert rel_err(model(x.float()), recorded) <= 2e-6


def test_chunks_cut_into_one_piece_a_thread():
    """A chunk's step rounds down to a multiple of the pieces (at least one point each), so that every
    full chunk is cut into one piece a thread; a ragged last chunk they do not divide is one piece."""
    from drift.nn.chunked import _pieces

    assert list(_pieces(23, 10, 3)) == [(0, 9, 3), (9, 9, 3), (18, 5, 1)]
    assert list(_pieces(24, 10, 3)) == [(0, 9, 3), (9, 9, 3), (18, 6, 3)]
    assert list(_pieces(8, 2, 4)) == [(0, 4, 4), (4, 4, 4)]
    assert list(_pieces(7, 5, 1)) == [(0, 5, 1), (5, 2, 1)]


@pytest.mark.parametrize("parts", [None, 3], ids=["threads", "3-pieces"])
@pytest.mark.parametrize("non_linearity", [torch.nn.functional.gelu, torch.tanh], ids=["gelu", "tanh"])
def test_projection_in_chunks_matches_forward_and_backward(monkeypatch, non_linearity, parts):
    """The projection runs a chunk of points at a time (here pieces of 7 points, one a thread: as many as
    torch's threads, or 3), forward and backward (recomputed)."""
    import drift.nn.chunked as chunked

    torch.manual_seed(5)
    model = FNO(2, 3, 6, (2, 2, 3), n_layers=1, dtype=torch.float64, non_linearity=non_linearity)
    x = random_tensor((2, 2, 9, 8, 6), torch.float64, 10).requires_grad_(True)
    monkeypatch.setattr(chunked, "PIECE_BYTES", 3 * model.project_hidden.weight.shape[0] * 8 * 7)
    if parts:
        monkeypatch.setattr(chunked, "_parts", lambda device: parts)
    y = model(x)
    _loss(y, 7).backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    grad_x = x.grad.clone()

    def reference(model, x):  # the same model, the projection written out on whole tensors
        z = model.lift(x)
        for block in model.blocks:
            z = block.forward_local(z, drift.Layout(x.shape[2:]))
        hidden = torch.einsum("oi,bi...->bo...", model.project_hidden.weight, z)
        hidden = hidden + model.project_hidden.bias.view(-1, 1, 1, 1)
        out = torch.einsum("oi,bi...->bo...", model.project_out.weight, non_linearity(hidden))
        return out + model.project_out.bias.view(-1, 1, 1, 1)

    model.zero_grad()
    x.grad = None
    y_ref = reference(model, x)
    _loss(y_ref, 7).backward()
    assert rel_err(y, y_ref) <= 1e-12 and rel_err(grad_x, x.grad) <= 1e-12
    for name, p in model.named_parameters():
        assert rel_err(grads[name], p.grad) <= 1e-12, name
    if non_linearity is torch.nn.functional.gelu:
        assert rel_err(y, reference_fno(model, x.detach())) <= 1e-12
    with torch.no_grad():
        assert rel_err(model(x), y_ref) <= 1e-12


def _convert_parallelized(state):
    """A parallelized float32 model (its plans built) converted by ``.double()``: exact in float64."""
    device = device_for(dist.get_rank())
    model = FNO(2, 1, 6, (2, 2, 3), n_layers=2, device=device)
    model.load_state_dict(state)
    mesh, placements = _mesh((2, 1, 1))
    parallelize(model, mesh, placements)
    x = random_tensor((2, 2, 9, 8, 6), torch.float64, 12)
    with torch.no_grad():
        model(_distribute(x.float(), mesh, placements, device)[0])
        model.double()
        y = model(_distribute(x, mesh, placements, device)[0])
    weight = model.blocks[0].spectral.weight
    assert isinstance(weight, DTensor) and weight.dtype == torch.complex128
    return _whole(y)


def test_parallelized_model_converts_exactly(ranks):
    torch.manual_seed(13)
    single = FNO(2, 1, 6, (2, 2, 3), n_layers=2)
    state = {k: v.clone() for k, v in single.state_dict().items()}
    single.double()
    want = reference_fno(single, random_tensor((2, 2, 9, 8, 6), torch.float64, 12))
    for y in ranks.run(2, _convert_parallelized, state):
        assert rel_err(y, want) <= 1e-12


def test_plans_built_in_inference_mode_serve_training():
    """A recorded pass through plans first built under ``inference_mode`` gives the output and the
    gradients (the input's and every parameter's) of Li et al.'s formula differentiated by autograd."""
    torch.manual_seed(14)
    for method in drift.nn.METHODS:
        model = FNO(2, 1, 6, (2, 2, 3), n_layers=2, method=method, dtype=torch.float64)
        x = random_tensor((2, 2, 9, 8, 6), torch.float64, 15)
        with torch.inference_mode():
            model(x)  # the plans are first built here
        x.requires_grad_(True)
        y = model(x)
        _loss(y, 16).backward()
        grads, grad_x = {name: p.grad.clone() for name, p in model.named_parameters()}, x.grad.clone()
        model.zero_grad()
        x.grad = None
        y_ref = reference_fno(model, x)
        _loss(y_ref, 16).backward()
        assert rel_err(y, y_ref) <= 1e-12 and rel_err(grad_x, x.grad) <= 1e-12, method
        for name, p in model.named_parameters():
            assert rel_err(grads[name], p.grad) <= 1e-12, (method, name)


def test_layers_follow_the_default_dtype():
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        model = FNO(2, 1, 6, (2, 2, 3), n_layers=1)
    finally:
        torch.set_default_dtype(before)
    assert model.lift.weight.dtype == torch.float64 and model.blocks[0].spectral.weight.dtype == torch.complex128


def test_half_precision_inputs_outside_autocast_say_so():
    model = FNO(2, 1, 6, (2, 2, 3), n_layers=1).bfloat16()
    with pytest.raises(drift.PlanError, match="torch.bfloat16 input outside torch.autocast.*use torch.autocast"):
        model(torch.randn(1, 2, 9, 8, 6, dtype=torch.bfloat16))


def _pruned_any_resolution():
    """dfno-pruned over 4 ranks splitting the real last dim, at resolutions whose middle dim is shorter
    than the rank count: the same weight placements at every resolution."""
    device = device_for(dist.get_rank())
    torch.manual_seed(16)
    layer = SpectralConv(2, 2, (2, 1, 2), method="dfno-pruned", dtype=torch.float64, device=device)
    w = layer.weight.detach().cpu().clone()
    mesh, _ = _mesh((1, 1, 4))
    parallelize(layer, mesh, (Shard(-1),))  # a negative dim, as DTensor allows
    errors = []
    for shape in ((8, 2, 8), (8, 3, 8), (16, 12, 16)):
        x = random_tensor((2, 2, *shape), torch.float64, 17)
        y = layer(_distribute(x, mesh, (Shard(4),), device)[0])
        errors.append(rel_err(y.full_tensor(), reference_conv(x, w, layer.modes_at(shape), shape, True)))
    return errors


def test_dfno_pruned_runs_at_any_resolution_that_holds_the_modes(ranks):
    for errors in ranks.run(4, _pruned_any_resolution):
        assert max(errors) <= 1e-12, errors


def _unhandled_parameter():
    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fno = FNO(1, 1, 4, (2, 2, 2), n_layers=1)
            self.gain = torch.nn.Parameter(torch.ones(()))

    mesh, _ = _mesh((2, 1, 1))
    with pytest.raises(ValueError, match="neither synchronised nor reduced: gain"):
        parallelize(Scaled(), mesh, (Shard(2),))
    return True


def test_parallelize_refuses_parameters_it_cannot_reduce(ranks):
    assert ranks.run(2, _unhandled_parameter) == [True, True]


# method="auto": the cost model's choice, and the function of the chosen method.

CPU = Machine.default("cpu")


@pytest.mark.parametrize("machine", [Machine.default("cpu"), Machine.default("cuda")], ids=["cpu", "cuda"])
def test_auto_picks_drift_for_few_modes_and_dfno_pruned_for_all(machine):
    few, every = ((64, 64, 32, 30), (8, 8, 8, 16)), ((64, 64, 64), (32, 32, 33))
    for parts in [(1, 1, 1), (4, 1, 1), (2, 2, 1)]:
        shape, modes = few
        choice = choose_method(shape, modes, (*parts, 1), in_channels=20, out_channels=20, machine=machine)
        assert choice.method == "drift", choice
        shape, modes = every
        choice = choose_method(shape, modes, parts, in_channels=20, out_channels=20, machine=machine)
        assert choice.method == "dfno-pruned", choice
        assert [c.method for c in choice.costs] == ["dfno-pruned", "drift"] and "auto chose dfno-pruned" in str(choice)


def test_auto_cost_model_counts_flops_and_bytes():
    # drift: the plans' contractions per channel, forward (in) and inverse (out); one reduce-scatter of
    # the in x M spectrum and one all-gather of the out x M one, (P - 1) / P of each sent.
    shape, modes, local = (32, 16, 12), (4, 3, 5), (8, 16, 12)
    kept, m = (8, 6, 5), 8 * 6 * 5
    costs = {c.method: c for c in method_costs(shape, modes, (4, 1, 1), in_channels=3, out_channels=2, machine=CPU)}
    rows = (5 + 4, 4 + 3, 5 + 4)  # real parts of 0..k, imaginary parts of 1..k (a half dim: 0..k-1, 1..k-1)
    # With their copies weighed in, the forward contracts 16 -> 7 folded rows first, then 12 -> 5 as a real
    # gemm on those rows, then 8 -> 8; the inverse the innermost dim first (a real gemm to 2 x 5 interleaved
    # rows), then 16 -> 6 and 8 -> 8 complex: more FLOPs than the folded optimum.
    forward = 2 * 8 * 12 * 16 * 7 + 4 * 8 * 7 * 12 * 5 + 8 * 6 * 5 * 8 * 8
    inverse = 2 * 8 * 16 * 12 * 10 + 8 * 8 * 5 * 16 * 6 + 8 * 6 * 5 * 8 * 8
    assert contraction.best_order(local, kept, True, rows=rows)[1] == forward < inverse
    assert costs["drift"].flops == 3 * forward + 2 * inverse
    assert costs["drift"].bytes_sent == 3 / 4 * (3 + 2) * m * 8
    alpha, beta, copy = CPU.alpha_s, CPU.beta_s_per_byte, CPU.copy_s_per_byte
    # Each collective's pass over its buffer: the whole spectrum of its channels.
    assert math.isclose(costs["drift"].comm_s, 2 * 3 * alpha + 3 / 4 * 5 * m * 8 * beta + 5 * m * 8 * copy)
    # dfno-pruned: 1-D FFTs from the last dim, each truncated; all-to-alls of the truncated field.
    lines = 32 * 16 * 2.5 * 12 * math.log2(12) + 32 * 5 * 5 * 16 * math.log2(16) + 6 * 5 * 5 * 32 * math.log2(32)
    assert math.isclose(costs["dfno-pruned"].flops, 5 * lines / 4)
    assert math.isclose(costs["dfno-pruned"].bytes_sent, 3 / 4 * 5 * 32 * 6 * 5 * 8 / 4)
    block = 5 * 32 * 6 * 5 * 8 / 4  # each rank's block of both all-to-alls
    assert math.isclose(costs["dfno-pruned"].comm_s, 2 * 3 * alpha + 3 / 4 * block * beta + block * copy)


def test_auto_on_one_device_computes_the_chosen_method():
    x = random_tensor((2, 3, 16, 16, 16), torch.float64, 4)
    for modes, chosen in [((2, 2, 2), "drift"), ((8, 8, 9), "dfno-pruned")]:
        torch.manual_seed(1)
        auto = SpectralConv(3, 2, modes, method="auto", dtype=torch.float64)
        torch.manual_seed(1)
        explicit = SpectralConv(3, 2, modes, method=chosen, dtype=torch.float64)
        expected = CPU if chosen == "drift" else Machine(1e9, 1e12, 0.0, 0.0)  # every mode: FFTs win at any rate
        auto.choose_method((16, 16, 16), (1, 1, 1), expected)
        assert auto.method == chosen and f"auto chose {chosen}" in repr(auto)
        y = auto(x)
        assert rel_err(y, explicit(x)) <= 1e-12
        assert (
            rel_err(y, reference_conv(x, auto.weight.detach(), auto.modes_at((16, 16, 16)), (16, 16, 16), True))
            <= 1e-12
        )
    # Resolved at the first input when nothing chose before.
    lazy = FNO(2, 1, 4, (2, 2, 2), n_layers=1, method="auto", dtype=torch.float64)
    lazy(random_tensor((1, 2, 16, 16, 16), torch.float64, 5))
    assert lazy.blocks[0].spectral.method == "drift" and lazy.blocks[0].spectral.choice.method == "drift"


def _auto_parallel(shape, modes):
    device = device_for(dist.get_rank())
    torch.manual_seed(3)
    model = FNO(2, 1, 6, modes, n_layers=2, method="auto", dtype=torch.float64, device=device)
    mesh, placements = _mesh((2, 2, 1))
    errors = []
    with drift.comm_log() as log:
        try:
            parallelize(FNO(2, 1, 6, modes, n_layers=1, method="auto"), mesh, placements)
        except ValueError as exc:
            errors.append(str(exc))
        try:
            parallelize(FNO(2, 1, 6, (40, 2, 2), n_layers=1, method="auto"), mesh, placements, global_shape=shape)
        except drift.PlanError as exc:
            errors.append(str(exc))
    assert log.calls == []
    parallelize(model, mesh, placements, global_shape=shape)
    x = random_tensor((2, 2, *shape), torch.float64, 8)
    xd, _ = _distribute(x, mesh, placements, device)
    return [b.spectral.method for b in model.blocks], model(xd).full_tensor().detach().cpu(), errors


@pytest.mark.parametrize(
    ("shape", "modes", "chosen"), [((16, 12, 10), (2, 2, 2), "drift"), ((32, 32, 16), (16, 16, 9), "dfno-pruned")]
)
def test_auto_parallelized_picks_by_the_mesh_and_computes_the_same_function(ranks, shape, modes, chosen):
    torch.manual_seed(3)
    single = FNO(2, 1, 6, modes, n_layers=2, method=chosen, dtype=torch.float64)
    x = random_tensor((2, 2, *shape), torch.float64, 8)
    y_ref = reference_fno(single, x)
    for methods, y, errors in ranks.run(4, _auto_parallel, shape, modes):
        assert methods == [chosen, chosen]
        assert rel_err(y, y_ref) <= 1e-12
        assert "method='auto' chooses by the grid: pass parallelize(..., global_shape=)" in errors[0]
        assert "method='auto' at resolution" in errors[1] and "no method fits" in errors[1]


def _every_dim_split():
    """A 2-D FNO keeping every mode on a 2 x 2 pencil: auto leaves out dfno-pruned, which needs a whole dim;
    asked for, dfno-pruned is refused before the model changes."""
    device = device_for(dist.get_rank())
    mesh, placements = _mesh((2, 2))
    torch.manual_seed(3)
    auto = parallelize(
        FNO(2, 1, 6, (4, 5), n_layers=1, method="auto", dtype=torch.float64, device=device),
        mesh,
        placements,
        global_shape=(8, 8),
    )
    x = random_tensor((2, 2, 8, 8), torch.float64, 8)
    y = auto(_distribute(x, mesh, placements, device)[0]).full_tensor().detach().cpu()
    pruned = FNO(2, 1, 6, (4, 5), n_layers=1, method="dfno-pruned", device=device)
    with pytest.raises(ValueError, match="split every dim: at least one dim must be whole"):
        parallelize(pruned, mesh, placements)
    untouched = all(getattr(m, "mesh", None) is None for m in pruned.modules())
    return auto.blocks[0].spectral.method, y, untouched


def test_auto_leaves_out_what_cannot_run_on_the_mesh(ranks):
    torch.manual_seed(3)
    single = FNO(2, 1, 6, (4, 5), n_layers=1, method="drift", dtype=torch.float64)
    y_ref = reference_fno(single, random_tensor((2, 2, 8, 8), torch.float64, 8))
    for method, y, untouched in ranks.run(4, _every_dim_split):
        assert method == "drift" and rel_err(y, y_ref) <= 1e-12 and untouched


def _mesh_dim_of_one_rank(method):
    """A 2 x 2 pencil given as a (2, 2, 1) mesh whose last dim, of one rank, 'splits' z."""
    device = device_for(dist.get_rank())
    mesh = drift.layout.device_mesh((2, 2, 1), ("x", "y", "z"), device.type)
    placements = (Shard(2), Shard(3), Shard(4))
    torch.manual_seed(3)
    model = FNO(2, 1, 6, (2, 2, 3), n_layers=1, method=method, dtype=torch.float64, device=device)
    parallelize(model, mesh, placements)
    x = random_tensor((2, 2, 9, 8, 6), torch.float64, 8)
    return model(_distribute(x, mesh, placements, device)[0]).full_tensor().detach().cpu()


@pytest.mark.parametrize("method", ["dfno", "dfno-pruned"])
def test_a_mesh_dim_of_one_rank_leaves_its_dim_whole(ranks, method):
    torch.manual_seed(3)
    single = FNO(2, 1, 6, (2, 2, 3), n_layers=1, method=method, dtype=torch.float64)
    y_ref = reference_fno(single, random_tensor((2, 2, 9, 8, 6), torch.float64, 8))
    for y in ranks.run(4, _mesh_dim_of_one_rank, method):
        assert rel_err(y, y_ref) <= 1e-12
