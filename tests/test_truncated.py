"""TruncatedFFT against torch.fft on 1..4 ranks: values, sharded values, inverse, gradients, bytes, DTensors."""

from __future__ import annotations

import itertools
import math
import random

import pytest
import torch
import torch.distributed as dist
from harness import attempt, check_one_bad_rank, device_for, rank_pool, short_timeout_group
from meshes import (
    attempts_without_collectives,
    check_dtensor_runs,
    distribute,
    lead_placements,
    local_block,
    mesh_for,
    rank_coordinates,
)
from reference import (
    TOL,
    case_id,
    mesh_block,
    mesh_share,
    random_tensor,
    rel_err,
    truncated_spectrum,
    zero_filled_inverse,
)
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

import drift
from drift.truncated import _contraction as contraction

# (global shape, grid): slab and pencil grids, even, odd and prime extents, uneven splits, empty blocks
# (torch.chunk leaves trailing blocks empty: 5 or 9 over 4 ranks, 1 over 2), 1-D to 4-D.
LAYOUTS = [
    ((13,), (1,)),
    ((8, 6), (1, 1)),
    ((12, 10, 7), (1, 1, 1)),
    ((6, 5, 4, 3), (1, 1, 1, 1)),
    ((16,), (2,)),
    ((9, 10), (2, 1)),
    ((10, 9), (1, 2)),
    ((12, 7, 5), (2, 1, 1)),
    ((7, 11, 6), (1, 2, 1)),
    ((5, 6, 4, 7), (2, 1, 1, 1)),
    ((4, 5, 6, 7), (1, 1, 1, 2)),
    ((17,), (3,)),
    ((11, 8), (3, 1)),
    ((10, 13, 6), (1, 3, 1)),
    ((7, 6, 5, 9), (1, 1, 1, 3)),
    ((23,), (4,)),
    ((11, 13), (2, 2)),
    ((13, 9, 8), (4, 1, 1)),
    ((12, 10, 7), (2, 2, 1)),
    ((9, 7, 10), (1, 2, 2)),
    ((8, 8, 8), (1, 1, 4)),
    ((6, 5, 7, 8), (2, 1, 2, 1)),
    ((5, 6, 7, 6), (1, 1, 2, 2)),
    ((5, 6), (4, 1)),
    ((6, 9), (1, 4)),
    ((9, 4, 3), (4, 1, 1)),
    ((1, 6, 5), (2, 2, 1)),
]
NORMS = ("backward", "ortho", "forward")
BATCHES = ((), (2,), (2, 3))


def _explicit_modes(shape, real, rng):
    """Scrambled subsets of each dim's frequencies, negative indices included, Nyquist where it exists."""
    modes = []
    for i, n in enumerate(shape):
        if real and i == len(shape) - 1:
            pool = list(range(n // 2 + 1))
            pick = rng.sample(pool, max(1, len(pool) - 1))
            if n % 2 == 0 and n // 2 not in pick:
                pick[-1] = n // 2
        else:
            pick = [f - n if f > n // 2 else f for f in rng.sample(range(n), max(1, min(n - 1, 5)))]
        modes.append(pick)
    return modes


def _int_modes(shape, real, wide):
    """Li et al.'s k per dim (frequency 0 alone on an extent of 1); ``wide`` keeps the whole half spectrum on a
    real last dim."""
    last = len(shape) - 1
    return [
        n // 2 + 1 if (real and i == last and wide) else max(1, min(n // 2, 3)) if n > 1 else [0]
        for i, n in enumerate(shape)
    ]


def _cases():
    rng = random.Random(1234)
    cases = []
    for (shape, grid), real, dtype in itertools.product(LAYOUTS, (True, False), (torch.float64, torch.float32)):
        i = len(cases)
        explicit = i % 2 == 1
        modes = _explicit_modes(shape, real, rng) if explicit else _int_modes(shape, real, wide=i % 4 == 0)
        cases.append((shape, grid, modes, real, dtype, NORMS[i % 3], BATCHES[i % 3]))
    return cases


def _case_id(case):
    shape, grid, modes, real, dtype, norm, batch = case
    return case_id(shape, grid, "real" if real else "complex", str(dtype)[6:], norm, f"b{len(batch)}")


def _first(s: slice, d: int) -> tuple:
    """Index of the slice ``s`` of the first of the last ``d`` dims (the first mode dim)."""
    return (..., s, *[slice(None)] * (d - 1))


def _check_values(shape, grid, modes, real, dtype, norm, batch):
    device = device_for(dist.get_rank())
    mesh, placements = mesh_for(grid)
    plan = drift.TruncatedFFT(shape, modes, mesh, placements, real=real, dtype=dtype, norm=norm, device=device)
    d, tol = len(shape), TOL[dtype]
    x = random_tensor((*batch, *shape), dtype, 1, complex_=not real)
    wide = x.to(torch.complex128 if x.is_complex() else torch.float64)
    spec = truncated_spectrum(wide, plan.modes, real, norm)
    x_local = local_block(x, mesh, placements, len(batch))
    mine = mesh_share(plan.mode_shape[0], mesh.shape, placements, mesh.get_coordinate())

    out = plan.forward(x_local)
    assert out.shape == (*batch, *plan.mode_shape) and out.dtype == plan.complex_dtype
    assert rel_err(out, spec) <= tol, rel_err(out, spec)

    # This rank's partial spectrum: the spectrum of the field that is its block and zero elsewhere.
    block = mesh_block(shape, mesh.shape, placements, mesh.get_coordinate())
    alone = torch.zeros_like(wide)
    alone[(..., *block)] = wide[(..., *block)]
    partial, want = plan.partial_spectrum(x_local), truncated_spectrum(alone, plan.modes, real, norm)
    assert partial.shape == want.shape
    assert rel_err(partial, want) <= tol if want.any() else not partial.any()  # an empty block: zeros

    share = plan.forward(x_local, sharded=True)
    expected_share = spec[_first(mine, d)]
    assert share.shape == expected_share.shape == (*batch, *plan.share_shape)
    assert rel_err(share, expected_share) <= tol, rel_err(share, expected_share)

    xhat = random_tensor((*batch, *plan.mode_shape), dtype, 2, complex_=True)
    field = zero_filled_inverse(xhat.to(torch.complex128), plan.modes, shape, real, norm)
    ref = local_block(field, mesh, placements, len(batch))
    y = plan.inverse(xhat.to(device))
    assert y.shape == (*batch, *plan.local_shape) and y.dtype == (dtype if real else plan.complex_dtype)
    assert rel_err(y, ref) <= tol, rel_err(y, ref)

    xhat_share = xhat[_first(mine, d)].to(device)
    y_sharded = plan.inverse(xhat_share, sharded=True)
    assert rel_err(y_sharded, ref) <= tol, rel_err(y_sharded, ref)
    assert len(plan.order) == d and sorted(plan.order) == list(range(d))


@pytest.mark.parametrize("case", _cases(), ids=_case_id)
def test_values_match_torch_fft(ranks, case):
    ranks.run(math.prod(case[1]), _check_values, *case)


def _loss(out, seed):
    """A rank's loss: a fixed random linear functional of its (real or complex) output."""
    real = torch.view_as_real(out) if out.is_complex() else out
    return (real * random_tensor(real.shape, torch.float64, seed).to(real.device)).sum()


def _check_gradients(shape, grid, modes, real, batch):
    """Each rank's gradient equals single-process autograd of the sum of every rank's loss."""
    rank, size, device = dist.get_rank(), dist.get_world_size(), device_for(dist.get_rank())
    mesh, placements = mesh_for(grid)
    plan = drift.TruncatedFFT(shape, modes, mesh, placements, real=real, dtype=torch.float64, device=device)
    d = len(shape)
    x = random_tensor((*batch, *shape), torch.float64, 3, complex_=not real)
    xhat = random_tensor((*batch, *plan.mode_shape), torch.float64, 4, complex_=True)
    coords = rank_coordinates(mesh)
    blocks = [mesh_block(shape, mesh.shape, placements, c) for c in coords]
    shares = [_first(mesh_share(plan.mode_shape[0], mesh.shape, placements, c), d) for c in coords]

    def reference(fn, inp):
        inp = inp.detach().clone().requires_grad_(True)
        sum(_loss(part, 100 + r) for r, part in enumerate(fn(inp))).backward()
        return inp.grad

    def local(fn, inp):
        inp = inp.detach().to(device, copy=True).requires_grad_(True)
        _loss(fn(inp), 100 + rank).backward()
        return inp.grad

    def spectrum(inp):
        return truncated_spectrum(inp, plan.modes, real, "backward")

    def field(inp):
        return zero_filled_inverse(inp, plan.modes, shape, real, "backward")

    x_local = x[(..., *blocks[rank])]
    checks = {
        "forward": (
            local(plan.forward, x_local),
            reference(lambda t: [spectrum(t)] * size, x)[(..., *blocks[rank])],
        ),
        "forward sharded": (
            local(lambda t: plan.forward(t, sharded=True), x_local),
            reference(lambda t: [spectrum(t)[s] for s in shares], x)[(..., *blocks[rank])],
        ),
        "inverse sharded": (
            local(lambda t: plan.inverse(t, sharded=True), xhat[shares[rank]]),
            reference(lambda t: [field(t)[(..., *b)] for b in blocks], xhat)[shares[rank]],
        ),
        "forward then inverse": (
            local(lambda t: plan.inverse(plan.forward(t)), x_local),
            reference(lambda t: [field(spectrum(t))[(..., *b)] for b in blocks], x)[(..., *blocks[rank])],
        ),
    }
    # A replicated input's gradient is this rank's contribution; their sum is the global gradient.
    partial = local(plan.inverse, xhat)
    dist.all_reduce(partial)
    checks["inverse"] = (partial, reference(lambda t: [field(t)[(..., *b)] for b in blocks], xhat))
    for name, (got, want) in checks.items():
        assert rel_err(got, want) <= TOL[torch.float64], (name, rel_err(got, want))
    assert d == len(plan.order)


GRADIENT_CASES = [
    ((12,), (3,), [2], True, (2,)),
    ((9, 10), (2, 1), [2, 3], True, ()),
    ((10, 9), (1, 2), [[0, 3, -2], 4], True, (2,)),
    ((7, 8, 6), (2, 2, 1), [2, 2, 4], True, ()),
    ((7, 8, 6), (1, 2, 2), [2, [1, -3], 2], False, (2,)),
    ((5, 6, 4, 7), (1, 1, 2, 2), [1, 2, 2, 3], True, ()),
    ((11,), (1,), [[3, -1, 0]], False, (3,)),
    ((6, 5, 4), (1, 1, 1), [2, 2, 2], True, (2,)),
    ((5, 6), (4, 1), [2, 3], True, (2,)),
    ((9, 4, 3), (4, 1, 1), [1, [0, -1], 1], False, ()),
    ((1, 6, 5), (2, 2, 1), [[0], 2, 2], True, (2,)),
]


@pytest.mark.parametrize(
    "case", GRADIENT_CASES, ids=lambda c: f"{'x'.join(map(str, c[0]))}-grid{'x'.join(map(str, c[1]))}"
)
def test_gradients_follow_sum_convention(ranks, case):
    ranks.run(math.prod(case[1]), _check_gradients, *case)


def _quadratic(out, seed):
    """A rank's loss with a second derivative: a fixed random weighting of its output's squared values."""
    real = torch.view_as_real(out) if out.is_complex() else out
    return (real.square() * random_tensor(real.shape, torch.float64, seed).to(real.device)).sum()


def _check_second_derivatives(shape, grid, modes, real):
    """Each rank's gradient of a functional of its gradient (``create_graph``) equals single-process
    autograd under the sum convention; a Replicate DTensor spectrum refuses a second derivative."""
    rank, device = dist.get_rank(), device_for(dist.get_rank())
    mesh, placements = mesh_for(grid)
    plan = drift.TruncatedFFT(shape, modes, mesh, placements, real=real, dtype=torch.float64, device=device)
    d = len(shape)
    x = random_tensor((2, *shape), torch.float64, 5, complex_=not real)
    xhat = random_tensor((2, *plan.mode_shape), torch.float64, 6, complex_=True)
    coords = rank_coordinates(mesh)
    blocks = [(..., *mesh_block(shape, mesh.shape, placements, c)) for c in coords]
    shares = [_first(mesh_share(plan.mode_shape[0], mesh.shape, placements, c), d) for c in coords]

    def local(fn, inp):
        inp = inp.detach().to(device, copy=True).requires_grad_(True)
        (grad,) = torch.autograd.grad(_quadratic(fn(inp), 100 + rank), inp, create_graph=True)
        return torch.autograd.grad(_loss(grad, 200 + rank), inp)[0]

    def reference(fn, inp, parts):
        inp = inp.detach().clone().requires_grad_(True)
        first = sum(_quadratic(out, 100 + r) for r, out in enumerate(fn(inp)))
        (grad,) = torch.autograd.grad(first, inp, create_graph=True)
        second = sum(_loss(grad[part], 200 + r) for r, part in enumerate(parts))
        return torch.autograd.grad(second, inp)[0][parts[rank]]

    def spectrum(t):
        return truncated_spectrum(t, plan.modes, real, "backward")

    def field(t):
        return zero_filled_inverse(t, plan.modes, shape, real, "backward")

    checks = {
        "forward": (local(plan.forward, x[blocks[rank]]), reference(lambda t: [spectrum(t)] * len(coords), x, blocks)),
        "forward sharded": (
            local(lambda t: plan.forward(t, sharded=True), x[blocks[rank]]),
            reference(lambda t: [spectrum(t)[s] for s in shares], x, blocks),
        ),
        "inverse sharded": (
            local(lambda t: plan.inverse(t, sharded=True), xhat[shares[rank]]),
            reference(lambda t: [field(t)[b] for b in blocks], xhat, shares),
        ),
        "forward then inverse": (
            local(lambda t: plan.inverse(plan.forward(t)), x[blocks[rank]]),
            reference(lambda t: [field(spectrum(t))[b] for b in blocks], x, blocks),
        ),
    }
    for name, (got, want) in checks.items():
        assert rel_err(got, want) <= TOL[torch.float64], (name, rel_err(got, want))
    x_dtensor = distribute(x, mesh, placements, 1, requires_grad=True)
    with pytest.raises(RuntimeError, match="differentiable once"):
        torch.autograd.grad(plan(x_dtensor).abs().square().sum(), x_dtensor, create_graph=True)


@pytest.mark.parametrize(
    "case",
    [((9, 10), (2, 1), (2, 3), True), ((7, 8, 6), (2, 2, 1), (2, 2, 4), True), ((5, 6), (3, 1), (2, 3), False)],
    ids=lambda c: f"{'x'.join(map(str, c[0]))}-grid{'x'.join(map(str, c[1]))}",
)
def test_second_derivatives_follow_sum_convention(ranks, case):
    ranks.run(math.prod(case[1]), _check_second_derivatives, *case)


# Plans whose inverse contracts in another order than the forward's reverse (``inverse_order``): the
# forward's real stage is not innermost, the inverse's is. One rank, a slab, a pencil with an odd extent.
SPLIT_ORDER_CASES = [
    ((16, 12, 6, 5), (1, 1, 1, 1), [2, 2, 2, 3], (2, 3)),
    ((16, 12, 9), (1, 1, 1), [2, 2, 5], ()),
    ((48, 16, 6, 5), (2, 1, 1, 1), [2, 2, 2, 2], (2,)),
    ((32, 24, 9), (2, 2, 1), [2, 2, 5], (2,)),
]


def _check_split_orders(shape, grid, modes, batch):
    mesh, placements = mesh_for(grid)
    plan = drift.TruncatedFFT(shape, modes, mesh, placements, dtype=torch.float64)
    assert plan.order != plan.inverse_order and plan.inverse_order[0] == len(shape) - 1, plan
    for i, dtype in enumerate((torch.float64, torch.float32)):
        _check_values(shape, grid, modes, True, dtype, NORMS[i], batch)
    _check_gradients(shape, grid, modes, True, batch)
    if math.prod(grid) == 1:
        small = drift.TruncatedFFT(shape, modes, dtype=torch.float64)
        x = random_tensor((1, *shape), torch.float64, 21).requires_grad_(True)
        xhat = random_tensor((1, *small.mode_shape), torch.float64, 22, complex_=True).requires_grad_(True)
        assert torch.autograd.gradcheck(small.forward, (x,)) and torch.autograd.gradcheck(small.inverse, (xhat,))


@pytest.mark.parametrize("case", SPLIT_ORDER_CASES, ids=lambda c: "x".join(map(str, c[0])) + f"-grid{len(c[1])}")
def test_inverse_order_of_its_own_matches_torch_fft(ranks, case):
    ranks.run(math.prod(case[1]), _check_split_orders, *case)


@pytest.mark.parametrize("real", [True, False])
def test_gradcheck_one_rank(real):
    plan = drift.TruncatedFFT((6, 5, 4), (2, [0, 2, -1], 2), real=real, dtype=torch.float64)
    x = random_tensor((2, 6, 5, 4), torch.float64, 5, complex_=not real).requires_grad_(True)
    xhat = random_tensor((2, *plan.mode_shape), torch.float64, 6, complex_=True).requires_grad_(True)
    assert torch.autograd.gradcheck(plan.forward, (x,))
    assert torch.autograd.gradcheck(lambda t: plan.forward(t, sharded=True), (x,))
    assert torch.autograd.gradcheck(plan.inverse, (xhat,))


def test_embedded_default_matches_reference():
    """World size 1 without init_process_group: the plan runs and issues no collective."""
    assert not dist.is_initialized()
    plan = drift.TruncatedFFT((10, 8), (3, 4), dtype=torch.float64)
    x = random_tensor((3, 10, 8), torch.float64, 7)
    with drift.comm_log() as log:
        out = plan.forward(x)
        share = plan.forward(x, sharded=True)
        y = plan.inverse(out)
    assert log.calls == []
    spec = truncated_spectrum(x, plan.modes, True, "backward")
    assert rel_err(out, spec) <= 1e-12
    assert rel_err(share, spec) <= 1e-12
    assert rel_err(y, zero_filled_inverse(spec, plan.modes, (10, 8), True, "backward")) <= 1e-12
    assert rel_err(plan.partial_spectrum(x), spec) <= 1e-12  # one rank: its partial spectrum is the spectrum


@pytest.mark.parametrize("real", [True, False])
@pytest.mark.parametrize("convert", ["double", "to float64", "float"])
def test_conversions_rebuild_exact_bases(real, convert):
    """A plan converted to the other precision is as exact as one built in it."""
    built, dtype = (torch.float64, torch.float32) if convert == "float" else (torch.float32, torch.float64)
    plan = drift.TruncatedFFT((12, 9, 8), (3, [0, 4, -2], 3), real=real, dtype=built)
    plan = {"double": plan.double, "to float64": lambda: plan.to(torch.float64), "float": plan.float}[convert]()
    assert plan.dtype == dtype and plan.complex_dtype == (
        torch.complex64 if dtype == torch.float32 else torch.complex128
    )
    x = random_tensor((2, 12, 9, 8), torch.float64, 15, complex_=not real)
    xhat = random_tensor((2, *plan.mode_shape), torch.float64, 16, complex_=True)
    spec = truncated_spectrum(x, plan.modes, real, "backward")
    out = plan.forward(x.to(dtype if real else plan.complex_dtype))
    y = plan.inverse(xhat.to(plan.complex_dtype))
    assert out.dtype == plan.complex_dtype and rel_err(out, spec) <= TOL[dtype], rel_err(out, spec)
    want = zero_filled_inverse(xhat, plan.modes, (12, 9, 8), real, "backward")
    assert rel_err(y, want) <= TOL[dtype], rel_err(y, want)


def test_flop_optimal_order():
    """Paper Table III: at P = 4 on 128 x 128 x 64 x 30 the cheapest order contracts y first."""
    plan_shape, kept = (32, 128, 64, 30), (16, 16, 16, 16)
    order, flops = contraction.best_order(plan_shape, kept, real=True)
    assert order[0] == 1
    every = [contraction.contraction_flops(o, plan_shape, kept, True) for o in itertools.permutations(range(4))]
    assert flops == min(every) < contraction.contraction_flops((3, 2, 1, 0), plan_shape, kept, True)


def test_orders_count_the_interleaving_copy():
    """With the copy's cost an innermost-first order wins where its extra FLOPs are fewer than the copy's
    weight: the inverse's at 16 x 12 x 9 (2.3x the FLOPs), not at the FNO block of a 4-rank slab
    (16 x 64 x 32 x 30), at 64 x 64 x 32 x 30 or at the paper grid, whose first two stages' copy is of
    the kept modes of two dims. Of orders that cost the same, the one whose first stage has lines before
    its dim (a batched gemm) wins."""
    kept = (16, 16, 16, 16)
    local = (64, 64, 32, 30)
    assert contraction.interleave_copy((0, 1, 2, 3), local, kept, True) == 2 * 16 * 16 * 32 * 30
    assert contraction.interleave_copy((3, 0, 1, 2), local, kept, True) == 0
    assert contraction.interleave_copy((0, 1, 2, 3), local, kept, False) == 0
    whole = drift.TruncatedFFT(local, (8, 8, 8, 16))
    assert whole.order == whole.inverse_order == (1, 0, 2, 3)
    rows = [17, 17, 17, 30]
    cost = {
        o: contraction.contraction_flops(o, local, kept, True, rows)
        + contraction.INVERSE_COPY_FLOPS * contraction.interleave_copy(o, local, kept, True)
        for o in itertools.permutations(range(4))
    }
    assert cost[(1, 0, 2, 3)] == cost[(0, 1, 2, 3)] == min(cost.values())
    block = drift.TruncatedFFT((16, 64, 32, 30), (8, 8, 8, 16))
    assert block.order == block.inverse_order == (1, 2, 3, 0)
    rows = [16, 17, 17, 30]
    assert block.flops == contraction.contraction_flops((1, 2, 3, 0), block.local_shape, kept, True, rows)
    small = drift.TruncatedFFT((16, 12, 9), (2, 2, 5))
    assert (small.order, small.inverse_order) == ((0, 1, 2), (2, 0, 1))
    count = contraction.contraction_flops
    flops = {o: count(o, (16, 12, 9), (4, 4, 5), True, (5, 5, 9)) for o in ((0, 1, 2), (2, 0, 1))}
    assert small.inverse_flops == flops[(2, 0, 1)] > 2 * small.flops == 2 * flops[(0, 1, 2)]
    paper = drift.TruncatedFFT((128, 128, 64, 30), (8, 8, 8, 16))
    assert paper.order == paper.inverse_order == (1, 0, 2, 3)


def _bytes_per_call(shape, grid, modes, batch):
    device = device_for(dist.get_rank())
    mesh, placements = mesh_for(grid)
    plan = drift.TruncatedFFT(shape, modes, mesh, placements, dtype=torch.float32, device=device)
    x = local_block(random_tensor((batch, *shape), torch.float32, 8), mesh, placements, 1).requires_grad_(True)
    records = {}
    for name, run in {
        "forward": lambda: plan.forward(x),
        "forward sharded": lambda: plan.forward(x, sharded=True),
        "inverse sharded": lambda: plan.inverse(plan.forward(x.detach(), sharded=True), sharded=True),
        "inverse": lambda: plan.inverse(plan.forward(x.detach())),
    }.items():
        with drift.comm_log() as log:
            out = run()
        records[name] = [(c.kind, c.bytes, c.wire_bytes) for c in log.calls]
        if out.requires_grad:
            with drift.comm_log() as log:
                _loss(out, 0).backward()
            records[name + " backward"] = [(c.kind, c.bytes) for c in log.calls]
    return records, plan.mode_shape


def test_conjugate_pairs_fold_into_one_gemm_row():
    """A real stage computes f and -f once: the real parts of the frequencies up to sign, then their
    imaginary parts but at 0 and N / 2 (zero at every offset)."""
    assert contraction.folded_rows(tuple(range(8)) + tuple(range(56, 64)), 64) == 9 + 8
    assert contraction.folded_rows(tuple(range(16)), 16) == 16  # all kept: N real values
    assert contraction.folded_rows((3, 5), 8) == 1 + 1  # 3 and -3: one pair
    assert contraction.folded_rows((0, 4, 1), 8) == 3 + 1
    forward = contraction.contraction_flops((0, 1), (64, 8), (16, 5), True, (17, 10))
    assert forward == 2 * 8 * 64 * 17 + 4 * 17 * 8 * 5  # the second stage: a real gemm on the 17 rows
    backward = contraction.contraction_flops((1, 0), (64, 8), (16, 5), True, (17, 10))
    assert backward == 4 * 64 * 8 * 5 + 8 * 5 * 64 * 16  # the innermost dim first: interleaved, not folded


# Extents long enough on the first dim that both the forward and the inverse contract it first (folded).
FOLD_CASES = [
    ((52, 4, 4), ([1, 2, 3, -1, -2, -3], 2, 3), None),  # an ascending run of conjugates after the positives
    ((78, 3), ([-1, 3, 1, -3, 5, 0, -2], 2), None),  # scattered pairs, a conjugate first
    ((48, 3, 2), ([24, 0, 3, -3], [0, -1], 2), None),  # N / 2 (real at every offset) beside a pair
    ((46, 5, 2), ([-3, -2, -1], 2, 2), ((2, 3), 0, 1)),  # conjugates only, a padded extent of 51
]


@pytest.mark.parametrize("case", FOLD_CASES, ids=lambda c: "x".join(map(str, c[0])))
def test_folded_stages_match_torch_fft(case):
    shape, modes, padding = case
    plan = drift.TruncatedFFT(shape, modes, dtype=torch.float64, padding=padding)
    assert [plan._forward_stages[i].kind for i in (0, 1)] == ["real", "fold_expand"], plan
    assert [plan._inverse_stages[i].kind for i in (-2, -1)] == ["fold_reduce", "real"], plan
    pad = [(0, 0)] * len(shape) if padding is None else plan.padding
    for dtype in (torch.float64, torch.float32):
        x = random_tensor((2, *shape), torch.float64, 31)
        wide = torch.nn.functional.pad(x, [p for pair in reversed(pad) for p in pair])
        xhat = random_tensor((2, *plan.mode_shape), torch.float64, 32, complex_=True)
        spec = truncated_spectrum(wide, plan.modes, True, "backward")
        crop = tuple(slice(b, b + n) for (b, _), n in zip(pad, shape, strict=True))
        want = zero_filled_inverse(xhat, plan.modes, plan.padded_shape, True, "backward")[(..., *crop)]
        p = plan.to(dtype)
        complex_dtype = torch.complex128 if dtype == torch.float64 else torch.complex64
        assert rel_err(p.forward(x.to(dtype)), spec) <= TOL[dtype]
        assert rel_err(p.inverse(xhat.to(complex_dtype)), want) <= TOL[dtype]
    plan = plan.double()
    x = random_tensor((2, *shape), torch.float64, 33).requires_grad_(True)
    xhat = random_tensor((2, *plan.mode_shape), torch.float64, 34, complex_=True).requires_grad_(True)
    assert torch.autograd.gradcheck(plan.forward, (x,)) and torch.autograd.gradcheck(plan.inverse, (xhat,))


@pytest.mark.parametrize("grid", [(2, 1, 1), (3, 1, 1), (4, 1, 1), (2, 2, 1)], ids=str)
def test_bytes_depend_on_modes_not_extents(ranks, grid):
    modes, batch, size = (3, 2, 4), 2, math.prod(grid)
    small = ranks.run(size, _bytes_per_call, (12, 10, 9), grid, modes, batch)
    large = ranks.run(size, _bytes_per_call, (48, 40, 30), grid, modes, batch)
    assert [r for r, _ in small] == [r for r, _ in large]
    records, mode_shape = small[0]
    # k = 3 keeps 2k = 6 frequencies of dim 0, k = 2 keeps 4 of dim 1, the half spectrum keeps 0..3 of dim 2.
    k1, rest = 6, 4 * 4
    assert mode_shape == (k1, 4, 4)
    payload = batch * k1 * rest * 8  # complex64
    # One collective per mesh dim that splits the field, the outermost first. A reduce-scatter pads K1 rows
    # to a multiple of its ranks (torch.chunk shares of ceil(K1 / P) rows); the next one splits this
    # rank's share again, and the backward all-gathers run innermost first.
    parts = [p for p in grid if p > 1]
    rows, scatters, gathers = k1, [], []
    for p in parts:
        c = -(-rows // p)
        padded = batch * p * c * rest * 8
        scatters.append(("reduce_scatter", padded, (p - 1) * padded // p))
        gathers.insert(0, ("all_gather", padded // p))
        rows = c  # rank 0's share: the first chunk
    reduces = [("all_reduce", payload, 2 * (p - 1) * payload // p) for p in parts]
    assert records["forward"] == reduces
    assert records["forward backward"] == [("all_reduce", payload)] * len(parts)
    assert records["forward sharded"] == scatters
    assert records["forward sharded backward"] == gathers
    assert [k for k, *_ in records["inverse sharded"]] == ["reduce_scatter"] * len(parts) + ["all_gather"] * len(parts)
    assert [k for k, *_ in records["inverse"]] == ["all_reduce"] * len(parts)


def test_bad_modes():
    cases = [
        ((8, 6), (5, 2), "dim 0: 2k = 10 exceeds the extent 8"),
        ((8, 6), (2, 5), "dim 1: k = 5 exceeds the 4 frequencies"),
        ((8, 6), (2, [0, 1, 1]), "dim 1: duplicate"),
        ((8, 6), ([0, 8], 2), "dim 0: index 8 is out of range"),
        ((8, 6), ([0, -9], 2), "dim 0: index -9 is out of range"),
        ((8, 6), (2, [0, 4]), "dim 1: index 4 is beyond the half spectrum"),
        ((8, 6), (2, []), "dim 1: the index list is empty"),
        ((8, 6), (0, 2), "dim 0: k = 0 must be at least 1"),
        ((8, 6), (2, 2.5), "dim 1"),
        ((8, 6), (2,), "one entry per dim"),
    ]
    for shape, modes, match in cases:
        with pytest.raises(ValueError, match=match):
            drift.TruncatedFFT(shape, modes)
    drift.TruncatedFFT((8, 6), (4, [0, -3]), real=False)  # 2k == N keeps every frequency
    with pytest.raises(ValueError, match="dim 1: index -2 is beyond the half spectrum"):
        drift.TruncatedFFT((8, 6), (4, [0, -2]))


def test_bad_plans():
    with pytest.raises(ValueError, match="dtype must be torch.float32 or torch.float64"):
        drift.TruncatedFFT((8,), 2, dtype=torch.int64)
    with pytest.raises(ValueError, match="dtype must be"):
        drift.TruncatedFFT((8,), 2, dtype=torch.complex64)
    with pytest.raises(ValueError, match="norm must be one of"):
        drift.TruncatedFFT((8,), 2, norm="unitary")
    with pytest.raises(ValueError, match="has 2 ranks but the process group has 1"):
        drift.TruncatedFFT((8, 8), 2, *drift.grid_mesh((2, 1)))
    with pytest.raises(ValueError, match="need one entry per dim of the mesh"):
        drift.TruncatedFFT((8, 8), 2, None, (Shard(0),))


def test_bad_inputs_raise_plan_error():
    plan = drift.TruncatedFFT((8, 6), (2, 3))
    good = torch.randn(8, 6)
    bad = {
        "shape": torch.randn(8, 7),
        "too few dims": torch.randn(6),
        "dtype": good.double(),
        "complex": good.to(torch.complex64),
        "integer": good.to(torch.int32),
        "device": good.to("meta"),
    }
    for x in bad.values():
        with pytest.raises(drift.PlanError, match="forward input on rank 0 expected"):
            plan.forward(x)
    with pytest.raises(drift.PlanError, match=r"expected shape \(\*batch, 4, 3\), got \(4, 4\)"):
        plan.inverse(torch.zeros(4, 4, dtype=torch.complex64))
    with pytest.raises(drift.PlanError, match="complex64"):
        plan.inverse(torch.zeros(4, 3))
    with pytest.raises(drift.PlanError, match=r"sharded inverse input on rank 0 expected shape \(\*batch, 4, 3\)"):
        plan.inverse(torch.zeros(3, 3, dtype=torch.complex64), sharded=True)
    assert issubclass(drift.PlanError, ValueError)


def test_non_strict_plan_converts_dtype():
    strict = drift.TruncatedFFT((8, 6), (2, 3), dtype=torch.float32)
    loose = drift.TruncatedFFT((8, 6), (2, 3), dtype=torch.float32, strict=False)
    x = torch.randn(8, 6, dtype=torch.float64)
    assert torch.equal(loose.forward(x), strict.forward(x.float()))  # exact: one process, the same computation
    with pytest.raises(drift.PlanError):
        loose.forward(torch.randn(8, 5))
    with pytest.raises(drift.PlanError):
        loose.forward(x.to(torch.complex128))


def _one_bad_rank(timeout_s):
    """Rank 0 passes a block of the wrong shape; the others enter the all-reduce without it."""
    mesh = DeviceMesh.from_group(short_timeout_group(timeout_s), device_for(dist.get_rank()).type)
    plan = drift.TruncatedFFT((12, 10), (2, 2), mesh, (Shard(0),))
    rows = plan.local_shape[0] + (1 if dist.get_rank() == 0 else 0)
    return attempt(plan.forward, torch.randn(rows, 10))


def test_one_bad_rank_fails_all_within_the_group_timeout():
    group_timeout_s = 2.0
    with rank_pool(3) as pool:
        results = pool.run(_one_bad_rank, group_timeout_s, timeout_s=60)
    check_one_bad_rank(results, "PlanError", "expected shape (*batch, 4, 10), got (5, 10)", group_timeout_s)


@pytest.mark.parametrize("real", [True, False])
def test_chunked_unrecorded_passes_match(real):
    """Passes autograd does not record run in chunks of rows bounded by work_bytes."""
    plan = drift.TruncatedFFT((10, 9, 8), (3, [0, 2, -1], 3), real=real, dtype=torch.float64)
    x = random_tensor((5, 3, 10, 9, 8), torch.float64, 13, complex_=not real)
    xhat = random_tensor((5, 3, *plan.mode_shape), torch.float64, 14, complex_=True)
    whole = plan.forward(x), plan.forward(x, sharded=True), plan.inverse(xhat)
    plan.work_bytes = 1  # one row per chunk
    chunked = plan.forward(x), plan.forward(x, sharded=True), plan.inverse(xhat)
    for a, b in zip(whole, chunked, strict=True):
        assert rel_err(b, a) <= 1e-12
    with torch.no_grad():
        y = plan.inverse(xhat.requires_grad_(True))
    assert rel_err(y, whole[2]) <= 1e-12
    assert rel_err(plan.forward(x.clone().requires_grad_(True)), whole[0]) <= 1e-12


def test_chunks_are_cache_sized_on_the_cpu_and_whole_batches_elsewhere():
    """The default bound is per device: a row of a 64 x 64 x 32 x 30 field per chunk on the CPU, a whole
    batch of 20 on another device (a GPU, where every chunk costs kernel launches); ``work_bytes`` overrides it."""
    shape, rows = (64, 64, 32, 30), 20
    for device, expected in (("cpu", 1), ("meta", rows)):
        plan = drift.TruncatedFFT(shape, (8, 8, 8, 16), device=device)
        assert plan.chunk_rows(plan._forward_stages, shape, rows) == expected, device
        assert plan.chunk_rows(plan._inverse_stages, plan.mode_shape, rows) == expected, device
        plan.work_bytes = 1
        assert plan.chunk_rows(plan._forward_stages, shape, rows) == 1


@pytest.mark.parametrize(("shape", "modes"), [((65536,), 8), ((16384, 8), (8, 3))], ids=str)
def test_long_contractions_keep_single_precision(shape, modes):
    """One float32 field with a long dim: the forward and the inverse's adjoint (a gradient) sum over its
    points in blocks, within float32's tolerance (one accumulator over 65536 terms lost 7e-6)."""
    plan = drift.TruncatedFFT(shape, modes, dtype=torch.float32)
    x = random_tensor((1, *shape), torch.float64, 12)
    assert rel_err(plan(x.float()), truncated_spectrum(x, plan.modes, True, "backward")) <= TOL[torch.float32]
    xhat = random_tensor((1, *plan.mode_shape), torch.float64, 13, complex_=True)
    g = random_tensor((1, *shape), torch.float64, 14)
    leaf = xhat.to(torch.complex64).requires_grad_(True)
    (got,) = torch.autograd.grad(plan.inverse(leaf), leaf, g.float())
    leaf = xhat.clone().requires_grad_(True)
    (want,) = torch.autograd.grad(zero_filled_inverse(leaf, plan.modes, shape, True, "backward"), leaf, g)
    assert rel_err(got, want) <= TOL[torch.float32]


@pytest.mark.parametrize("real", [True, False])
def test_inverse_into_a_preallocated_tensor(real):
    """``inverse(out=...)`` writes torch.fft's values into ``out`` (in chunks) and returns it; an ``out`` it
    cannot fill as it is is a PlanError."""
    plan = drift.TruncatedFFT((10, 9, 7), (3, 2, 3), real=real, dtype=torch.float64)
    xhat = random_tensor((2, 3, *plan.mode_shape), torch.float64, 15, complex_=True)
    if real:  # the spectrum of a real field, so that its inverse is irfftn's
        xhat = truncated_spectrum(random_tensor((2, 3, 10, 9, 7), torch.float64, 16), plan.modes, True, "backward")
    expected = zero_filled_inverse(xhat, plan.modes, (10, 9, 7), real, "backward")
    out = torch.full_like(expected, float("nan"))
    plan.work_bytes = 1  # one row per chunk
    assert plan.inverse(xhat, out=out) is out
    assert rel_err(out, expected) <= 1e-12
    for bad in (
        out[..., :6],
        out.transpose(-1, -2).contiguous().transpose(-1, -2),
        torch.empty(out.shape, dtype=torch.complex128 if real else torch.float64),
    ):
        with pytest.raises(drift.PlanError, match="out= must be a contiguous"):
            plan.inverse(xhat, out=bad)
    with pytest.raises(drift.PlanError, match="automatic differentiation"):
        plan.inverse(xhat.clone().requires_grad_(True), out=out)
    every_mode = drift.TruncatedFFT((6,), [list(range(6))], real=False, dtype=torch.float64)
    spectrum = random_tensor((2, 6), torch.float64, 17, complex_=True)
    with pytest.raises(drift.PlanError, match="out= shares memory with the input"):
        every_mode.inverse(spectrum, out=spectrum)


def _bad_outs_on_a_slab():
    """``out=`` that the sharded inverse cannot fill is refused before its all-gather."""
    device = device_for(dist.get_rank())
    plan = drift.TruncatedFFT((8, 6), (2, 3), *mesh_for((2, 1)), dtype=torch.float64, device=device)
    share = torch.zeros(2, *plan.share_shape, dtype=torch.complex128, device=device)
    out = torch.empty(2, *plan.local_shape, dtype=torch.float64, device=device)
    cases = [
        (lambda o: plan.inverse(share, sharded=True, out=o), out[..., :-1]),
        (lambda o: plan.inverse(share, sharded=True, out=o), out.float()),
        (lambda s: plan.inverse(s, sharded=True, out=out), share.clone().requires_grad_(True)),
    ]
    return attempts_without_collectives(cases)


def test_bad_outs_fail_before_any_collective(ranks):
    for errors in ranks.run(2, _bad_outs_on_a_slab):
        kinds, messages = zip(*errors, strict=True)
        assert kinds == ("PlanError",) * 3, errors
        assert "out= must be a contiguous torch.float64 tensor" in messages[0] + messages[1]
        assert "automatic differentiation" in messages[2]


def _conjugate_views():
    """Lazily conjugated tensors (``t.conj()``, a loss written with ``y.conj()``) through the sharded paths
    and ``Layout.gather``: the values and gradients of their resolved copies."""
    device = device_for(dist.get_rank())
    plan = drift.TruncatedFFT((8, 6), (2, 3), *mesh_for((2, 1)), dtype=torch.float64, device=device)
    x = random_tensor((8, 6), torch.float64, 7).to(device)[plan.local_slices]
    w = random_tensor(plan.share_shape, torch.float64, 8, complex_=True).to(device)
    grads = []
    for loss in (lambda y: (y.conj() * w).real.sum(), lambda y: (y.real * w.real + y.imag * w.imag).sum()):
        leaf = x.clone().requires_grad_(True)
        loss(plan(leaf, sharded=True)).backward()
        grads.append(leaf.grad)
    share = random_tensor(plan.share_shape, torch.float64, 9, complex_=True).to(device).conj()
    block = random_tensor(plan.local_shape, torch.float64, 10, complex_=True).to(device).conj()
    inverses = [plan.inverse(t, sharded=True) for t in (share, share.resolve_conj())]
    gathered = [plan.layout.gather(t) for t in (block, block.resolve_conj())]
    return rel_err(*grads), rel_err(*inverses), rel_err(*gathered)


def test_conjugate_views_go_through_the_collectives(ranks):
    assert ranks.run(2, _conjugate_views) == [(0.0, 0.0, 0.0)] * 2


def _check_dtensors(shape, grid, placements, modes, real, batch):
    """DTensor in, DTensor out: global values are torch.fft's, and the gradient of a DTensor loss on the output,
    or of a loss on its ``full_tensor()``, is single-process autograd's."""
    mesh, grid_placements = mesh_for(grid)
    placements = placements or grid_placements
    lead, device = len(batch), device_for(dist.get_rank())
    plan = drift.TruncatedFFT(shape, modes, mesh, placements, real=real, dtype=torch.float64, device=device)
    field_placements = lead_placements(placements, lead)
    share_placements = tuple(Shard(lead) if isinstance(p, Shard) else Replicate() for p in placements)
    replicated = (Replicate(),) * mesh.ndim
    x = random_tensor((*batch, *shape), torch.float64, 21, complex_=not real)
    xhat = random_tensor((*batch, *plan.mode_shape), torch.float64, 22, complex_=True)

    def spectrum(t):
        return truncated_spectrum(t, plan.modes, real, "backward")

    def field(t):
        return zero_filled_inverse(t, plan.modes, shape, real, "backward")

    runs = [
        ("forward", plan.forward, spectrum, x, field_placements, replicated),
        ("forward sharded", lambda t: plan(t, sharded=True), spectrum, x, field_placements, share_placements),
        ("inverse", plan.inverse, field, xhat, replicated, field_placements),
        ("inverse sharded", lambda t: plan.inverse(t, sharded=True), field, xhat, share_placements, field_placements),
    ]
    check_dtensor_runs(runs, mesh, device)


DTENSOR_CASES = [
    ((9, 7, 6), (2, 2, 1), None, (3, 2, 3), True, (2,)),
    ((5, 6), (4, 1), None, (2, 3), False, (2,)),
    ((11, 13), (2, 2), (Shard(1), Shard(0)), (4, [0, 2, 5]), True, ()),
    ((11, 13), (2, 2), (Replicate(), Shard(1)), (3, 4), False, (2,)),
]


@pytest.mark.parametrize("case", DTENSOR_CASES, ids=lambda c: case_id(c[0], c[1], *([] if c[2] is None else [c[2]])))
def test_dtensor_in_dtensor_out(ranks, case):
    ranks.run(math.prod(case[1]), _check_dtensors, *case)


def _bad_dtensors():
    """Every bad DTensor layout and plan placement fails at once on every rank, before any collective."""
    mesh, placements = mesh_for((2, 2))  # Shard(0), Shard(1) of an (8, 6) field
    slab, slab_placements = mesh_for((4, 1))
    plan = drift.TruncatedFFT((8, 6), (2, 2), mesh, placements)
    x = torch.randn(2, 8, 6)
    xhat = torch.randn(2, *plan.mode_shape, dtype=torch.complex64)
    partial = DTensor.from_local(x[..., 3 * mesh.get_coordinate()[1] :][..., :3], mesh, (Partial(), Shard(2)))
    cases = [
        (plan.forward, distribute(x, mesh, (Shard(0), Shard(2)), 0)),
        (plan.forward, distribute(x, mesh, (Shard(2), Shard(1)), 0)),
        (plan.forward, distribute(x, slab, slab_placements, 1)),
        (plan.forward, partial),
        (plan.forward, distribute(x, mesh, (Shard(1), Shard(1)), 0)),
        (plan.inverse, distribute(xhat, mesh, (Shard(1), Shard(1)), 0)),
        (lambda t: plan.inverse(t, sharded=True), distribute(xhat, mesh, (Replicate(), Replicate()), 0)),
        (plan.inverse, distribute(xhat[..., :1], mesh, (Replicate(), Replicate()), 0)),
        (lambda p: drift.TruncatedFFT((8, 6), 2, mesh, p), (Shard(1), Shard(-1))),
        (lambda p: drift.TruncatedFFT((8, 6), 2, mesh, p), (Shard(0), Partial())),
    ]
    return attempts_without_collectives(cases)


def test_bad_dtensors_fail_before_any_collective(ranks):
    for errors in ranks.run(4, _bad_dtensors):
        kinds, messages = zip(*errors, strict=True)
        assert all(k in ("ValueError", "PlanError") for k in kinds), errors
        assert "mesh dim 0 shards the batch dim of a (2, 8, 6) DTensor" in messages[0]
        assert kinds[1] == kinds[2] == "PlanError" and "does not match the plan's" in messages[1] + messages[2]
        assert "mesh dim 0: Partial placements are not supported" in messages[3]
        assert "transformed dim 0 is split over mesh dims 0 and 1" in messages[4]
        assert kinds[5] == kinds[6] == "PlanError" and "expected" in messages[5] and "sharded=True" in messages[6]
        assert kinds[7] == "PlanError" and "does not match the plan's modes (4, 2)" in messages[7]
        assert "transformed dim 1 is split over mesh dims 0 and 1" in messages[8]
        assert "mesh dim 1: Partial placements are not supported" in messages[9]
