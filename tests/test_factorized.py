"""Factorized spectral weights: the ranks and the rebuilt weight against tensorly and neuraloperator, and
the factorized layer, on one device and on 4 ranks, against a dense SpectralConv holding the rebuilt
weight, with the factors' gradients from single-process autograd through tensorly's rebuild."""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist
from harness import device_for
from meshes import distribute, lead_placements, linear_functional, mesh_for
from reference import random_tensor, rel_err, truncated_spectrum, zero_filled_inverse
from torch.distributed.tensor import DTensor, Shard

import drift
from drift.checkpoint import load_checkpoint, save_checkpoint
from drift.nn import FNO, FactorizedWeight, SpectralConv, from_neuralop_factors, from_neuralop_weight, parallelize
from drift.nn.factorized import cp_rank, tucker_rank

tl = pytest.importorskip("tensorly", reason="tensorly (the test extra) is not installed")
tl.set_backend("pytorch")

RANKS = {"tucker": 0.5, "cp": 0.5}


def _tensorly_rebuild(state: dict, factorization: str) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """tensorly's dense tensor of a ``FactorizedWeight`` state, from leaves that record gradients."""
    leaves = {k: v.detach().clone().requires_grad_(True) for k, v in state.items()}
    factors = [leaves[f"factors.{j}"] for j in range(len(leaves) - 1)]
    if factorization == "tucker":
        return tl.tucker_to_tensor((leaves["core"], factors)), [leaves["core"], *factors]
    return tl.cp_to_tensor((leaves["weights"], factors)), [leaves["weights"], *factors]


@pytest.mark.parametrize(
    "shape", [(20, 20, 16, 16, 16, 16), (20, 20, 8, 8, 8, 4), (3, 2, 4, 6), (1, 1, 4, 4), (7, 5, 9)]
)
def test_ranks_are_tensorlys(shape):
    from tensorly.cp_tensor import validate_cp_rank
    from tensorly.tucker_tensor import validate_tucker_rank

    for rank in (0.01, 0.05, 0.3, 1.0, 2.5):
        assert list(tucker_rank(shape, rank)) == list(validate_tucker_rank(shape, rank)), rank
        expected = validate_cp_rank(shape, rank)
        if expected >= 1:
            assert cp_rank(shape, rank) == expected, rank
    assert tucker_rank(shape, 3) == (3,) * len(shape) and cp_rank(shape, 3) == 3


@pytest.mark.parametrize("factorization", ["tucker", "cp"])
def test_rebuild_equals_tensorly_at_every_index(factorization):
    torch.manual_seed(0)
    weight = FactorizedWeight((3, 4, 6, 5, 4), factorization, 0.4, dtype=torch.float64)
    want, _ = _tensorly_rebuild(weight.state_dict(), factorization)
    assert rel_err(weight.block(), want) <= 1e-12
    # Entries of the dense weight: std sqrt(2 / (in + out)) as neuraloperator's init (within sampling).
    assert 0.3 < want.abs().square().mean().sqrt() / math.sqrt(2 / 7) < 3
    picks = torch.tensor([4, 0, 2])
    for index in [(None, None, slice(1, 4)), (None, slice(2, 4), picks, slice(0, 0)), (slice(1, 2), None, picks)]:
        block = want
        for dim, i in enumerate(index):
            if isinstance(i, slice):
                block = block.narrow(dim, i.start, i.stop - i.start)
            elif i is not None:
                block = block.index_select(dim, i)
        assert rel_err(weight.block(index), block) <= 1e-12, index


@pytest.mark.parametrize("factorization", ["tucker", "cp"])
def test_neuraloperator_factors_load_and_rebuild_its_weight(factorization):
    neuralop = pytest.importorskip("neuralop.layers.spectral_convolution", reason="neuraloperator is not installed")
    shape, modes = (16, 12, 10), (3, 2, 4)
    torch.manual_seed(1)
    n_modes = drift.nn.neuralop_n_modes(shape, modes)
    theirs = neuralop.SpectralConv(3, 2, n_modes, factorization=factorization, rank=0.3, bias=False)
    ours = SpectralConv(3, 2, modes, factorization=factorization, rank=0.3)
    ours.weight.load_state_dict(from_neuralop_factors(theirs.weight, shape, modes))  # same factor shapes
    dense = from_neuralop_weight(theirs.weight.to_tensor().detach(), shape, modes)
    assert rel_err(ours.weight.block(), dense) <= 2e-6
    x = torch.randn(2, 3, *shape)
    with torch.no_grad():
        y_theirs, y_ours = theirs(x), ours(x)
    spec = truncated_spectrum(x.double(), ours.modes_at(shape), True, "backward")
    mixed = torch.einsum("bi...,io...->bo...", spec, dense.to(torch.complex128))
    reference = zero_filled_inverse(mixed, ours.modes_at(shape), shape, True, "backward")
    assert rel_err(y_ours, reference) <= 2e-6 and rel_err(y_theirs, reference) <= 2e-6


def _dense_reference(state, factorization, modes, real, x, w_out):
    """A dense single-device SpectralConv holding tensorly's rebuilt weight: its output, the input's
    gradient and the factors' gradients (through tensorly's rebuild) of the loss <w_out, y>."""
    rebuilt, leaves = _tensorly_rebuild(state, factorization)
    dense = SpectralConv(rebuilt.shape[0], rebuilt.shape[1], modes, real=real, dtype=torch.float64)
    dense.load_state_dict({"weight": rebuilt.detach()})
    x = x.clone().requires_grad_(True)
    y = dense(x)
    linear_functional(y, w_out).backward()
    grads = torch.autograd.grad(rebuilt, leaves, dense.weight.grad)
    return y.detach(), x.grad, grads


def _layer(method, factorization, modes, real, state, device):
    rank = RANKS[factorization]
    layer = SpectralConv(
        3, 2, modes, method=method, real=real, factorization=factorization, rank=rank, dtype=torch.float64
    )
    layer.weight.load_state_dict(state)
    return layer.to(device)


def _record_blocks(weight: FactorizedWeight) -> list[tuple[int, ...]]:
    """The shapes of the blocks ``weight`` rebuilds from now on."""
    shapes, block = [], weight.block

    def recorded(index=()):
        out = block(index)
        shapes.append(tuple(out.shape))
        return out

    weight.block = recorded
    return shapes


def _on_ranks(grid, shape, modes, real, states, x, w_out):
    """Every method and factorization, parallelized over ``grid``: the output, the input's and the
    factors' gradients (whole), and the shapes of the weight blocks each rank rebuilt."""
    device = device_for(dist.get_rank())
    mesh, placements = mesh_for(grid)
    field = lead_placements(placements, 2)
    results = {}
    for method in drift.nn.METHODS:
        for factorization, state in states.items():
            layer = parallelize(_layer(method, factorization, modes, real, state, device), mesh, field)
            shapes = _record_blocks(layer.weight)
            xd = distribute(x, mesh, placements, 2, requires_grad=True)
            y = layer(xd)
            assert isinstance(y, DTensor) and tuple(y.placements) == field
            real_y = torch.view_as_real(y) if y.is_complex() else y
            linear_functional(y, distribute(w_out, mesh, real_y.placements, 0)).backward()
            grads = [p.grad.cpu() for p in layer.weight.parameters()]
            results[method, factorization] = (
                y.full_tensor().detach().cpu(),
                xd.grad.full_tensor().cpu(),
                grads,
                shapes,
            )
    return results


# 5 points over 4 ranks are 2, 2, 1, 0 and K1 = 3 modes 1, 1, 1, 0: empty blocks and an empty share.
CASES = [((5, 8, 6), (4, 1, 1), ([0, 2, -1], 2, 2), True), ((8, 9, 6), (2, 2, 1), (2, 2, 3), False)]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "grid" + "x".join(map(str, c[1])))
def test_factorized_layer_equals_dense_on_one_and_four_ranks(ranks, case):
    shape, grid, modes, real = case
    torch.manual_seed(2)
    states = {
        f: SpectralConv(3, 2, modes, real=real, factorization=f, rank=RANKS[f], dtype=torch.float64).weight.state_dict()
        for f in ("tucker", "cp")
    }
    x = random_tensor((2, 3, *shape), torch.float64, 3, complex_=not real)
    w_out = random_tensor((2, 2, *shape, *(() if real else (2,))), torch.float64, 4)
    references = {f: _dense_reference(s, f, modes, real, x, w_out) for f, s in states.items()}
    for method in drift.nn.METHODS:  # one device
        for f, (y_ref, gx_ref, grads_ref) in references.items():
            layer = _layer(method, f, modes, real, states[f], "cpu")
            xr = x.clone().requires_grad_(True)
            y = layer(xr)
            linear_functional(y, w_out).backward()
            assert rel_err(y, y_ref) <= 1e-12 and rel_err(xr.grad, gx_ref) <= 1e-12, (method, f)
            for p, g in zip(layer.weight.parameters(), grads_ref, strict=True):
                assert rel_err(p.grad, g) <= 1e-12, (method, f)
    results = ranks.run(math.prod(grid), _on_ranks, grid, shape, modes, real, states, x, w_out)
    full = (3, 2, *SpectralConv(3, 2, modes, real=real).mode_shape)
    for rank_results in results:
        for (method, f), (y, gx, grads, shapes) in rank_results.items():
            y_ref, gx_ref, grads_ref = references[f]
            assert rel_err(y, y_ref) <= 1e-12 and rel_err(gx, gx_ref) <= 1e-12, (method, f)
            for g, g_ref in zip(grads, grads_ref, strict=True):
                assert rel_err(g, g_ref) <= 1e-12, (method, f)
            # Each rank rebuilds a part of the weight only, never all of it.
            assert shapes and all(math.prod(s) < math.prod(full) for s in shapes), (method, f, shapes)


def _fno(factorization, method="drift", seed=0, device="cpu"):
    torch.manual_seed(seed)
    return FNO(2, 1, 6, (2, 2, 3), n_layers=2, method=method, factorization=factorization, rank=0.3,
               dtype=torch.float64, device=device)  # fmt: skip


def _train_save_reload(factorization, state, root):
    """2 data x 2 spatial ranks: one Adam step of the parallelized model from ``state``, a checkpoint,
    then a fresh model over a 4-rank slab (dfno) that loads it; the gradients, the state after the step
    and the reloaded model's output, whole."""
    from torch.distributed.device_mesh import init_device_mesh

    device = device_for(dist.get_rank())
    model = _fno(factorization, device=device)
    model.load_state_dict(state)
    mesh, placements = init_device_mesh(device.type, (2, 2)), (Shard(0), Shard(2))
    parallelize(model, mesh, placements)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    x = distribute(random_tensor((4, 2, 9, 8, 6), torch.float64, 5), mesh, placements, 0)
    target = distribute(random_tensor((4, 1, 9, 8, 6), torch.float64, 6), mesh, placements, 0)
    ((model(x) - target) ** 2).mean().backward()
    grads = {n: p.grad.detach().cpu().clone() for n, p in model.named_parameters()}
    optimizer.step()
    save_checkpoint(root, 1, model, optimizer, {})
    after = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}

    slab, slab_placements = mesh_for((4, 1, 1))
    fresh = parallelize(_fno(factorization, "dfno", seed=1, device=device), slab, lead_placements(slab_placements, 2))
    load_checkpoint(root / "epoch-0001", fresh)
    probe = distribute(random_tensor((2, 2, 9, 8, 6), torch.float64, 7), slab, slab_placements, 2)
    with torch.no_grad():
        y = fresh(probe).full_tensor().cpu()
    return grads, after, y


@pytest.mark.parametrize("factorization", ["tucker", "cp"])
def test_fno_data_x_spatial_step_and_checkpoint(ranks, tmp_path, factorization):
    single = _fno(factorization)
    state = {k: v.clone() for k, v in single.state_dict().items()}
    assert not any(k.endswith("weight") and "spectral" in k for k in state)  # no dense spectral weight
    optimizer = torch.optim.Adam(single.parameters(), lr=1e-2)
    x, target = random_tensor((4, 2, 9, 8, 6), torch.float64, 5), random_tensor((4, 1, 9, 8, 6), torch.float64, 6)
    ((single(x) - target) ** 2).mean().backward()
    grads = {n: p.grad.clone() for n, p in single.named_parameters()}
    optimizer.step()
    y_ref = single(random_tensor((2, 2, 9, 8, 6), torch.float64, 7)).detach()
    results = ranks.run(4, _train_save_reload, factorization, state, tmp_path / "ckpt")
    for rank_grads, after, y in results:
        for name, g in grads.items():
            assert rel_err(rank_grads[name], g) <= 1e-12, name
        for name, value in single.state_dict().items():
            assert rel_err(after[name], value) <= 1e-12, name
        assert rel_err(y, y_ref) <= 1e-12
    # The 4-rank checkpoint loads into a model on one process.
    one = _fno(factorization, seed=2)
    load_checkpoint(tmp_path / "ckpt" / "epoch-0001", one)
    for name, value in results[0][1].items():  # exact: the checkpoint's stored values read back
        assert torch.equal(one.state_dict()[name], value), name


def test_bad_factorization_options_fail_at_construction():
    with pytest.raises(ValueError, match=r"factorization must be None or one of \('tucker', 'cp'\), got 'tt'"):
        SpectralConv(2, 2, (2, 2), factorization="tt")
    with pytest.raises(ValueError, match=r"rank = 0.01 rounds to a CP rank of 0 for the weight \(2, 2, 4, 2\)"):
        SpectralConv(2, 2, (2, 2), factorization="cp", rank=0.01)
    with pytest.raises(ValueError, match=r"rank = 1e-05 rounds to a CP rank of 0"):
        FNO(2, 1, 4, (2, 2, 2), factorization="cp", rank=1e-5)
    with pytest.raises(ValueError, match="rank = 0.0 must be positive"):
        SpectralConv(2, 2, (2, 2), factorization="tucker", rank=0.0)
    with pytest.raises(ValueError, match=r"rank \(2, 2\): a Tucker rank needs one positive int per dim"):
        SpectralConv(2, 2, (2, 2), factorization="tucker", rank=(2, 2))
    with pytest.raises(ValueError, match="rank True: a CP rank|rank must be a float"):
        SpectralConv(2, 2, (2, 2), factorization="cp", rank=True)
    with pytest.raises(ValueError, match=r"rank \(2, 2\): a CP rank is one positive int"):
        SpectralConv(2, 2, (2, 2), factorization="cp", rank=(2, 2))


def test_conversions_and_parameter_bytes():
    """``.float()`` converts the complex factors; the factors hold about ``rank`` of the dense parameters."""
    model = _fno("tucker")
    model.float()
    assert all(p.dtype == torch.complex64 for p in model.blocks[0].spectral.parameters())
    x = random_tensor((1, 2, 9, 8, 6), torch.float64, 8)
    assert rel_err(model(x.float()), model.double()(x)) <= 2e-6
    layer = SpectralConv(20, 20, (8, 8, 8, 16), factorization="cp", rank=0.05)
    dense = 20 * 20 * 16**4
    held = sum(p.numel() for p in layer.parameters())
    assert abs(held / dense - 0.05) < 0.001
