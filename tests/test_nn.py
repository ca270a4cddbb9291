"""SpectralConv and FNO: every method on every grid computes the single-device function of one global weight."""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist
from harness import device_for
from reference import TOL, random_tensor, rel_err, truncated_spectrum, zero_filled_inverse

import drift
from drift.nn import FNO, SpectralConv, spectral_weight


def reference_conv(x, w, modes, shape, real):
    """The single-device spectral convolution: rfftn, keep the modes, mix channels, zero-fill, irfftn."""
    spec = truncated_spectrum(x, modes, real, "backward")
    return zero_filled_inverse(torch.einsum("bi...,io...->bo...", spec, w), modes, shape, real, "backward")


def _loss(out, seed):
    real = torch.view_as_real(out) if out.is_complex() else out
    return (real * random_tensor(real.shape, torch.float64, seed).to(real.device)).sum()


def _check_conv(shape, grid, modes, method, real, dtype):
    rank, size, device = dist.get_rank(), dist.get_world_size(), device_for(dist.get_rank())
    layer = SpectralConv(3, 2, shape, modes, grid, method=method, real=real, dtype=dtype, device=device, seed=5)
    w = spectral_weight(3, 2, layer.mode_shape, 5, dtype)
    assert torch.equal(layer.global_weight().cpu(), w), "the same seed must give the same global weight"
    x = random_tensor((2, 3, *shape), torch.float64, 6, complex_=not real).to(
        layer.weight.real.dtype if real else layer.weight.dtype
    )
    blocks = [drift.local_slices(shape, grid, r) for r in range(size)]
    x_local = drift.scatter(x, grid).to(device).requires_grad_(True)
    with drift.comm_log() as log:
        y = layer(x_local)
    _loss(y.double() if real else y.to(torch.complex128), 100 + rank).backward()

    wide = torch.complex128 if x.is_complex() else torch.float64
    x_ref, w_ref = x.to(wide).requires_grad_(True), w.to(torch.complex128).requires_grad_(True)
    full = reference_conv(x_ref, w_ref, layer.modes, shape, real)
    assert rel_err(y, full[(..., *blocks[rank])]) <= TOL[dtype]
    sum(_loss(full[(..., *b)], 100 + r) for r, b in enumerate(blocks)).backward()
    assert rel_err(x_local.grad, x_ref.grad[(..., *blocks[rank])]) <= TOL[dtype]
    assert rel_err(layer.gather_shares(layer.weight.grad), w_ref.grad) <= TOL[dtype]

    # A global weight loaded on any grid is the one read back.
    w2 = random_tensor((3, 2, *layer.mode_shape), torch.float64, 7, complex_=True).to(layer.weight.dtype)
    layer.load_global_weight(w2)
    assert torch.equal(layer.global_weight().cpu(), w2)
    return log.kinds(), log.bytes


CONV_CASES = [
    ((12,), (1,), (3,), True),
    ((12, 10), (2, 1), (3, 3), True),
    ((10, 12), (1, 2), (2, 4), False),
    ((9, 8, 6), (3, 1, 1), (2, 2, 3), True),
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
    if math.prod(grid) == 1:
        assert kinds == []
    elif method == "drift":
        assert kinds == ["reduce_scatter", "all_gather"]
    else:
        assert kinds and set(kinds) == {"all_to_all"}


def _drift_bytes(shape, size):
    layer = SpectralConv(4, 4, shape, (2, 2, 3), (size, 1, 1), seed=1)
    x = torch.randn(2, 4, *layer.plan.local_shape)
    with drift.comm_log() as log:
        layer(x)
    return [(c.kind, c.bytes) for c in log.calls], layer.plan.num_modes


def test_drift_payload_depends_on_modes_not_grid(ranks):
    small = ranks.run(4, _drift_bytes, (12, 10, 8), 4)
    large = ranks.run(4, _drift_bytes, (48, 40, 30), 4)
    assert small == large
    (calls, m) = small[0]
    padded_share = -(-m // 4)
    # reduce-scatter of 2 samples x 4 channels x M modes (padded to 4 equal shares), all-gather of one share
    assert calls == [("reduce_scatter", 4 * 2 * 4 * padded_share * 8), ("all_gather", 2 * 4 * padded_share * 8)]


def _fno_forward(shape, grid, method, state):
    device = device_for(dist.get_rank())
    model = FNO(2, 1, 6, (2, 2, 3), shape, grid, n_layers=2, method=method, dtype=torch.float64, device=device, seed=3)
    if state is not None:
        model.load_global_state({k: v.to(device) for k, v in state.items()})
    x = random_tensor((2, 2, *shape), torch.float64, 8)
    x_local = drift.scatter(x, grid).to(device)
    y = model(x_local)
    _loss(y, 200 + dist.get_rank()).backward()
    grads = {n: p.grad.cpu() for n, p in model.named_parameters() if not n.startswith("spectral.")}
    for i, layer in enumerate(model.spectral):
        grads[f"spectral.{i}.weight"] = layer.gather_shares(layer.weight.grad).cpu()
    return drift.gather(y.detach(), shape, grid).cpu(), grads, {k: v.cpu() for k, v in model.global_state().items()}


@pytest.mark.parametrize(
    ("grid", "method"), [((2, 1, 1), "drift"), ((1, 2, 2), "drift"), ((2, 2, 1), "dfno"), ((3, 1, 1), "dfno-pruned")]
)
def test_fno_is_the_same_function_on_every_grid(ranks, grid, method):
    shape = (9, 8, 6)
    single = FNO(2, 1, 6, (2, 2, 3), shape, (1, 1, 1), n_layers=2, dtype=torch.float64, seed=3)
    x = random_tensor((2, 2, *shape), torch.float64, 8)
    y_ref = single(x)
    size = math.prod(grid)
    blocks = [drift.local_slices(shape, grid, r) for r in range(size)]
    sum(_loss(y_ref[(..., *b)], 200 + r) for r, b in enumerate(blocks)).backward()
    results = ranks.run(size, _fno_forward, shape, grid, method, None)
    for y, grads, state in results:
        assert rel_err(y, y_ref) <= 1e-12
        for name, p in single.named_parameters():
            want = p.grad
            if name.startswith("spectral."):
                want = single.spectral[int(name.split(".")[1])].gather_shares(p.grad)
            assert rel_err(grads[name], want) <= 1e-12, name
        for name, value in single.global_state().items():
            assert torch.equal(state[name], value), name


def test_fno_state_moves_between_grids(ranks):
    shape = (9, 8, 6)
    source = FNO(2, 1, 6, (2, 2, 3), shape, (1, 1, 1), n_layers=2, dtype=torch.float64, seed=11)
    state = source.global_state()
    x = random_tensor((2, 2, *shape), torch.float64, 8)
    results = ranks.run(4, _fno_forward, shape, (2, 2, 1), "drift", state)
    for y, _, back in results:
        assert rel_err(y, source(x)) <= 1e-12
        assert all(torch.equal(back[k], v) for k, v in state.items())
    target = FNO(2, 1, 6, (2, 2, 3), shape, (1, 1, 1), n_layers=2, dtype=torch.float64, seed=0)
    target.load_global_state(results[0][2])
    assert rel_err(target(x), source(x)) <= 1e-12


def test_bad_layer_arguments():
    with pytest.raises(ValueError, match="method must be one of"):
        SpectralConv(2, 2, (8, 8), 2, (1, 1), method="fft")
    with pytest.raises(ValueError, match="1 to 4 spatial dims"):
        SpectralConv(2, 2, (4, 4, 4, 4, 4), 1, (1,) * 5)
    layer = SpectralConv(2, 3, (8, 8), 2, (1, 1), seed=0)
    with pytest.raises(ValueError, match=r"expects \(batch, 2, \*local block\)"):
        layer(torch.randn(1, 3, 8, 8))
    with pytest.raises(ValueError, match=r"global weight must be torch.complex64 of shape \(2, 3, 4, 2\), got"):
        layer.load_global_weight(torch.zeros(2, 3, 4, 3, dtype=torch.complex64))
    with pytest.raises(ValueError, match="got torch.complex128 of shape"):
        layer.load_global_weight(torch.zeros(2, 3, 4, 2, dtype=torch.complex128))
    with pytest.raises(drift.PlanError, match="expected shape"):
        layer(torch.randn(1, 2, 8, 7))
    model = FNO(1, 1, 4, 2, (8, 8), (1, 1), n_layers=1, seed=0)
    state = model.global_state()
    state["lift.weight"] = state["lift.weight"].double()
    with pytest.raises(ValueError, match=r"state\['lift.weight'\] must be torch.float32"):
        model.load_global_state(state)
    with pytest.raises(ValueError, match="state keys differ"):
        FNO(1, 1, 4, 2, (8, 8), (1, 1), n_layers=1, seed=0).load_global_state({})


def test_fno_block_without_autograd_matches():
    """The unrecorded block accumulates the pointwise gemm into the spectral output in place."""
    model = FNO(2, 1, 6, (2, 2, 3), (9, 8, 6), (1, 1, 1), n_layers=2, dtype=torch.float64, seed=4)
    x = random_tensor((2, 2, 9, 8, 6), torch.float64, 9)
    recorded = model(x)
    with torch.no_grad():
        unrecorded = model(x)
    with torch.inference_mode():
        inference = model(x)
    assert recorded.requires_grad and not unrecorded.requires_grad
    assert rel_err(unrecorded, recorded) <= 1e-12 and rel_err(inference, recorded) <= 1e-12


def test_unrecorded_projection_in_chunks_matches(monkeypatch):
    """Without autograd the 128-channel projection runs a chunk of points at a time (here 7 points)."""
    import drift.nn.fno as fno

    model = FNO(2, 3, 6, (2, 2, 3), (9, 8, 6), (1, 1, 1), n_layers=1, dtype=torch.float64, seed=5)
    x = random_tensor((2, 2, 9, 8, 6), torch.float64, 10)
    recorded = model(x)
    monkeypatch.setattr(fno, "PROJECTION_CHUNK_BYTES", 2 * fno.PROJECTION_WIDTH * 8 * 7)
    with torch.no_grad():
        chunked = model(x)
    assert chunked.shape == recorded.shape and rel_err(chunked, recorded) <= 1e-12
