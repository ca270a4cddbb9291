"""The data generator's solver: seconds per trajectory when a chunk of trajectories steps together.

Simulates the same ``--samples`` random initial states (``drift train``'s defaults: 16^3, 21 frames,
t_end 1) one chunk after another for each chunk size, the sizes interleaved over ``--rounds``; prints
the median wall and CPU seconds per trajectory and writes JSON. ``generate`` uses chunks of
``CHUNK_CELLS // resolution**3`` trajectories on the CPU (``OTHER_DEVICES_CHUNK_CELLS`` elsewhere).

    python benchmarks/generator.py [--resolution 16] [--samples 8] [--chunks 1 4 8] [--rounds 2] [--device cuda]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from drift.data.navier_stokes import CHUNK_CELLS, OTHER_DEVICES_CHUNK_CELLS, random_initial_state, simulate
from drift.profiling import synchronize_device


def _per_trajectory(states: torch.Tensor, chunk: int, frames: int) -> tuple[float, float]:
    synchronize_device()
    wall, cpu = time.perf_counter(), time.process_time()
    for first in range(0, len(states), chunk):
        simulate(states[first : first + chunk], frames, 1.0, 1e-8, 1e-8)
    synchronize_device()
    return (time.perf_counter() - wall) / len(states), (time.process_time() - cpu) / len(states)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--resolution", type=int, default=16)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--frames", type=int, default=21)
    parser.add_argument("--chunks", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json")
    args = parser.parse_args()
    g = torch.Generator().manual_seed(0)
    states = torch.stack([random_initial_state(args.resolution, 1.0, g) for _ in range(args.samples)]).to(args.device)
    times: dict[int, list[tuple[float, float]]] = {c: [] for c in args.chunks}
    for _ in range(args.rounds):
        for chunk in args.chunks:
            times[chunk].append(_per_trajectory(states, chunk, args.frames))
    default = max(1, CHUNK_CELLS.get(states.device.type, OTHER_DEVICES_CHUNK_CELLS) // args.resolution**3)
    print(
        f"{args.resolution}^3, {args.frames} frames, {args.samples} trajectories on {states.device}, "
        f"{torch.get_num_threads()} threads"
    )
    rows = []
    for chunk, runs in times.items():
        wall, cpu = statistics.median(t[0] for t in runs), statistics.median(t[1] for t in runs)
        rows.append(dict(chunk=chunk, wall_s=wall, cpu_s=cpu))
        mark = "  (generate's chunk)" if chunk == default else ""
        print(f"chunk {chunk:3d}: {wall:.3f} s wall, {cpu:.3f} s CPU per trajectory{mark}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(args=vars(args), threads=torch.get_num_threads(), rows=rows), f, indent=2)


if __name__ == "__main__":
    main()
