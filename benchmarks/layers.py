"""One FNO block per method (drift, dfno, dfno-pruned) on P Gloo ranks: time, phases, payload, memory.

The block is ``gelu(K x + W x)`` with the same global weights for every method: K a ``SpectralConv``,
W a pointwise linear. For each global shape, rank count and method a fresh group of ranks (one thread
each) runs a warm-up and ``--repeats`` timed forward and backward passes (each the slowest rank's
time between barriers), splits the forward into phases (local transforms, collectives, spectral
multiply, pointwise and GeLU), records the payload of each collective and every rank's peak memory.
With ``--neuralop``, one process also runs neuraloperator's SpectralConv (the same kept modes)
against drift's on the first shape, each in a child process for its own peak memory.

    python benchmarks/layers.py [--shapes 64x64x32x30 128x128x64x30] [--nproc 1 2 4] [--neuralop]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import drift
from drift.nn import PointwiseLinear, SpectralConv, fno_block, neuralop_n_modes

ROOT = Path(__file__).resolve().parents[1]


def _peak_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9


def _block_worker(rank, size, shape, modes, width, method, repeats, backward_too, port, out) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    if size > 1:
        dist.init_process_group("gloo", rank=rank, world_size=size, timeout=datetime.timedelta(minutes=20))
    grid = (size,) + (1,) * (len(shape) - 1)
    base = _peak_gb()
    conv = SpectralConv(width, width, shape, modes, grid, method=method, seed=1)
    linear = PointwiseLinear(width, width, torch.Generator().manual_seed(2))
    local = conv.plan.local_shape
    x = torch.randn(1, width, *local)
    g = torch.randn(1, width, *local)
    barrier = dist.barrier if size > 1 else (lambda: None)

    def block(inp):
        return fno_block(conv, linear, inp)

    def timed(fn):
        barrier()
        start = time.perf_counter()
        fn()
        barrier()
        return time.perf_counter() - start

    with torch.no_grad():
        block(x)
    forward, phases, calls = [], [], []
    for _ in range(repeats):
        with drift.profile() as prof, drift.comm_log() as log, torch.no_grad():
            forward.append(timed(lambda: block(x)))
        comm_s = sum(c.seconds for c in log.calls)
        phases.append({**prof, "transform": prof.get("transform", 0.0) - comm_s, "collectives": comm_s})
        calls = [(c.kind, c.bytes) for c in log.calls]
    x.requires_grad_(True)
    backward = []
    for _ in range(repeats if backward_too else 0):
        y = block(x)
        backward.append(timed(lambda y=y: (y * g).sum().backward()))
        x.grad = None
    result = {
        "forward_s": forward,
        "backward_s": backward or [float("nan")],
        "phases_s": {k: statistics.median(p[k] for p in phases) for k in phases[0]},
        "collectives": calls,
        "peak_gb": _peak_gb(),
        "start_gb": base,
    }
    everyone = [None] * size
    if size > 1:
        dist.all_gather_object(everyone, result)
    else:
        everyone = [result]
    if rank == 0:
        Path(out).write_text(json.dumps(everyone))
    if size > 1:
        dist.destroy_process_group()


def run_block(shape, modes, width, method, size, repeats, backward_too=True) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        port = 29600 + (os.getpid() + size) % 300
        args = (size, shape, modes, width, method, repeats, backward_too, port, str(out))
        try:
            mp.start_processes(_block_worker, args=args, nprocs=size, start_method="spawn")
        except Exception as exc:  # a rank killed for memory or failing: record it
            return {"completed": False, "error": " ".join(str(exc).split())[-300:]}
        ranks = json.loads(out.read_text())
    worst = max(range(size), key=lambda r: statistics.median(ranks[r]["forward_s"]))
    return {
        "completed": True,
        "forward_s": statistics.median(ranks[0]["forward_s"]),
        "backward_s": statistics.median(ranks[0]["backward_s"]),
        "phases_s": ranks[worst]["phases_s"],
        "collectives": ranks[0]["collectives"],
        "peak_gb_per_rank": [r["peak_gb"] for r in ranks],
        "start_gb": ranks[0]["start_gb"],
    }


def _single_worker(_rank, which, shape, modes, width, out) -> None:
    """One forward of drift's or neuraloperator's SpectralConv in this fresh process."""
    torch.set_num_threads(2)
    if which == "neuralop":
        from neuralop.layers.spectral_convolution import SpectralConv as NeuralopConv

        conv = NeuralopConv(width, width, n_modes=neuralop_n_modes(shape, modes), bias=False)
    else:
        conv = SpectralConv(width, width, shape, modes, (1,) * len(shape), seed=1)
    x = torch.randn(1, width, *shape)
    with torch.no_grad():
        start = time.perf_counter()
        conv(x)
        seconds = time.perf_counter() - start
    Path(out).write_text(json.dumps({"forward_s": seconds, "peak_gb": _peak_gb()}))


def run_single(which, shape, modes, width) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "single.json"
        try:
            mp.start_processes(
                _single_worker, args=(which, shape, modes, width, str(out)), nprocs=1, start_method="spawn"
            )
        except Exception as exc:
            return {"completed": False, "error": " ".join(str(exc).split())[-300:]}
        return {"completed": True, **json.loads(out.read_text())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", default=["64x64x32x30", "128x128x64x30"])
    parser.add_argument("--nproc", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--methods", nargs="+", default=list(drift.nn.METHODS))
    parser.add_argument("--modes", type=int, nargs="+", default=[8, 8, 8, 16])
    parser.add_argument("--width", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--neuralop", action="store_true")
    parser.add_argument("--forward-only", action="store_true", help="skip the backward passes (less memory)")
    parser.add_argument("--out", type=Path, default=Path("results/layers.json"))
    args = parser.parse_args()
    modes = tuple(args.modes)
    rows = []
    for text in args.shapes:
        shape = tuple(int(n) for n in text.split("x"))
        for size in args.nproc:
            for method in args.methods:
                r = run_block(shape, modes, args.width, method, size, args.repeats, not args.forward_only)
                rows.append({"shape": shape, "ranks": size, "method": method, **r})
                if not r["completed"]:
                    print(f"{text} P={size} {method}: did not complete ({r['error']})", flush=True)
                    continue
                ph = r["phases_s"]
                print(
                    f"{text} P={size} {method:11s} forward {r['forward_s'] * 1e3:8.1f} ms backward "
                    f"{r['backward_s'] * 1e3:8.1f} ms | transform {ph.get('transform', 0) * 1e3:7.1f} "
                    f"collectives {ph.get('collectives', 0) * 1e3:7.1f} multiply {ph.get('multiply', 0) * 1e3:6.1f} "
                    f"pointwise+gelu {ph.get('pointwise+gelu', 0) * 1e3:6.1f} ms | payload "
                    f"{sum(b for _, b in r['collectives']) / 1e6:8.2f} MB in {len(r['collectives'])} calls | "
                    f"peak {max(r['peak_gb_per_rank']):.2f} GB/rank",
                    flush=True,
                )
    singles = {}
    if args.neuralop:
        shape = tuple(int(n) for n in args.shapes[-1].split("x"))
        for which in ("drift", "neuralop"):
            singles[which] = run_single(which, shape, modes, args.width)
            print(f"single process {which}: {singles[which]}", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"width": args.width, "modes": modes, "rows": rows, "single": singles}, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
