"""``drift bench modes``: sensitivity of one FNO block's forward time to k_max (the paper's Figure 11).

For each k in ``--k`` every dim keeps k modes (Li et al.'s convention: 2k frequencies on the leading
dims, k on the last real dim, capped at what the dim has), on a fixed global grid, for each P and
method. DFNO's time should not depend on k (it transforms and moves the whole field); drift's grows
with k through the partial DFTs and the collective payload.

JSON (``modes.json``), besides the common envelope (``drift.bench.output``): ``rows``, one per
(k, P, method): ``{k, modes, ranks, method, shape, completed, forward: {median, mean, q1, q3, min, max, n}
(seconds), backward: null, phases_s, collectives, payload_bytes, peak_gb_per_rank}`` or
``{..., completed: false, error}``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from drift.arguments import positive_int
from drift.arguments import shape as shape_arg
from drift.bench import blocks, output, plots

METHODS = ("drift", "dfno")


def modes_for(k: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    """k modes per dim, capped at N // 2 on the leading dims and N // 2 + 1 on the last (real) dim."""
    return tuple(min(k, n // 2) for n in shape[:-1]) + (min(k, shape[-1] // 2 + 1),)


def run(args: argparse.Namespace) -> int:
    """The ``drift bench modes`` subcommand."""
    shape = tuple(args.shape)
    mine = [(k, modes_for(k, shape), method) for k in args.k for method in args.methods]
    error = blocks.check_cases([(shape, modes) for _, modes, _ in mine])
    if error:
        print(f"drift bench modes: error: {error}")
        return 2
    rows = []
    for size in output.progress(args.nproc, "modes: rank counts"):
        cases = [(shape, modes, args.width, method) for _, modes, method in mine]
        results = blocks.run(blocks.block_worker, size, cases, args.warmup, args.iters, False)
        for (k, modes, method), r in zip(mine, results, strict=True):
            rows.append({"k": k, "modes": modes, "ranks": size, "method": method, "shape": shape, **r})
    rows.sort(key=lambda r: (r["ranks"], r["k"]))
    table, header = blocks.timing_table(rows, ["ranks", "k"])
    keep = [i for i, h in enumerate(header) if h not in ("backward ms", "bwd / drift")]
    table, header = [[row[i] for i in keep] for row in table], [header[i] for i in keep]
    title = f"k_max sensitivity, one FNO block forward, {'x'.join(map(str, shape))}, width {args.width}"
    for size in args.nproc:
        plots.timings(
            [r for r in rows if r["ranks"] == size], "k", "k_max", f"P={size}", args.out / f"modes_P{size}.png"
        )
    path = output.finish(args.out, "modes", output.config_of(args), [(title, table, header)], rows=rows)
    print(f"wrote {path} and plots in {args.out}")
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``drift bench modes``."""
    parser.add_argument("--k", type=positive_int, nargs="+", default=[4, 8, 12, 16], help="k_max values")
    parser.add_argument("--shape", type=shape_arg, default=(32, 32, 32, 30), help="global grid")
    parser.add_argument("--nproc", type=positive_int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--methods", nargs="+", choices=("drift", "dfno", "dfno-pruned"), default=list(METHODS))
    parser.add_argument("--width", type=positive_int, default=20)
    parser.add_argument("--warmup", type=positive_int, default=2)
    parser.add_argument("--iters", type=positive_int, default=10)
    parser.add_argument("--out", type=Path, default=Path("results/bench/modes"))
    parser.set_defaults(run=run)
