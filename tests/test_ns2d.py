"""Li et al.'s 2-D Navier-Stokes generator (drift.data.ns2d) against a numpy ETDRK4 written here, on 1 and 4
ranks; its order in dt; a flow without advection against its closed form; the file 4 ranks write against
1 rank's; the initial field's statistics; Li's .mat files (drift.data.mat)."""

from __future__ import annotations

import math

import h5py
import numpy as np
import pytest
import torch
from meshes import mesh_for

from drift.data import detect
from drift.data.mat import MatFile
from drift.data.ns2d import ALPHA, SIGMA, TAU, VorticitySolver, check_arguments, fourier_interpolate, generate_ns2d
from drift.layout import Layout

N, NU = 32, 1e-3


def _wavenumbers(n: int) -> tuple[np.ndarray, np.ndarray]:
    return np.fft.fftfreq(n, 1 / n)[:, None], np.fft.rfftfreq(n, 1 / n)[None, :]


def reference(w0: np.ndarray, nu: float, dt: float, steps: int) -> np.ndarray:
    """ETDRK4 of the vorticity equation with Li's forcing from ``w0`` ``(b, n, n)``, in numpy: Kassam and
    Trefethen's coefficients on the full circle (64 points), 2/3 dealiasing, Nyquist-free derivatives."""
    n = w0.shape[-1]
    kx, ky = _wavenumbers(n)
    k2 = kx**2 + ky**2
    ikx = 2j * np.pi * np.where(np.abs(kx) == n // 2, 0, kx)
    iky = 2j * np.pi * np.where(ky == n // 2, 0, ky)
    inv = np.where(k2 > 0, 1 / (4 * np.pi**2 * np.maximum(k2, 1)), 0)
    keep = (np.abs(kx) <= n / 3) & (ky <= n / 3)
    x = np.arange(n)[:, None] / n
    y = np.arange(n)[None, :] / n
    f = np.fft.rfft2(0.1 * (np.sin(2 * np.pi * (x + y)) + np.cos(2 * np.pi * (x + y))))
    h_l = -dt * nu * 4 * np.pi**2 * k2
    r = np.exp(2j * np.pi * (np.arange(64) + 0.5) / 64)
    z = h_l[..., None] + r
    e, e2 = np.exp(h_l), np.exp(h_l / 2)
    q = dt * np.mean((np.exp(z / 2) - 1) / z, -1).real
    f1 = dt * np.mean((-4 - z + np.exp(z) * (4 - 3 * z + z**2)) / z**3, -1).real
    f2 = dt * np.mean((2 + z + np.exp(z) * (z - 2)) / z**3, -1).real
    f3 = dt * np.mean((-4 - 3 * z - z**2 + np.exp(z) * (4 - z)) / z**3, -1).real

    def tendency(w):
        psi = w * inv
        u, v, wx, wy = (np.fft.irfft2(a, s=(n, n)) for a in (iky * psi, -ikx * psi, ikx * w, iky * w))
        return f - keep * np.fft.rfft2(u * wx + v * wy)

    w = np.fft.rfft2(w0)
    for _ in range(steps):
        nw = tendency(w)
        a = e2 * w + q * nw
        na = tendency(a)
        b = e2 * w + q * na
        nb = tendency(b)
        c = e2 * a + q * (2 * nb - nw)
        w = e * w + f1 * nw + 2 * f2 * (na + nb) + f3 * tendency(c)
    return np.fft.irfft2(w, s=(n, n))


def _rel(a, b) -> float:
    return float(np.linalg.norm(np.asarray(a) - np.asarray(b)) / np.linalg.norm(np.asarray(b)))


def _solve_on_ranks(size: int, dtype: torch.dtype, steps: list[int]):
    """On each rank: the initial fields and the fields at t = 0.06 after ``steps[b]`` steps, whole, and
    their records at 16^2 and 64^2, whole."""
    mesh, placements = mesh_for((size, 1))
    solver = VorticitySolver(N, NU, mesh=mesh, placements=placements, dtype=dtype)
    whole = Layout((N, N), mesh, placements)
    w = solver.initial([0, 1], seed=7)
    w0 = whole.gather(solver.plan.inverse(w))
    w = solver.advance(w, 0.06, steps)
    records = [Layout((n, n), mesh, placements).gather(solver.record(w, n)) for n in (16, 64)]
    return w0.double().numpy(), whole.gather(solver.plan.inverse(w)).double().numpy(), [r.numpy() for r in records]


@pytest.mark.parametrize("size", [1, 4])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
def test_matches_numpy_reference(ranks, size, dtype):
    steps = [6, 6] if dtype == torch.float64 else [6, 3]  # float32: each trajectory its own step
    w0, w, records = ranks.run(size, _solve_on_ranks, size, dtype, steps)[0]
    tol = 1e-12 if dtype == torch.float64 else 2e-5
    for b, s in enumerate(steps):
        assert _rel(w[b], reference(w0[b : b + 1], NU, 0.06 / s, s)[0]) < tol
    for record, n in zip(records, (16, 64), strict=True):
        assert _rel(record, fourier_interpolate(torch.from_numpy(w), n)) < tol


def test_time_step_order():
    """ETDRK4 on Li's forced random field: the error against 128 steps falls as dt^4 (fourth order)."""
    solver = VorticitySolver(N, NU)
    w0 = solver.initial([0], seed=3)
    ref = solver.advance(w0, 1.0, [128])
    errors = [float((solver.advance(w0, 1.0, [m]) - ref).norm() / ref.norm()) for m in (8, 16, 32)]
    orders = [math.log2(a / b) for a, b in zip(errors, errors[1:], strict=False)]
    assert all(abs(p - 4) < 0.2 for p in orders), (errors, orders)


def test_unadvected_flow_is_exact():
    """Wave vectors on the (1, 1) direction: the advection vanishes and each mode relaxes to the forcing's
    response in closed form, which ETDRK4 follows to round-off whatever its step."""
    solver = VorticitySolver(N, NU)
    x, y = (t.numpy() for t in solver.points(N))
    ks = np.arange(1, 6)[:, None, None]
    a, b = np.random.default_rng(0).standard_normal((2, 5, 1, 1))
    phase = 2 * np.pi * ks * (x + y)
    modes = a * np.cos(phase) + b * np.sin(phase)  # (5, n, n): k (1, 1) for k = 1..5
    w = solver.advance(solver.plan.forward(torch.from_numpy(modes.sum(0))), 3.0, [4])
    lam = 8 * np.pi**2 * ks  # -lap of mode k (1, 1), over k
    decay = np.exp(-NU * lam * ks * 3.0)
    forced = (1 - decay[0]) / (NU * lam[0] * ks[0]) * 0.1 * (np.sin(phase[0]) + np.cos(phase[0]))
    exact = (decay * modes).sum(0) + forced
    assert _rel(solver.plan.inverse(w).numpy(), exact) < 1e-13


def test_initial_field_statistics():
    """Li's GaussianRF: mean zero, and the mean power per mode is 2 sigma^2 n^4 (4 pi^2 |k|^2 + tau^2)^-alpha,
    slope and level, within the sampling error of 64 fields at 64^2."""
    n = 64
    solver = VorticitySolver(n, NU)
    fields = solver.plan.inverse(solver.initial(range(64), seed=1)).numpy()
    assert np.abs(fields.mean((-2, -1))).max() < 1e-15
    power = (np.abs(np.fft.rfft2(fields)) ** 2).mean(0)
    kx, ky = _wavenumbers(n)
    shell = np.rint(np.sqrt(kx**2 + ky**2)).astype(int)
    radii = np.arange(4, 25)
    measured = np.array([power[shell == r].mean() for r in radii])
    law = np.array(
        [(2 * SIGMA**2 * n**4 * (4 * np.pi**2 * (kx**2 + ky**2) + TAU**2) ** -ALPHA)[shell == r].mean() for r in radii]
    )
    assert np.abs(measured / law - 1).max() < 0.15
    slope, expected = (np.polyfit(np.log(radii), np.log(p), 1)[0] for p in (measured, law))
    assert abs(slope - expected) < 0.2 and expected < -4.5


def test_fourier_interpolate_is_exact_on_band_limited_fields():
    x = torch.arange(24, dtype=torch.float64) / 24

    def field(s):
        return torch.sin(2 * torch.pi * (3 * s[:, None] - 2 * s[None, :])) + torch.cos(2 * torch.pi * 5 * s[:, None])

    fine = torch.arange(72, dtype=torch.float64) / 72
    assert torch.allclose(fourier_interpolate(field(x), 72), field(fine), atol=1e-13)
    assert torch.allclose(fourier_interpolate(field(fine), 24), field(x), atol=1e-13)


@pytest.mark.parametrize("drawn", [64, 16])
def test_an_initial_field_drawn_on_another_grid_is_the_same_field(drawn):
    # Drawn at 64^2 (or 16^2), a 32^2 solve starts from that field truncated (or zero-padded) to its grid.
    own = VorticitySolver(drawn, NU)
    solver = VorticitySolver(32, NU)
    field = solver.plan.inverse(solver.initial(range(2), seed=3, resolution=drawn))
    reference = fourier_interpolate(own.plan.inverse(own.initial(range(2), seed=3)), 32)
    assert (field - reference).abs().max() <= 1e-12 * reference.abs().max()
    assert torch.equal(solver.initial(range(2), seed=3, resolution=32), solver.initial(range(2), seed=3))


def _generate(size: int, path: str, batch: int) -> None:
    mesh, placements = mesh_for((size, 1))
    generate_ns2d(
        path,
        samples=3,
        resolution=16,
        solve_resolution=32,
        frames=3,
        record_every=0.5,
        initial=True,
        seed=2,
        initial_resolution=64,  # the spectra resampled across ranks too
        mesh=mesh,
        placements=placements,
        batch=batch,
    )


def test_file_from_4_ranks_equals_1_rank(ranks, tmp_path):
    one, four = tmp_path / "one.h5", tmp_path / "four.h5"
    ranks.run(1, _generate, 1, str(one), 3)
    ranks.run(4, _generate, 4, str(four), 2)  # and other batches: a trajectory's data are its own
    assert detect(four).name == "PDEBench scalar" and detect(four).describe(four).grid == (16, 16)
    with h5py.File(one) as a, h5py.File(four) as b:
        assert a["tensor"].shape == (3, 3, 16, 16) and a["tensor"].dtype == np.float32
        assert np.abs(a["tensor"][()] - b["tensor"][()]).max() <= 1e-6 * np.abs(a["tensor"][()]).max()
        assert (a["steps"][()] == b["steps"][()]).all() and (a["steps"][:, 0] == 0).all()
        assert np.allclose(a["t-coordinate"][()], [0, 0.5, 1.0, 1.5])
        assert np.allclose(a["x-coordinate"][()], np.arange(16) / 16)
        assert a.attrs["viscosity"] == NU and a.attrs["solve resolution"] == 32
        assert "Fourier truncation" in a.attrs["resampling"] and "ETDRK4" in a.attrs["scheme"]
        assert dict(a.attrs) == dict(b.attrs)


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(viscosity=0.0), "viscosity must be > 0"),
        (dict(resolution=24), "must be even and divide the solve resolution 64"),
        (dict(resolution=30, solve_resolution=30, ranks=4), "does not split over 4 ranks"),
        (dict(cfl=1.5), "cfl must be in"),
        (dict(forcing="kolmogorov"), "forcing must be one of"),
        (dict(initial_resolution=9), "initial field's resolution must be even"),
        (dict(initial_resolution=30, ranks=4), "initial field's resolution 30 does not split over 4 ranks"),
    ],
)
def test_bad_arguments(change, match):
    args = dict(
        samples=1,
        resolution=16,
        solve_resolution=64,
        viscosity=1e-3,
        record_every=1.0,
        frames=2,
        dt=None,
        cfl=0.5,
        ranks=1,
    )
    with pytest.raises(ValueError, match=match):
        check_arguments(**{**args, **change})


def test_unstable_time_step_is_refused_before_running(tmp_path):
    with pytest.raises(ValueError, match=r"dt 0\.5 is unstable at t = 0: CFL number"):
        generate_ns2d(tmp_path / "x.h5", samples=1, resolution=16, solve_resolution=64, frames=2, dt=0.5)
    assert not list(tmp_path.iterdir())


def test_mat_v73_reads_in_matlab_order(tmp_path):
    """A v7.3 file as MATLAB writes it (a 512-byte user block, column-major: dims reversed on disk)."""
    u = np.random.default_rng(0).standard_normal((3, 4, 5, 6)).astype(np.float32)  # N x X x Y x T
    path = tmp_path / "ns.mat"
    with h5py.File(path, "w", userblock_size=512) as f:
        f.create_dataset("u", data=u.transpose())  # what h5py sees of MATLAB's u: T x Y x X x N
        f.create_dataset("a", data=u[..., 0].transpose())
    with MatFile(path) as mat:
        assert mat.keys() == ["a", "u"] and mat.shape("u") == (3, 4, 5, 6)
        assert np.array_equal(mat.read("u", 1, 3), u[1:3]) and np.array_equal(mat.read("a"), u[..., 0])
        assert np.array_equal(mat.frames(0, 2), np.moveaxis(u[:2], -1, 1))


def test_drift_generate_problem_ns2d_on_two_ranks(tmp_path, capsys):
    """The command: the grid split over 2 ranks, the file drift trains on; bad arguments refused in one line
    before any rank starts, an existing output kept."""
    from drift.cli import main

    out = tmp_path / "ns.h5"
    argv = ["generate", "--problem", "ns2d", "--samples", "2", "--resolution", "16", "--solve-resolution", "32"]
    argv += ["--frames", "3", "--out", str(out)]
    assert main([*argv, "--nproc", "2"]) == 0, capsys.readouterr().err
    assert detect(out).name == "PDEBench scalar"
    with h5py.File(out) as f:
        assert f["tensor"].shape == (2, 3, 16, 16) and f.attrs["solve resolution"] == 32
        written = f["tensor"][:]
    assert main([*argv, "--force"]) == 0  # one rank: the same trajectories, to round-off (another process)
    with h5py.File(out) as f:
        assert np.abs(f["tensor"][:] - written).max() <= 1e-6 * np.abs(written).max()
    for extra, named in ((["--force", "--solve-resolution", "30"], "solve resolution 30"), ([], "exists")):
        assert main([*argv, *extra]) == 2
        err = capsys.readouterr().err
        assert named in err and len(err.strip().splitlines()) == 1, err
