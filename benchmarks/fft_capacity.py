"""The largest square 2-D complex64 in-place distributed FFT this machine completes, with peak memory.

Each size runs in a fresh group of Gloo ranks (slab mesh: dim 0 over P ranks, ``DistributedFFT(inplace=True)``).
Every rank fills its block chunk by chunk from a seeded generator (no second copy), takes a few
reference Fourier coefficients of the global field with a ``TruncatedFFT`` first, then runs the
in-place forward and inverse, checks the coefficients it holds against the reference and the
roundtrip against a regeneration of its block, and reports its peak resident memory.

    python benchmarks/fft_capacity.py --sizes 32768 36864 [--nproc 4]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import drift

ROWS_PER_CHUNK = 256


def _rss_gb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e9


def _peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9


def _fill(block: torch.Tensor, rank: int, seed: int) -> None:
    """Deterministic random values, written chunk by chunk into ``block`` (rows, N)."""
    for i, start in enumerate(range(0, block.shape[0], ROWS_PER_CHUNK)):
        chunk = torch.view_as_real(block[start : start + ROWS_PER_CHUNK])
        g = torch.Generator().manual_seed(seed * 1_000_003 + rank * 10_007 + i)
        torch.randn(chunk.shape, generator=g, out=chunk)


def _roundtrip_error(block: torch.Tensor, rank: int, seed: int) -> float:
    err = norm = 0.0
    for i, start in enumerate(range(0, block.shape[0], ROWS_PER_CHUNK)):
        got = block[start : start + ROWS_PER_CHUNK]
        g = torch.Generator().manual_seed(seed * 1_000_003 + rank * 10_007 + i)
        want = torch.view_as_complex(torch.randn((*got.shape, 2), generator=g))
        err += float((got - want).abs().square().sum())
        norm += float(want.abs().square().sum())
    return err, norm


def _worker(rank: int, size: int, n: int, port: int, seed: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=size, timeout=datetime.timedelta(minutes=30))
    base = _rss_gb()
    shape = (n, n)
    mesh, placements = drift.grid_mesh((size, 1))
    plan = drift.DistributedFFT(shape, mesh, placements, dtype=torch.float32, inplace=True)
    block = torch.empty(plan.local_shape, dtype=torch.complex64)
    _fill(block, rank, seed)
    block_gb = block.numel() * block.element_size() / 1e9
    # A few coefficients of the global field, from the blocks, before the in-place transform.
    modes = ([0, 1, n // 3, -1], [0, 2, n // 2, -5])
    probe = drift.TruncatedFFT(shape, modes, mesh, placements, real=False, dtype=torch.float32)
    with torch.inference_mode():
        coeffs = probe.forward(block)
    dist.barrier()
    start = time.perf_counter()
    spectrum = plan.forward(block)
    dist.barrier()
    forward_s = time.perf_counter() - start
    mine = plan.output_slices()
    coeff_err = 0.0
    for a, fa in enumerate(probe.modes[0]):
        for b, fb in enumerate(probe.modes[1]):
            if mine[0].start <= fa < mine[0].stop and mine[1].start <= fb < mine[1].stop:
                got = complex(spectrum[fa - mine[0].start, fb - mine[1].start])
                want = complex(coeffs[a, b])
                coeff_err = max(coeff_err, abs(got - want) / abs(want))
    dist.barrier()
    start = time.perf_counter()
    back = plan.inverse(spectrum)
    dist.barrier()
    inverse_s = time.perf_counter() - start
    err, norm = _roundtrip_error(back, rank, seed)
    stats = torch.tensor([err, norm, coeff_err, _peak_rss_gb(), base, block_gb], dtype=torch.float64)
    every = [torch.zeros_like(stats) for _ in range(size)]
    dist.all_gather(every, stats)
    if rank == 0:
        every = torch.stack(every)
        peak = every[:, 3]
        result = {
            "n": n,
            "ranks": size,
            "data_gb": n * n * 8 / 1e9,
            "forward_s": forward_s,
            "inverse_s": inverse_s,
            "roundtrip_rel_error": float((every[:, 0].sum() / every[:, 1].sum()).sqrt()),
            "coefficient_rel_error": float(every[:, 2].max()),
            "peak_rss_gb_per_rank": peak.tolist(),
            "baseline_rss_gb_per_rank": every[:, 4].tolist(),
            "block_gb_per_rank": every[:, 5].tolist(),
            "peak_over_block": float((peak / every[:, 5]).max()),
            "peak_minus_baseline_over_block": float(((peak - every[:, 4]) / every[:, 5]).max()),
            "total_peak_rss_gb": float(peak.sum()),
        }
        Path(out).write_text(json.dumps(result))
    drift.comm.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[32768, 36864])
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("results/fft_capacity.json"))
    args = parser.parse_args()
    results = []
    for n in args.sizes:
        tmp = args.out.with_suffix(f".{n}.part")
        tmp.parent.mkdir(parents=True, exist_ok=True)
        port = 29400 + n % 500
        start = time.perf_counter()
        try:
            mp.start_processes(
                _worker,
                args=(args.nproc, n, port, args.seed, str(tmp)),
                nprocs=args.nproc,
                start_method="spawn",
            )
            result = json.loads(tmp.read_text())
            result["completed"] = True
        except Exception as exc:  # a rank killed for memory or failing: record it and go on
            result = {"n": n, "ranks": args.nproc, "completed": False, "error": str(exc).splitlines()[0]}
        finally:
            tmp.unlink(missing_ok=True)
        result["wall_s"] = time.perf_counter() - start
        results.append(result)
        if result["completed"]:
            r = result
            print(
                f"{n} x {n} complex64 ({r['data_gb']:.1f} GB) on {args.nproc} ranks: "
                f"forward {r['forward_s']:.1f} s, inverse {r['inverse_s']:.1f} s, "
                f"roundtrip error {r['roundtrip_rel_error']:.1e}, "
                f"coefficient error {r['coefficient_rel_error']:.1e}, "
                f"peak RSS {max(r['peak_rss_gb_per_rank']):.2f} GB per rank "
                f"= {r['peak_over_block']:.2f} x block "
                f"({r['peak_minus_baseline_over_block']:.2f} x above the start-up "
                f"{max(r['baseline_rss_gb_per_rank']):.2f} GB), all ranks {r['total_peak_rss_gb']:.1f} GB",
                flush=True,
            )
        else:
            print(f"{n} x {n}: did not complete ({result['error']})", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"machine_memory_gb": _machine_gb(), "results": results}, indent=2))
    print(f"wrote {args.out}")


def _machine_gb() -> float:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9


if __name__ == "__main__":
    main()
