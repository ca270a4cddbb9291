"""The compressible Navier-Stokes solver behind `drift generate`: conservation, accuracy, viscosity."""

import math
import subprocess
import sys

import h5py
import pytest
import torch
from harness import device_for

from drift.data import Trajectories, generate, navier_stokes
from drift.data.navier_stokes import conserved, primitives, random_initial_state, simulate, step


def _layered(n, rho, vel_x, p=1.0):
    """A state on a 2 x 2 x n grid that varies along the last dim only (z)."""
    z = (torch.arange(n, dtype=torch.float64) + 0.5) / n
    shape = (2, 2, n)
    vel = torch.zeros(3, *shape, dtype=torch.float64)
    vel[0] = vel_x(z).expand(shape)
    return conserved(rho(z).expand(shape).clone(), vel, torch.full(shape, p, dtype=torch.float64)), z


def test_mass_momentum_and_energy_are_conserved():
    u0 = random_initial_state(8, 1.0, torch.Generator().manual_seed(3))
    states = simulate(u0, 4, 0.3, eta=1e-3, zeta=2e-3)
    totals = states.sum((2, 3, 4))
    scale = totals[0].abs().clamp(min=float(totals[0, 0]))
    assert float(((totals - totals[0]).abs() / scale).max()) < 1e-12
    rho, _, p = primitives(states[-1])
    assert float(rho.min()) > 0 and float(p.min()) > 0


def test_advected_density_wave_converges_at_second_order():
    def error(n, t=0.25):
        u0, z = _layered(n, lambda z: 1 + 0.2 * torch.sin(2 * math.pi * z), lambda z: 0 * z + 1.0)
        # velocity along x does not move a wave along z: advect along z instead
        u0[1], u0[3] = u0[3], u0[1].clone()
        rho = simulate(u0, 2, t, 0.0, 0.0)[-1][0, 0, 0]
        return float((rho - (1 + 0.2 * torch.sin(2 * math.pi * (z - t)))).abs().mean())

    e16, e32, e64 = error(16), error(32), error(64)
    assert e16 / e32 > 2 and e32 / e64 > 3, (e16, e32, e64)


def test_shear_wave_decays_at_the_viscous_rate():
    """The extra decay that viscosity adds to a shear wave is exp(-eta k^2 t) (the scheme's own numerical
    dissipation, present without viscosity too, divides out)."""
    eta, t, amplitude = 0.01, 0.5, 0.01
    u0, z = _layered(32, lambda z: 0 * z + 1.0, lambda z: amplitude * torch.sin(2 * math.pi * z))

    def mode(viscosity):
        _, vel, _ = primitives(simulate(u0, 2, t, viscosity, 0.0)[-1])
        return float((vel[0, 0, 0] * torch.sin(2 * math.pi * z)).sum() * 2 / 32)

    viscous, inviscid = mode(eta), mode(0.0)
    assert 0.95 < inviscid / amplitude < 1
    expected = math.exp(-eta * (2 * math.pi) ** 2 * t)
    assert abs(viscous / inviscid / expected - 1) < 0.01, (viscous / inviscid, expected)


def test_a_batch_of_trajectories_follows_each_ones_own_steps():
    g = torch.Generator().manual_seed(5)
    u0 = torch.stack([random_initial_state(8, 1.0, g) for _ in range(3)])
    batched = simulate(u0, 4, 0.3, eta=1e-3, zeta=2e-3)
    alone = torch.stack([simulate(u, 4, 0.3, eta=1e-3, zeta=2e-3) for u in u0])
    assert batched.shape == (3, 4, 5, 8, 8, 8)
    assert float((batched - alone).abs().max() / alone.abs().max()) < 1e-13


def test_a_state_whose_step_is_capped_at_zero_is_unchanged():
    u = torch.stack([random_initial_state(8, 1.0, torch.Generator().manual_seed(s)) for s in (1, 2)])
    new, dt = step(u, 1 / 8, 1e-3, 2e-3, dt_max=torch.tensor([0.0, math.inf], dtype=torch.float64))
    alone, dt_alone = step(u[1], 1 / 8, 1e-3, 2e-3)
    assert torch.equal(new[0], u[0]) and float(dt[0]) == 0
    assert float((new[1] - alone).abs().max() / alone.abs().max()) < 1e-14 and float(dt[1]) == float(dt_alone) > 0


def test_generated_trajectories_are_those_simulated_one_at_a_time(tmp_path, monkeypatch):
    """Chunks of 2 trajectories (one chunk boundary among 3) on the CPU, or on the test device: the file
    holds, for the seed, the states of initial data drawn one trajectory after another, each simulated
    alone on the CPU."""
    monkeypatch.setitem(navier_stokes.CHUNK_CELLS, "cpu", 2 * 8**3)
    path = tmp_path / "cfd.hdf5"
    generate(path, samples=3, resolution=8, frames=3, t_end=0.2, seed=4, progress=False, device=device_for())
    g = torch.Generator().manual_seed(4)
    for b in range(3):
        rho, vel, p = primitives(simulate(random_initial_state(8, 1.0, g), 3, 0.2, 1e-8, 1e-8))
        with h5py.File(path) as f:
            for name, expected in zip(("density", "pressure", "Vx", "Vy", "Vz"), (rho, p, *vel.unbind(1)), strict=True):
                torch.testing.assert_close(torch.from_numpy(f[name][b]), expected.float(), rtol=2e-7, atol=0)


def test_generated_files_read_as_pdebench(tmp_path):
    path = tmp_path / "gen" / "cfd.hdf5"
    generate(path, samples=2, resolution=8, frames=4, t_end=0.2, seed=1, progress=False)
    with h5py.File(path) as f:
        assert f["density"].shape == (2, 4, 8, 8, 8) and f["t-coordinate"].shape == (5,)
        # Frame k was simulated at k * t_end / (frames - 1); PDEBench adds one step after the last.
        assert f["t-coordinate"][:].tolist() == pytest.approx([0.0, 0.2 / 3, 0.4 / 3, 0.2, 0.8 / 3], rel=1e-6)
        assert f.attrs["M"] == 1.0 and math.isclose(f.attrs["gamma"], 5 / 3)
    train = Trajectories(path, t_in=1, t_out=3)
    x, y = train[0]
    assert x.shape == (5, 1, 8, 8, 8) and y.shape == (5, 3, 8, 8, 8) and bool(torch.isfinite(y).all())


def test_cli_rejects_bad_values_in_one_line():
    done = subprocess.run(
        [sys.executable, "-m", "drift", "generate", "--resolution", "zero"], capture_output=True, text=True
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].endswith("argument --resolution: 'zero' is not a int")
    assert "Traceback" not in done.stderr


def test_cli_refuses_a_device_it_cannot_run_on(monkeypatch, tmp_path, capsys):
    from drift.cli import main

    out = tmp_path / "cfd.hdf5"
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert main(["generate", "--device", "cuda", "--out", str(out)]) == 2
    assert capsys.readouterr().err.strip() == "drift generate: error: --device cuda: no CUDA device is available"
    with pytest.raises(SystemExit) as info:
        main(["generate", "--device", "gpu", "--out", str(out)])
    assert info.value.code == 2 and "argument --device: invalid choice: 'gpu'" in capsys.readouterr().err
    for option in (["--resolution", "3"], ["--frames", "1"]):  # within argparse's types, not the solver's
        assert main(["generate", *option, "--out", str(out)]) == 2
        message = capsys.readouterr().err.strip()
        assert message == "drift generate: error: need samples >= 1, resolution >= 4, frames >= 2 and t_end > 0"
    assert not out.exists()
