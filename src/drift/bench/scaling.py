"""``drift bench scaling``: strong and weak scaling of one FNO block's forward and backward time.

Strong: a fixed global grid (``--shape``) on P = ``--nproc`` ranks. Weak: a fixed local block
(``--local``) per rank, the global grid growing with P along the first (distributed) dim, as the
paper's Figure 10. For each P and method (drift, dfno, dfno-pruned) a fresh group of ranks times
``--warmup`` + ``--iters`` passes of the block (``drift.bench.blocks``).

JSON (``scaling.json``), besides the common envelope (``drift.bench.output``): ``rows``, one per
(scaling, P, method): ``{scaling: "strong"|"weak", ranks, method, shape (global), completed,
forward: {median, mean, q1, q3, min, max, n} (seconds), backward: same or null, phases_s: {phase: seconds},
collectives: [[kind, bytes]] of one forward, payload_bytes, peak_gb_per_rank}``, or ``{..., completed: false, error}``
when a rank failed (e.g. killed for memory: all cases of that P then fail).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from drift.arguments import positive_int
from drift.arguments import shape as shape_arg
from drift.bench import blocks, output, plots
from drift.nn import METHODS


def shapes(args: argparse.Namespace) -> list[tuple[str, int, tuple[int, ...]]]:
    """(scaling, P, global shape) cases in the order they run."""
    cases = []
    for kind in args.scaling:
        for size in args.nproc:
            if kind == "strong":
                cases.append((kind, size, tuple(args.shape)))
            else:
                cases.append((kind, size, (args.local[0] * size, *args.local[1:])))
    return cases


def run(args: argparse.Namespace) -> int:
    """The ``drift bench scaling`` subcommand."""
    error = blocks.check_cases([(shape, args.modes) for _, _, shape in shapes(args)])
    if error:
        print(f"drift bench scaling: error: {error}")
        return 2
    rows = []
    for size in output.progress(args.nproc, "scaling: rank counts"):
        # One group per P runs every case of that P (starting a group costs seconds).
        mine = [(kind, shape, method) for kind, p, shape in shapes(args) if p == size for method in args.methods]
        cases = [(shape, tuple(args.modes), args.width, method) for _, shape, method in mine]
        results = blocks.run(blocks.block_worker, size, cases, args.warmup, args.iters, not args.forward_only)
        for (kind, shape, method), r in zip(mine, results, strict=True):
            rows.append({"scaling": kind, "ranks": size, "method": method, "shape": shape, **r})
    tables = []
    for kind in args.scaling:
        mine = [r for r in rows if r["scaling"] == kind]
        table, header = blocks.timing_table(mine, ["ranks", "shape"])
        tables.append((f"{kind} scaling, one FNO block (width {args.width}, modes {tuple(args.modes)})", table, header))
        plots.timings(mine, "ranks", "ranks P", f"{kind} scaling", args.out / f"scaling_{kind}.png")
    path = output.finish(args.out, "scaling", output.config_of(args), tables, rows=rows)
    print(f"wrote {path} and plots in {args.out}")
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``drift bench scaling``."""
    parser.add_argument("--scaling", nargs="+", choices=("strong", "weak"), default=["strong", "weak"])
    parser.add_argument("--shape", type=shape_arg, default=(32, 32, 32, 30), help="strong scaling's global grid")
    parser.add_argument("--local", type=shape_arg, default=(16, 16, 16, 30), help="weak scaling's block per rank")
    parser.add_argument("--nproc", type=positive_int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--modes", type=positive_int, nargs="+", default=[8, 8, 8, 16])
    parser.add_argument("--width", type=positive_int, default=20)
    # Fewer than the paper's 5 + 20: the default sizes must finish in minutes on two cores.
    parser.add_argument("--warmup", type=positive_int, default=1)
    parser.add_argument("--iters", type=positive_int, default=5)
    parser.add_argument("--forward-only", action="store_true", help="skip the backward passes")
    parser.add_argument("--out", type=Path, default=Path("results/bench/scaling"))
    parser.set_defaults(run=run)
