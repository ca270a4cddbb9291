"""neuraloperator's blocks with their channel-MLP tails stored (the default) and recomputed (``--recompute
mlp``, ``drift.nn.set_recompute(model, "mlp")``): a training step's time and memory, side by side.

One process, ``--threads`` threads; the two settings alternate step by step on one model
(``FNO.neuralop_defaults``, as ``drift train --model neuralop`` builds it) after a warm-up of each, and the
medians of ``--rounds`` steps are compared. A step is the forward, an MSE loss, the backward and AdamW's
step. Memory: ``drift.memory.LiveBytes``' peak of one step of each (every tensor the step touches,
parameters and Adam's moments included).

    python benchmarks/recompute_mlp.py --shape 128x128 --batch 16 --width 32 --modes 12
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from drift.memory import LiveBytes, empty_cache
from drift.nn import FNO, set_recompute

SETTINGS = (None, "mlp")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="128x128", help="the grid, like 128x128 or 32x32x32")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--modes", type=int, default=12, help="Li et al.'s k, every dim")
    parser.add_argument("--channels", type=int, default=1, help="input and output channels")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    shape = tuple(int(n) for n in args.shape.split("x"))
    torch.manual_seed(0)
    model = FNO.neuralop_defaults(args.channels, args.channels, args.width, (args.modes,) * len(shape))
    x = torch.randn(args.batch, args.channels, *shape)
    target = torch.randn_like(x)
    optimizer = torch.optim.AdamW(model.parameters(), 3e-3)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(model(x), target).backward()
        optimizer.step()

    peaks, times = {}, {s: [] for s in SETTINGS}
    for setting in SETTINGS:
        set_recompute(model, setting)
        step()  # the first step maps the pool's tensors
        empty_cache()
        with LiveBytes() as counted:
            step()
        peaks[setting] = counted.peak
    for _ in range(args.rounds):
        for setting in SETTINGS:
            set_recompute(model, setting)
            start = time.perf_counter()
            step()
            times[setting].append(time.perf_counter() - start)
    stored, recomputed = (statistics.median(times[s]) for s in SETTINGS)
    print(f"neuraloperator's FNO, {args.shape}, batch {args.batch}, width {args.width}, modes {args.modes}, "
          f"{args.threads} threads, medians of {args.rounds} steps each")  # fmt: skip
    print("| blocks' channel MLPs | step | live peak |")
    print("|---|---|---|")
    for setting, seconds in zip(SETTINGS, (stored, recomputed), strict=True):
        name = "recomputed (--recompute mlp)" if setting else "stored"
        print(f"| {name} | {seconds:.3f} s | {peaks[setting] / 1e9:.3f} GB |")
    print(f"recomputed / stored: step {recomputed / stored:.3f}, memory {peaks['mlp'] / peaks[None]:.3f}")


if __name__ == "__main__":
    main()
