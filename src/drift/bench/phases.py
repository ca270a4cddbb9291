"""``drift bench phases``: where one FNO forward's time goes, per method and P (the paper's Figure 9).

The whole FNO (lift, ``--layers`` blocks, projection; width, modes as the paper) on a fixed global
grid; phases as in ``drift.bench.blocks``: transform (partial DFTs or FFTs), collectives, spectral
multiply, pointwise + GeLU, lift + projection, other. Printed as a table (ms per forward) and drawn
as a heat map (colour: share of the forward).

JSON (``phases.json``), besides the common envelope (``drift.bench.output``): ``phases``: the phase
names in column order; ``rows``, one per (P, method): ``{ranks, method, shape, completed, forward:
{median, mean, q1, q3, min, max, n} (seconds), backward: null, phases_s: {phase: seconds per forward},
collectives: [[kind, bytes]], payload_bytes}`` or ``{..., completed: false, error}``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from drift.arguments import positive_int
from drift.arguments import shape as shape_arg
from drift.bench import blocks, output, plots
from drift.nn import METHODS

PHASES = ("transform", "collectives", "multiply", "pointwise+gelu", "lift+projection", "other")


def run(args: argparse.Namespace) -> int:
    """The ``drift bench phases`` subcommand."""
    shape, modes = tuple(args.shape), tuple(args.modes)
    error = blocks.check_cases([(shape, modes)])
    if error:
        print(f"drift bench phases: error: {error}")
        return 2
    rows = []
    for size in output.progress(args.nproc, "phases: rank counts"):
        cases = [(shape, modes, args.width, method) for method in args.methods]
        results = blocks.run(blocks.fno_worker, size, cases, args.warmup, args.iters)
        for method, r in zip(args.methods, results, strict=True):
            rows.append({"ranks": size, "method": method, "shape": shape, **r})
    done = [r for r in rows if r["completed"]]
    table = [
        [r["ranks"], r["method"], r["forward"]["median"] * 1e3, *(r["phases_s"].get(p, 0.0) * 1e3 for p in PHASES)]
        for r in done
    ]
    header = ["P", "method", "forward ms", *(f"{p} ms" for p in PHASES)]
    title = f"phases of one FNO forward ({len(modes)}D, {'x'.join(map(str, shape))}, width {args.width}, modes {modes})"
    for r in rows:
        if not r["completed"]:
            print(f"P={r['ranks']} {r['method']}: failed: {r['error']}")
    if done:
        labels = [f"{r['method']} P={r['ranks']}" for r in done]
        plots.heatmap(labels, PHASES, [row[3:] for row in table], args.out / "phases.png")
    path = output.finish(args.out, "phases", output.config_of(args), [(title, table, header)], phases=PHASES, rows=rows)
    print(f"wrote {path} and the heat map in {args.out}")
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``drift bench phases``."""
    parser.add_argument("--shape", type=shape_arg, default=(32, 32, 32, 30), help="global grid")
    parser.add_argument("--nproc", type=positive_int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--modes", type=positive_int, nargs="+", default=[8, 8, 8, 16])
    parser.add_argument("--width", type=positive_int, default=20)
    parser.add_argument("--warmup", type=positive_int, default=1)
    parser.add_argument("--iters", type=positive_int, default=5)
    parser.add_argument("--out", type=Path, default=Path("results/bench/phases"))
    parser.set_defaults(run=run)
