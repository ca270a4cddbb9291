"""TruncatedFFT against torch.fft on 1..4 ranks: values, sharded values, inverse, gradients, bytes."""

from __future__ import annotations

import itertools
import math
import random

import pytest
import torch
import torch.distributed as dist
from harness import attempt, check_one_bad_rank, device_for, rank_pool, short_timeout_group
from reference import TOL, case_id, random_tensor, rel_err, truncated_spectrum, zero_filled_inverse

import drift

# (global shape, grid): slab and pencil grids, even, odd and prime extents, uneven splits, 1-D to 4-D.
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
    """Li et al.'s k per dim; ``wide`` keeps the whole half spectrum on a real last dim."""
    last = len(shape) - 1
    return [n // 2 + 1 if (real and i == last and wide) else max(1, min(n // 2, 3)) for i, n in enumerate(shape)]


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


def _check_values(shape, grid, modes, real, dtype, norm, batch):
    rank, device = dist.get_rank(), device_for(dist.get_rank())
    plan = drift.TruncatedFFT(shape, modes, grid, real=real, dtype=dtype, norm=norm, device=device)
    d, tol = len(shape), TOL[dtype]
    x = random_tensor((*batch, *shape), dtype, 1, complex_=not real)
    wide = x.to(torch.complex128 if x.is_complex() else torch.float64)
    spec = truncated_spectrum(wide, plan.modes, real, norm)
    x_local = drift.scatter(x.to(device), grid)

    out = plan.forward(x_local)
    assert out.shape == (*batch, *plan.mode_shape) and out.dtype == plan.complex_dtype
    assert rel_err(out, spec) <= tol, rel_err(out, spec)

    share = plan.forward(x_local, out="sharded")
    expected_share = spec.reshape(*batch, -1)[..., plan.mode_slice(rank)]
    assert share.shape == expected_share.shape
    assert rel_err(share, expected_share) <= tol, rel_err(share, expected_share)

    xhat = random_tensor((*batch, *plan.mode_shape), dtype, 2, complex_=True)
    ref = zero_filled_inverse(xhat.to(torch.complex128), plan.modes, shape, real, norm)[(..., *plan.local_slices)]
    y = plan.inverse(xhat.to(device))
    assert y.shape == (*batch, *plan.local_shape) and y.dtype == (dtype if real else plan.complex_dtype)
    assert rel_err(y, ref) <= tol, rel_err(y, ref)

    xhat_share = xhat.reshape(*batch, -1)[..., plan.mode_slice(rank)].to(device)
    y_sharded = plan.inverse(xhat_share, inp="sharded")
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
    plan = drift.TruncatedFFT(shape, modes, grid, real=real, dtype=torch.float64, device=device)
    d = len(shape)
    x = random_tensor((*batch, *shape), torch.float64, 3, complex_=not real)
    xhat = random_tensor((*batch, *plan.mode_shape), torch.float64, 4, complex_=True)
    blocks = [drift.local_slices(shape, grid, r) for r in range(size)]
    shares = [plan.mode_slice(r) for r in range(size)]

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

    x_local = drift.scatter(x, grid)
    flat = xhat.reshape(*batch, -1)
    my_share = flat[..., shares[rank]]
    checks = {
        "forward": (
            local(plan.forward, x_local),
            reference(lambda t: [spectrum(t)] * size, x)[(..., *blocks[rank])],
        ),
        "forward sharded": (
            local(lambda t: plan.forward(t, out="sharded"), x_local),
            reference(lambda t: [spectrum(t).reshape(*batch, -1)[..., s] for s in shares], x)[(..., *blocks[rank])],
        ),
        "inverse sharded": (
            local(lambda t: plan.inverse(t, inp="sharded"), my_share),
            reference(lambda t: [field(t.reshape(*batch, *plan.mode_shape))[(..., *b)] for b in blocks], flat)[
                ..., shares[rank]
            ],
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
]


@pytest.mark.parametrize(
    "case", GRADIENT_CASES, ids=lambda c: f"{'x'.join(map(str, c[0]))}-grid{'x'.join(map(str, c[1]))}"
)
def test_gradients_follow_sum_convention(ranks, case):
    ranks.run(math.prod(case[1]), _check_gradients, *case)


@pytest.mark.parametrize("real", [True, False])
def test_gradcheck_one_rank(real):
    plan = drift.TruncatedFFT((6, 5, 4), (2, [0, 2, -1], 2), (1, 1, 1), real=real, dtype=torch.float64)
    x = random_tensor((2, 6, 5, 4), torch.float64, 5, complex_=not real).requires_grad_(True)
    xhat = random_tensor((2, *plan.mode_shape), torch.float64, 6, complex_=True).requires_grad_(True)
    assert torch.autograd.gradcheck(plan.forward, (x,))
    assert torch.autograd.gradcheck(lambda t: plan.forward(t, out="sharded"), (x,))
    assert torch.autograd.gradcheck(plan.inverse, (xhat,))


def test_embedded_default_matches_reference():
    """World size 1 without init_process_group: the plan runs and issues no collective."""
    assert not dist.is_initialized()
    plan = drift.TruncatedFFT((10, 8), (3, 4), (1, 1), dtype=torch.float64)
    x = random_tensor((3, 10, 8), torch.float64, 7)
    with drift.comm_log() as log:
        out = plan.forward(x)
        share = plan.forward(x, out="sharded")
        y = plan.inverse(out)
    assert log.calls == []
    spec = truncated_spectrum(x, plan.modes, True, "backward")
    assert rel_err(out, spec) <= 1e-12
    assert rel_err(share, spec.reshape(3, -1)) <= 1e-12
    assert rel_err(y, zero_filled_inverse(spec, plan.modes, (10, 8), True, "backward")) <= 1e-12


def test_flop_optimal_order():
    """Paper Table III: at P = 4 on 128 x 128 x 64 x 30 the cheapest order contracts y first."""
    plan_shape, kept = (32, 128, 64, 30), (16, 16, 16, 16)
    order, flops = drift.truncated.best_order(plan_shape, kept, real=True)
    assert order[0] == 1
    every = [drift.truncated.contraction_flops(o, plan_shape, kept, True) for o in itertools.permutations(range(4))]
    assert flops == min(every) < drift.truncated.contraction_flops((3, 2, 1, 0), plan_shape, kept, True)


def _bytes_per_call(shape, grid, modes, batch):
    device = device_for(dist.get_rank())
    plan = drift.TruncatedFFT(shape, modes, grid, dtype=torch.float32, device=device)
    x = drift.scatter(random_tensor((batch, *shape), torch.float32, 8).to(device), grid).requires_grad_(True)
    records = {}
    for name, run in {
        "forward": lambda: plan.forward(x),
        "forward sharded": lambda: plan.forward(x, out="sharded"),
        "inverse sharded": lambda: plan.inverse(plan.forward(x.detach(), out="sharded"), inp="sharded"),
        "inverse": lambda: plan.inverse(plan.forward(x.detach())),
    }.items():
        with drift.comm_log() as log:
            out = run()
        records[name] = [(c.kind, c.bytes, c.wire_bytes) for c in log.calls]
        if out.requires_grad:
            with drift.comm_log() as log:
                torch.view_as_real(out).sum().backward()
            records[name + " backward"] = [(c.kind, c.bytes) for c in log.calls]
    return records, plan.num_modes


@pytest.mark.parametrize("size", [2, 3, 4])
def test_bytes_depend_on_modes_not_extents(ranks, size):
    modes, batch = (3, 2, 4), 2
    small = ranks.run(size, _bytes_per_call, (12, 10, 9), (size, 1, 1), modes, batch)
    large = ranks.run(size, _bytes_per_call, (48, 40, 30), (size, 1, 1), modes, batch)
    assert [r for r, _ in small] == [r for r, _ in large]
    records, m = small[0]
    payload = batch * m * 8  # complex64
    padded = size * batch * -(-m // size) * 8
    assert records["forward"] == [("all_reduce", payload, 2 * (size - 1) * payload // size)]
    assert records["forward backward"] == [("all_reduce", payload)]
    assert records["forward sharded"] == [("reduce_scatter", padded, (size - 1) * padded // size)]
    assert records["forward sharded backward"] == [("all_gather", padded // size)]
    assert [k for k, *_ in records["inverse sharded"]] == ["reduce_scatter", "all_gather"]
    assert [k for k, *_ in records["inverse"]] == ["all_reduce"]


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
            drift.TruncatedFFT(shape, modes, (1, 1))
    drift.TruncatedFFT((8, 6), (4, [0, -3]), (1, 1), real=False)  # 2k == N keeps every frequency
    with pytest.raises(ValueError, match="dim 1: index -2 is beyond the half spectrum"):
        drift.TruncatedFFT((8, 6), (4, [0, -2]), (1, 1))


def test_bad_plans():
    with pytest.raises(ValueError, match="dtype must be torch.float32 or torch.float64"):
        drift.TruncatedFFT((8,), 2, (1,), dtype=torch.int64)
    with pytest.raises(ValueError, match="dtype must be"):
        drift.TruncatedFFT((8,), 2, (1,), dtype=torch.complex64)
    with pytest.raises(ValueError, match="norm must be one of"):
        drift.TruncatedFFT((8,), 2, (1,), norm="unitary")
    with pytest.raises(ValueError, match="has 2 ranks but the process group has 1"):
        drift.TruncatedFFT((8, 8), 2, (2, 1))
    with pytest.raises(ValueError, match="exceeds its extent"):
        drift.TruncatedFFT((8, 1), 1, (1, 2))


def test_bad_inputs_raise_plan_error():
    plan = drift.TruncatedFFT((8, 6), (2, 3), (1, 1))
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
    with pytest.raises(ValueError, match="out must be"):
        plan.forward(good, out="scattered")
    assert issubclass(drift.PlanError, ValueError)


def test_non_strict_plan_converts_dtype():
    strict = drift.TruncatedFFT((8, 6), (2, 3), (1, 1), dtype=torch.float32)
    loose = drift.TruncatedFFT((8, 6), (2, 3), (1, 1), dtype=torch.float32, strict=False)
    x = torch.randn(8, 6, dtype=torch.float64)
    assert torch.equal(loose.forward(x), strict.forward(x.float()))
    with pytest.raises(drift.PlanError):
        loose.forward(torch.randn(8, 5))
    with pytest.raises(drift.PlanError):
        loose.forward(x.to(torch.complex128))


def _one_bad_rank(timeout_s):
    """Rank 0 passes a block of the wrong shape; the others enter the all-reduce without it."""
    group = short_timeout_group(timeout_s)
    plan = drift.TruncatedFFT((12, 10), (2, 2), (dist.get_world_size(), 1), group=group)
    rows = plan.local_shape[0] + (1 if dist.get_rank() == 0 else 0)
    return attempt(plan.forward, torch.randn(rows, 10))


def test_one_bad_rank_fails_all_within_the_group_timeout():
    with rank_pool(3) as pool:
        results = pool.run(_one_bad_rank, 2.0, timeout_s=60)
    check_one_bad_rank(results, "PlanError", "expected shape (*batch, 4, 10), got (5, 10)")


@pytest.mark.parametrize("real", [True, False])
def test_chunked_unrecorded_passes_match(real):
    """Passes autograd does not record run in chunks of rows bounded by work_bytes."""
    plan = drift.TruncatedFFT((10, 9, 8), (3, [0, 2, -1], 3), (1, 1, 1), real=real, dtype=torch.float64)
    x = random_tensor((5, 3, 10, 9, 8), torch.float64, 13, complex_=not real)
    xhat = random_tensor((5, 3, *plan.mode_shape), torch.float64, 14, complex_=True)
    whole = plan.forward(x), plan.forward(x, out="sharded"), plan.inverse(xhat)
    plan.work_bytes = 1  # one row per chunk
    chunked = plan.forward(x), plan.forward(x, out="sharded"), plan.inverse(xhat)
    for a, b in zip(whole, chunked, strict=True):
        assert rel_err(b, a) <= 1e-12
    with torch.no_grad():
        y = plan.inverse(xhat.requires_grad_(True))
    assert rel_err(y, whole[2]) <= 1e-12
    assert rel_err(plan.forward(x.clone().requires_grad_(True)), whole[0]) <= 1e-12
