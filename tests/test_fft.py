"""DistributedFFT against torch.fft and scipy.fft on 1..4 ranks: values, roundtrips, gradients, DTensors, errors."""

from __future__ import annotations

import itertools
import math

import pytest
import scipy.fft
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
from reference import TOL, case_id, mesh_block, random_tensor, rel_err, truncated_spectrum, zero_filled_inverse
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

import drift
from drift.fft import _dct

# (global shape, grid): slab and pencil, 2-D to 4-D, even, odd and prime extents, uneven splits, empty
# blocks (torch.chunk leaves trailing blocks empty: 5 or 2 over 4 ranks, 9 over 4, 1 over 2), transposed
# dims shorter than their ranks (r2c's half spectra of 4 and 3 over 4 ranks).
LAYOUTS = [
    ((8, 6), (1, 1)),
    ((5, 6, 7), (1, 1, 1)),
    ((9, 10), (2, 1)),
    ((10, 9), (1, 2)),
    ((12, 7, 5), (2, 1, 1)),
    ((7, 11, 6), (1, 1, 2)),
    ((5, 6, 4, 7), (2, 1, 1, 1)),
    ((11, 8), (3, 1)),
    ((10, 13, 6), (1, 3, 1)),
    ((7, 6, 5, 9), (1, 1, 1, 3)),
    ((23, 12), (4, 1)),
    ((13, 9), (1, 4)),
    ((11, 13, 6), (2, 2, 1)),
    ((9, 7, 10), (1, 2, 2)),
    ((8, 8, 8), (4, 1, 1)),
    ((6, 5, 7, 8), (2, 1, 2, 1)),
    ((5, 6, 7, 6), (1, 1, 2, 2)),
    ((5, 6), (4, 1)),
    ((2, 8), (4, 1)),
    ((6, 9, 5), (1, 4, 1)),
    ((1, 6, 5), (2, 2, 1)),
    ((8, 4), (4, 1)),
    ((8, 3), (1, 4)),
]
KINDS = ("c2c", "r2c", "dct2")
BATCHES = ((), (2,), (2, 3))


def _cases():
    cases = []
    for (shape, grid), kind, dtype in itertools.product(LAYOUTS, KINDS, (torch.float64, torch.float32)):
        i = len(cases)
        norms = ("backward", "ortho") if kind == "dct2" else ("backward", "ortho", "forward")
        cases.append((shape, grid, kind, dtype, norms[i % len(norms)], BATCHES[i % 3]))
    return cases


def _case_id(case):
    shape, grid, kind, dtype, norm, batch = case
    return case_id(shape, grid, kind, str(dtype)[6:], norm, f"b{len(batch)}")


def reference(x: torch.Tensor, d: int, kind: str, norm: str) -> torch.Tensor:
    """The single-process transform of the last d dims (x in float64 or complex128)."""
    dims = tuple(range(-d, 0))
    if kind == "c2c":
        return torch.fft.fftn(x, dim=dims, norm=norm)
    if kind == "r2c":
        return torch.fft.rfftn(x, dim=dims, norm=norm)
    return torch.from_numpy(scipy.fft.dctn(x.numpy(), type=2, axes=dims, norm=norm))


def _check_values(shape, grid, kind, dtype, norm, batch):
    device = device_for(dist.get_rank())
    mesh, placements = mesh_for(grid)
    plan = drift.DistributedFFT(shape, mesh, placements, kind=kind, dtype=dtype, norm=norm, device=device)
    x = random_tensor((*batch, *shape), dtype, 1, complex_=kind == "c2c")
    wide = x.to(torch.complex128 if kind == "c2c" else torch.float64)
    # This rank's output block is the one torch.chunk cuts for it under the output placements.
    mine = plan.output_slices()
    assert mine == mesh_block(plan.output_shape, mesh.shape, plan.output_placements, mesh.get_coordinate())
    ref = reference(wide, len(shape), kind, norm)[(..., *mine)]
    x_local = local_block(x, mesh, placements, len(batch))
    with drift.comm_log() as log:
        y = plan.forward(x_local)
        back = plan.inverse(y)
    assert y.shape == ref.shape and y.dtype == (plan.dtype if kind == "dct2" else plan.complex_dtype)
    assert rel_err(y, ref) <= TOL[dtype], rel_err(y, ref)
    assert back.shape == x_local.shape and back.dtype == x_local.dtype
    assert rel_err(back, x_local) <= TOL[dtype], rel_err(back, x_local)
    assert set(log.kinds()) <= {"all_to_all"}
    return len(log.calls), mine, [plan.output_slices(c) for c in rank_coordinates(mesh)]


@pytest.mark.parametrize("case", _cases(), ids=_case_id)
def test_values_and_roundtrip(ranks, case):
    shape, grid, kind = case[:3]
    size = math.prod(grid)
    results = ranks.run(size, _check_values, *case)
    # The output blocks tile the output shape exactly.
    plan_shape = (*shape[:-1], shape[-1] // 2 + 1) if kind == "r2c" else shape
    count = torch.zeros(plan_shape, dtype=torch.int64)
    for _, slices, _ in results:
        count[slices] += 1
    assert bool((count == 1).all())
    # output_slices(coordinate) names every rank's block, on every rank.
    assert all(every == [slices for _, slices, _ in results] for _, _, every in results)
    # One all-to-all per transpose and direction: none on one rank, 1 or 2 each way on slab or pencil grids.
    split = sum(p > 1 for p in grid)
    pre = 1 if kind == "r2c" and grid[-1] > 1 else 0
    assert {calls for calls, _, _ in results} == {2 * (split + pre)}


def _loss(out, seed):
    real = torch.view_as_real(out) if out.is_complex() else out
    return (real * random_tensor(real.shape, torch.float64, seed).to(real.device)).sum()


def _differentiable(shape, kind, norm, inverse):
    """The single-process transform with torch autograd (DCTs through drift.fft._dct, checked against scipy)."""
    dims = tuple(range(-len(shape), 0))
    if kind == "dct2":

        def dct(t):
            for dim in dims:
                t = (_dct.idct2 if inverse else _dct.dct2)(t, dim, norm)
            return t

        return dct
    if kind == "r2c":
        if inverse:
            return lambda t: torch.fft.irfftn(t, s=shape, dim=dims, norm=norm)
        return lambda t: torch.fft.rfftn(t, dim=dims, norm=norm)
    return lambda t: (torch.fft.ifftn if inverse else torch.fft.fftn)(t, dim=dims, norm=norm)


def _check_gradients(shape, grid, kind, norm):
    """Each rank's gradient equals single-process autograd of the sum of every rank's loss."""
    rank, device = dist.get_rank(), device_for(dist.get_rank())
    mesh, placements = mesh_for(grid)
    plan = drift.DistributedFFT(shape, mesh, placements, kind=kind, dtype=torch.float64, norm=norm, device=device)
    coords = rank_coordinates(mesh)
    in_blocks = [mesh_block(shape, mesh.shape, placements, c) for c in coords]
    out_blocks = [plan.output_slices(c) for c in coords]
    x = random_tensor((2, *shape), torch.float64, 3, complex_=kind == "c2c")
    y = random_tensor((2, *plan.output_shape), torch.float64, 4, complex_=kind != "dct2")
    for name, run, run_single, inp, mine, theirs in (
        ("forward", plan.forward, _differentiable(shape, kind, norm, False), x, in_blocks[rank], out_blocks),
        ("inverse", plan.inverse, _differentiable(shape, kind, norm, True), y, out_blocks[rank], in_blocks),
    ):
        local = inp[(..., *mine)].to(device).requires_grad_(True)
        _loss(run(local), 100 + rank).backward()
        full = inp.clone().requires_grad_(True)
        out = run_single(full)
        sum(_loss(out[(..., *b)], 100 + r) for r, b in enumerate(theirs)).backward()
        err = rel_err(local.grad, full.grad[(..., *mine)])
        assert err <= 1e-12, (name, err)


GRADIENT_CASES = [
    ((9, 10), (2, 1), "c2c", "ortho"),
    ((10, 9), (1, 2), "r2c", "backward"),
    ((7, 8, 6), (3, 1, 1), "dct2", "ortho"),
    ((7, 8, 6), (2, 2, 1), "r2c", "forward"),
    ((5, 6, 4, 7), (1, 2, 1, 2), "c2c", "backward"),
    ((6, 5, 7), (1, 2, 2), "dct2", "backward"),
    ((5, 6), (4, 1), "c2c", "ortho"),
    ((6, 9, 5), (1, 4, 1), "r2c", "backward"),
    ((1, 6, 5), (2, 2, 1), "dct2", "ortho"),
    ((8, 3), (1, 4), "r2c", "ortho"),
]


@pytest.mark.parametrize("case", GRADIENT_CASES, ids=lambda c: f"{c[2]}-grid{'x'.join(map(str, c[1]))}")
def test_gradients_follow_sum_convention(ranks, case):
    ranks.run(math.prod(case[1]), _check_gradients, *case)


@pytest.mark.parametrize("kind", KINDS)
def test_gradcheck_one_rank(kind):
    plan = drift.DistributedFFT((5, 4, 6), kind=kind, dtype=torch.float64, norm="ortho")
    x = random_tensor((2, 5, 4, 6), torch.float64, 5, complex_=kind == "c2c").requires_grad_(True)
    y = random_tensor((2, *plan.output_shape), torch.float64, 6, complex_=kind != "dct2").requires_grad_(True)
    assert torch.autograd.gradcheck(plan.forward, (x,))
    assert torch.autograd.gradcheck(plan.inverse, (y,))


def test_bad_plans():
    cases = [
        (lambda: drift.DistributedFFT((8, 8), *drift.grid_mesh((2, 1))), "has 2 ranks but the process group has 1"),
        (lambda: drift.DistributedFFT((8, 8), kind="c2r"), "kind must be one of"),
        (lambda: drift.DistributedFFT((8, 8), dtype=torch.complex64), "dtype must be"),
        (lambda: drift.DistributedFFT((8, 8), dtype=torch.int32), "dtype must be"),
        (lambda: drift.DistributedFFT((8, 8), kind="dct2", norm="forward"), "norm for kind 'dct2'"),
        (lambda: drift.DistributedFFT((8, 1), None, (Shard(1),)), "need one entry per dim of the mesh"),
    ]
    for make, match in cases:
        with pytest.raises(ValueError, match=match):
            make()


def test_bad_inputs_raise_plan_error():
    c2c = drift.DistributedFFT((8, 6))
    r2c = drift.DistributedFFT((8, 6), kind="r2c")
    dct2 = drift.DistributedFFT((8, 6), kind="dct2")
    real, cplx = torch.randn(8, 6), torch.randn(8, 6, dtype=torch.complex64)
    bad = [
        (c2c.forward, real, "forward input on rank 0 expected dtype torch.complex64"),
        (c2c.forward, cplx.to(torch.complex128), "expected dtype torch.complex64"),
        (
            c2c.forward,
            torch.randn(8, 5, dtype=torch.complex64),
            r"expected shape \(\*batch, 8, 6\), got \(8, 5\)",
        ),
        (r2c.forward, cplx, "expected dtype torch.float32"),
        (r2c.inverse, torch.randn(8, 6, dtype=torch.complex64), r"inverse input .* got \(8, 6\)"),
        (r2c.inverse, torch.randn(8, 4), "expected dtype torch.complex64"),
        (dct2.forward, real.double(), "expected dtype torch.float32"),
        (dct2.inverse, cplx, "expected dtype torch.float32"),
        (dct2.forward, real.to("meta"), "on cpu, got torch.float32 on meta"),
    ]
    for fn, x, match in bad:
        with pytest.raises(drift.PlanError, match=match):
            fn(x)


def _bad_grids():
    errors = []
    for shape, grid in [((8, 8), (2, 2)), ((8, 8), (8, 1)), ((2, 8), (4, 1)), ((8, 3), (1, 4))]:
        with drift.comm_log() as log:
            errors.append(attempt(lambda s=shape, g=grid: drift.DistributedFFT(s, *mesh_for(g), kind="r2c"))[:2])
        assert log.calls == []
    return errors


def test_bad_grids_fail_before_any_collective(ranks):
    for errors in ranks.run(4, _bad_grids):
        assert "split every dim: at least one dim must be whole" in errors[0][1]
        assert "has 8 ranks but the process group has 4" in errors[1][1]
        # Extents below the ranks that split them (the input's 2 rows, the half spectrum's 2 columns) leave
        # trailing blocks empty, which every step handles.
        assert errors[2] == errors[3] == (None, "")


def _short_transposed_dims():
    return (
        # 4 ranks split dim 0 of (8, 4), then the half spectrum of the last dim: 3 entries over 4 ranks.
        drift.DistributedFFT((8, 4), *mesh_for((4, 1)), kind="r2c").output_slices(),
        # Pruned: 4 ranks split the 3 kept modes of the last dim after dim 0 (4 kept modes) is transformed.
        drift.DistributedFFT((8, 9), *mesh_for((1, 4)), kind="r2c", modes=(2, 3)).output_slices(),
        drift.DistributedFFT((8, 4), *mesh_for((4, 1)), kind="c2c").output_slices(),
    )


def test_transposed_dims_shorter_than_their_ranks_leave_empty_blocks(ranks):
    # 3 entries over 4 ranks: torch.chunk blocks of 1, the last one empty.
    short = [slice(0, 1), slice(1, 2), slice(2, 3), slice(3, 3)]
    assert ranks.run(4, _short_transposed_dims) == [
        ((slice(0, 8), short[r]), (slice(0, 4), short[r]), (slice(0, 8), slice(r, r + 1))) for r in range(4)
    ]


def _one_bad_rank(timeout_s):
    """Rank 0 passes a float64 block; the others enter the transpose without it."""
    mesh = DeviceMesh.from_group(short_timeout_group(timeout_s), device_for(dist.get_rank()).type)
    plan = drift.DistributedFFT((12, 10, 6), mesh, (Shard(2),), kind="r2c")
    x = torch.randn(*plan.local_shape, dtype=torch.float64 if dist.get_rank() == 0 else torch.float32)
    return attempt(plan.forward, x)


def test_one_bad_rank_fails_all_within_the_group_timeout():
    group_timeout_s = 2.0
    with rank_pool(3) as pool:
        results = pool.run(_one_bad_rank, group_timeout_s, timeout_s=60)
    check_one_bad_rank(results, "PlanError", "expected dtype torch.float32", group_timeout_s)


INPLACE_LAYOUTS = [
    ((8, 6), (1, 1), ()),
    ((8, 12), (2, 1), (2,)),
    ((12, 8, 6), (3, 1, 1), ()),
    ((8, 4, 12), (1, 1, 4), (3,)),
    ((8, 12, 6), (2, 2, 1), ()),
    ((6, 8, 4, 6), (1, 2, 1, 2), (2,)),
]


def _check_inplace(shape, grid, batch, dtype, norm, staging_bytes):
    mesh, placements = mesh_for(grid)
    device = device_for(dist.get_rank())
    plan = drift.DistributedFFT(shape, mesh, placements, dtype=dtype, norm=norm, device=device, inplace=True)
    plan.staging_bytes = staging_bytes
    x = random_tensor((*batch, *shape), dtype, 9, complex_=True)
    ref = reference(x.to(torch.complex128), len(shape), "c2c", norm)[(..., *plan.output_slices())]
    x_local = local_block(x, mesh, placements, len(batch)).clone(memory_format=torch.contiguous_format)
    storage = x_local.data_ptr()
    with drift.comm_log() as log:
        y = plan.forward(x_local)
    assert y.data_ptr() == storage, "the output must live in the input's storage"
    assert rel_err(y, ref) <= TOL[dtype], rel_err(y, ref)
    assert set(log.kinds()) <= {"sendrecv"}
    # Every chunk of every exchange fits the staging bound.
    assert all(c.bytes <= staging_bytes for c in log.calls)
    back = plan.inverse(y)
    assert back.data_ptr() == storage
    assert rel_err(back, local_block(x, mesh, placements, len(batch))) <= TOL[dtype]
    return len(log.calls), log.bytes


def _inplace_exchanges(shape, grid, batch, itemsize: int, staging_bytes: int) -> tuple[int, int]:
    """The calls and bytes one rank's forward hands to ``sendrecv`` (even splits): one transpose per split
    dim, within its q ranks, sends the block's share of each of the q - 1 others, in chunks of at most
    ``staging_bytes``."""
    block = math.prod(batch) * math.prod(shape) // math.prod(grid)  # elements, before and after each transpose
    calls = nbytes = 0
    for q in (g for g in grid if g > 1):
        share = block // q
        chunk = min(staging_bytes // itemsize, share)
        calls += (q - 1) * -(-share // chunk)
        nbytes += (q - 1) * share * itemsize
    return calls, nbytes


@pytest.mark.parametrize(("shape", "grid", "batch"), INPLACE_LAYOUTS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_inplace_matches_and_reuses_the_storage(ranks, shape, grid, batch, dtype):
    norm = "ortho" if dtype == torch.float64 else "backward"
    exchanges = ranks.run(math.prod(grid), _check_inplace, shape, grid, batch, dtype, norm, 256)
    itemsize = 16 if dtype == torch.float64 else 8  # complex128, complex64
    assert exchanges == [_inplace_exchanges(shape, grid, batch, itemsize, 256)] * math.prod(grid)


def _inplace_empty_batch():
    mesh, placements = mesh_for((2, 2, 1))
    device = device_for(dist.get_rank())
    plan = drift.DistributedFFT((8, 12, 6), mesh, placements, device=device, inplace=True)
    with drift.comm_log() as log:
        y = plan.forward(torch.empty(0, *plan.local_shape, dtype=torch.complex64, device=device))
        back = plan.inverse(y)
    return (tuple(y.shape), tuple(back.shape)), ((0, *plan.output_local_shape), (0, *plan.local_shape)), log.calls


def test_inplace_takes_an_empty_batch(ranks):
    for shapes, expected, calls in ranks.run(4, _inplace_empty_batch):
        assert shapes == expected and calls == []


def test_inplace_rejects_what_it_cannot_do():
    with pytest.raises(ValueError, match="kind 'r2c' is not supported"):
        drift.DistributedFFT((8, 8), kind="r2c", inplace=True)
    plan = drift.DistributedFFT((8, 6), inplace=True, dtype=torch.float64)
    x = torch.randn(8, 6, dtype=torch.complex128)
    with pytest.raises(drift.PlanError, match="contiguous"):
        plan.forward(x.t().contiguous().t())
    with pytest.raises(drift.PlanError, match="does not record autograd"):
        plan.forward(x.clone().requires_grad_(True))


def _uneven_inplace():
    with pytest.raises(ValueError, match="split evenly"):
        drift.DistributedFFT((9, 8), *mesh_for((3, 1)), inplace=True)
    return True


def test_inplace_needs_even_splits(ranks):
    assert ranks.run(3, _uneven_inplace) == [True] * 3


# (shape, grid, modes, kind) and, per transpose of the pruned and of the full plan, the global extents
# it moves and their itemsize (batch 2, float64): worked out by hand from the schedule (the dims whole
# at the start are transformed first; a split dim is swapped with a transformed whole one; r2c makes
# its real last dim whole first). A kept mode count is 2k, k on r2c's last dim; r2c's full last extent
# N // 2 + 1. Over the ranks, a transpose's payloads add up to its extents x itemsize x batch.
PRUNED_CASES = [
    ((12, 10, 7), (2, 1, 1), (3, 2, 3), "r2c", [((12, 4, 3), 16)], [((12, 10, 4), 16)]),
    (
        (11, 13, 6),
        (2, 2, 1),
        (2, [0, 4, -3], 2),
        "r2c",
        [((11, 13, 2), 16), ((11, 3, 2), 16)],
        [((11, 13, 4), 16), ((11, 13, 4), 16)],
    ),
    ((9, 8, 10), (1, 3, 1), (3, 3, 4), "c2c", [((6, 8, 8), 16)], [((9, 8, 10), 16)]),
    # The real input's transpose moves 8-byte values, as many in both plans.
    ((8, 9), (1, 4), (2, 4), "r2c", [((8, 9), 8), ((8, 4), 16)], [((8, 9), 8), ((8, 5), 16)]),
    ((8, 9), (1, 4), (2, 3), "r2c", [((8, 9), 8), ((8, 3), 16)], [((8, 9), 8), ((8, 5), 16)]),
    (
        (6, 5, 7, 8),
        (2, 1, 2, 1),
        (2, 2, 3, 3),
        "c2c",
        [((6, 4, 7, 6), 16), ((6, 4, 6, 6), 16)],
        [((6, 5, 7, 8), 16), ((6, 5, 7, 8), 16)],
    ),
]


def _check_pruned(shape, grid, modes, kind):
    device = device_for(dist.get_rank())
    mesh, placements = mesh_for(grid)
    plan = drift.DistributedFFT(shape, mesh, placements, kind=kind, dtype=torch.float64, device=device, modes=modes)
    real = kind == "r2c"
    x = random_tensor((2, *shape), torch.float64, 11, complex_=not real)
    spec = truncated_spectrum(x, plan.modes, real, "backward")
    assert plan.output_shape == spec.shape[1:]
    with drift.comm_log() as log:
        y = plan.forward(local_block(x, mesh, placements, 1))
    assert rel_err(y, spec[(..., *plan.output_slices())]) <= 1e-12
    xhat = random_tensor(spec.shape, torch.float64, 12, complex_=True)
    back = plan.inverse(xhat[(..., *plan.output_slices())].to(device))
    want = local_block(zero_filled_inverse(xhat, plan.modes, shape, real, "backward"), mesh, placements, 1)
    assert rel_err(back, want) <= 1e-12
    full = drift.DistributedFFT(shape, mesh, placements, kind=kind, dtype=torch.float64, device=device)
    with drift.comm_log() as full_log:
        full.forward(local_block(x, mesh, placements, 1))
    assert set(log.kinds()) == set(full_log.kinds()) == {"all_to_all"}
    return [c.bytes for c in log.calls], [c.bytes for c in full_log.calls]


@pytest.mark.parametrize("case", PRUNED_CASES, ids=lambda c: f"{c[3]}-grid{'x'.join(map(str, c[1]))}")
def test_pruned_transform_keeps_only_the_modes(ranks, case):
    shape, grid, modes, kind, pruned_moves, full_moves = case
    results = ranks.run(math.prod(grid), _check_pruned, shape, grid, modes, kind)
    # Every rank takes part in every transpose (one all-to-all each); over the ranks, each moves its
    # global extents x itemsize x batch 2: the pruned transposes move only kept modes.
    for which, moves in enumerate((pruned_moves, full_moves)):
        per_rank = [r[which] for r in results]
        assert all(len(calls) == len(moves) for calls in per_rank), per_rank
        for step, (extents, itemsize) in enumerate(moves):
            assert sum(calls[step] for calls in per_rank) == 2 * math.prod(extents) * itemsize, (which, step)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("convert", ["double", "to float64", "float"])
def test_conversions_change_the_precision(kind, convert):
    """A plan converted to the other precision computes in it, as exactly as one built in it."""
    built, dtype = (torch.float64, torch.float32) if convert == "float" else (torch.float32, torch.float64)
    plan = drift.DistributedFFT((12, 9, 8), kind=kind, dtype=built, norm="ortho")
    plan = {"double": plan.double, "to float64": lambda: plan.to(torch.float64), "float": plan.float}[convert]()
    assert plan.dtype == dtype and plan.complex_dtype == {torch.float32: torch.complex64}.get(dtype, torch.complex128)
    x = random_tensor((2, 12, 9, 8), torch.float64, 17, complex_=kind == "c2c")
    y = plan.forward(x.to(plan.complex_dtype if kind == "c2c" else dtype))
    want = reference(x, 3, kind, "ortho")
    assert y.dtype == (dtype if kind == "dct2" else plan.complex_dtype)
    assert rel_err(y, want) <= TOL[dtype], rel_err(y, want)
    assert rel_err(plan.inverse(y), x) <= TOL[dtype]


def _check_dtensors(shape, grid, placements, kind, batch):
    """DTensor in, DTensor out: global values are torch.fft's (scipy's DCT), and the gradient of a DTensor loss on
    the output, or of a loss on its ``full_tensor()``, is single-process autograd's."""
    mesh, grid_placements = mesh_for(grid)
    placements = placements or grid_placements
    lead, device = len(batch), device_for(dist.get_rank())
    plan = drift.DistributedFFT(shape, mesh, placements, kind=kind, dtype=torch.float64, norm="ortho", device=device)
    field_placements = lead_placements(placements, lead)
    output_placements = lead_placements(plan.output_placements, lead)
    x = random_tensor((*batch, *shape), torch.float64, 23, complex_=kind == "c2c")
    y = random_tensor((*batch, *plan.output_shape), torch.float64, 24, complex_=kind != "dct2")
    runs = [
        ("forward", plan.forward, _differentiable(shape, kind, "ortho", False), x, field_placements, output_placements),
        ("inverse", plan.inverse, _differentiable(shape, kind, "ortho", True), y, output_placements, field_placements),
    ]
    check_dtensor_runs(runs, mesh, device)


DTENSOR_CASES = [
    ((11, 13, 6), (2, 2, 1), None, "r2c", (2,)),
    ((5, 6), (4, 1), None, "c2c", (2,)),
    ((9, 7, 10), (1, 2, 2), None, "dct2", ()),
    ((11, 13, 6), (2, 2, 1), (Shard(1), Shard(0)), "c2c", ()),
    ((11, 13), (2, 2), (Replicate(), Shard(1)), "r2c", (2,)),
]


@pytest.mark.parametrize(
    "case", DTENSOR_CASES, ids=lambda c: case_id(c[0], c[1], c[3], *([] if c[2] is None else [c[2]]))
)
def test_dtensor_in_dtensor_out(ranks, case):
    ranks.run(math.prod(case[1]), _check_dtensors, *case)


def _bad_dtensors():
    """Every bad DTensor layout fails at once on every rank, before any collective."""
    mesh, placements = mesh_for((2, 2, 1))  # Shard(0), Shard(1) of an (8, 6, 4) field
    slab, slab_placements = mesh_for((4, 1, 1))
    plan = drift.DistributedFFT((8, 6, 4), mesh, placements, kind="r2c")
    x = torch.randn(2, 8, 6, 4)
    y = torch.randn(2, *plan.output_shape, dtype=torch.complex64)
    c = mesh.get_coordinate()
    partial = DTensor.from_local(x[:, 4 * c[1] : 4 * c[1] + 4], mesh, (Partial(), Shard(1)))
    cases = [
        (plan.forward, distribute(x, mesh, (Shard(0), Shard(2)), 0)),
        (plan.forward, distribute(x, mesh, (Shard(2), Shard(1)), 0)),
        (plan.forward, distribute(x, slab, slab_placements, 1)),
        (plan.forward, partial),
        (plan.forward, distribute(x, mesh, (Shard(1), Shard(1)), 0)),
        (plan.inverse, distribute(y, mesh, (Replicate(), Replicate()), 0)),
        (plan.inverse, distribute(y, slab, lead_placements(plan.output_placements[:1], 1), 0)),
        (plan.inverse, distribute(y[..., :2], mesh, plan.output_placements, 1)),  # placed right, of another shape
        (lambda p: drift.DistributedFFT((8, 6, 4), mesh, p), (Shard(2), Shard(-1))),
        (lambda p: drift.DistributedFFT((8, 6, 4), mesh, p), (Partial(), Shard(0))),
    ]
    return attempts_without_collectives(cases)


def test_bad_dtensors_fail_before_any_collective(ranks):
    for errors in ranks.run(4, _bad_dtensors):
        kinds, messages = zip(*errors, strict=True)
        assert all(k in ("ValueError", "PlanError") for k in kinds), errors
        assert "mesh dim 0 shards the batch dim of a (2, 8, 6, 4) DTensor" in messages[0]
        assert kinds[1] == kinds[2] == "PlanError" and "does not match the plan's" in messages[1] + messages[2]
        assert "mesh dim 0: Partial placements are not supported" in messages[3]
        assert "transformed dim 0 is split over mesh dims 0 and 1" in messages[4]
        assert kinds[5] == kinds[6] == "PlanError" and "expected" in messages[5] and "expected" in messages[6]
        assert kinds[7] == "PlanError"
        assert "a DTensor of shape (2, 8, 6, 2), expected (*batch, *(8, 6, 3))" in messages[7]
        assert "transformed dim 2 is split over mesh dims 0 and 1" in messages[8]
        assert "mesh dim 0: Partial placements are not supported" in messages[9]
