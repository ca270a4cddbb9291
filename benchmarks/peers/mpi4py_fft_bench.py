"""mpi4py-fft (FFTW + MPI) peer baseline for the distributed-FFT benchmark.

Benchmark-only: runs in the isolated environment created by ``setup.sh``
(benchmarks/peers/.venv); drift never imports or depends on it.

Usage (from the repository root)::

    mpirun --allow-run-as-root --oversubscribe -np 2 \\
        benchmarks/peers/.venv/bin/python benchmarks/peers/mpi4py_fft_bench.py \\
        --shape 256 256 256 --kind c2c --repeats 10 --json out.json

Single precision throughout: complex64 input for ``c2c``, float32 input for
``r2c`` (PFFT's real-to-complex mode, last axis halved to n//2+1).  Each
forward/backward call is timed between MPI barriers; the wall time of one
call is the maximum over ranks.  The timed call is the public API
``fft.forward(u, u_hat)`` / ``fft.backward(u_hat, u_out)`` including its
copy into/out of the plan's internal buffers.  mpi4py-fft normalises the
forward transform (1/N) and not the backward one, so backward(forward(u))
reproduces u.
"""

from __future__ import annotations

import os

# One FFTW/BLAS thread per rank; must be set before numpy / FFTW load.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse
import json
import statistics
import time

import mpi4py_fft
import numpy as np
from mpi4py import MPI
from mpi4py_fft import PFFT

THREADS = 1


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", type=int, nargs="+", default=[256, 256, 256])
    p.add_argument("--kind", choices=("c2c", "r2c"), default="c2c")
    p.add_argument("--grid", choices=("slab", "pencil"), default="slab")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument(
        "--planner",
        default="FFTW_MEASURE",
        choices=("FFTW_ESTIMATE", "FFTW_MEASURE", "FFTW_PATIENT", "FFTW_EXHAUSTIVE"),
        help="FFTW planner effort (mpi4py-fft default: FFTW_MEASURE)",
    )
    p.add_argument(
        "--collapse", action="store_true", help="PFFT collapse=True (merge serial transforms over non-distributed axes)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="write results dict to this path (rank 0)")
    return p.parse_args()


def timed(comm: MPI.Comm, fn) -> float:
    """Wall time of fn() in ms, barrier-fenced, max over ranks."""
    comm.Barrier()
    t0 = time.perf_counter()
    fn()
    dt = time.perf_counter() - t0
    comm.Barrier()
    return comm.allreduce(dt, op=MPI.MAX) * 1e3


def main() -> None:
    args = parse_args()
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    shape = tuple(args.shape)

    dtype = np.complex64 if args.kind == "c2c" else np.float32
    # grid=(-1,): distribute only axis 0 (slab); (-1, -1): 2-D process grid
    # over axes 0 and 1, last axis local (pencil; degenerates to slab for P=2).
    grid = (-1,) if args.grid == "slab" else (-1, -1)

    t_plan = time.perf_counter()
    fft = PFFT(
        comm,
        shape,
        dtype=dtype,
        grid=grid,
        collapse=args.collapse,
        backend="fftw",
        threads=THREADS,
        planner_effort=args.planner,
    )
    t_plan = comm.allreduce(time.perf_counter() - t_plan, op=MPI.MAX)
    proc_grid = [fft.subcomm[i].Get_size() for i in range(len(shape))]

    u = fft.forward.input_array.copy()  # local input block, correct dtype/shape
    u_hat = fft.forward.output_array.copy()
    u_out = np.empty_like(u)
    rng = np.random.default_rng(args.seed + 1000 * rank)
    if args.kind == "c2c":
        u[...] = (rng.standard_normal(u.shape) + 1j * rng.standard_normal(u.shape)).astype(np.complex64)
    else:
        u[...] = rng.standard_normal(u.shape).astype(np.float32)
    assert u.dtype == dtype and u_hat.dtype == np.complex64, (u.dtype, u_hat.dtype)

    fwd = lambda: fft.forward(u, u_hat)  # noqa: E731
    bwd = lambda: fft.backward(u_hat, u_out)  # noqa: E731

    for _ in range(args.warmup):
        fwd()
        bwd()

    fwd_ms = [timed(comm, fwd) for _ in range(args.repeats)]
    bwd_ms = [timed(comm, bwd) for _ in range(args.repeats)]

    # Roundtrip check on the untouched input u (forward is 1/N-normalised).
    fwd()
    bwd()
    num = comm.allreduce(float(np.sum(np.abs(u_out - u).astype(np.float64) ** 2)), op=MPI.SUM)
    den = comm.allreduce(float(np.sum(np.abs(u).astype(np.float64) ** 2)), op=MPI.SUM)
    err_global = (num / den) ** 0.5
    local_den = float(np.max(np.abs(u))) or 1.0
    err_local = float(np.max(np.abs(u_out - u))) / local_den
    err_max = comm.allreduce(err_local, op=MPI.MAX)

    if rank == 0:
        res = {
            "shape": list(shape),
            "kind": args.kind,
            "grid": args.grid,
            "process_grid": proc_grid,
            "ranks": size,
            "dtype_in": np.dtype(dtype).name,
            "dtype_out": u_hat.dtype.name,
            "forward_ms_median": statistics.median(fwd_ms),
            "backward_ms_median": statistics.median(bwd_ms),
            "forward_ms_all": fwd_ms,
            "backward_ms_all": bwd_ms,
            # max over ranks of (max |roundtrip - u| / max |u|) on each rank
            "roundtrip_rel_error": err_max,
            # global relative L2 error ||roundtrip - u|| / ||u||
            "roundtrip_rel_l2_error": err_global,
            "repeats": args.repeats,
            "warmup": args.warmup,
            "planner_effort": args.planner,
            "collapse": args.collapse,
            "plan_s": t_plan,
            "threads": THREADS,
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "timed_call": "fft.forward(u, u_hat) / fft.backward(u_hat, u_out)",
            "mpi4py_fft_version": mpi4py_fft.__version__,
            "mpi4py_version": __import__("mpi4py").__version__,
            "numpy_version": np.__version__,
            "mpi_library": MPI.Get_library_version().replace("\x00", "").splitlines()[0].strip(),
        }
        print(
            f"mpi4py-fft {mpi4py_fft.__version__} {args.kind} {'x'.join(map(str, shape))} "
            f"{args.grid}{proc_grid} P={size} threads={THREADS}: "
            f"fwd {res['forward_ms_median']:.1f} ms  bwd {res['backward_ms_median']:.1f} ms  "
            f"(median of {args.repeats}) roundtrip err {err_max:.2e}",
            flush=True,
        )
        if args.json:
            os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
            with open(args.json, "w") as f:
                json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
