"""One FNO block per method (drift, dfno, dfno-pruned) on P Gloo ranks: time, phases, payload, memory.

The block is ``gelu(K x + W x)`` with the same global weights for every method: K a ``SpectralConv``,
W a pointwise linear. For each global shape, rank count and method a fresh group of ranks (one thread
each) runs a warm-up and ``--repeats`` timed forward and backward passes (``drift.bench.blocks``: each
the slowest rank's time between barriers; medians), splits the forward into phases (local transforms,
collectives, spectral multiply, pointwise and GeLU), records the payload of each collective and every
rank's peak memory. ``drift bench scaling`` measures the same blocks with warm-up, spreads and plots.
With ``--neuralop``, one process also runs neuraloperator's SpectralConv (the same kept modes)
against drift's on the first shape, each in a child process for its own peak memory.

    python benchmarks/layers.py [--shapes 64x64x32x30 128x128x64x30] [--nproc 1 2 4] [--neuralop]
"""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp

import drift
from drift.arguments import shape as shape_arg
from drift.bench import blocks
from drift.nn import SpectralConv, neuralop_n_modes


def _peak_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9


def _single_worker(_rank, which, shape, modes, width, out) -> None:
    """One forward of drift's or neuraloperator's SpectralConv in this fresh process."""
    torch.set_num_threads(2)
    if which == "neuralop":
        from neuralop.layers.spectral_convolution import SpectralConv as NeuralopConv

        conv = NeuralopConv(width, width, n_modes=neuralop_n_modes(shape, modes), bias=False)
    else:
        torch.manual_seed(1)
        conv = SpectralConv(width, width, modes)
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
    parser.add_argument("--shapes", nargs="+", type=shape_arg, default=[(64, 64, 32, 30), (128, 128, 64, 30)])
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
    for shape in args.shapes:
        text = "x".join(map(str, shape))
        for size in args.nproc:
            for method in args.methods:
                # One group per method, so that each peak memory is the method's own.
                case = [(shape, modes, args.width, method)]
                (r,) = blocks.run(blocks.block_worker, size, case, 1, args.repeats, not args.forward_only)
                rows.append({"shape": shape, "ranks": size, "method": method, **r})
                if not r["completed"]:
                    print(f"{text} P={size} {method}: did not complete ({r['error']})", flush=True)
                    continue
                ph = r["phases_s"]
                backward = (r["backward"] or {}).get("median", float("nan"))
                print(
                    f"{text} P={size} {method:11s} forward {r['forward']['median'] * 1e3:8.1f} ms backward "
                    f"{backward * 1e3:8.1f} ms | transform {ph.get('transform', 0) * 1e3:7.1f} "
                    f"collectives {ph.get('collectives', 0) * 1e3:7.1f} multiply {ph.get('multiply', 0) * 1e3:6.1f} "
                    f"pointwise+gelu {ph.get('pointwise+gelu', 0) * 1e3:6.1f} ms | payload "
                    f"{r['payload_bytes'] / 1e6:8.2f} MB in {len(r['collectives'])} calls | "
                    f"peak {max(r['peak_gb_per_rank']):.2f} GB/rank",
                    flush=True,
                )
    singles = {}
    if args.neuralop:
        shape = args.shapes[-1]
        for which in ("drift", "neuralop"):
            singles[which] = run_single(which, shape, modes, args.width)
            print(f"single process {which}: {singles[which]}", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"width": args.width, "modes": modes, "rows": rows, "single": singles}, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
