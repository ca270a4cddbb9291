"""``drift bench capacity``: the largest grid whose FNO forward, or training step, fits a memory cap.

Grids: 3D+time ``n x n x n/2 x 30`` (the paper's 128 x 128 x 64 x 30 family; width 20, 4 blocks,
modes (8, 8, 8, 16)) and, with ``--dims 2``, ``n x n`` (the seed's FNO-forward capacity experiment,
modes (8, 8)); n a multiple of ``--step``. For each method, P and pass (``forward``: one forward
without autograd; ``train``: forward, MSE loss, backward and an Adam step) a bisection over n runs
each trial in fresh ranks (slab grid) whose summed resident memory is polled and capped at
``--memory-gb`` (the ranks are killed above it); a trial fits when it completes and the sum of the
ranks' peak private memory stays under the cap. Private: resident and not file-backed (the peak
resident set less the mapped files, ``runner.peak_private_gb``), so that torch's libraries, mapped by
every rank, are not counted P times; torch's own start-up data (0.15 GB a rank here) is counted.
The search assumes that a grid fits when a larger one does. ``--recompute`` trains with the blocks
recomputed in the backward pass (``drift.nn.set_recompute``), ``--activations bfloat16`` keeps the
streaming forward's fields between blocks in bfloat16. Beside every row: the grid points per GB of the
summed peak, and per rank the forward's floor (input, output, one activation, the parameters and the
start-up) and ``drift.cost.fno_memory``'s estimate, against the measured peak.

JSON (``capacity.json``), besides the common envelope (``drift.bench.output``): ``memory_gb`` (the
cap), ``rows``, one per (dims, method, ranks, pass): ``{dims, method, ranks, pass, largest_n (null when
even the smallest grid failed), largest_shape, peak_gb_per_rank, seconds (of the largest fitting
trial's pass), points_per_gb, floor_gb_per_rank, estimate_gb_per_rank, trials: [{n, shape, fits,
peak_gb_total, peak_gb_per_rank, seconds, error}]}``, and ``recompute``, ``activations``; memory is
private memory in GB as above.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path
from typing import Any

import torch

from drift.arguments import positive_float, positive_int
from drift.bench import output, plots
from drift.bench.blocks import FIELDS, as_model_input, distribute, random_input
from drift.bench.runner import available_gb, peak_private_gb, peak_rss_gb
from drift.cost import Pass, fno_memory
from drift.jobs.launch import RankError, run_ranks
from drift.nn import ACTIVATION_DTYPES, FNO, METHODS

TIME_STEPS = 30  # the paper's time extent (t_out = 16 kept of 30)


def grid_shape(dims: int, n: int) -> tuple[int, ...]:
    """The global grid for extent ``n``: ``n x n x n/2 x 30`` (dims 4) or ``n x n`` (dims 2)."""
    return (n, n, n // 2, TIME_STEPS) if dims == 4 else (n, n)


def default_modes(dims: int) -> tuple[int, ...]:
    """The paper's modes (8, 8, 8, 16) for 3D+time, (8, 8) in 2-D."""
    return (8, 8, 8, 16) if dims == 4 else (8, 8)


def _trial_worker(
    shape: tuple[int, ...], modes: tuple, width: int, method: str, train: bool, recompute: bool, activations: str
) -> dict[str, Any]:
    torch.manual_seed(0)
    fields = ACTIVATION_DTYPES[activations]
    model = FNO(FIELDS, FIELDS, width, modes, method=method, recompute=recompute, activations=fields)
    layout = distribute(model, shape)
    x = as_model_input(random_input(layout, FIELDS), layout)
    start = time.perf_counter()
    if train:
        # Two steps: a training loop's later steps hold more than its first (the pool's and the
        # allocator's pages kept from step to step, drift.cost.memory's slack).
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        for _ in range(2):
            y = model(x)
            (y.to_local() if layout.mesh is not None else y).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad()
            del y
    else:
        with torch.no_grad():
            model(x)
    return {"seconds": time.perf_counter() - start, "peak_gb": peak_private_gb(), "peak_rss_gb": peak_rss_gb()}


def trial(
    dims: int,
    n: int,
    width: int,
    method: str,
    size: int,
    train: bool,
    cap_gb: float,
    timeout_s: float,
    recompute: bool = False,
    activations: str = "float32",
) -> dict:
    """One grid in fresh ranks under the memory cap: ``{n, shape, fits, peak_gb_total, seconds, error}``."""
    shape = grid_shape(dims, n)
    row: dict[str, Any] = {"n": n, "shape": shape, "fits": False, "peak_gb_total": None, "seconds": None}
    try:
        ranks = run_ranks(
            size,
            _trial_worker,
            shape,
            default_modes(dims),
            width,
            method,
            train,
            recompute,
            activations,
            timeout_s=timeout_s,
            memory_cap_gb=cap_gb,
        )
    except RankError as exc:
        return {**row, "error": str(exc)[-200:]}
    peaks = [r["peak_gb"] for r in ranks]
    row.update(peak_gb_total=sum(peaks), peak_gb_per_rank=peaks, seconds=max(r["seconds"] for r in ranks))
    row["fits"] = sum(peaks) <= cap_gb
    row["error"] = None if row["fits"] else f"peak {sum(peaks):.2f} GB over the cap"
    return row


def bisect(fits, lo: int, hi: int) -> tuple[int | None, list]:
    """The largest m in [lo, hi] with ``fits(m)`` true (None if not even lo), assuming monotonicity;
    ``fits`` returns (bool, record); also every record in the order tried."""
    records, best = [], None
    while lo <= hi:
        mid = (lo + hi) // 2
        ok, record = fits(mid)
        records.append(record)
        if ok:
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    return best, records


def search(dims: int, method: str, size: int, train: bool, args: argparse.Namespace) -> dict[str, Any]:
    """Bisection over n = step * m for one (dims, method, P, pass)."""
    modes = default_modes(dims)
    # The smallest n: every kept frequency exists (2k per leading dim, n/2 for the third of 4) and
    # every rank has a block.
    least = max(2 * k * (2 if dims == 4 and i == 2 else 1) for i, k in enumerate(modes[:-1]))
    step, max_n = (args.step, args.max_n) if dims == 4 else (args.step_2d, args.max_n_2d)
    lo = max(1, -(-max(least, size) // step))

    def fits(m: int) -> tuple[bool, dict]:
        r = trial(
            dims,
            m * step,
            args.width,
            method,
            size,
            train,
            args.memory_gb,
            args.trial_timeout,
            args.recompute,
            args.activations,
        )
        return r["fits"], r

    best, records = bisect(fits, lo, max_n // step)
    largest = next((r for r in records if best is not None and r["n"] == best * step), None)
    memory = {"points_per_gb": None, "floor_gb_per_rank": None, "estimate_gb_per_rank": None}
    if largest:
        shape = tuple(largest["shape"])
        passed = Pass.FORWARD if not train else Pass.RECOMPUTE_STEP if args.recompute else Pass.STEP
        estimate = fno_memory(
            shape,
            (size,) + (1,) * (dims - 1),
            in_channels=FIELDS,
            out_channels=FIELDS,
            width=args.width,
            modes=modes,
            method=method,
            pass_=passed,
            activation_bytes=2 if args.activations == "bfloat16" else None,
        )
        memory = {
            "points_per_gb": math.prod(shape) / sum(largest["peak_gb_per_rank"]),
            "floor_gb_per_rank": estimate.floor / 1e9,
            "estimate_gb_per_rank": estimate.total / 1e9,
        }
    return {
        "dims": dims,
        "method": method,
        "ranks": size,
        "pass": "train" if train else "forward",
        "largest_n": largest["n"] if largest else None,
        "largest_shape": largest["shape"] if largest else None,
        "peak_gb_per_rank": largest["peak_gb_per_rank"] if largest else None,
        "seconds": largest["seconds"] if largest else None,
        **memory,
        "recompute": args.recompute,
        "activations": args.activations,
        "trials": records,
    }


def run(args: argparse.Namespace) -> int:
    """The ``drift bench capacity`` subcommand."""
    if args.memory_gb > available_gb():
        print(f"note: the cap {args.memory_gb:.1f} GB exceeds the memory available now ({available_gb():.1f} GB)")
    cases = [
        (dims, method, size, passname == "train")
        for dims in args.dims
        for method in args.methods
        for size in args.nproc
        for passname in (args.passes if dims == 4 else ["forward"])
    ]
    rows = [search(*case, args) for case in output.progress(cases, "capacity searches")]
    table = [
        [
            f"{r['dims']}D",
            r["method"],
            r["ranks"],
            r["pass"],
            "x".join(map(str, r["largest_shape"])) if r["largest_shape"] else "none",
            max(r["peak_gb_per_rank"]) if r["peak_gb_per_rank"] else None,
            sum(r["peak_gb_per_rank"]) if r["peak_gb_per_rank"] else None,
            r["points_per_gb"],
            r["floor_gb_per_rank"],
            r["estimate_gb_per_rank"],
            r["seconds"],
            len(r["trials"]),
        ]
        for r in rows
    ]
    header = [
        "grid",
        "method",
        "P",
        "pass",
        "largest grid",
        "peak GB/rank",
        "peak GB total",
        "points/GB",
        "floor GB/rank",
        "estimate GB/rank",
        "pass s",
        "trials",
    ]
    title = (
        f"largest grid under a {args.memory_gb:g} GB cap (all ranks together), n a multiple of {args.step} "
        f"(3D+time) or {args.step_2d} (2-D)"
    )
    plots.capacity(rows, args.out / "capacity.png")
    path = output.finish(
        args.out, "capacity", output.config_of(args), [(title, table, header)], memory_gb=args.memory_gb, rows=rows
    )
    print(f"wrote {path} and the plot in {args.out}")
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``drift bench capacity``."""
    parser.add_argument("--memory-gb", type=positive_float, default=4.0, help="cap on all ranks' memory")
    parser.add_argument("--dims", type=int, nargs="+", choices=(2, 4), default=[4, 2], help="3D+time (4) and 2-D")
    parser.add_argument("--nproc", type=positive_int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=["drift", "dfno"])
    parser.add_argument("--passes", nargs="+", choices=("forward", "train"), default=["forward", "train"])
    parser.add_argument("--width", type=positive_int, default=20)
    parser.add_argument("--step", type=positive_int, default=16, help="3D+time: n is a multiple of this")
    parser.add_argument("--max-n", type=positive_int, default=128, help="3D+time: the largest n tried")
    parser.add_argument("--step-2d", type=positive_int, default=512, help="2-D: n is a multiple of this")
    parser.add_argument("--max-n-2d", type=positive_int, default=8192, help="2-D: the largest n tried")
    parser.add_argument("--recompute", action="store_true", help="train with the blocks recomputed in the backward")
    parser.add_argument(
        "--activations", choices=tuple(ACTIVATION_DTYPES), default="float32", help="the streaming forward's fields"
    )
    parser.add_argument("--trial-timeout", type=positive_float, default=600.0, help="seconds per trial")
    parser.add_argument("--out", type=Path, default=Path("results/bench/capacity"))
    parser.set_defaults(run=run)
