"""DistributedFFT against torch.fft and scipy.fft on 1..4 ranks: values, roundtrips, gradients, errors."""

from __future__ import annotations

import itertools
import math

import pytest
import scipy.fft
import torch
import torch.distributed as dist
from harness import attempt, check_one_bad_rank, device_for, rank_pool, short_timeout_group
from reference import TOL, case_id, random_tensor, rel_err

import drift

# (global shape, grid): slab and pencil, 2-D to 4-D, even, odd and prime extents, uneven splits.
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
    rank, device = dist.get_rank(), device_for(dist.get_rank())
    plan = drift.DistributedFFT(shape, grid, kind=kind, dtype=dtype, norm=norm, device=device)
    x = random_tensor((*batch, *shape), dtype, 1, complex_=kind == "c2c")
    wide = x.to(torch.complex128 if kind == "c2c" else torch.float64)
    ref = reference(wide, len(shape), kind, norm)[(..., *plan.output_slices(rank))]
    x_local = drift.scatter(x.to(device), grid)
    with drift.comm_log() as log:
        y = plan.forward(x_local)
        back = plan.inverse(y)
    assert y.shape == ref.shape and y.dtype == (plan.dtype if kind == "dct2" else plan.complex_dtype)
    assert rel_err(y, ref) <= TOL[dtype], rel_err(y, ref)
    assert back.shape == x_local.shape and back.dtype == x_local.dtype
    assert rel_err(back, x_local) <= TOL[dtype], rel_err(back, x_local)
    assert set(log.kinds()) <= {"all_to_all"}
    return len(log.calls), plan.output_slices(rank)


@pytest.mark.parametrize("case", _cases(), ids=_case_id)
def test_values_and_roundtrip(ranks, case):
    shape, grid, kind = case[:3]
    size = math.prod(grid)
    results = ranks.run(size, _check_values, *case)
    # The output blocks tile the output shape exactly.
    plan_shape = (*shape[:-1], shape[-1] // 2 + 1) if kind == "r2c" else shape
    count = torch.zeros(plan_shape, dtype=torch.int64)
    for _, slices in results:
        count[slices] += 1
    assert bool((count == 1).all())
    # One all-to-all per transpose and direction: none on one rank, 1 or 2 each way on slab or pencil grids.
    split = sum(p > 1 for p in grid)
    pre = 1 if kind == "r2c" and grid[-1] > 1 else 0
    assert {calls for calls, _ in results} == {2 * (split + pre)}


def _loss(out, seed):
    real = torch.view_as_real(out) if out.is_complex() else out
    return (real * random_tensor(real.shape, torch.float64, seed).to(real.device)).sum()


def _differentiable(shape, kind, norm, inverse):
    """The single-process transform with torch autograd (DCTs through drift.dct, checked against scipy)."""
    dims = tuple(range(-len(shape), 0))
    if kind == "dct2":

        def dct(t):
            for dim in dims:
                t = (drift.dct.idct2 if inverse else drift.dct.dct2)(t, dim, norm)
            return t

        return dct
    if kind == "r2c":
        if inverse:
            return lambda t: torch.fft.irfftn(t, s=shape, dim=dims, norm=norm)
        return lambda t: torch.fft.rfftn(t, dim=dims, norm=norm)
    return lambda t: (torch.fft.ifftn if inverse else torch.fft.fftn)(t, dim=dims, norm=norm)


def _check_gradients(shape, grid, kind, norm):
    """Each rank's gradient equals single-process autograd of the sum of every rank's loss."""
    rank, size, device = dist.get_rank(), dist.get_world_size(), device_for(dist.get_rank())
    plan = drift.DistributedFFT(shape, grid, kind=kind, dtype=torch.float64, norm=norm, device=device)
    in_blocks = [drift.local_slices(shape, grid, r) for r in range(size)]
    out_blocks = [plan.output_slices(r) for r in range(size)]
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
]


@pytest.mark.parametrize("case", GRADIENT_CASES, ids=lambda c: f"{c[2]}-grid{'x'.join(map(str, c[1]))}")
def test_gradients_follow_sum_convention(ranks, case):
    ranks.run(math.prod(case[1]), _check_gradients, *case)


@pytest.mark.parametrize("kind", KINDS)
def test_gradcheck_one_rank(kind):
    plan = drift.DistributedFFT((5, 4, 6), (1, 1, 1), kind=kind, dtype=torch.float64, norm="ortho")
    x = random_tensor((2, 5, 4, 6), torch.float64, 5, complex_=kind == "c2c").requires_grad_(True)
    y = random_tensor((2, *plan.output_shape), torch.float64, 6, complex_=kind != "dct2").requires_grad_(True)
    assert torch.autograd.gradcheck(plan.forward, (x,))
    assert torch.autograd.gradcheck(plan.inverse, (y,))


def test_bad_plans():
    cases = [
        (dict(global_shape=(8, 8), grid=(2, 1)), "has 2 ranks but the process group has 1"),
        (dict(global_shape=(8, 8), grid=(1, 1), kind="c2r"), "kind must be one of"),
        (dict(global_shape=(8, 8), grid=(1, 1), dtype=torch.complex64), "dtype must be"),
        (dict(global_shape=(8, 8), grid=(1, 1), dtype=torch.int32), "dtype must be"),
        (dict(global_shape=(8, 8), grid=(1, 1), kind="dct2", norm="forward"), "norm for kind 'dct2'"),
        (dict(global_shape=(8, 1), grid=(1, 2)), "exceeds its extent"),
    ]
    for kwargs, match in cases:
        with pytest.raises(ValueError, match=match):
            drift.DistributedFFT(**kwargs)


def test_bad_inputs_raise_plan_error():
    c2c = drift.DistributedFFT((8, 6), (1, 1))
    r2c = drift.DistributedFFT((8, 6), (1, 1), kind="r2c")
    dct2 = drift.DistributedFFT((8, 6), (1, 1), kind="dct2")
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
        try:
            drift.DistributedFFT(shape, grid, kind="r2c")
        except ValueError as exc:
            errors.append(str(exc))
    return errors


def test_bad_grids_fail_before_any_collective(ranks):
    for errors in ranks.run(4, _bad_grids):
        assert "splits every dim" in errors[0]
        assert "has 8 ranks but the process group has 4" in errors[1]
        assert "exceeds its extent" in errors[2] and "exceeds its extent" in errors[3]


def _r2c_half_spectrum_too_short():
    # 4 ranks split dim 0 of (8, 4): the half spectrum of the last dim has 3 entries, too few for 4 ranks.
    with pytest.raises(ValueError, match="cannot be transposed"):
        drift.DistributedFFT((8, 4), (4, 1), kind="r2c")
    # Pruned: after keeping 3 modes of the last dim, 4 ranks cannot split it.
    with pytest.raises(ValueError, match="cannot be transposed"):
        drift.DistributedFFT((8, 9), (1, 4), kind="r2c", modes=(2, 3))
    return drift.DistributedFFT((8, 4), (4, 1), kind="c2c").output_slices(dist.get_rank())


def test_transpose_that_does_not_fit_is_an_error(ranks):
    assert ranks.run(4, _r2c_half_spectrum_too_short) == [(slice(0, 8), slice(r, r + 1)) for r in range(4)]


def _one_bad_rank(timeout_s):
    """Rank 0 passes a float64 block; the others enter the transpose without it."""
    group = short_timeout_group(timeout_s)
    plan = drift.DistributedFFT((12, 10, 6), (1, 1, dist.get_world_size()), kind="r2c", group=group)
    x = torch.randn(*plan.local_shape, dtype=torch.float64 if dist.get_rank() == 0 else torch.float32)
    return attempt(plan.forward, x)


def test_one_bad_rank_fails_all_within_the_group_timeout():
    with rank_pool(3) as pool:
        check_one_bad_rank(pool.run(_one_bad_rank, 2.0, timeout_s=60), "PlanError", "expected dtype torch.float32")


INPLACE_LAYOUTS = [
    ((8, 6), (1, 1), ()),
    ((8, 12), (2, 1), (2,)),
    ((12, 8, 6), (3, 1, 1), ()),
    ((8, 4, 12), (1, 1, 4), (3,)),
    ((8, 12, 6), (2, 2, 1), ()),
    ((6, 8, 4, 6), (1, 2, 1, 2), (2,)),
]


def _check_inplace(shape, grid, batch, dtype, norm, staging_bytes):
    rank, device = dist.get_rank(), device_for(dist.get_rank())
    plan = drift.DistributedFFT(shape, grid, dtype=dtype, norm=norm, device=device, inplace=True)
    plan.staging_bytes = staging_bytes
    x = random_tensor((*batch, *shape), dtype, 9, complex_=True)
    ref = reference(x.to(torch.complex128), len(shape), "c2c", norm)[(..., *plan.output_slices(rank))]
    x_local = drift.scatter(x.to(device), grid)
    storage = x_local.data_ptr()
    with drift.comm_log() as log:
        y = plan.forward(x_local)
    assert y.data_ptr() == storage, "the output must live in the input's storage"
    assert rel_err(y, ref) <= TOL[dtype], rel_err(y, ref)
    assert set(log.kinds()) <= {"sendrecv"}
    # Every chunk of every exchange fits the staging bound.
    assert all(c.bytes <= staging_bytes for c in log.calls)
    back = plan.inverse(y)
    assert back.data_ptr() == storage and back.shape == drift.scatter(x, grid).shape
    assert rel_err(back, drift.scatter(x.to(device), grid)) <= TOL[dtype]
    return len(log.calls)


@pytest.mark.parametrize(("shape", "grid", "batch"), INPLACE_LAYOUTS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_inplace_matches_and_reuses_the_storage(ranks, shape, grid, batch, dtype):
    norm = "ortho" if dtype == torch.float64 else "backward"
    calls = ranks.run(math.prod(grid), _check_inplace, shape, grid, batch, dtype, norm, 256)
    if math.prod(grid) > 1:
        assert min(calls) > 0


def test_inplace_rejects_what_it_cannot_do():
    with pytest.raises(ValueError, match="kind 'r2c' is not supported"):
        drift.DistributedFFT((8, 8), (1, 1), kind="r2c", inplace=True)
    plan = drift.DistributedFFT((8, 6), (1, 1), inplace=True, dtype=torch.float64)
    x = torch.randn(8, 6, dtype=torch.complex128)
    with pytest.raises(drift.PlanError, match="contiguous"):
        plan.forward(x.t().contiguous().t())
    with pytest.raises(drift.PlanError, match="does not record autograd"):
        plan.forward(x.clone().requires_grad_(True))


def _uneven_inplace():
    with pytest.raises(ValueError, match="split evenly"):
        drift.DistributedFFT((9, 8), (3, 1), inplace=True)
    return True


def test_inplace_needs_even_splits(ranks):
    assert ranks.run(3, _uneven_inplace) == [True] * 3


PRUNED_CASES = [
    ((12, 10, 7), (2, 1, 1), (3, 2, 3), "r2c"),
    ((11, 13, 6), (2, 2, 1), (2, [0, 4, -3], 2), "r2c"),
    ((9, 8, 10), (1, 3, 1), (3, 3, 4), "c2c"),
    ((8, 9), (1, 4), (2, 4), "r2c"),
    ((6, 5, 7, 8), (2, 1, 2, 1), (2, 2, 3, 3), "c2c"),
]


def _check_pruned(shape, grid, modes, kind):
    from reference import truncated_spectrum, zero_filled_inverse

    rank, device = dist.get_rank(), device_for(dist.get_rank())
    plan = drift.DistributedFFT(shape, grid, kind=kind, dtype=torch.float64, device=device, modes=modes)
    real = kind == "r2c"
    x = random_tensor((2, *shape), torch.float64, 11, complex_=not real)
    spec = truncated_spectrum(x, plan.modes, real, "backward")
    assert plan.output_shape == spec.shape[1:]
    with drift.comm_log() as log:
        y = plan.forward(drift.scatter(x, grid).to(device))
    assert rel_err(y, spec[(..., *plan.output_slices(rank))]) <= 1e-12
    xhat = random_tensor(spec.shape, torch.float64, 12, complex_=True)
    back = plan.inverse(xhat[(..., *plan.output_slices(rank))].to(device))
    want = zero_filled_inverse(xhat, plan.modes, shape, real, "backward")[(..., *drift.local_slices(shape, grid, rank))]
    assert rel_err(back, want) <= 1e-12
    full = drift.DistributedFFT(shape, grid, kind=kind, dtype=torch.float64, device=device)
    with drift.comm_log() as full_log:
        full.forward(drift.scatter(x, grid).to(device))
    return log.bytes, full_log.bytes


@pytest.mark.parametrize("case", PRUNED_CASES, ids=lambda c: f"{c[3]}-grid{'x'.join(map(str, c[1]))}")
def test_pruned_transform_keeps_only_the_modes(ranks, case):
    shape, grid, modes, kind = case
    for pruned, full in ranks.run(math.prod(grid), _check_pruned, *case):
        assert 0 < pruned < full  # the pruned transposes move only kept modes
