"""Implicit domain padding: TruncatedFFT(padding=...), SpectralConv and FNO(domain_padding=...) against explicit
torch.nn.functional.pad + torch.fft (+ crop) on 1 and 4 ranks."""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist
from harness import device_for
from meshes import check_dtensor_runs, distribute, lead_placements, local_block, mesh_for
from reference import TOL, case_id, mesh_share, random_tensor, rel_err
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.nn import functional as F

import drift
from drift.layout import to_dtensor
from drift.nn import FNO, SpectralConv, parallelize


def kept(spec, n: int, half: bool) -> list[int]:
    """Li et al.'s kept frequencies of an extent n for an int k (0..k-1 on a half spectrum), or a list."""
    if not isinstance(spec, int):
        return [f % n for f in spec]
    return list(range(spec)) if half else [*range(spec), *range(n - spec, n)]


def explicit_pad(x: torch.Tensor, pairs) -> torch.Tensor:
    return F.pad(x, [side for pair in reversed(pairs) for side in pair])


def crop(y: torch.Tensor, pairs, shape) -> torch.Tensor:
    return y[(..., *(slice(b, b + n) for (b, _), n in zip(pairs, shape, strict=True)))]


def padded_spectrum(x, modes, pairs, real, norm):
    """The retained modes of fftn (rfftn) of ``x`` zero-padded by ``pairs`` on its last dims."""
    d = len(pairs)
    xp = explicit_pad(x, pairs)
    padded = xp.shape[xp.dim() - d :]
    spec = (torch.fft.rfftn if real else torch.fft.fftn)(xp, dim=tuple(range(-d, 0)), norm=norm)
    index = [torch.tensor(kept(m, n, real and i == d - 1)) for i, (m, n) in enumerate(zip(modes, padded, strict=True))]
    return spec[(..., *torch.meshgrid(*index, indexing="ij"))]


def padded_inverse(xhat, modes, pairs, shape, real, norm):
    """ifftn (irfftn) over the padded extents of the zero-filled spectrum, cropped to ``shape``'s real points."""
    d = len(shape)
    padded = [n + b + a for n, (b, a) in zip(shape, pairs, strict=True)]
    full = [*padded[:-1], padded[-1] // 2 + 1] if real else padded
    index = [torch.tensor(kept(m, n, real and i == d - 1)) for i, (m, n) in enumerate(zip(modes, padded, strict=True))]
    z = torch.zeros(*xhat.shape[: xhat.dim() - d], *full, dtype=xhat.dtype)
    z[(..., *torch.meshgrid(*index, indexing="ij"))] = xhat
    y = (torch.fft.irfftn if real else torch.fft.ifftn)(z, s=padded, dim=tuple(range(-d, 0)), norm=norm)
    return crop(y, pairs, shape)


def as_pairs(padding, d):
    if isinstance(padding, int):
        padding = (padding,) * d
    return [(0, p) if isinstance(p, int) else tuple(p) for p in padding]


# (shape, grid, modes, padding, real, dtype, norm, batch): 1 rank, slabs with uneven and empty blocks (9 or 5
# over 4), pencils (one splitting the real last dim), padding up to the extent on a side, modes that only the
# padded extent holds (2k > N).
TRUNCATED_CASES = [
    ((13,), (1,), (8,), [(3, 2)], False, torch.float64, "ortho", (2,)),
    ((12, 10, 7), (1, 1, 1), (3, 3, 3), [(2, 2), 0, 5], True, torch.float32, "backward", ()),
    ((9, 10), (4, 1), (5, 3), [(3, 3), (0, 4)], True, torch.float64, "forward", (2,)),
    ((5, 6, 4), (4, 1, 1), (3, 2, 3), 2, False, torch.float32, "ortho", (2,)),
    ((5, 6, 4), (4, 1, 1), (3, 4, 2), [(1, 1), (1, 2), 0], True, torch.float64, "backward", ()),
    ((11, 13), (2, 2), (4, 5), [(11, 0), (1, 13)], True, torch.float64, "backward", ()),
    ((9, 7, 10), (1, 2, 2), (2, 3, 4), [(1, 1), (2, 2), (0, 3)], True, torch.float32, "forward", (2,)),
    ((7, 6, 5), (2, 1, 2), ([0, 2, -1], 2, 2), [(2, 1), 0, (1, 1)], False, torch.float64, "ortho", (2,)),
]


def _check_truncated(shape, grid, modes, padding, real, dtype, norm, batch):
    device = device_for(dist.get_rank())
    mesh, placements = mesh_for(grid)
    plan = drift.TruncatedFFT(
        shape, modes, mesh, placements, real=real, dtype=dtype, norm=norm, device=device, padding=padding
    )
    pairs, d, tol = as_pairs(padding, len(shape)), len(shape), TOL[dtype]
    assert plan.padded_shape == tuple(n + b + a for n, (b, a) in zip(shape, pairs, strict=True))
    x = random_tensor((*batch, *shape), dtype, 1, complex_=not real)
    wide = x.to(torch.complex128 if x.is_complex() else torch.float64)
    spec = padded_spectrum(wide, modes, pairs, real, norm)
    mine = (
        ...,
        mesh_share(plan.mode_shape[0], mesh.shape, placements, mesh.get_coordinate()),
        *[slice(None)] * (d - 1),
    )
    x_local = local_block(x, mesh, placements, len(batch))
    assert rel_err(plan(x_local), spec) <= tol
    assert rel_err(plan(x_local, sharded=True), spec[mine]) <= tol

    xhat = random_tensor((*batch, *plan.mode_shape), dtype, 2, complex_=True)
    field = padded_inverse(xhat.to(torch.complex128), modes, pairs, shape, real, norm)
    ref = local_block(field, mesh, placements, len(batch))
    y = plan.inverse(xhat.to(device))
    assert y.shape == (*batch, *plan.local_shape) and rel_err(y, ref) <= tol
    assert rel_err(plan.inverse(xhat[mine].to(device), sharded=True), ref) <= tol
    if dtype != torch.float64:
        return
    # Gradients: DTensor in and out, against single-process autograd through explicit padding.
    lead = len(batch)
    field_placements = lead_placements(placements, lead)
    share_placements = tuple(Shard(lead) if isinstance(p, Shard) else Replicate() for p in placements)
    replicated = (Replicate(),) * mesh.ndim

    def forward_ref(t):
        return padded_spectrum(t, modes, pairs, real, norm)

    def inverse_ref(t):
        return padded_inverse(t, modes, pairs, shape, real, norm)

    runs = [
        ("forward", plan.forward, forward_ref, x, field_placements, replicated),
        ("forward sharded", lambda t: plan(t, sharded=True), forward_ref, x, field_placements, share_placements),
        ("inverse", plan.inverse, inverse_ref, xhat, replicated, field_placements),
        (
            "inverse sharded",
            lambda t: plan.inverse(t, sharded=True),
            inverse_ref,
            xhat,
            share_placements,
            field_placements,
        ),
    ]
    check_dtensor_runs(runs, mesh, device)


@pytest.mark.parametrize(
    "case", TRUNCATED_CASES, ids=lambda c: case_id(c[0], c[1], "real" if c[4] else "complex", str(c[5])[6:], c[6])
)
def test_truncated_fft_padding_is_explicit_padding(ranks, case):
    ranks.run(math.prod(case[1]), _check_truncated, *case)


def _collectives(padding):
    device = device_for(dist.get_rank())
    mesh, placements = mesh_for((4, 1, 1))
    plan = drift.TruncatedFFT((12, 10, 9), (3, 2, 4), mesh, placements, device=device, padding=padding)
    x = local_block(random_tensor((2, 12, 10, 9), torch.float32, 9), mesh, placements, 1)
    with drift.comm_log() as log:
        plan.inverse(plan(x, sharded=True), sharded=True)
        plan(x)
    return [(c.kind, c.bytes) for c in log.calls]


def test_padding_adds_no_communication(ranks):
    """The same collectives and bytes with and without padding (only the bases change)."""
    plain = ranks.run(4, _collectives, None)
    padded = ranks.run(4, _collectives, [(3, 3), (0, 10), (4, 5)])
    assert padded == plain and [k for k, _ in plain[0]] == ["reduce_scatter", "all_gather", "all_reduce"]


@pytest.mark.parametrize("real", [True, False])
def test_truncated_fft_padding_one_device(real):
    """No mesh, no process group: values and gradients against explicit padding, and no collective."""
    shape, modes, pairs = (6, 5, 4), (4, [0, 2, -1], 3), [(1, 2), (2, 0), (0, 3)]
    plan = drift.TruncatedFFT(shape, modes, real=real, dtype=torch.float64, padding=pairs)
    x = random_tensor((2, *shape), torch.float64, 5, complex_=not real)
    xhat = random_tensor((2, *plan.mode_shape), torch.float64, 6, complex_=True)
    runs = [
        (plan.forward, lambda t: padded_spectrum(t, modes, pairs, real, "backward"), x),
        (plan.inverse, lambda t: padded_inverse(t, modes, pairs, shape, real, "backward"), xhat),
    ]
    for seed, (run, reference, inp) in enumerate(runs):
        got, want = inp.clone().requires_grad_(True), inp.clone().requires_grad_(True)
        with drift.comm_log() as log:
            out = run(got)
        assert log.calls == [] and rel_err(out, reference(want)) <= 1e-12
        w = random_tensor(torch.view_as_real(out).shape if out.is_complex() else out.shape, torch.float64, seed)
        for t, fn in ((got, run), (want, reference)):
            y = fn(t)
            ((torch.view_as_real(y) if y.is_complex() else y) * w).sum().backward()
        assert rel_err(got.grad, want.grad) <= 1e-12


def test_truncated_fft_bad_padding():
    cases = [
        (-1, "padding on dim 0: -1 must be between 0 and the extent 8 on each side"),
        ([(0, 9), 0], r"padding on dim 0: \(0, 9\) must be between 0 and the extent 8"),
        ([0, (7, 0)], r"padding on dim 1: \(7, 0\) must be between 0 and the extent 6"),
        ([1], "padding needs an int or one entry per dim"),
        ([1, 1.5], "padding on dim 1 must be an int or a pair"),
        ([1, (1, 2, 3)], "padding on dim 1 must be an int or a pair"),
        ([True, 0], "padding on dim 0 must be an int or a pair"),
        ("2", "padding needs an int or one entry per dim"),
    ]
    for padding, match in cases:
        with pytest.raises(ValueError, match=match):
            drift.TruncatedFFT((8, 6), (2, 2), padding=padding)
    # Modes are checked against the padded extent: 2k = 10 needs 2 zeros on an extent of 8.
    with pytest.raises(ValueError, match="dim 0: 2k = 10 exceeds the extent 8"):
        drift.TruncatedFFT((8, 6), (5, 2))
    assert drift.TruncatedFFT((8, 6), (5, 2), padding=[(1, 1), 0]).modes[0] == (0, 1, 2, 3, 4, 5, 6, 7, 8, 9)
    with pytest.raises(ValueError, match="dim 0: 2k = 12 exceeds the extent 10"):
        drift.TruncatedFFT((8, 6), (6, 2), padding=[(1, 1), 0])


# SpectralConv and FNO.


def padding_pairs_of(fractions, mode, shape):
    sides = [round(f * n) for f, n in zip(fractions, shape, strict=True)]
    return [(p, p) if mode == "symmetric" else (0, p) for p in sides]


def reference_padded_conv(x, w, modes, fractions, mode, real):
    """Single-device spectral convolution of ``x`` zero-padded by round(fraction * N), cropped back."""
    shape = x.shape[2:]
    pairs = padding_pairs_of(fractions, mode, shape)
    mixed = torch.einsum("bi...,io...->bo...", padded_spectrum(x, modes, pairs, real, "backward"), w)
    return padded_inverse(mixed, modes, pairs, shape, real, "backward")


def _fractions(padding, d):
    return (padding,) * d if isinstance(padding, float) else padding


def _mesh(grid):
    mesh, placements = mesh_for(grid)
    return mesh, lead_placements(placements, 2)


def _check_conv(shape, grid, modes, method, real, padding, mode):
    rank, device = dist.get_rank(), device_for(dist.get_rank())
    torch.manual_seed(5)
    factory = dict(dtype=torch.float64, device=device)
    layer = SpectralConv(
        3, 2, modes, method=method, real=real, domain_padding=padding, domain_padding_mode=mode, **factory
    )
    w = layer.weight.detach().cpu().clone()
    mesh, field_placements = mesh_for(grid)
    placements = lead_placements(field_placements, 2)
    parallelize(layer, mesh, placements)
    block = drift.Layout(shape, mesh, field_placements).local_slices
    x = random_tensor((2, 3, *shape), torch.float64, 6, complex_=not real)
    local = distribute(x, mesh, placements, 0).to_local().detach().requires_grad_(True)
    y = layer(to_dtensor(local, mesh, placements, x.shape))
    assert isinstance(y, DTensor) and y.shape == (2, 2, *shape)
    out = y.to_local()
    g = random_tensor((torch.view_as_real(out) if out.is_complex() else out).shape, torch.float64, 100 + rank)
    ((torch.view_as_real(out) if out.is_complex() else out) * g.to(device)).sum().backward()
    grads = to_dtensor(local.grad, mesh, placements, x.shape).full_tensor().cpu()
    return y.full_tensor().detach().cpu(), grads, layer.weight.grad.full_tensor().cpu(), w, block, g


CONV_CASES = [
    ((9, 8, 6), (1, 1, 1), (3, 2, 3), "drift", True, 0.25, "symmetric"),
    ((9, 8, 6), (1, 1, 1), (3, 2, 3), "dfno", True, 0.25, "symmetric"),
    ((9, 8, 6), (1, 1, 1), (3, 2, 3), "dfno-pruned", False, (0.2, 0.1, 0.5), "one-sided"),
    ((5, 8, 6), (4, 1, 1), (3, 2, 3), "drift", True, (0.5, 0.25, 0.2), "symmetric"),  # 2, 2, 1, 0 rows; 2k > 5
    ((8, 9, 6), (2, 2, 1), (2, 3, 2), "drift", False, 0.3, "one-sided"),
    ((7, 6, 10), (1, 2, 2), (2, 2, 3), "drift", True, (0.0, 0.5, 1.0), "symmetric"),
    ((9, 8, 6), (4, 1, 1), (2, 2, 3), "dfno", True, (0.0, 0.25, 0.5), "symmetric"),  # the split dim unpadded
    ((8, 6, 10), (1, 1, 4), (2, 2, 3), "dfno-pruned", True, (0.25, 0.5, 0.0), "one-sided"),
]


@pytest.mark.parametrize("case", CONV_CASES, ids=lambda c: case_id(c[0], c[1], c[3], c[6]))
def test_spectral_conv_padding_matches_explicit_padding(ranks, case):
    shape, grid, modes, method, real, padding, mode = case
    results = ranks.run(math.prod(grid), _check_conv, *case)
    w = results[0][3].to(torch.complex128).requires_grad_(True)
    x = random_tensor((2, 3, *shape), torch.float64, 6, complex_=not real).requires_grad_(True)
    want = reference_padded_conv(x, w, modes, _fractions(padding, len(shape)), mode, real)
    # The reference loss: every rank's functional of its own block, summed.
    total = 0
    for _, _, _, _, block, g in results:
        part = want[(..., *block)]
        total = total + ((torch.view_as_real(part) if part.is_complex() else part) * g).sum()
    total.backward()
    for y, x_grad, w_grad, *_ in results:
        assert rel_err(y, want) <= 1e-12
        assert rel_err(x_grad, x.grad) <= 1e-12
        assert rel_err(w_grad, w.grad) <= 1e-12


def test_methods_and_resolutions_single_device():
    """The same weights give the same padded function for every method, at every resolution (the padding
    follows round(fraction * N)), in float64 and float32."""
    for dtype in (torch.float64, torch.float32):
        for n in (8, 11, 13):
            x = random_tensor((2, 3, n, 7), dtype, n)
            for method in drift.nn.METHODS:
                torch.manual_seed(3)
                layer = SpectralConv(3, 3, (3, 3), method=method, dtype=dtype, domain_padding=(0.3, 0.15))
                want = reference_padded_conv(
                    x.double(), layer.weight.detach().to(torch.complex128), (3, 3), (0.3, 0.15), "symmetric", True
                )
                assert rel_err(layer(x), want) <= TOL[dtype], (dtype, n, method)


def test_padding_amounts_are_neuraloperators():
    """The symmetric padding of every resolution is neuraloperator 2.0's DomainPadding's, ties rounded as
    Python does (2.5 -> 2, 1.5 -> 2)."""
    padding = pytest.importorskip("neuralop.layers.padding")
    for fractions in ((0.25, 0.25), (0.3, 0.15), (0.5, 1.0)):
        layer = SpectralConv(1, 1, (1, 1), domain_padding=fractions)
        for shape in ((10, 6), (11, 7), (13, 9)):
            x = random_tensor((1, 1, *shape), torch.float32, 0)
            want = padding.DomainPadding(list(fractions)).pad(x)
            pairs = layer.padding_at(shape)
            assert torch.equal(explicit_pad(x, pairs), want), (fractions, shape, pairs)  # exact: values copied


def reference_padded_fno(model: FNO, x: torch.Tensor, fractions, mode) -> torch.Tensor:
    """The FNO formula with per-layer explicit padding, on torch.fft, in float64."""

    def pointwise(layer, t):
        bias = layer.bias.double().view(-1, *[1] * (t.dim() - 2))
        return torch.einsum("oi,bi...->bo...", layer.weight.double(), t) + bias

    x = pointwise(model.lift, x.double())
    for i, block in enumerate(model.blocks):
        weight = block.spectral.weight.detach().to(torch.complex128)
        x = reference_padded_conv(x, weight, block.spectral.mode_spec, fractions, mode, True) + pointwise(block.skip, x)
        if i < len(model.blocks) - 1:
            x = F.gelu(x)
    return pointwise(model.project_out, F.gelu(pointwise(model.project_hidden, x)))


def _fno(grid, method, padding, mode, state):
    device = device_for(dist.get_rank())
    padded = dict(domain_padding=padding, domain_padding_mode=mode)
    model = FNO(2, 1, 6, (2, 3, 3), n_layers=2, method=method, dtype=torch.float64, device=device, **padded)
    model.load_state_dict(state)
    mesh, placements = _mesh(grid)
    parallelize(model, mesh, placements)
    x = random_tensor((2, 2, 9, 8, 6), torch.float64, 8)
    y = model(distribute(x, mesh, placements, 0))
    y.to_local().square().sum().backward()  # the sum over ranks is the global sum of squares
    grads = {
        n: (p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad).cpu() for n, p in model.named_parameters()
    }
    return y.full_tensor().detach().cpu(), grads


@pytest.mark.parametrize(
    ("grid", "method", "padding", "mode"),
    [
        ((1, 1, 1), "drift", 0.25, "symmetric"),
        ((4, 1, 1), "drift", 0.25, "symmetric"),
        ((2, 2, 1), "drift", (0.5, 0.2, 0.4), "one-sided"),
        ((4, 1, 1), "dfno-pruned", (0.0, 0.25, 0.5), "symmetric"),
    ],
)
def test_fno_padding_matches_explicit_padding(ranks, grid, method, padding, mode):
    torch.manual_seed(3)
    padded = dict(domain_padding=padding, domain_padding_mode=mode)
    single = FNO(2, 1, 6, (2, 3, 3), n_layers=2, method=method, dtype=torch.float64, **padded)
    x = random_tensor((2, 2, 9, 8, 6), torch.float64, 8)
    y_ref = single(x)
    assert rel_err(y_ref, reference_padded_fno(single, x, _fractions(padding, 3), mode)) <= 1e-12
    y_ref.square().sum().backward()
    state = {k: v.clone() for k, v in single.state_dict().items()}
    for y, grads in ranks.run(math.prod(grid), _fno, grid, method, padding, mode, state):
        assert rel_err(y, y_ref) <= 1e-12
        for name, p in single.named_parameters():
            assert rel_err(grads[name], p.grad) <= 1e-12, name


def test_bad_domain_padding_raises_at_construction():
    cases = [
        (-0.1, "domain_padding on dim 0: -0.1 must be a fraction of the extent between 0 and 1"),
        (1.5, "domain_padding on dim 0: 1.5 must be a fraction"),
        ((0.1, 2.0), "domain_padding on dim 1: 2.0 must be a fraction"),
        ((0.1,), r"domain_padding needs a number or one per spatial dim \(2\)"),
        ((0.1, True), "domain_padding on dim 1: True"),
        ("0.1", "domain_padding needs a number or one per spatial dim"),
    ]
    for padding, match in cases:
        with pytest.raises(ValueError, match=match):
            SpectralConv(2, 2, (2, 2), domain_padding=padding)
        with pytest.raises(ValueError, match=match):
            FNO(1, 1, 4, (2, 2), domain_padding=padding)
    with pytest.raises(ValueError, match=r"domain_padding_mode must be one of \('symmetric', 'one-sided'\)"):
        FNO(1, 1, 4, (2, 2), domain_padding=0.1, domain_padding_mode="reflect")
    layer = SpectralConv(2, 2, (3, 2), domain_padding=(0.1, 0.0))
    layer(torch.randn(1, 2, 10, 6))  # 10 + 2 holds 2k = 6 ...
    with pytest.raises(drift.PlanError, match=r"resolution \(4, 6\): modes on dim 0: 2k = 6 exceeds the extent 4"):
        layer(torch.randn(1, 2, 4, 6))  # ... 4 + 0 does not (round(0.4) = 0)
    with pytest.raises(
        drift.PlanError, match=r"resolution \(5, 6\) \(padded to \(7, 6\)\): .*2k = 8 exceeds the extent 7"
    ):
        SpectralConv(2, 2, (4, 2), domain_padding=(0.2, 0.0))(torch.randn(1, 2, 5, 6))


def _dfno_split_padding():
    mesh, placements = _mesh((4, 1, 1))
    errors = []
    for method in ("dfno", "dfno-pruned"):
        model = FNO(1, 1, 4, (2, 2, 2), n_layers=1, method=method, domain_padding=(0.25, 0.0, 0.5))
        with drift.comm_log() as log, pytest.raises(drift.PlanError) as info:
            parallelize(model, mesh, placements)
        assert log.calls == [] and model.blocks[0].spectral.mesh is None
        errors.append(str(info.value))
    parallelize(FNO(1, 1, 4, (2, 2, 2), n_layers=1, method="dfno", domain_padding=(0.0, 0.25, 0.5)), mesh, placements)
    return errors


def test_dfno_padding_of_a_split_dim_is_refused(ranks):
    for errors in ranks.run(4, _dfno_split_padding):
        for method, message in zip(("dfno", "dfno-pruned"), errors, strict=True):
            assert f"{method} with domain_padding=(0.25, 0.0, 0.5) pads the tensor" in message
            assert "not supported on spatial dims split over ranks (dims [0])" in message
