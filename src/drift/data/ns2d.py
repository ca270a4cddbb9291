"""Li et al.'s two-dimensional incompressible Navier-Stokes benchmark (the FNO paper's), solved over ranks.

The equations, in vorticity form on the periodic unit square (as the authors' generator,
``data_generation/navier_stokes/ns_2d.py`` in ``zongyi-li/fourier_neural_operator``)::

    w_t + u . grad w = nu lap w + f,    u = (psi_y, -psi_x),    -lap psi = w,

with Li's forcing ``f = 0.1 (sin 2 pi (x + y) + cos 2 pi (x + y))`` and initial vorticity from Li's
Gaussian random field (``GaussianRF(2, n, alpha=2.5, tau=7)``: mean zero, covariance ``sigma^2 (-lap +
tau^2)^-alpha`` with ``sigma = tau^(alpha - 1)``; drawn here as filtered white noise, the same law, not
Li's samples). The grid is Li's: nodes ``(i / n, j / n)``, dim 0 is x, dim 1 is y.

Scheme: pseudo-spectral. The advection ``u . grad w`` is a product in physical space, dealiased by the 2/3
rule (``|k_x|, |k_y| <= n / 3``, as Li's); derivatives drop the Nyquist modes, which the state never
holds (the initial field is drawn without them). Time: ETDRK4 (Cox and Matthews 2002; coefficients by
Kassam and Trefethen's contour integrals), the viscous term integrated exactly: fourth order, and exact
when the advection vanishes (a flow whose wave vectors share one direction, as the forcing's). Each
trajectory takes its own steps in each record interval: ``ceil(record_every * U * n / cfl)``, U its
largest ``|u| + |v|`` at the interval's start (or a fixed ``dt``), so its data do not depend on the batch
it is solved in, nor on the ranks.

Distributed: ``DistributedFFT`` (r2c) over a slab of rows: each rank holds its rows of the physical field
and all k_x of its share of k_y of the spectrum, and forms the products on its rows. A recorded frame at
another resolution is the solve's spectrum truncated (a coarser grid) or zero-padded (``fourier_interpolate``:
a finer one) to that grid's band; only the band's k_x rows cross between ranks.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from drift import comm
from drift.data.writer import TurnWriter
from drift.fft import DistributedFFT
from drift.jobs.console import bars_shown
from drift.layout import Layout, grid_mesh

ALPHA, TAU = 2.5, 7.0  # Li's GaussianRF(2, n, alpha=2.5, tau=7)
SIGMA = TAU ** (ALPHA - 1)  # GaussianRF's default, tau^(alpha - d / 2)
FORCINGS = ("li", "none")
SCHEME = (
    "pseudo-spectral, 2/3-rule dealiasing; ETDRK4 (Cox-Matthews, Kassam-Trefethen contour coefficients), "
    "viscous term exact"
)
# The largest CFL number dt * max(|u| + |v|) * n a step may take. RK4 is stable on the imaginary axis up to
# 2 sqrt(2), and the fastest dealiased mode turns at 2 pi (n / 3) (|u| + |v|): a bound of 1.35. Measured
# (64^2, viscosity 1e-5, 10 time units): stable at 1.6, blown up at 2.0.
CFL_LIMIT = 1.0
# A speed growing more than this in one record interval is a blow-up, not a flow (which would then ask
# for ever more steps).
BLOWUP = 10.0
CONTOUR_POINTS = 32  # on the upper half circle: the coefficients to round-off for real, negative h L
CACHED_STEPS = 64  # coefficient sets kept per solver (one per step size the record intervals take)


def li_forcing(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Li et al.'s forcing ``0.1 (sin 2 pi (x + y) + cos 2 pi (x + y))`` at points ``(x, y)``."""
    phase = 2 * math.pi * (x + y)
    return 0.1 * (torch.sin(phase) + torch.cos(phase))


def _forcing(forcing: str | Callable) -> Callable | None:
    if callable(forcing):
        return forcing
    if forcing not in FORCINGS:
        raise ValueError(f"forcing must be one of {FORCINGS} or a function of (x, y), got {forcing!r}")
    return li_forcing if forcing == "li" else None


def _band(n: int, keep: int) -> torch.Tensor:
    """Indices along a full (c2c) spectral dim of ``n`` of the wavenumbers ``|k| < keep / 2``."""
    half = keep // 2
    return torch.cat([torch.arange(half), torch.arange(n - half + 1, n)])


def _wavenumbers(plan: DistributedFFT, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``|k|^2`` (float64) and the mask of the modes below Nyquist on ``plan``'s output block of the
    ``n`` x ``n`` grid's spectrum."""
    rows, cols = plan.output_slices()
    kx = torch.fft.fftfreq(n, 1 / n, dtype=torch.float64)[rows, None]
    ky = torch.arange(n // 2 + 1, dtype=torch.float64)[None, cols]
    return kx**2 + ky**2, (kx.abs() < n / 2) & (ky < n / 2)


class VorticitySolver:
    """The vorticity equation on an ``n`` x ``n`` grid, its rows split over ``mesh`` (``placements``: as
    ``DistributedFFT``'s, dim 1 whole; None: one process).

    States are this rank's block ``(batch, n, m)`` of ``rfft2(w)`` (backward norm; ``plan.output_slices()``:
    every k_x, a share of k_y); physical fields its rows ``(batch, r, n)`` (``plan.local_slices``).
    ``forcing``: "li", "none" or a function of the points' ``(x, y)`` tensors.
    """

    def __init__(
        self,
        n: int,
        viscosity: float,
        *,
        forcing: str | Callable = "li",
        mesh=None,
        placements: Sequence | None = None,
        dtype: torch.dtype = torch.float64,
        device: torch.device | str | None = None,
    ) -> None:
        self.n, self.viscosity, self.mesh, self.placements = n, viscosity, mesh, placements
        self.plan = DistributedFFT((n, n), mesh, placements, kind="r2c", dtype=dtype, device=device)
        self._plans = {n: self.plan}  # the recorded grids' plans, by resolution
        real, cplx, device = self.plan.dtype, self.plan.complex_dtype, self.plan.device
        rows, cols = self.plan.output_slices()
        kx = torch.fft.fftfreq(n, 1 / n, dtype=torch.float64)[rows, None]
        ky = torch.arange(n // 2 + 1, dtype=torch.float64)[None, cols]
        self.k2 = kx**2 + ky**2  # integers: the coefficients depend on them alone
        nyquist_free = (kx.abs() < n / 2) & (ky < n / 2)
        self.band = nyquist_free.to(real).to(device)
        self.dealias = ((kx.abs() <= n / 3) & (ky <= n / 3)).to(real).to(device)
        # Derivatives of the Nyquist modes are not those of a real field: dropped (the state holds none).
        self.ddx = (2j * math.pi * kx * nyquist_free).to(cplx).to(device)
        self.ddy = (2j * math.pi * ky * nyquist_free).to(cplx).to(device)
        lap = 4 * math.pi**2 * self.k2
        self.inv_lap = torch.where(self.k2 > 0, 1 / lap.clamp(min=1), 0).to(real).to(device)
        x, y = self.points(n)
        f = _forcing(forcing)
        self.forcing = self.plan.forward(f(x, y).to(real).to(device)) if f else torch.zeros_like(self.ddx)
        self._coefficients: dict[float, tuple] = {}  # by step: the few a run's intervals take

    def rows(self, n: int) -> slice:
        """This rank's rows of the ``n`` x ``n`` grid (it holds every column)."""
        return self._plan(n).local_slices[0]

    def points(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's grid points ``(x, y)`` (``(r, 1)`` and ``(1, n)``, float64) on the ``n`` x ``n`` grid."""
        nodes = torch.arange(n, dtype=torch.float64) / n
        return nodes[self.rows(n), None], nodes[None, :]

    def _plan(self, n: int) -> DistributedFFT:
        if n not in self._plans:
            self._plans[n] = DistributedFFT(
                (n, n), self.mesh, self.placements, kind="r2c", dtype=self.plan.dtype, device=self.plan.device
            )
        return self._plans[n]

    def initial(self, trajectories: Sequence[int], seed: int, resolution: int | None = None) -> torch.Tensor:
        """Li's Gaussian random field for each trajectory index, drawn on the ``resolution`` grid (default
        the solve's; another gives the same field at every solve resolution, truncated or zero-padded to
        it): white noise drawn row by row (numpy's ``default_rng([seed, trajectory, row])``, so any split
        of the rows draws the same field), filtered to covariance ``sigma^2 (-lap + tau^2)^-alpha``
        without the mean and Nyquist modes."""
        m = resolution or self.n
        plan = self._plan(m)
        rows = plan.local_slices[0]
        noise = np.array(
            [
                [np.random.default_rng([seed, t, r]).standard_normal(m) for r in range(rows.start, rows.stop)]
                for t in trajectories
            ]
        ).reshape(len(trajectories), rows.stop - rows.start, m)
        k2, band = (self.k2, self.band) if m == self.n else _wavenumbers(plan, m)
        # Li's field is Re ifft2(s * complex noise), s = n^2 sqrt(2) sigma (4 pi^2 |k|^2 + tau^2)^(-alpha / 2):
        # the real noise's rfft2 times s / n has the same covariance.
        s = m * math.sqrt(2) * SIGMA * (4 * math.pi**2 * k2 + TAU**2) ** (-ALPHA / 2)
        scale = (s * (k2 > 0)).to(plan.dtype).to(plan.device) * band.to(plan.dtype).to(plan.device)
        w = plan.forward(torch.from_numpy(noise).to(plan.dtype).to(plan.device)) * scale
        return w if m == self.n else self._resample(w, m, self.n)

    def velocity(self, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The velocity ``(u, v)`` on this rank's rows."""
        psi = w * self.inv_lap
        u, v = self.plan.inverse(torch.stack([psi * self.ddy, -psi * self.ddx])).unbind(0)
        return u, v

    def speed(self, w: torch.Tensor) -> torch.Tensor:
        """Each trajectory's largest ``|u| + |v|`` over the grid ``(batch,)``, on every rank."""
        u, v = self.velocity(w)
        top = (u.abs() + v.abs()).amax((-2, -1))
        for axis in self.plan.layout.spatial_axes:
            top = comm.all_reduce_max(top, group=self.plan.layout.group(axis))
        return top

    def tendency(self, w: torch.Tensor) -> torch.Tensor:
        """``f - u . grad w``, dealiased: the explicit part of ``w_t``."""
        psi = w * self.inv_lap
        fields = torch.stack([psi * self.ddy, -psi * self.ddx, w * self.ddx, w * self.ddy])
        u, v, wx, wy = self.plan.inverse(fields).unbind(0)  # one exchange for the four fields
        return self.forcing - self.dealias * self.plan.forward(u * wx + v * wy)

    def coefficients(self, dt: float) -> tuple[torch.Tensor, ...]:
        """ETDRK4's ``(e^{hL}, e^{hL/2}, Q, f1, f2, f3)`` on this rank's modes for a step ``dt`` (the
        identity for 0), L the viscous term: Kassam and Trefethen's contour means in float64."""
        values, index = torch.unique(self.k2, return_inverse=True)
        z = (-dt * self.viscosity * 4 * math.pi**2 * values).to(torch.complex128)[:, None]
        zeta = z + torch.exp(1j * math.pi * (torch.arange(CONTOUR_POINTS, dtype=torch.float64) + 0.5) / CONTOUR_POINTS)
        ez = torch.exp(zeta)

        def mean(t: torch.Tensor) -> torch.Tensor:
            return dt * t.mean(-1).real

        table = torch.stack(
            [
                torch.exp(z[:, 0]).real,
                torch.exp(z[:, 0] / 2).real,
                mean((torch.exp(zeta / 2) - 1) / zeta),
                mean((-4 - zeta + ez * (4 - 3 * zeta + zeta**2)) / zeta**3),
                mean((2 + zeta + ez * (zeta - 2)) / zeta**3),
                mean((-4 - 3 * zeta - zeta**2 + ez * (4 - zeta)) / zeta**3),
            ]
        )
        return tuple(table[:, index].to(self.plan.dtype).to(self.plan.device))

    def step(self, w: torch.Tensor, c: Sequence[torch.Tensor]) -> torch.Tensor:
        """One ETDRK4 step of ``w`` with coefficients ``c`` (``coefficients``, or per trajectory stacked)."""
        e, e2, q, f1, f2, f3 = c
        nw = self.tendency(w)
        a = e2 * w + q * nw
        na = self.tendency(a)
        b = e2 * w + q * na
        nb = self.tendency(b)
        c_ = e2 * a + q * (2 * nb - nw)
        return e * w + f1 * nw + 2 * f2 * (na + nb) + f3 * self.tendency(c_)

    def _cached(self, dt: float) -> tuple[torch.Tensor, ...]:
        if dt not in self._coefficients:
            if len(self._coefficients) >= CACHED_STEPS:
                self._coefficients.clear()
            self._coefficients[dt] = self.coefficients(dt)
        return self._coefficients[dt]

    def advance(self, w: torch.Tensor, span: float, steps: Sequence[int]) -> torch.Tensor:
        """Each trajectory ``b`` of ``w`` advanced by time ``span`` in ``steps[b]`` equal steps (the ones
        done first take identity steps while the others go on)."""
        c, active = None, None
        for j in range(max(steps)):
            now = tuple(span / s if j < s else 0.0 for s in steps)
            if now != active:
                active = now
                sets = [self._cached(dt) for dt in now]
                c = sets[0] if len(set(now)) == 1 else [torch.stack(k) for k in zip(*sets, strict=True)]
            w = self.step(w, c)
        return w

    def record(self, w: torch.Tensor, n: int) -> torch.Tensor:
        """This rank's rows (``points(n)``) of the fields at ``n`` x ``n``: ``w`` itself at the solve's
        ``n``; else its spectrum truncated (``n`` coarser) or zero-padded (``n`` finer: Fourier
        interpolation) to the band ``|k| < min(n, self.n) / 2`` of each dim (``fourier_interpolate``'s).
        Only the band's k_x rows of the spectrum cross between ranks (one all-gather)."""
        if n == self.n:
            return self.plan.inverse(w)
        return self._plan(n).inverse(self._resample(w, self.n, n, scale=False)) * (n / self.n) ** 2

    def _resample(self, w: torch.Tensor, m: int, n: int, scale: bool = True) -> torch.Tensor:
        """This rank's block of the ``n`` x ``n`` grid's spectrum holding the band ``|k| < min(m, n) / 2`` of
        ``w``, this rank's block of an ``m`` x ``m`` grid's spectrum; ``scale``: times ``(n / m)^2``, the
        same field's spectrum on the other grid. Only the band's k_x rows cross between ranks."""
        keep = min(n, m)
        layout = Layout((keep - 1, m // 2 + 1), self.mesh, self._plan(m).output_placements)
        kept = layout.gather(w.index_select(-2, _band(m, keep).to(w.device)))[..., : keep // 2]  # every rank
        cols = self._plan(n).output_slices()[1]
        block = w.new_zeros((*w.shape[:-2], n, cols.stop - cols.start))
        width = max(0, min(cols.stop, keep // 2) - cols.start)
        block[..., _band(n, keep).to(w.device), :width] = kept[..., cols.start : cols.start + width]
        return block * (n / m) ** 2 if scale else block


def fourier_interpolate(field: torch.Tensor, n: int) -> torch.Tensor:
    """``field`` ``(..., m, m)`` (real, periodic, on Li's nodes) resampled to ``n`` x ``n`` through its
    spectrum: zero-padded for ``n > m`` (Fourier interpolation: the band-limited field at the finer
    nodes), truncated for ``n < m``; the band ``|k| < min(n, m) / 2`` of each dim is kept (one process;
    ``VorticitySolver.record`` does the same over ranks)."""
    m = field.shape[-1]
    keep = min(n, m)
    spectrum = torch.fft.rfft2(field).index_select(-2, _band(m, keep).to(field.device))[..., : keep // 2]
    out = spectrum.new_zeros((*field.shape[:-2], n, n // 2 + 1))
    out[..., _band(n, keep).to(field.device), : keep // 2] = spectrum
    return torch.fft.irfft2(out, s=(n, n)) * (n / m) ** 2


def resampling(resolution: int, solve_resolution: int) -> str:
    """How frames at ``resolution`` come from a solve at ``solve_resolution`` (the file's attribute)."""
    if resolution == solve_resolution:
        return "none: recorded on the solve's grid"
    if resolution < solve_resolution:
        return f"Fourier truncation of the {solve_resolution}^2 solve's spectrum to |k| < {resolution // 2}"
    return f"Fourier interpolation (zero-padded spectrum) of the {solve_resolution}^2 solve to {resolution}^2"


def check_arguments(
    *,
    samples: int,
    resolution: int,
    solve_resolution: int,
    viscosity: float,
    record_every: float,
    frames: int,
    dt: float | None,
    cfl: float,
    ranks: int,
    forcing: str | Callable = "li",
    initial_resolution: int | None = None,
) -> None:
    """ValueError, one line, for arguments ``generate_ns2d`` cannot run with."""
    if not viscosity > 0:
        raise ValueError(f"viscosity must be > 0, got {viscosity}")
    if samples < 1 or frames < 1 or not record_every > 0:
        raise ValueError(
            f"need samples >= 1, frames >= 1 and record_every > 0, got {samples}, {frames}, {record_every}"
        )
    if solve_resolution < 8 or solve_resolution % 2:
        raise ValueError(f"the solve resolution must be even and >= 8, got {solve_resolution}")
    small, large = sorted((resolution, solve_resolution))
    if resolution < 2 or resolution % 2 or large % small:
        raise ValueError(
            f"the record resolution {resolution} must be even and divide the solve resolution {solve_resolution} "
            "(or be a multiple of it: Fourier interpolation)"
        )
    if initial_resolution is not None and (initial_resolution < 8 or initial_resolution % 2):
        raise ValueError(f"the initial field's resolution must be even and >= 8, got {initial_resolution}")
    for what, n in (("solve", solve_resolution), ("record", resolution), ("initial field's", initial_resolution)):
        if n is None:
            continue
        if n % ranks:
            raise ValueError(
                f"the {what} resolution {n} does not split over {ranks} ranks (each takes n / {ranks} rows)"
            )
    if dt is not None and not dt > 0:
        raise ValueError(f"dt must be > 0, got {dt}")
    if not 0 < cfl <= CFL_LIMIT:
        raise ValueError(f"cfl must be in (0, {CFL_LIMIT}] (ETDRK4's stable CFL numbers here), got {cfl}")
    _forcing(forcing)


def _steps(speed: torch.Tensor, n: int, record_every: float, dt: float | None, cfl: float, t: float) -> list[int]:
    """Steps per trajectory for the record interval starting at time ``t``: from ``dt`` (ValueError when its
    CFL number exceeds the limit) or from ``cfl``."""
    if not bool(torch.isfinite(speed).all()):
        raise FloatingPointError(f"the solution blew up before t = {t:g}: lower cfl or dt")
    if dt is None:
        return [max(1, math.ceil(record_every * float(s) * n / cfl)) for s in speed]
    steps = max(1, math.ceil(record_every / dt - 1e-9))
    worst = float(speed.max()) * n * record_every / steps
    if worst > CFL_LIMIT:
        raise ValueError(
            f"dt {record_every / steps:.3g} is unstable at t = {t:g}: CFL number {worst:.3g} exceeds {CFL_LIMIT} "
            f"(dt * max(|u| + |v|) * n); take dt <= {CFL_LIMIT * record_every / steps / worst:.3g} or leave dt to cfl"
        )
    return [steps] * len(speed)


def generate_ns2d(
    path: str | Path,
    *,
    samples: int = 4,
    resolution: int = 64,
    solve_resolution: int = 256,
    viscosity: float = 1e-3,
    forcing: str | Callable = "li",
    record_every: float = 1.0,
    frames: int = 50,
    initial: bool = False,
    seed: int = 0,
    initial_resolution: int | None = None,
    dt: float | None = None,
    cfl: float = 0.5,
    mesh=None,
    placements: Sequence | None = None,
    batch: int = 8,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str | None = None,
    replace: bool = False,
    progress: bool | None = None,
) -> dict:
    """Write ``samples`` trajectories of Li et al.'s benchmark at ``path``, in PDEBench's scalar layout
    (drift reads it as "PDEBench scalar", 2-D). Call on every rank of the default group (or alone).

    Frames are at ``t = k * record_every``, k = 1..``frames`` (Li's ``u``), or k = 0..``frames`` - 1 with
    ``initial`` (frame 0 the initial field, Li's ``a``), at ``resolution``^2 from a solve at
    ``solve_resolution``^2 (Fourier truncation, or interpolation when finer: ``resampling``), each from an
    initial field drawn at ``initial_resolution``^2 (default the solve's, as Li's generator; a fixed one
    starts every solve resolution from the same field, truncated or zero-padded to it). Time steps:
    ``dt`` fixed (rounded down to divide ``record_every``; ValueError when its CFL number exceeds
    ``CFL_LIMIT`` at the start of an interval), or when None per trajectory and interval from ``cfl``.
    The rows are split over ``mesh`` (default: every rank, ``grid_mesh((ranks, 1))``); ``batch``
    trajectories are solved together, in ``dtype``. The file holds ``tensor`` (samples, frames, x, y)
    float32, ``x-coordinate``, ``y-coordinate`` (the nodes i / n), ``t-coordinate`` (frames + 1 entries
    as PDEBench's), ``steps`` (the steps each trajectory took to each frame) and the run's attributes; each
    rank writes its rows (``TurnWriter``). OutputError when writing fails; returns the attributes."""
    ranks = comm.world_size()
    check_arguments(
        samples=samples,
        resolution=resolution,
        solve_resolution=solve_resolution,
        viscosity=viscosity,
        record_every=record_every,
        frames=frames,
        dt=dt,
        cfl=cfl,
        ranks=ranks,
        forcing=forcing,
        initial_resolution=initial_resolution,
    )
    if mesh is None:
        mesh, placements = grid_mesh((ranks, 1), "cpu" if device is None else torch.device(device).type)
    solver = VorticitySolver(
        solve_resolution, viscosity, forcing=forcing, mesh=mesh, placements=placements, dtype=dtype, device=device
    )
    times = (np.arange(frames + 1) + (0 if initial else 1)) * record_every
    attrs = {
        "equation": "w_t + u . grad w = nu lap w + f, u = (psi_y, -psi_x), -lap psi = w; periodic unit square",
        "viscosity": viscosity,
        "forcing": "0.1 (sin 2 pi (x + y) + cos 2 pi (x + y))" if forcing == "li" else str(forcing),
        "initial condition": f"Li's GaussianRF: alpha {ALPHA}, tau {TAU}, sigma tau^(alpha - 1), mean zero, "
        f"drawn at {initial_resolution or solve_resolution}^2",
        "scheme": SCHEME,
        "time step": f"{record_every} / steps" + (f", dt {dt}" if dt else f", CFL {cfl} at each interval's start"),
        "record every": record_every,
        "solve resolution": solve_resolution,
        "resampling": resampling(resolution, solve_resolution),
        "seed": seed,
    }
    nodes = (np.arange(resolution) / resolution).astype(np.float32)
    writer = TurnWriter.create(
        path,
        {"tensor": ((samples, frames, resolution, resolution), np.float32), "steps": ((samples, frames), np.int32)},
        {"x-coordinate": nodes, "y-coordinate": nodes, "t-coordinate": times.astype(np.float32)},
        attrs,
        replace=replace,
    )
    rows = solver.rows(resolution)
    bar = tqdm(total=samples, desc="solving", unit="trajectory", disable=not bars_shown(progress) or comm.rank() != 0)
    with writer, bar:
        for first in range(0, samples, batch):
            chosen = range(first, min(first + batch, samples))
            drawn = solver.initial(chosen, seed, initial_resolution)
            out, steps = _trajectories(solver, drawn, resolution, record_every, frames, initial, dt, cfl)
            blocks = [("tensor", (slice(first, chosen.stop), slice(None), rows, slice(None)), out)]
            if comm.rank() == 0:
                blocks.append(("steps", (slice(first, chosen.stop), slice(None)), steps))
            writer.write(blocks)
            bar.update(len(chosen))
        writer.commit()
    return attrs


def _trajectories(
    solver: VorticitySolver,
    w: torch.Tensor,
    resolution: int,
    record_every: float,
    frames: int,
    initial: bool,
    dt: float | None,
    cfl: float,
) -> tuple[np.ndarray, np.ndarray]:
    """This rank's rows of the frames of the trajectories from ``w`` (this rank's block of their initial
    spectra) ``(batch, frames, r, resolution)`` and the steps each took to each frame ``(batch, frames)``."""
    out, steps = [], []
    if initial:
        out.append(solver.record(w, resolution))
        steps.append([0] * w.shape[0])
    before = None
    while len(out) < frames:
        t = (len(out) - initial) * record_every
        speed = solver.speed(w)
        if before is not None and bool((speed > BLOWUP * before).any()):
            raise FloatingPointError(f"the solution blew up before t = {t:g}: lower cfl or dt")
        taken, before = _steps(speed, solver.n, record_every, dt, cfl, t), speed
        w = solver.advance(w, record_every, taken)
        out.append(solver.record(w, resolution))
        steps.append(taken)
    if not all(bool(torch.isfinite(frame).all()) for frame in out):  # the last frame (the spectra mix every rank's)
        raise FloatingPointError(f"the solution blew up before t = {t + record_every:g}: lower cfl or dt")
    frames_out = torch.stack(out, 1).to(torch.float32).cpu().numpy()
    return frames_out, np.array(steps, dtype=np.int32).T
