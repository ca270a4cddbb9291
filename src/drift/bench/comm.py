"""``drift bench comm``: collective times on this machine, an alpha-beta fit, and a cluster projection.

1. Sweep: for each rank count P and each collective of ``drift.comm`` (all-reduce, reduce-scatter,
   all-gather, all-to-all) and message size n (bytes of the whole vector: the all-reduce input, the
   reduce-scatter input, the all-gather output, the all-to-all input), the time of one call: ``iters``
   rounds, each one batch of back-to-back calls after a barrier per (collective, size), in a fresh
   order each round; per-call time of each batch; the mean over batches (what a sequence of calls
   costs; on an oversubscribed host the median jumps between the modes of a call that finishes within
   a time slice and one that waits one out), then the slowest rank.
2. Fit (``drift.cost.Fit``): ``t = alpha L(P) + beta W(P, n) + gamma L(P) [n / P > S]`` with the
   ring-algorithm terms of ``drift.cost.terms`` (the bandwidth-optimal schedules Gloo and NCCL use for
   large messages), least squares in relative error, coefficients >= 0. The threshold S is one per
   machine: the power of two (or none) with the least error over every fit (``choose_threshold``). Each
   collective is fitted per P (on an oversubscribed CPU host, P ranks on fewer cores are a different
   "network" for each P) and once over all P. Reported: the largest and median relative error of the
   model over the measured points, how many it predicts within 25%, and the same for the plain alpha-beta
   model (no S).
3. Table I of the paper: the collectives of one FNO forward (drift and dfno) on ``--fno-shape`` with
   ``comm_log``: per kind, calls, payload bytes, measured seconds and the model's seconds (``model_for``).
4. Projection: the forward time of one FNO block for drift and dfno on a cluster given by alpha,
   beta and a compute rate (``--cluster``; ``paper``: ``drift.cost.PAPER``, derived from the paper's
   measured times), for P up to 1024. drift's reduce-scatter and all-gather run over the reduction mesh
   (``drift.reduction_mesh``) the model finds fastest (``drift.cost.drift_reduction``); the unfactorised
   one (one level per split dim, drift without ``reduction=``) is reported beside it. A model, not a
   measurement.

JSON (``comm.json``), besides the common envelope (``drift.bench.output``):
``sweep``: rows ``{kind, ranks, bytes, seconds: {mean, median, q1, q3, min, max, n}}`` (slowest rank,
over batches); ``threshold_bytes``: S or null; ``fits_per_ranks``: ``{kind: {"P": {alpha_s,
beta_s_per_byte, gamma_s, threshold_bytes, max_rel_error, median_rel_error, within_25_percent,
points}}}``; ``fits``: ``{kind: {...}}`` (one fit over all P); ``without_threshold``:
``{within_25_percent, points, max_rel_error}`` of the per-P plain alpha-beta fits; ``fno``: rows
``{method, ranks, shape, kind, calls, bytes, measured_s, last_arrival_s, model_s}`` per forward; ``cluster``:
``{name, alpha_s, beta_s_per_byte, flops_per_s, source}``; ``projection``: rows ``{ranks, grid,
reduction, drift: {compute_s, comm_s, unfactorised_comm_s, total_s}, dfno: {compute_s, comm_s, total_s}, ratio}``.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from drift import comm as collectives
from drift import cost
from drift._moved import moved_names
from drift.arguments import positive_int
from drift.arguments import shape as shape_arg
from drift.bench import output, plots
from drift.bench.blocks import FIELDS, as_model_input, distribute, random_input
from drift.bench.runner import barrier, bench_device, rank_zero, spread
from drift.jobs.launch import rank_device, run_ranks
from drift.modes import mode_lists
from drift.nn import FNO, METHODS
from drift.profiling import synchronize_device
from drift.truncated import transform_flops

KINDS = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all")
BATCH_TARGET_S = 0.01  # each timed batch of back-to-back calls lasts about this long

# The model of the collectives moved to drift.cost, with the rest of drift's cost model.
__getattr__ = moved_names(
    __name__,
    {
        "drift.cost": (
            "Fit",
            "best_reduction",
            "drift_reduction",
            "factorisations",
            "fit_alpha_beta",
            "non_negative_lstsq",
            "reduction_seconds",
            "terms",
        ),
    },
)


def choose_threshold(rows: Sequence[dict]) -> int | None:
    """The threshold S of this machine, or None: the choice with the least Bayesian information criterion
    over the per-P fits of every collective. Candidates: every measured step message but the largest
    (S splits the messages there); each costs one gamma per fit and S itself, so a threshold is kept only
    when it explains the times much better than the plain alpha-beta model."""
    points = _points(rows)
    count = sum(len(pts) for pts in points.values())
    messages = sorted({n // p for pts in points.values() for p, n, _ in pts})

    def criterion(threshold: int | None) -> float:
        squared = 0.0
        for (kind, _), pts in points.items():
            squared += sum(e * e for e in rel_errors(cost.fit_alpha_beta(kind, pts, threshold), kind, pts))
        parameters = 2 * len(points) + (0 if threshold is None else len(points) + 1)
        return count * math.log(max(squared, 1e-300) / count) + parameters * math.log(count)

    return min([None, *messages[:-1]], key=criterion)


def _points(rows: Sequence[dict]) -> dict[tuple[str, int], list[tuple[int, float, float]]]:
    """The sweep's ``(ranks, bytes, mean seconds)`` points per collective and P."""
    points = {}
    for r in rows:
        points.setdefault((r["kind"], r["ranks"]), []).append((r["ranks"], r["bytes"], r["seconds"]["mean"]))
    return points


def rel_errors(fit: cost.Fit, kind: str, points: Sequence[tuple[int, float, float]]) -> list[float]:
    """|model - measured| / measured at each point."""
    return [abs(fit.predict(kind, p, n) - s) / s for p, n, s in points]


def held_out_errors(kind: str, points: Sequence[tuple[int, float, float]], threshold_bytes: int | None) -> list[float]:
    """Each point's relative error under the model fitted to the other points: how well the model
    predicts a size it was not fitted to (none below 4 points: the rest would not test the fit)."""
    if len(points) < 4:
        return []
    rest = [[q for j, q in enumerate(points) if j != i] for i in range(len(points))]
    fits = [cost.fit_alpha_beta(kind, r, threshold_bytes) for r in rest]
    return [rel_errors(fit, kind, [p])[0] for p, fit in zip(points, fits, strict=True)]


def _accuracy(fit: cost.Fit, kind: str, points: Sequence[tuple[int, float, float]]) -> dict:
    errors = rel_errors(fit, kind, points)
    held_out = held_out_errors(kind, points, fit.threshold_bytes)
    return {
        **asdict(fit),
        "max_rel_error": max(errors),
        "median_rel_error": statistics.median(errors),
        "within_25_percent": sum(e <= 0.25 for e in errors),
        "held_out_within_25_percent": sum(e <= 0.25 for e in held_out),
        "held_out_points": len(held_out),
        "points": len(points),
    }


def _per_rank(nbytes: int, size: int) -> int:
    """float32 elements per rank of an ``nbytes`` vector (at least one: the vector is rounded to them)."""
    return max(1, nbytes // (4 * size))


def _operands(kind: str, nbytes: int, size: int) -> tuple:
    """The call and its input for an ``nbytes`` float32 vector (rounded to a multiple of ``size``)."""
    per_rank = _per_rank(nbytes, size)
    on = dict(device=rank_device())
    if kind == "all_reduce":
        return collectives.all_reduce, torch.ones(per_rank * size, **on)
    if kind == "reduce_scatter":
        return collectives.reduce_scatter, torch.ones(size, per_rank, **on)
    if kind == "all_gather":
        return collectives.all_gather, torch.ones(1, per_rank, **on)
    counts = [per_rank] * size
    out = torch.empty(per_rank * size, **on)

    def exchange(x: torch.Tensor) -> torch.Tensor:
        return collectives.all_to_all(x, counts, counts, out=out)

    return exchange, torch.ones(per_rank * size, **on)


def _sweep_worker(kinds: Sequence[str], sizes: Sequence[int], warmup: int, iters: int) -> dict:
    size, rank = collectives.world_size(), collectives.rank()
    cases = [(k, n) for k in kinds for n in sizes]
    operands = [_operands(kind, nbytes, size) for kind, nbytes in cases]
    batches = []
    for call, x in output.progress(operands, f"comm P={size} warm-up", disable=not rank_zero()):
        start = time.perf_counter()
        for _ in range(warmup):
            call(x)
        synchronize_device()
        # Batches long enough that timer and barrier costs vanish next to them: one decision for all
        # ranks (rank 0's), so that every rank runs the same number of calls.
        each = (time.perf_counter() - start) / max(warmup, 1)
        batch = torch.tensor([max(1, min(200, round(BATCH_TARGET_S / max(each, 1e-6))))], device=rank_device())
        batches.append(int(collectives.broadcast(batch, src=0)) if size > 1 else int(batch))
    # Rounds of one batch per case, in a fresh order each round (the same on every rank): a slow spell
    # of a shared machine then lands on cases at random, not on neighbouring sizes of one collective.
    rng = np.random.default_rng(0)
    samples = [[] for _ in cases]
    for _ in output.progress(range(iters), f"comm P={size} rounds", disable=not rank_zero()):
        for index in rng.permutation(len(cases)):
            (call, x), batch = operands[index], batches[index]
            barrier()
            start = time.perf_counter()
            for _ in range(batch):
                call(x)
            synchronize_device()
            samples[index].append((time.perf_counter() - start) / batch)
    return {"rank": rank, "samples": dict(zip(cases, samples, strict=True))}


def sweep(nproc: Sequence[int], kinds: Sequence[str], sizes: Sequence[int], warmup: int, iters: int) -> list[dict]:
    """Measured seconds per call for each P > 1, collective and size: rows as in the module docstring."""
    rows = []
    for size in nproc:
        ranks = run_ranks(size, _sweep_worker, kinds, sizes, warmup, iters, device=bench_device(), timeout_s=900.0)
        for kind in kinds:
            for nbytes in sizes:
                # The slowest rank's: a collective is done when its last rank is.
                worst = max((r["samples"][(kind, nbytes)] for r in ranks), key=statistics.fmean)
                actual = _per_rank(nbytes, size) * 4 * size
                rows.append({"kind": kind, "ranks": size, "bytes": actual, "seconds": spread(worst)})
    return rows


def fits_from_sweep(rows: Sequence[dict]) -> dict:
    """The model of this machine from the sweep's mean seconds: the threshold S (``choose_threshold``),
    then per collective the fit per P (keyed by ``str(P)``, as in the JSON) and the fit over all P, and
    the per-P fits' accuracy without S."""
    threshold = choose_threshold(rows)
    points = _points(rows)
    per_ranks, overall, plain, plain_held_out = {}, {}, [], []
    for kind in sorted({k for k, _ in points}):
        mine = {size: pts for (k, size), pts in points.items() if k == kind}
        per_ranks[kind] = {
            str(size): _accuracy(cost.fit_alpha_beta(kind, pts, threshold), kind, pts) for size, pts in mine.items()
        }
        every = [pt for pts in mine.values() for pt in pts]
        overall[kind] = _accuracy(cost.fit_alpha_beta(kind, every, threshold), kind, every)
        for pts in mine.values():
            plain += rel_errors(cost.fit_alpha_beta(kind, pts), kind, pts)
            plain_held_out += held_out_errors(kind, pts, None)
    without = {
        "within_25_percent": sum(e <= 0.25 for e in plain),
        "held_out_within_25_percent": sum(e <= 0.25 for e in plain_held_out),
        "held_out_points": len(plain_held_out),
        "points": len(plain),
        "max_rel_error": max(plain),
    }
    return {"threshold_bytes": threshold, "fits": overall, "fits_per_ranks": per_ranks, "without_threshold": without}


def model_for(model: dict, kind: str, size: int) -> cost.Fit | None:
    """The fitted ``Fit`` of ``kind`` at ``size`` ranks: the per-P fit where the sweep measured that P,
    else the fit over all P; None when the sweep did not measure ``kind``."""
    if kind not in model["fits"]:
        return None
    fields = model["fits_per_ranks"][kind].get(str(size), model["fits"][kind])
    return cost.Fit(fields["alpha_s"], fields["beta_s_per_byte"], fields["gamma_s"], fields["threshold_bytes"])


def _fno_worker(shape: tuple, modes: tuple, width: int, methods: Sequence[str], warmup: int, iters: int) -> list:
    every = []
    for method in methods:
        torch.manual_seed(0)
        model = FNO(FIELDS, FIELDS, width, modes, method=method, device=rank_device())
        layout = distribute(model, shape)
        x = as_model_input(random_input(layout, FIELDS), layout)
        per_forward = []
        with torch.no_grad():
            for i in range(warmup + iters):
                barrier()
                with collectives.comm_log() as log:
                    model(x)
                if i >= warmup:
                    per_forward.append(log.calls)
        # Every forward issues the same calls; seconds are the median over forwards, call by call.
        calls = per_forward[0]
        seconds = [statistics.median(f[j].seconds for f in per_forward) for j in range(len(calls))]
        every.append([(c.kind, c.bytes, c.group_size, s) for c, s in zip(calls, seconds, strict=True)])
    return every


def fno_collectives(
    shape: tuple, modes: tuple, width: int, methods: Sequence[str], size: int, warmup: int, iters: int, model: dict
) -> list[dict]:
    """The paper's Table I: per method and collective kind, one FNO forward's calls, payload bytes,
    measured seconds (the slowest rank's, which include waiting for the others to arrive, and the sum over
    calls of the last rank to arrive's) and the fitted model's seconds (``model_for``)."""
    ranks = run_ranks(
        size, _fno_worker, shape, modes, width, list(methods), warmup, iters, device=bench_device(), timeout_s=900.0
    )
    rows = []
    for index, method in enumerate(methods):
        for kind in sorted({c[0] for c in ranks[0][index]}):
            mine = [[c for c in r[index] if c[0] == kind] for r in ranks]
            fit, modelled = model_for(model, kind, size), None
            if fit is not None:
                # all-gather's payload is its input; the model's n is the gathered vector.
                modelled = sum(fit.predict(kind, g, b * g if kind == "all_gather" else b) for _, b, g, _ in mine[0])
            rows.append(
                {
                    "method": method,
                    "ranks": size,
                    "shape": shape,
                    "kind": kind,
                    "calls": len(mine[0]),
                    "bytes": sum(c[1] for c in mine[0]),
                    "measured_s": max(sum(c[3] for c in r) for r in mine),
                    # Each call's last rank to arrive waits for no one: its time is the transfer alone.
                    "last_arrival_s": sum(min(r[j][3] for r in mine) for j in range(len(mine[0]))),
                    "model_s": modelled,
                }
            )
    return rows


@dataclass(frozen=True)
class Cluster:
    """A machine for the projection: alpha (s per latency step), beta (s per byte), compute rate (FLOP/s)."""

    name: str
    alpha_s: float
    beta_s_per_byte: float
    flops_per_s: float
    source: str = ""


# The paper's platform (drift.cost.PAPER, which derives its numbers) for the projection.
PAPER = Cluster(
    "paper",
    alpha_s=cost.PAPER.alpha_s,
    beta_s_per_byte=cost.PAPER.beta_s_per_byte,
    flops_per_s=cost.PAPER.matmul_flops_per_s,
    source="derived from the DRIFT paper's measured DRIFT times, section VI-E (see drift.cost.PAPER)",
)


def parse_cluster(text: str) -> Cluster:
    """``paper`` or ``alpha,beta,flops`` (seconds, seconds per byte, FLOP/s)."""
    if text == "paper":
        return PAPER
    try:
        alpha, beta, flops = (float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--cluster must be 'paper' or alpha,beta,flops, got {text!r}") from None
    if min(alpha, beta) < 0 or flops <= 0:
        raise argparse.ArgumentTypeError(f"--cluster needs alpha, beta >= 0 and flops > 0, got {text!r}")
    return Cluster("custom", alpha, beta, flops, "command line")


def projection_grid(shape: Sequence[int], kept: Sequence[int], size: int) -> tuple[int, ...]:
    """The grid for P ranks: split the leading dims in turn (powers of two), keeping each local extent
    at least half the dim's kept modes (the paper's switch to a pencil at P = 32), last dim whole."""
    grid = [1] * len(shape)
    left = size
    for dim in range(len(shape) - 1):
        while left > 1 and shape[dim] // (grid[dim] * 2) >= max(1, kept[dim] // 2):
            grid[dim] *= 2
            left //= 2
    if left > 1:
        raise ValueError(f"{size} ranks cannot split {tuple(shape)} with at least k modes per block")
    return tuple(grid)


def project_block(cluster: Cluster, shape: Sequence[int], modes: Sequence[int], width: int, size: int) -> dict:
    """Modelled forward seconds of one FNO block (batch 1, float32, real 3D+time field) for drift and dfno.

    Both: spectral multiply (8 in out M / P FLOP) and pointwise linear (2 width^2 local points).
    drift: forward and inverse partial DFTs (``drift.truncated.transform_flops``, per channel) plus
    the reduce-scatter and the all-gather of the ``width x M`` complex64 spectrum (padded as its shares
    are) on the fastest reduction mesh (``drift.cost.drift_reduction``; ``unfactorised_comm_s``: one level per split
    dim). dfno: forward and inverse real FFTs (2.5 V log2 V FLOP per channel, V the global points, split
    over P), plus per split dim one all-to-all each way of the local half spectrum (complex64) in that
    dim's group of ranks.
    """
    grid = projection_grid(shape, [2 * k for k in modes], size)
    local = [math.ceil(n / p) for n, p in zip(shape, grid, strict=True)]
    lists = mode_lists(tuple(modes), tuple(shape), True)
    kept = [len(m) for m in lists]
    m = math.prod(kept)
    shared_flops = 8 * width * width * m / size + 2 * width * width * math.prod(local)
    model = cost.Fit(cluster.alpha_s, cluster.beta_s_per_byte)
    drift_flops = shared_flops + width * sum(transform_flops(local, lists, shape, True))
    split, row = [p for p in grid if p > 1], width * (m // kept[0]) * 8
    reduction, drift_comm = cost.drift_reduction(model, split, kept[0], row)
    volume = math.prod(shape)
    half = math.prod(shape[:-1]) * (shape[-1] // 2 + 1)
    dfno_flops = shared_flops + 2 * width * 2.5 * volume * math.log2(volume) / size
    dfno_comm = sum(2 * model.predict("all_to_all", p, width * half * 8 / size) for p in grid if p > 1)
    out = {"ranks": size, "grid": grid, "reduction": reduction}
    for name, flops, seconds in (("drift", drift_flops, drift_comm), ("dfno", dfno_flops, dfno_comm)):
        compute = flops / cluster.flops_per_s
        out[name] = {"compute_s": compute, "comm_s": seconds, "total_s": compute + seconds}
    out["drift"]["unfactorised_comm_s"] = cost.drift_reduction(model, split, kept[0], row, factorise=False)[1]
    out["ratio"] = out["dfno"]["total_s"] / out["drift"]["total_s"]
    return out


def run(args: argparse.Namespace) -> int:
    """The ``drift bench comm`` subcommand."""
    config = {k: v for k, v in vars(args).items() if k != "run"}
    sizes = [int(kib) * 1024 for kib in args.sizes_kib]
    multi = [p for p in args.nproc if p > 1]
    print(f"collective sweep: P = {multi}, {len(sizes)} sizes, {args.warmup} warm-up + {args.iters} batches")
    rows = sweep(multi, args.kinds, sizes, args.warmup, args.iters) if multi else []
    model = fits_from_sweep(rows) if rows else None
    fit_rows, fit_header = _fit_table(model) if model else ([], [])
    if model:
        print(output.table(fit_rows, fit_header))
        print(_summary(model))
    fno = []
    if args.fno_ranks > 1 and model:
        fno = fno_collectives(
            tuple(args.fno_shape), tuple(args.modes), args.width, args.methods, args.fno_ranks, 1, args.fno_iters, model
        )
        fno_rows = [
            [
                r["method"],
                r["kind"],
                r["calls"],
                r["bytes"] / 1e6,
                r["measured_s"] * 1e3,
                r["last_arrival_s"] * 1e3,
                _ms(r["model_s"]),
            ]
            for r in fno
        ]
        fno_header = ["method", "collective", "calls", "MB", "slowest rank ms", "last to arrive ms", "model ms"]
        print(f"collectives of one FNO forward, {'x'.join(map(str, args.fno_shape))}, P = {args.fno_ranks}")
        print(output.table(fno_rows, fno_header))
    cluster = args.cluster
    projection = [project_block(cluster, args.project_shape, args.modes, args.width, p) for p in args.project_ranks]
    proj_rows = [
        [
            r["ranks"],
            "x".join(map(str, r["grid"])),
            "x".join(map(str, r["reduction"])) or "-",
            r["drift"]["total_s"] * 1e3,
            r["drift"]["comm_s"] * 1e3,
            r["drift"]["unfactorised_comm_s"] * 1e3,
            r["dfno"]["total_s"] * 1e3,
            r["dfno"]["comm_s"] * 1e3,
            r["ratio"],
        ]
        for r in projection
    ]
    proj_header = [
        "P",
        "grid",
        "reduction",
        "drift ms",
        "drift comm ms",
        "unfactorised comm ms",
        "dfno ms",
        "dfno comm ms",
        "dfno/drift",
    ]
    print(f"PROJECTION (model, not measured) of one block's forward on cluster {cluster.name!r}")
    print(output.table(proj_rows, proj_header))
    path = output.write_json(
        args.out,
        "comm.json",
        "comm",
        config,
        sweep=rows,
        **(model or {"threshold_bytes": None, "fits": {}, "fits_per_ranks": {}, "without_threshold": None}),
        fno=fno,
        cluster=asdict(cluster),
        projection=projection,
    )
    md = [output.markdown(proj_rows, proj_header)]
    if fno:
        md.insert(0, output.markdown(fno_rows, fno_header))
    if model:
        md[:0] = [output.markdown(fit_rows, fit_header), _summary(model), output.markdown(*_points_table(rows, model))]
    (args.out / "comm.md").write_text("\n\n".join(md) + "\n")
    if model:
        plots.comm(rows, lambda kind, size: model_for(model, kind, size), args.out / "comm_fit.png")
    plots.projection(projection, cluster.name, args.out / "projection.png")
    print(f"wrote {path} and plots in {args.out}")
    return 0


def _fit_table(model: dict) -> tuple[list[list], list[str]]:
    """One row per collective and P: the fitted coefficients and how well they predict the sweep."""
    table = []
    for kind, per in model["fits_per_ranks"].items():
        for size, f in per.items():
            table.append(
                [
                    kind,
                    size,
                    f["alpha_s"] * 1e6,
                    _gbps(f["beta_s_per_byte"]),
                    f["gamma_s"] * 1e6,
                    f["max_rel_error"],
                    f["median_rel_error"],
                    f"{f['within_25_percent']}/{f['points']}",
                    f"{f['held_out_within_25_percent']}/{f['held_out_points']}",
                ]
            )
    header = [
        "collective",
        "P",
        "alpha us",
        "1/beta GB/s",
        "gamma us",
        "max rel err",
        "median rel err",
        "within 25%",
        "held out within 25%",
    ]
    return table, header


def _summary(model: dict) -> str:
    """One line: the threshold; the per-P fits' points within 25%, fitted and held out, with and without
    it; the one fit over P."""
    per = [f for fits in model["fits_per_ranks"].values() for f in fits.values()]
    inside, points = sum(f["within_25_percent"] for f in per), sum(f["points"] for f in per)
    held, held_points = sum(f["held_out_within_25_percent"] for f in per), sum(f["held_out_points"] for f in per)
    s = model["threshold_bytes"]
    w = model["without_threshold"]
    one = max(f["max_rel_error"] for f in model["fits"].values())
    return (
        f"threshold S = {'none' if s is None else f'{s // 1024} KiB'}: {inside}/{points} points within 25%, "
        f"{held}/{held_points} held out (each size predicted by a fit without it); alpha-beta alone: "
        f"{w['within_25_percent']}/{w['points']}, {w['held_out_within_25_percent']}/{w['held_out_points']} held "
        f"out, max rel err {w['max_rel_error']:.2f}; one fit over every P: max rel err {one:.2f}"
    )


def _points_table(rows: Sequence[dict], model: dict) -> tuple[list[list], list[str]]:
    """Every measured point against its per-P model: kind, P, KiB, mean, median and model us, error."""
    table = []
    for r in rows:
        modelled = model_for(model, r["kind"], r["ranks"]).predict(r["kind"], r["ranks"], r["bytes"])
        mean = r["seconds"]["mean"]
        table.append(
            [
                r["kind"],
                r["ranks"],
                r["bytes"] // 1024,
                mean * 1e6,
                r["seconds"]["median"] * 1e6,
                modelled * 1e6,
                modelled / mean - 1,
            ]
        )
    return table, ["collective", "P", "KiB", "mean us", "median us", "model us", "model / mean - 1"]


def _gbps(beta: float) -> float | None:
    return 1e-9 / beta if beta > 0 else None


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``drift bench comm``."""
    parser.add_argument("--nproc", type=positive_int, nargs="+", default=[2, 4], help="rank counts to sweep")
    parser.add_argument(
        "--sizes-kib",
        type=positive_int,
        nargs="+",
        default=[64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384],
        help="message sizes in KiB (the whole vector); above 32 MiB on CPU each call's fresh output is "
        "mapped and page-faulted anew (glibc's mmap threshold), a regime the alpha-beta model does not describe",
    )
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS))
    parser.add_argument("--warmup", type=positive_int, default=3)
    parser.add_argument("--iters", type=positive_int, default=40, help="rounds: timed batches per point")
    parser.add_argument("--fno-shape", type=shape_arg, default=(32, 32, 32, 30), help="grid of the FNO table")
    parser.add_argument("--fno-ranks", type=positive_int, default=4, help="ranks of the FNO table (1: skip it)")
    parser.add_argument("--fno-iters", type=positive_int, default=3)
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=["drift", "dfno"])
    parser.add_argument("--modes", type=positive_int, nargs="+", default=[8, 8, 8, 16])
    parser.add_argument("--width", type=positive_int, default=20)
    parser.add_argument(
        "--cluster", type=parse_cluster, default=PAPER, help="'paper' or alpha_s,beta_s_per_byte,flops_per_s"
    )
    parser.add_argument("--project-shape", type=shape_arg, default=(128, 128, 128, 30))
    parser.add_argument(
        "--project-ranks", type=positive_int, nargs="+", default=[4, 8, 16, 32, 64, 128, 256, 512, 1024]
    )
    parser.add_argument("--out", type=Path, default=Path("results/bench/comm"))
    parser.set_defaults(run=run)
