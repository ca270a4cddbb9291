"""drift's reduce-scatter on CPU ranks against Gloo's own reduce-scatter, side by side.

drift (``drift.comm.reduce_scatter`` on CPU tensors) sends each share to its owner in one all-to-all, and
the owner sums the P pieces; Gloo's own collective moves the same bytes. Each variant runs on P local
ranks (``drift.jobs.launch``), one thread each, interleaved in an order alternated every repeat; a time is
the slowest rank's between barriers. Prints medians and the ratio, checks the two results agree, and
writes JSON. The default payload is one FNO block's spectrum at the paper's modes, 20 x 16^4 complex64.

    python benchmarks/reduce_scatter.py [--ranks 2 4] [--mb 10.49] [--repeats 9] [--json results/reduce_scatter.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from drift import comm
from drift.bench.runner import machine, timed
from drift.jobs.launch import run_ranks


def _worker(numel: int, repeats: int) -> dict:
    import torch.distributed as dist

    torch.set_num_threads(1)
    size = dist.get_world_size()
    x = torch.randn(numel // size * size, generator=torch.Generator().manual_seed(dist.get_rank()))
    gloo = torch.empty(x.numel() // size)
    native = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor  # renamed in torch 2.13
    variants = {"drift": lambda: comm.reduce_scatter(x), "gloo": lambda: native(gloo, x)}
    times: dict[str, list[float]] = {name: [] for name in variants}
    for repeat in range(repeats + 1):  # the first round warms up
        order = list(variants) if repeat % 2 == 0 else list(reversed(variants))
        for name in order:
            seconds = timed(variants[name])
            if repeat:
                times[name].append(seconds)
    difference = float((comm.reduce_scatter(x) - gloo).abs().max() / gloo.abs().max())
    return {"times": times, "relative_difference": difference}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--mb", type=float, default=20 * 16**4 * 8 / 1e6)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--json", type=Path, default=Path("results/reduce_scatter.json"))
    args = parser.parse_args()
    numel = int(args.mb * 1e6 / 4)
    rows = []
    print(f"reduce-scatter of {numel * 4 / 1e6:.2f} MB (float32) per rank, medians of {args.repeats} interleaved")
    for size in args.ranks:
        result = run_ranks(size, _worker, numel, args.repeats, threads=1, timeout_s=600.0)[0]
        drift_s, gloo_s = (statistics.median(result["times"][name]) for name in ("drift", "gloo"))
        rows.append(dict(ranks=size, drift_s=drift_s, gloo_s=gloo_s, **result))
        print(
            f"P = {size}: drift {drift_s * 1e3:6.1f} ms, Gloo reduce_scatter {gloo_s * 1e3:6.1f} ms, "
            f"Gloo / drift {gloo_s / drift_s:.2f}x (max relative difference {result['relative_difference']:.1e})"
        )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"machine": machine(), "mb": args.mb, "rows": rows}, indent=2))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
