"""Two ``drift generate --problem ns2d`` files recorded at one resolution from solves at two others (the same
initial fields: ``--initial-resolution``), compared frame by frame: how much the solve's grid changes the
recorded data.

    drift generate --problem ns2d --samples 4 --frames 50 --resolution 64 --solve-resolution 128 \
        --initial-resolution 256 --nproc 2 --out cmp_128.h5
    drift generate --problem ns2d --samples 4 --frames 50 --resolution 64 --solve-resolution 256 \
        --initial-resolution 256 --nproc 2 --out cmp_256.h5
    python benchmarks/ns2d_solve_resolution.py cmp_128.h5 cmp_256.h5

Prints the relative L2 difference per frame (per trajectory, then averaged), its mean and maximum, and the
time steps each solve took.
"""

from __future__ import annotations

import argparse

import h5py
import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("coarse", help="the file from the coarser solve")
    parser.add_argument("fine", help="the file from the finer solve (the reference)")
    args = parser.parse_args()
    with h5py.File(args.coarse, "r") as a, h5py.File(args.fine, "r") as b:
        coarse, fine = a["tensor"][()].astype(np.float64), b["tensor"][()].astype(np.float64)
        steps = a["steps"][()].sum(1), b["steps"][()].sum(1)
    error = np.linalg.norm(coarse - fine, axis=(2, 3)) / np.linalg.norm(fine, axis=(2, 3))  # (trajectory, frame)
    print(f"relative L2 per frame: mean {error.mean():.2e}, max {error.max():.2e}")
    print("mean per frame:", " ".join(f"{e:.1e}" for e in error.mean(0)))
    print(f"time steps per trajectory: {args.coarse} {steps[0].tolist()}, {args.fine} {steps[1].tolist()}")


if __name__ == "__main__":
    main()
