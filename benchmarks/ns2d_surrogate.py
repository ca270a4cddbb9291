"""Surrogate against solver on Li et al.'s 2-D Navier-Stokes, and a model at resolutions it never saw.

A model trained at one resolution (``--run``: ``drift train --recipe autoregressive`` on ``drift generate
--problem ns2d`` data) rolls a trajectory out from its first t_in frames, which ``drift generate`` solves at
each of ``--resolutions`` n (solved and recorded at n^2, the reference, with the training data's viscosity,
forcing and record interval, from initial fields the model never saw). For each n, on the same ``--nproc``
ranks, side by side: the solver's time (``drift generate``, the whole command), the surrogate's (``drift
predict``: start-up, reading, the rollout and writing) and the rollout's relative L2 error per predicted
frame against the solve (per trajectory, then averaged): above the training resolution, zero-shot
super-resolution.

    python benchmarks/ns2d_surrogate.py --run runs/ns2d64 --resolutions 64 256 1024 --nproc 4

Prints a markdown table and writes ``<out>/ns2d_surrogate.json``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np

from drift.train import trained_config


def timed(command: list[str]) -> float:
    """Seconds ``drift <command>`` takes, start-up included."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "drift", *command, "--no-progress"], check=True, capture_output=True)
    return time.perf_counter() - start


def errors(predicted: Path, solved: Path, t_in: int) -> np.ndarray:
    """Relative L2 error of each predicted frame, per trajectory, averaged over the trajectories."""
    with h5py.File(predicted, "r") as p, h5py.File(solved, "r") as s:
        pred = p["tensor"][:, t_in:].astype(np.float64)
        true = s["tensor"][:, t_in : t_in + pred.shape[1]].astype(np.float64)
    axes = (2, 3)
    return (np.linalg.norm(pred - true, axis=axes) / np.linalg.norm(true, axis=axes)).mean(axis=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", required=True, help="a trained run folder")
    parser.add_argument("--resolutions", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument("--samples", type=int, default=1, help="trajectories solved and predicted per resolution")
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1000, help="the solves' initial fields (not the training's)")
    parser.add_argument("--out", default="results/ns2d_surrogate")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    config = trained_config(args.run)
    data = config.data if isinstance(config.data, str) else config.data[0]
    with h5py.File(data, "r") as f:
        viscosity, every = float(f.attrs["viscosity"]), float(f.attrs["record every"])
    frames = config.t_in + config.t_out
    rows = []
    for n in args.resolutions:
        solved, predicted = out / f"solve_{n}.h5", out / f"predict_{n}.h5"
        solve = ["generate", "--problem", "ns2d", "--samples", str(args.samples), "--frames", str(frames),
                 "--resolution", str(n), "--solve-resolution", str(n), "--viscosity", str(viscosity),
                 "--record-every", str(every), "--seed", str(args.seed), "--nproc", str(args.nproc),
                 "--out", str(solved), "--force"]  # fmt: skip
        predict = ["predict", args.run, "--data", str(solved), "--out", str(predicted), "--nproc", str(args.nproc),
                   "--force"]  # fmt: skip
        solver_s, surrogate_s = timed(solve), timed(predict)
        error = errors(predicted, solved, config.t_in)
        rows.append(dict(resolution=n, solver_s=solver_s, surrogate_s=surrogate_s, speedup=solver_s / surrogate_s,
                         rel_l2_mean=float(error.mean()), rel_l2_last=float(error[-1]),
                         rel_l2_per_frame=error.tolist()))  # fmt: skip
        print(f"{n}^2: solver {solver_s:.1f} s, surrogate {surrogate_s:.1f} s, error {error.mean():.4f}", flush=True)
    print(f"\n{config.t_out} frames predicted from {config.t_in}, {args.samples} trajectory(ies), {args.nproc} ranks\n")
    print("| resolution | solver (drift generate) | surrogate (drift predict) | speedup | rel. L2, mean | last frame |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['resolution']}^2 | {r['solver_s']:.1f} s | {r['surrogate_s']:.1f} s | {r['speedup']:.1f}x | "
              f"{r['rel_l2_mean']:.4f} | {r['rel_l2_last']:.4f} |")  # fmt: skip
    (out / "ns2d_surrogate.json").write_text(json.dumps(dict(run=args.run, nproc=args.nproc, rows=rows), indent=1))


if __name__ == "__main__":
    main()
