"""Timing one FNO block, or a whole FNO forward, on P ranks: what ``scaling``, ``modes`` and ``phases``
(and ``benchmarks/layers.py``) measure.

The block is ``drift.nn.fno_block``: ``gelu(K x + W x)`` with K a ``SpectralConv`` of the given
method and W a ``PointwiseLinear``, batch 1, float32, the same global weights for every method (drawn
after ``torch.manual_seed(0)``), parallelized over a slab mesh (P, 1, ..., 1) on P > 1 ranks; the block
runs on each rank's local block (``forward_local``), the whole FNO on DTensors, as users call it.
Each timed pass is the wall time between barriers (so the slowest rank's).
The forward runs without autograd; a backward pass is timed alone, after an untimed recorded forward.

Phases (seconds per pass, the mean over ranks of each rank's median): ``transform`` (local partial DFTs
or FFTs, collectives excluded), ``collectives`` (the calls ``comm_log`` records, waiting for peers
included), ``multiply`` (spectral weights), ``pointwise+gelu``, and for a whole FNO
``lift+projection`` and ``other`` (the rest of the pass).
"""

from __future__ import annotations

import functools
import statistics
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import Shard

import drift
from drift.bench.runner import bench_device, peak_rss_gb, spread, timed
from drift.jobs.launch import RankError, rank_device, run_ranks
from drift.layout import Layout, grid_mesh, shift_placements, to_dtensor
from drift.modes import mode_lists
from drift.nn import FNO, PointwiseLinear, SpectralConv, fno_block, parallelize
from drift.nn.methods import Drift

FIELDS = 5  # FNO input and output channels: PDEBench's five fields


def slab(shape: Sequence[int], size: int) -> tuple[int, ...]:
    """The slab grid (P, 1, ..., 1) the paper uses."""
    return (size,) + (1,) * (len(shape) - 1)


def distribute(model: nn.Module, shape: Sequence[int], **options: Any) -> Layout:
    """Parallelize ``model`` over a slab mesh of every rank of the default group (nothing on one rank),
    with ``parallelize``'s ``options`` (``reduction``, ``overlap``); the layout of its inputs' spatial
    dims (global extents ``shape``)."""
    size = drift.comm.world_size()
    if size == 1:
        return Layout(shape)
    mesh, placements = grid_mesh(slab(shape, size), rank_device().type)
    parallelize(model, mesh, [Shard(p.dim + 2) if isinstance(p, Shard) else p for p in placements], **options)
    return Layout(shape, mesh, placements)


def random_input(layout: Layout, channels: int) -> torch.Tensor:
    """This rank's block of a random ``(1, channels, *shape)`` field on its device."""
    return torch.randn(1, channels, *layout.local_shape, device=rank_device())


def as_model_input(x: torch.Tensor, layout: Layout) -> torch.Tensor:
    """A local block as a parallelized model takes it: a DTensor on the layout's mesh (itself on one rank)."""
    if layout.mesh is None:
        return x
    return to_dtensor(x, layout.mesh, shift_placements(layout.placements, 2), (*x.shape[:2], *layout.global_shape))


def _split_phases(prof: dict[str, float], log: drift.CommLog, total: float) -> dict[str, float]:
    comm_s = sum(c.seconds for c in log.calls)
    phases = {**prof, "transform": prof.get("transform", 0.0) - comm_s, "collectives": comm_s}
    phases["other"] = total - sum(phases.values())
    return phases


def _time_passes(
    forward, inputs: torch.Tensor, warmup: int, iters: int, backward: bool
) -> tuple[list[float], list[float], list[dict], list[tuple[str, int]]]:
    """Timed forwards (with phases and the collectives of one), then timed backwards."""
    with torch.no_grad():
        for _ in range(warmup):
            forward(inputs)
    forwards, phases, calls = [], [], []
    for _ in range(iters):
        with drift.profile() as prof, drift.comm_log() as log, torch.no_grad():
            seconds = timed(lambda: forward(inputs))
        forwards.append(seconds)
        phases.append(_split_phases(prof, log, seconds))
        calls = [(c.kind, c.bytes, c.group_size) for c in log.calls]
    backwards = []
    if backward:
        x = inputs.detach().requires_grad_(True)
        for i in range(warmup + iters):
            y = forward(x)
            seconds = timed(lambda y=y: y.sum().backward())
            x.grad = None
            if i >= warmup:
                backwards.append(seconds)
    return forwards, backwards, phases, calls


def block_worker(cases: Sequence[tuple], warmup: int, iters: int, backward: bool) -> list[dict[str, Any]]:
    """On every rank: time one FNO block per case ``(shape, modes, width, method)`` or ``(shape, modes,
    width, method, options)`` (``parallelize``'s options), one after another in this process (a group
    start costs seconds); per case this rank's samples, phases and collectives."""
    results = []
    for shape, modes, width, method, *options in cases:
        torch.manual_seed(0)
        conv = SpectralConv(width, width, modes, method=method, device=rank_device())
        linear = PointwiseLinear(width, width, device=rank_device())
        layout = distribute(nn.ModuleList([conv, linear]), shape, **(options[0] if options else {}))
        block = functools.partial(fno_block, conv, linear, layout=layout)
        results.append(_rank_result(*_time_passes(block, random_input(layout, width), warmup, iters, backward)))
    return results


def fno_worker(cases: Sequence[tuple], warmup: int, iters: int) -> list[dict[str, Any]]:
    """On every rank: time whole FNO forwards (lift, 4 blocks, projection) with their phases, per case
    ``(shape, modes, width, method)``."""
    results = []
    for shape, modes, width, method in cases:
        torch.manual_seed(0)
        model = FNO(FIELDS, FIELDS, width, modes, method=method, device=rank_device())
        layout = distribute(model, shape)
        x = as_model_input(random_input(layout, FIELDS), layout)
        results.append(_rank_result(*_time_passes(model, x, warmup, iters, False)))
    return results


def _rank_result(forwards, backwards, phases, calls) -> dict[str, Any]:
    return {
        "forward_s": forwards,
        "backward_s": backwards,
        "phases_s": {k: statistics.median(p.get(k, 0.0) for p in phases) for k in phases[0]},
        "collectives": calls,
        "peak_gb": peak_rss_gb(),
    }


def summarise(ranks: list[dict]) -> dict[str, Any]:
    """The parent's row from the per-rank results: spreads of rank 0's samples (every rank measures the
    slowest one between barriers), mean phases over ranks, payload bytes per forward, and each rank's
    peak resident memory (GB) so far: with several cases in one process, the peak over those run yet."""
    phases = {k: statistics.mean(r["phases_s"].get(k, 0.0) for r in ranks) for k in ranks[0]["phases_s"]}
    return {
        "completed": True,
        "forward": spread(ranks[0]["forward_s"]),
        "backward": spread(ranks[0]["backward_s"]) if ranks[0]["backward_s"] else None,
        "phases_s": phases,
        "collectives": ranks[0]["collectives"],
        "payload_bytes": sum(c[1] for c in ranks[0]["collectives"]),
        "peak_gb_per_rank": [r["peak_gb"] for r in ranks],
    }


def run(worker, size: int, cases: Sequence[tuple], *args: Any, timeout_s: float = 1800.0) -> list[dict[str, Any]]:
    """``worker(cases, *args)`` on ``size`` ranks, one summary per case; when a rank fails, every case
    is ``{"completed": False, "error"}``."""
    try:
        ranks = run_ranks(size, worker, list(cases), *args, device=bench_device(), timeout_s=timeout_s)
    except RankError as exc:
        return [{"completed": False, "error": str(exc)[-300:]} for _ in cases]
    return [summarise([r[i] for r in ranks]) for i in range(len(cases))]


def _ms(spread_s: dict | None) -> str:
    if not spread_s:
        return "-"
    return f"{spread_s['median'] * 1e3:.1f} [{spread_s['q1'] * 1e3:.0f}-{spread_s['q3'] * 1e3:.0f}]"


def timing_table(rows: list[dict], keys: Sequence[str]) -> tuple[list[list], list[str]]:
    """Table rows and header for block timings: ``keys`` columns, method, forward and backward ms
    (median [quartiles]), each pass's time over drift's at the same keys, payload MB per forward."""
    drift_rows = {tuple(r[k] for k in keys): r for r in rows if r["method"] == Drift.name and r["completed"]}

    def over_drift(r: dict, which: str) -> float | None:
        base = drift_rows.get(tuple(r[k] for k in keys))
        if not base or not r.get(which) or not base.get(which):
            return None
        return r[which]["median"] / base[which]["median"]

    table = []
    for r in rows:
        head = [("x".join(map(str, r[k])) if isinstance(r[k], tuple | list) else r[k]) for k in keys]
        if not r["completed"]:
            table.append([*head, r["method"], "failed: " + r["error"][-60:], "-", "-", "-", "-"])
            continue
        table.append(
            [
                *head,
                r["method"],
                _ms(r["forward"]),
                _ms(r["backward"]),
                over_drift(r, "forward"),
                over_drift(r, "backward"),
                r["payload_bytes"] / 1e6,
            ]
        )
    header = [*keys, "method", "forward ms", "backward ms", "fwd / drift", "bwd / drift", "payload MB"]
    return table, header


def check_cases(cases: Sequence[tuple]) -> str | None:
    """An error message when a case's modes do not fit its grid (checked before any rank starts)."""
    for shape, modes, *_ in cases:
        try:
            mode_lists(tuple(modes), tuple(shape), True)
        except ValueError as exc:
            return f"modes {tuple(modes)} on grid {'x'.join(map(str, shape))}: {exc}"
    return None
