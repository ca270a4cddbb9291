"""Collectives in pieces overlapped with the transform (``overlap=``): values and gradients against torch.fft
and the plan without overlap, on 1 to 4 ranks, slab and pencil, with a reduction mesh, more pieces than
fields; the collectives issued; a failing piece; parallelize."""

from __future__ import annotations

import math
import threading

import pytest
import torch
import torch.distributed as dist
from harness import device_for
from meshes import attempts_without_collectives, distribute, local_block, mesh_for, rank_coordinates, reduction_for
from reference import TOL, mesh_block, mesh_share, random_tensor, rel_err, truncated_spectrum, zero_filled_inverse
from torch.distributed.tensor import Shard

import drift
from drift.nn import FNO, SpectralConv, parallelize
from drift.truncated._overlap import compute_then_send, piece_slices, receive_then_compute


def test_piece_slices():
    assert piece_slices(7, 3) == [slice(0, 3), slice(3, 5), slice(5, 7)]
    assert piece_slices(2, 5) == [slice(0, 1), slice(1, 2)]
    assert piece_slices(6, 1) == [slice(0, 6)]
    assert piece_slices(0, 4) == [slice(0, 0)]


def _first(s: slice, d: int) -> tuple:
    return (..., s, *[slice(None)] * (d - 1))


def _loss(out, seed):
    real = torch.view_as_real(out) if out.is_complex() else out
    return (real * random_tensor(real.shape, torch.float64, seed).to(real.device)).sum()


def _logged(fn, *args):
    with drift.comm_log() as log:
        out = fn(*args)
    return out, [(c.kind, c.group_size, c.wire_bytes) for c in log.calls]


def _check(shape, grid, reduction, overlap, modes, real, dtype, batch):
    """The plan with ``overlap`` pieces against torch.fft and the plan without: sharded forward and inverse
    values, gradients (float64) of each and of the round trip, and the collectives: the plain plan's,
    once per piece, with the plain plan's bytes in all."""
    rank, device = dist.get_rank(), device_for(dist.get_rank())
    mesh, placements = mesh_for(grid)
    common = dict(real=real, dtype=dtype, device=device)
    if reduction is not None:
        common["reduction"] = reduction_for(grid, reduction)
    plain = drift.TruncatedFFT(shape, modes, mesh, placements, **common)
    plan = drift.TruncatedFFT(shape, modes, mesh, placements, overlap=overlap, **common)
    assert f"overlap={overlap}" in repr(plan) and plan.share_shape == plain.share_shape
    d, tol, lead = len(shape), TOL[dtype], len(batch)
    coords = rank_coordinates(mesh)
    blocks = [mesh_block(shape, mesh.shape, placements, c) for c in coords]
    shares = [_first(mesh_share(plan.mode_shape[0], mesh.shape, placements, c), d) for c in coords]
    pieces = len(piece_slices(math.prod(batch), overlap))

    x = random_tensor((*batch, *shape), dtype, 1, complex_=not real)
    spec = truncated_spectrum(x.to(torch.complex128 if x.is_complex() else torch.float64), plan.modes, real, "backward")
    x_local = local_block(x, mesh, placements, lead)
    share, calls = _logged(plan.forward, x_local, True)
    plain_share, plain_calls = _logged(plain.forward, x_local, True)
    assert rel_err(share, spec[shares[rank]]) <= tol and rel_err(share, plain_share) <= tol

    xhat = random_tensor((*batch, *plan.mode_shape), dtype, 2, complex_=True)
    field = zero_filled_inverse(xhat.to(torch.complex128), plan.modes, shape, real, "backward")
    y, gathers = _logged(plan.inverse, xhat[shares[rank]].to(device), True)
    plain_y, plain_gathers = _logged(plain.inverse, xhat[shares[rank]].to(device), True)
    assert rel_err(y, field[(..., *blocks[rank])]) <= tol and rel_err(y, plain_y) <= tol
    out = torch.empty_like(y)
    # Exact: the same computation in this process, written into ``out``.
    assert plan.inverse(xhat[shares[rank]].to(device), True, out=out) is out and torch.equal(out, y)

    for log, plain_log in ((calls, plain_calls), (gathers, plain_gathers)):
        assert [(k, g) for k, g, _ in log] == [(k, g) for k, g, _ in plain_log] * pieces
        assert sum(w for *_, w in log) == sum(w for *_, w in plain_log)

    if dtype == torch.float64:

        def local(fn, inp):
            inp = inp.detach().to(device, copy=True).requires_grad_(True)
            _loss(fn(inp), 100 + rank).backward()
            return inp.grad

        def reference(fn, inp):
            inp = inp.detach().clone().requires_grad_(True)
            sum(_loss(part, 100 + r) for r, part in enumerate(fn(inp))).backward()
            return inp.grad

        def spectrum(t):
            return truncated_spectrum(t, plan.modes, real, "backward")

        def inverse(t):
            return zero_filled_inverse(t, plan.modes, shape, real, "backward")

        got = local(lambda t: plan.forward(t, sharded=True), x_local)
        want = reference(lambda t: [spectrum(t)[s] for s in shares], x)[(..., *blocks[rank])]
        assert rel_err(got, want) <= tol, rel_err(got, want)
        got = local(lambda t: plan.inverse(t, sharded=True), xhat[shares[rank]])
        want = reference(lambda t: [inverse(t)[(..., *b)] for b in blocks], xhat)[shares[rank]]
        assert rel_err(got, want) <= tol, rel_err(got, want)
        got = local(lambda t: plan.inverse(plan.forward(t, sharded=True), sharded=True), x_local)
        want = reference(lambda t: [inverse(spectrum(t))[(..., *b)] for b in blocks], x)[(..., *blocks[rank])]
        assert rel_err(got, want) <= tol, rel_err(got, want)


# (global shape, grid, reduction, overlap, modes, real, dtype, batch): uneven pieces (5 fields in 3), more
# pieces than fields, empty shares (K1 = 6 over 4), a pencil, a reduction mesh, one rank.
CASES = [
    ((13, 6, 5), (4, 1, 1), None, 3, (3, 2, 3), True, torch.float64, (5,)),
    ((13, 6, 5), (4, 1, 1), (2, 2), 2, (3, 2, 3), True, torch.float32, (2, 2)),
    ((6, 11), (1, 4), None, 7, (3, 4), False, torch.float64, (3,)),
    ((7, 8, 6), (2, 2, 1), (1, 2, 2), 4, (3, 2, 4), True, torch.float64, (2, 3)),
    ((9, 7), (3, 1), None, 2, (4, 3), True, torch.float32, (4,)),
    ((9, 7), (2, 1), None, 2, (4, 3), False, torch.float64, (3,)),
    ((9, 7), (1, 1), None, 3, (4, 3), True, torch.float64, (4,)),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c[:5])) + f"-{c[6]}".replace("torch.", ""))
def test_overlap_matches_plain_plan_and_torch_fft(ranks, case):
    ranks.run(math.prod(case[1]), _check, *case)


def test_a_failing_piece_raises_after_the_others_settle():
    """A collective that fails in the thread raises in the caller, once every piece already queued has
    finished or been cancelled: no collective of this call runs after it returns."""
    done = []

    def send(t):
        if t[0] == 2:
            raise RuntimeError("piece 2 lost its peer")
        done.append(int(t[0]))
        return t

    with pytest.raises(RuntimeError, match="piece 2 lost its peer"):
        compute_then_send(5, 5, lambda s: torch.arange(5.0)[s].clone(), send)
    with pytest.raises(RuntimeError, match="piece 2 lost its peer"):
        receive_then_compute(5, 5, lambda s: send(torch.arange(5.0)[s]), lambda s, t: None)
    assert set(done) <= {0, 1, 3, 4} and 0 in done and 1 in done
    threads = [t for t in threading.enumerate() if t.name.startswith("drift-comm")]
    assert len(threads) == 1  # one communication thread, whatever the calls
    assert torch.equal(
        compute_then_send(5, 3, lambda s: torch.arange(5.0)[s] * 2, lambda t: t + 1), torch.arange(5.0) * 2 + 1
    )


def _parallel_model(overlap):
    """An FNO parallelized with ``overlap`` over a slab of 4 ranks against the same one on one device."""
    device = device_for(dist.get_rank())
    mesh, placements = mesh_for((4,))[0], (Shard(2),)
    x = random_tensor((3, 3, 9, 6), torch.float64, 5)
    torch.manual_seed(0)
    single, model = (FNO(3, 2, 4, (3, 2), 2, projection_width=8, dtype=torch.float64, device=device) for _ in range(2))
    model.load_state_dict(single.state_dict())
    parallelize(model, mesh, placements, overlap=overlap)
    assert all(m.overlap == overlap for m in model.modules() if isinstance(m, SpectralConv)), repr(model)
    ref_in = x.to(device, copy=True).requires_grad_(True)
    ref = single(ref_in)
    ref.square().sum().backward()
    xd = distribute(x, mesh, placements, 0, requires_grad=True)
    out = model(xd)
    assert rel_err(out.full_tensor(), ref) <= 1e-12, rel_err(out.full_tensor(), ref)
    out.square().sum().backward()
    assert rel_err(xd.grad.full_tensor(), ref_in.grad) <= 1e-12
    for (name, p), r in zip(model.named_parameters(), single.parameters(), strict=True):
        grad = p.grad.full_tensor() if isinstance(p.grad, torch.distributed.tensor.DTensor) else p.grad
        assert rel_err(grad, r.grad) <= 1e-12, (name, rel_err(grad, r.grad))
    return attempts_without_collectives(
        [
            (lambda m: parallelize(m, mesh, placements, overlap=0), FNO(1, 1, 2, (2, 2), 1)),
            (lambda m: parallelize(m, mesh, placements, overlap=2), FNO(1, 1, 2, (2, 2), 1, method="dfno")),
            (lambda k: drift.TruncatedFFT((12, 6), 2, mesh, placements, overlap=k), 1.5),
        ]
    )


def test_parallelize_with_overlap(ranks):
    for errors in ranks.run(4, _parallel_model, 3):
        assert all(kind == "ValueError" for kind, _ in errors), errors
        messages = [m for _, m in errors]
        assert "overlap must be a positive number of pieces, got 0" in messages[0]
        assert "overlap applies to method 'drift' only; the model has dfno layers" in messages[1]
        assert "overlap must be a positive number of pieces, got 1.5" in messages[2]
