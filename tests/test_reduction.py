"""The factorised reduction (``reduction=``) against the flat one and torch.fft: a slab on 4 ranks as 2 x 2
and on 6 ranks as 2 x 3 and 3 x 2, a pencil, values, gradients, bytes, parallelize, bad shapes."""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist
from harness import device_for
from meshes import attempts_without_collectives, distribute, local_block, mesh_for, rank_coordinates, reduction_for
from reference import TOL, mesh_block, mesh_share, random_tensor, rel_err, truncated_spectrum, zero_filled_inverse
from torch.distributed.tensor import DTensor, Shard

import drift
from drift.layout import device_mesh
from drift.nn import FNO, SpectralConv, parallelize


def _first(s: slice, d: int) -> tuple:
    return (..., s, *[slice(None)] * (d - 1))


def _loss(out, seed):
    real = torch.view_as_real(out) if out.is_complex() else out
    return (real * random_tensor(real.shape, torch.float64, seed).to(real.device)).sum()


def _logged(fn, *args):
    with drift.comm_log() as log:
        out = fn(*args)
    return out, [(c.kind, c.group_size, c.wire_bytes) for c in log.calls]


def _check(shape, grid, reduction, modes, real, dtype, batch):
    """The reduction-mesh plan against torch.fft and the flat plan: sharded forward and inverse values,
    gradients (float64), and the collectives: one per reduction mesh dim, the bytes of the flat one."""
    rank, device = dist.get_rank(), device_for(dist.get_rank())
    mesh, placements = mesh_for(grid)
    common = dict(real=real, dtype=dtype, device=device)
    flat = drift.TruncatedFFT(shape, modes, mesh, placements, **common)
    tree = drift.TruncatedFFT(shape, modes, mesh, placements, reduction=reduction_for(grid, reduction), **common)
    assert f"reduction={tuple(reduction)}" in repr(tree) and tree.share_shape == flat.share_shape
    d, tol, lead = len(shape), TOL[dtype], len(batch)
    coords = rank_coordinates(mesh)
    blocks = [mesh_block(shape, mesh.shape, placements, c) for c in coords]
    shares = [_first(mesh_share(tree.mode_shape[0], mesh.shape, placements, c), d) for c in coords]

    x = random_tensor((*batch, *shape), dtype, 1, complex_=not real)
    spec = truncated_spectrum(x.to(torch.complex128 if x.is_complex() else torch.float64), tree.modes, real, "backward")
    x_local = local_block(x, mesh, placements, lead)
    share, tree_calls = _logged(tree.forward, x_local, True)
    flat_share, flat_calls = _logged(flat.forward, x_local, True)
    assert rel_err(share, spec[shares[rank]]) <= tol and rel_err(share, flat_share) <= tol

    xhat = random_tensor((*batch, *tree.mode_shape), dtype, 2, complex_=True)
    field = zero_filled_inverse(xhat.to(torch.complex128), tree.modes, shape, real, "backward")
    y, tree_gathers = _logged(tree.inverse, xhat[shares[rank]].to(device), True)
    flat_y, flat_gathers = _logged(flat.inverse, xhat[shares[rank]].to(device), True)
    assert rel_err(y, field[(..., *blocks[rank])]) <= tol and rel_err(y, flat_y) <= tol

    # One collective per reduction mesh dim of more than one rank (per spatial mesh dim, the last
    # first in the reduce-scatter, the first first in the all-gather), the flat collectives' bytes.
    levels = [p for p in reduction if p > 1]
    if sum(isinstance(p, Shard) for p in placements) == 1:
        assert [(k, g) for k, g, _ in tree_calls] == [("reduce_scatter", p) for p in reversed(levels)]
        assert [(k, g) for k, g, _ in tree_gathers] == [("all_gather", p) for p in levels]
    for tree_log, flat_log in ((tree_calls, flat_calls), (tree_gathers, flat_gathers)):
        assert sum(w for *_, w in tree_log) == sum(w for *_, w in flat_log) > 0

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
            return truncated_spectrum(t, tree.modes, real, "backward")

        def inverse(t):
            return zero_filled_inverse(t, tree.modes, shape, real, "backward")

        got = local(lambda t: tree.forward(t, sharded=True), x_local)
        want = reference(lambda t: [spectrum(t)[s] for s in shares], x)[(..., *blocks[rank])]
        assert rel_err(got, want) <= tol, rel_err(got, want)
        got = local(lambda t: tree.inverse(t, sharded=True), xhat[shares[rank]])
        want = reference(lambda t: [inverse(t)[(..., *b)] for b in blocks], xhat)[shares[rank]]
        assert rel_err(got, want) <= tol, rel_err(got, want)
        got = local(lambda t: tree.inverse(tree.forward(t, sharded=True), sharded=True), x_local)
        want = reference(lambda t: [inverse(spectrum(t))[(..., *b)] for b in blocks], x)[(..., *blocks[rank])]
        assert rel_err(got, want) <= tol, rel_err(got, want)


# (global shape, grid, reduction, modes, real, dtype, batch): uneven shares with empty ones (K1 = 6 over
# 4: 2, 2, 2, 0; K1 = 10 over 6: 2, 2, 2, 2, 2, 0), a pencil's nested shares (K1 = 6 over 2 x 2: 2, 1, 2, 1)
# with the reduction mesh of its mesh dims.
CASES = [
    ((13, 6, 5), (4, 1, 1), (2, 2), (3, 2, 3), True, torch.float64, (2,)),
    ((13, 6, 5), (4, 1, 1), (2, 2), (3, 2, 3), True, torch.float32, ()),
    ((6, 11), (1, 4), (2, 2), (3, 4), False, torch.float64, (2,)),
    ((6, 11), (1, 4), (4, 1), (3, 4), False, torch.float32, (2,)),
    ((7, 8, 6), (2, 2, 1), (1, 2, 2), (3, 2, 4), True, torch.float64, (2,)),
    ((7, 8, 6), (2, 2, 1), (2, 2), (3, 2, 2), False, torch.float64, ()),
    ((14, 5, 6), (6, 1, 1), (2, 3), (5, 2, 3), True, torch.float64, (2,)),
    ((14, 5, 6), (6, 1, 1), (3, 2), (5, 2, 3), True, torch.float32, (2,)),
    ((14, 5, 6), (6, 1, 1), (2, 3), (5, 2, 3), False, torch.float32, ()),
    ((25,), (6,), (2, 3), (4,), False, torch.float64, (3,)),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c[:4])) + f"-{c[5]}".replace("torch.", ""))
def test_reduction_mesh_matches_flat_and_torch_fft(ranks, case):
    ranks.run(math.prod(case[1]), _check, *case)


def _parallel_models(reduction):
    """An FNO parallelized with and without ``reduction`` over a slab of 4 ranks, and over a 2 (data)
    x 2 (space) mesh with a reduction of the 2 spatial ranks as 1 x 2."""
    device = device_for(dist.get_rank())
    x = random_tensor((2, 3, 9, 6), torch.float64, 5)
    results = []
    for mesh, placements, shape in (
        (mesh_for((4,))[0], (Shard(2),), reduction),
        (device_mesh((2, 2), ("data", "space")), (Shard(0), Shard(2)), (1, 2)),
    ):
        torch.manual_seed(0)
        single, flat, tree = (
            FNO(3, 2, 4, (3, 2), 2, projection_width=8, dtype=torch.float64, device=device) for _ in range(3)
        )
        flat.load_state_dict(single.state_dict())
        tree.load_state_dict(single.state_dict())
        parallelize(flat, mesh, placements)
        parallelize(tree, mesh, placements, reduction=shape)
        convs = [m for m in tree.modules() if isinstance(m, SpectralConv)]
        assert all(c.reduction is convs[0].reduction and f"reduction={shape}" in repr(c) for c in convs), repr(tree)
        ref_in = x.to(device, copy=True).requires_grad_(True)
        ref = single(ref_in)
        ref.square().sum().backward()
        for model in (flat, tree):
            xd = distribute(x, mesh, placements, 0, requires_grad=True)
            out = model(xd)
            assert rel_err(out.full_tensor(), ref) <= 1e-12, rel_err(out.full_tensor(), ref)
            out.square().sum().backward()
            assert rel_err(xd.grad.full_tensor(), ref_in.grad) <= 1e-12, rel_err(xd.grad.full_tensor(), ref_in.grad)
        for (name, p), q, r in zip(tree.named_parameters(), flat.parameters(), single.parameters(), strict=True):
            if "weight" in name and p.dim() > 2:  # a spectral weight: sharded alike, whole gradient alike
                # Exact: both sharded from the same initial weight, values moved, none computed.
                assert p.placements == q.placements and torch.equal(p.to_local(), q.to_local()), name
                p_grad, q_grad = p.grad.full_tensor(), q.grad.full_tensor()
            else:
                p_grad, q_grad = p.grad, q.grad
            assert rel_err(p_grad, r.grad) <= 1e-12 and rel_err(q_grad, r.grad) <= 1e-12, (
                name,
                rel_err(p_grad, r.grad),
                rel_err(q_grad, r.grad),
            )
        # The state dicts are the same: one loads into the other.
        flat.load_state_dict(tree.state_dict())
        # Their keys, and the entries of the reduction's that differ from the single-device model's.
        state, reference = tree.state_dict(), single.state_dict()
        changed = [k for k, v in state.items() if not torch.equal(_whole(v), reference[k])]
        results.append((sorted(state), sorted(flat.state_dict()), sorted(reference), changed))
    return results


def _whole(t: torch.Tensor) -> torch.Tensor:
    """A state-dict entry's global value (a DTensor's gathered: a collective on every rank)."""
    return t.full_tensor() if isinstance(t, DTensor) else t


def test_parallelize_with_reduction_keeps_shares_and_weights(ranks):
    results = ranks.run(4, _parallel_models, (2, 2))
    assert len(results) == 4 and all(r == results[0] for r in results)  # every rank holds the same names
    assert len(results[0]) == 2  # the slab and the data x space mesh
    for tree, flat, single, changed in results[0]:
        # The reduction changes no name and no value: each rank's state dict is the flat model's and the
        # single-device model's, entry by entry.
        assert tree == flat == single and tree, (tree, flat, single)
        assert changed == [], changed


def _bad_reductions():
    mesh, placements = mesh_for((6, 1))
    errors = attempts_without_collectives(
        [
            (lambda r: drift.TruncatedFFT((12, 6), (3, 2), mesh, placements, reduction=r), (2, 2)),
            (lambda r: drift.TruncatedFFT((12, 6), (3, 2), mesh, placements, reduction=r), (4, 2)),
            (lambda r: drift.TruncatedFFT((12, 6), (3, 2), mesh, placements, reduction=r), (2, 0, 3)),
            (lambda r: drift.reduction_mesh(mesh, [0], r), (2.0, 3)),
            (lambda m: parallelize(m, mesh, (Shard(2),), reduction=(3, 3)), FNO(1, 1, 2, (2, 2), 1)),
            (lambda m: parallelize(m, mesh, (Shard(2),), reduction=(2, 3)), FNO(1, 1, 2, (2, 2), 1, method="dfno")),
        ]
    )
    # A reduction mesh over other ranks than the field's; one that does not split a pencil's mesh dims in turn;
    # a sub-mesh, whose ranks cannot make the groups of the other sub-meshes' fields.
    other = drift.reduction_mesh(mesh, [], (1,))
    pencil, pencil_placements = mesh_for((3, 2))
    rows = drift.layout.device_mesh((3, 2), ("data", "x"), mesh.device_type)["x"]
    errors += attempts_without_collectives(
        [
            (lambda r: drift.TruncatedFFT((12, 6), 2, mesh, placements, reduction=r), other),
            (lambda r: drift.TruncatedFFT((12, 6), 2, pencil, pencil_placements, reduction=r), (2, 3)),
            (lambda m: parallelize(m, rows, (Shard(2),), reduction=(2,)), FNO(1, 1, 2, (2, 2), 1)),
        ]
    )
    return errors


def test_bad_reductions_fail_before_any_collective(ranks):
    for errors in ranks.run(6, _bad_reductions):
        assert all(kind == "ValueError" for kind, _ in errors), errors
        messages = [m for _, m in errors]
        assert "reduction (2, 2) has 4 ranks but the field is split over 6" in messages[0]
        assert "reduction (4, 2) has 8 ranks" in messages[1]
        assert "reduction (2, 0, 3) needs one or more positive ints" in messages[2]
        assert "reduction (2.0, 3) needs one or more positive ints" in messages[3]
        assert "reduction (3, 3) has 9 ranks but the field is split over 6" in messages[4]
        assert "reduction applies to method 'drift' only" in messages[5] and "dfno" in messages[5]
        assert "does not span, in order, the ranks [0, 1, 2, 3, 4, 5]" in messages[6]
        assert "reduction (2, 3) does not split the spatial mesh dims (3, 2) in turn" in messages[7]
        assert "reduction needs a mesh over all 6 ranks, got a sub-mesh of 2" in messages[8]


def test_one_process_reduction():
    """Without a mesh nothing is summed: a reduction of one rank is the plan itself, any other an error."""
    x = random_tensor((2, 9, 8), torch.float64, 9)
    plan = drift.TruncatedFFT((9, 8), (3, 2), dtype=torch.float64, reduction=(1,))
    assert rel_err(plan(x, sharded=True), truncated_spectrum(x, plan.modes, True, "backward")) <= 1e-12
    with pytest.raises(ValueError, match=r"reduction \(2, 2\) needs a mesh"):
        drift.TruncatedFFT((9, 8), (3, 2), reduction=(2, 2))


def _auto_reductions():
    """parallelize(reduction="auto") on a slab of 4 ranks, 2 a host: the cost model's shape, and the values."""
    from drift.cost import Hosts, Machine

    device = device_for(dist.get_rank())
    mesh, placements = mesh_for((4,))[0], (Shard(2),)
    x = random_tensor((2, 3, 16, 6), torch.float64, 5)
    chosen = []
    for method, machine in [
        ("drift", Machine(1e10, 1e10, 1e-4, 1e-9, Hosts(2, 1e-3, 8e-9))),
        ("auto", Machine(1e10, 1e10, 1e-4, 1e-9, Hosts(2, 1e-3, 8e-9))),
        ("drift", Machine(1e10, 1e10, 0.0, 1e-9)),  # no latency: one level is as fast
    ]:
        torch.manual_seed(0)
        single, model = (
            FNO(3, 2, 4, (3, 2), 2, method=m, dtype=torch.float64, device=device) for m in ("drift", method)
        )
        model.load_state_dict(single.state_dict())
        parallelize(model, mesh, placements, reduction="auto", global_shape=(16, 6), machine=machine)
        convs = [m for m in model.modules() if isinstance(m, SpectralConv)]
        shapes = {None if c.reduction is None else tuple(c.reduction.shape) for c in convs}
        chosen.append((sorted({c.method for c in convs}), shapes))
        out = model(distribute(x, mesh, placements, 0)).full_tensor()
        assert rel_err(out, single(x.to(device))) <= 1e-12
    return chosen, attempts_without_collectives(
        [(lambda r: parallelize(FNO(1, 1, 2, (2, 2), 1), mesh, placements, reduction=r, global_shape=(8, 8)), "best")]
    )


def test_parallelize_chooses_the_reduction(ranks):
    for chosen, errors in ranks.run(4, _auto_reductions):
        assert chosen == [(["drift"], {(2, 2)}), (["drift"], {(2, 2)}), (["drift"], {None})]
        assert errors == [
            ("ValueError", "reduction must be a mesh shape, a reduction mesh, None or 'auto', got 'best'")
        ]
