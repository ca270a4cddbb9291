"""A solver of the 3D compressible Navier-Stokes equations on the periodic unit cube (PDEBench's setting).

Conservative finite volumes on an n^3 grid of cells: conserved variables (rho, rho u, rho v, rho w, E),
ideal gas with gamma = 5/3. Convective fluxes: MUSCL reconstruction of the primitive variables
(minmod limiter) and the Rusanov (local Lax-Friedrichs) Riemann solver. Viscous fluxes: the Newtonian
stress ``eta (grad v + grad v^T) + (zeta - 2 eta / 3) (div v) I`` and its work, by central differences
at the faces. Time: the two-stage strong-stability-preserving Runge-Kutta scheme with a CFL step. Every
update is a difference of face fluxes, so mass, momentum and energy are conserved to round-off.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from tqdm import tqdm

from drift._plan import chunk_bound
from drift.data.pdebench import write_pdebench3d
from drift.jobs.console import bars_shown

GAMMA = 5.0 / 3.0
# Cells per chunk of trajectories that `generate` advances together. On the CPU the solver is bound by its
# elementwise work, not by Python: larger chunks fall out of cache and run slower per trajectory, while 4
# trajectories at 16^3 still let two threads share each operation (measured: docs/benchmarks/data.md). On a GPU
# every operation is a kernel launch whatever its size, so a chunk holds the default set's 256 trajectories
# at 16^3 (its states and temporaries, a few GB).
CHUNK_CELLS = {"cpu": 4 * 16**3}
OTHER_DEVICES_CHUNK_CELLS = 256 * 16**3

# Every state is ``(..., 5, n, n, n)``: any leading batch dims, then the field, then x, y, z.
FIELD, SPACE = -4, (-3, -2, -1)


def primitives(u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Density ``(..., n, n, n)``, velocity ``(..., 3, n, n, n)`` and pressure from the conserved
    ``(..., 5, n, n, n)``."""
    rho = u.select(FIELD, 0)
    vel = u.narrow(FIELD, 1, 3) / rho.unsqueeze(FIELD)
    p = (GAMMA - 1) * (u.select(FIELD, 4) - 0.5 * rho * (vel * vel).sum(FIELD))
    return rho, vel, p


def conserved(rho: torch.Tensor, vel: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """The conserved ``(..., 5, n, n, n)`` from density, velocity ``(..., 3, n, n, n)`` and pressure."""
    energy = p / (GAMMA - 1) + 0.5 * rho * (vel * vel).sum(FIELD)
    return torch.cat([rho.unsqueeze(FIELD), rho.unsqueeze(FIELD) * vel, energy.unsqueeze(FIELD)], FIELD)


def _minmod(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.where(a * b > 0, torch.sign(a) * torch.minimum(a.abs(), b.abs()), torch.zeros_like(a))


def _euler_flux(w: torch.Tensor, axis: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Flux along ``axis`` of primitive states ``w = (rho, u, v, w, p)`` and their conserved form."""
    rho, vel, p = w.select(FIELD, 0), w.narrow(FIELD, 1, 3), w.select(FIELD, 4)
    u = conserved(rho, vel, p)
    vn = vel.select(FIELD, axis)
    flux = u * vn.unsqueeze(FIELD)
    flux.select(FIELD, 1 + axis).add_(p)
    flux.select(FIELD, 4).add_(p * vn)
    return flux, u


def _convective_divergence(u: torch.Tensor, dx: float) -> tuple[torch.Tensor, torch.Tensor]:
    """-div F of the Euler fluxes, and each state's largest signal speed ``(...)`` (for its time step)."""
    rho, vel, p = primitives(u)
    w = torch.cat([rho.unsqueeze(FIELD), vel, p.unsqueeze(FIELD)], FIELD)
    total = torch.zeros_like(u)
    speed = torch.zeros(u.shape[:FIELD], dtype=u.dtype, device=u.device)
    for axis, dim in enumerate(SPACE):
        slope = _minmod(w - w.roll(1, dim), w.roll(-1, dim) - w)
        left = w + 0.5 * slope  # state on the low side of face i+1/2
        right = (w - 0.5 * slope).roll(-1, dim)  # state on the high side of face i+1/2
        f_left, u_left = _euler_flux(left, axis)
        f_right, u_right = _euler_flux(right, axis)
        c_left = torch.sqrt(GAMMA * left.select(FIELD, 4) / left.select(FIELD, 0))
        c_right = torch.sqrt(GAMMA * right.select(FIELD, 4) / right.select(FIELD, 0))
        a = torch.maximum(left.select(FIELD, 1 + axis).abs() + c_left, right.select(FIELD, 1 + axis).abs() + c_right)
        face = 0.5 * (f_left + f_right) - 0.5 * a.unsqueeze(FIELD) * (u_right - u_left)
        total -= (face - face.roll(1, dim)) / dx
        speed = torch.maximum(speed, a.amax(SPACE))
    return total, speed


def _viscous_divergence(u: torch.Tensor, dx: float, eta: float, zeta: float) -> torch.Tensor:
    """div of the viscous momentum and energy fluxes, with face gradients by central differences."""
    if eta == 0 and zeta == 0:
        return torch.zeros_like(u)
    _, vel, _ = primitives(u)
    total = torch.zeros_like(u)
    for axis, dim in enumerate(SPACE):
        # Velocity gradient at faces i+1/2 along axis: the normal derivative directly, the others averaged.
        grad = []  # grad[j]: d v / d x_j, (..., 3, n, n, n)
        for j, dj in enumerate(SPACE):
            if j == axis:
                grad.append((vel.roll(-1, dim) - vel) / dx)
            else:
                central = (vel.roll(-1, dj) - vel.roll(1, dj)) / (2 * dx)
                grad.append(0.5 * (central + central.roll(-1, dim)))
        div = grad[0].select(FIELD, 0) + grad[1].select(FIELD, 1) + grad[2].select(FIELD, 2)
        transposed = torch.stack([g.select(FIELD, axis) for g in grad], FIELD)  # d v_axis / d x_j
        stress = eta * (grad[axis] + transposed)
        stress.select(FIELD, axis).add_((zeta - 2 * eta / 3) * div)
        v_face = 0.5 * (vel + vel.roll(-1, dim))
        work = (stress * v_face).sum(FIELD)
        face = torch.cat([torch.zeros_like(div).unsqueeze(FIELD), stress, work.unsqueeze(FIELD)], FIELD)
        total += (face - face.roll(1, dim)) / dx
    return total


def step(
    u: torch.Tensor,
    dx: float,
    eta: float,
    zeta: float,
    cfl: float = 0.3,
    dt_max: float | torch.Tensor = math.inf,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One SSP-RK2 step of each state in ``u`` ``(..., 5, n, n, n)``, of its own size min(CFL limit,
    viscous limit, ``dt_max``) (a float, or one per state); returns (new states, dt ``(...)``).
    A state with ``dt_max`` 0 is returned unchanged."""
    rhs, speed = _convective_divergence(u, dx)
    dt = cfl * dx / speed
    nu = max(eta, zeta)
    if nu > 0:
        rho_min = u.select(FIELD, 0).amin(SPACE)
        dt = torch.minimum(dt, 0.15 * dx * dx / (nu / rho_min))
    dt = torch.minimum(dt, torch.as_tensor(dt_max, dtype=u.dtype, device=u.device))
    h = dt[(...,) + (None,) * 4]
    stage = u + h * (rhs + _viscous_divergence(u, dx, eta, zeta))
    rhs2, _ = _convective_divergence(stage, dx)
    return 0.5 * (u + stage + h * (rhs2 + _viscous_divergence(stage, dx, eta, zeta))), dt


def random_field(n: int, generator: torch.Generator, k_max: int = 4, dtype=torch.float64) -> torch.Tensor:
    """A smooth periodic random field of zero mean and unit maximum: random Fourier modes up to ``k_max``."""
    x = (torch.arange(n, dtype=dtype) + 0.5) / n
    field = torch.zeros((n, n, n), dtype=dtype)
    for _ in range(8):
        k = torch.randint(-k_max, k_max + 1, (3,), generator=generator).to(dtype)
        amplitude, phase = torch.rand(2, generator=generator, dtype=dtype)
        arg = 2 * math.pi * (k[0] * x[:, None, None] + k[1] * x[None, :, None] + k[2] * x[None, None, :])
        field += amplitude * torch.sin(arg + 2 * math.pi * phase)
    field -= field.mean()
    return field / field.abs().max().clamp(min=1e-12)


def random_initial_state(n: int, mach: float, generator: torch.Generator, dtype=torch.float64) -> torch.Tensor:
    """PDEBench-style random initial data ``(5, n, n, n)``: density and pressure fluctuating around 1,
    velocities of magnitude up to ``mach`` times the mean sound speed."""
    rho = 1 + 0.5 * random_field(n, generator, dtype=dtype).abs()
    p = 1 + 0.5 * random_field(n, generator, dtype=dtype).abs()
    c0 = math.sqrt(GAMMA)
    vel = torch.stack([random_field(n, generator, dtype=dtype) for _ in range(3)]) * mach * c0
    return conserved(rho, vel, p)


def simulate(u0: torch.Tensor, frames: int, t_end: float, eta: float, zeta: float, cfl: float = 0.3) -> torch.Tensor:
    """States at ``frames`` equally spaced times from 0 to ``t_end``: ``(..., frames, 5, n, n, n)`` from
    the initial states ``u0`` ``(..., 5, n, n, n)``. Each state takes its own steps, capped at the next
    frame time, so a batch of states follows the same steps as each one alone."""
    dx = 1.0 / u0.shape[-1]
    out = [u0]
    u = u0
    t = torch.zeros(u0.shape[:FIELD], dtype=u0.dtype, device=u0.device)
    for k in range(1, frames):
        target = t_end * k / (frames - 1)
        while bool((running := t < target - 1e-14).any()):
            # A state that reached the frame time steps by 0, which leaves it unchanged.
            u, dt = step(u, dx, eta, zeta, cfl, dt_max=torch.where(running, target - t, 0.0))
            t = t + dt
        out.append(u)
    return torch.stack(out, FIELD - 1)


def generate(
    path: str | Path,
    *,
    samples: int = 4,
    resolution: int = 32,
    frames: int = 21,
    t_end: float = 1.0,
    mach: float = 1.0,
    eta: float = 1e-8,
    zeta: float = 1e-8,
    seed: int = 0,
    progress: bool | None = None,
    device: torch.device | str = "cpu",
) -> None:
    """Write ``samples`` trajectories from random initial data in PDEBench's 3D layout at ``path``; a
    progress bar on stderr if ``progress``, or when None on a terminal (``drift.jobs.console.bars_shown``).

    The initial data are drawn on the CPU, so a seed gives the same data on any ``device`` the solver runs
    on, to round-off (a GPU's fused multiply-adds round differently)."""
    if samples < 1 or resolution < 4 or frames < 2 or t_end <= 0:
        raise ValueError("need samples >= 1, resolution >= 4, frames >= 2 and t_end > 0")
    device = torch.device(device)
    g = torch.Generator().manual_seed(seed)
    shape = (samples, frames, resolution, resolution, resolution)
    fields = {name: torch.empty(shape, dtype=torch.float32) for name in ("density", "pressure", "Vx", "Vy", "Vz")}
    chunk = max(1, chunk_bound(CHUNK_CELLS, OTHER_DEVICES_CHUNK_CELLS, device) // resolution**3)
    with tqdm(total=samples, desc="simulating", unit="sample", disable=not bars_shown(progress)) as bar:
        for first in range(0, samples, chunk):
            count = min(chunk, samples - first)
            # Drawn one trajectory after another, as the data of a seed always were.
            u0 = torch.stack([random_initial_state(resolution, mach, g) for _ in range(count)]).to(device)
            rho, vel, p = (t.cpu() for t in primitives(simulate(u0, frames, t_end, eta, zeta)))
            batch = slice(first, first + count)
            fields["density"][batch], fields["pressure"][batch] = rho, p
            fields["Vx"][batch], fields["Vy"][batch], fields["Vz"][batch] = vel.unbind(FIELD)
            bar.update(count)
    attrs = {"M": mach, "eta": eta, "zeta": zeta, "gamma": GAMMA}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    write_pdebench3d(path, {k: v.numpy() for k, v in fields.items()}, t_end=t_end, attrs=attrs)
