"""DistributedFFT against mpi4py-fft (FFTW + MPI) on the same ranks and against torch.fft in one process.

For each rank count P: drift on P Gloo ranks (slab grid, one thread per rank) and mpi4py-fft on P MPI
ranks (slab, one FFTW thread per rank) transform the same global shape in single precision, c2c and
r2c, in alternating rounds; each call is timed between barriers as the slowest rank's time. At P = 1
drift and ``torch.fft.fftn``/``rfftn`` run side by side in this process with the same threads.

mpi4py-fft runs in its own environment (``bash benchmarks/peers/setup.sh``); without it the peer
columns are left empty.

    python benchmarks/fft_vs_peers.py [--shape 256 256 256] [--nproc 1 2 4] [--rounds 2]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import drift

ROOT = Path(__file__).resolve().parents[1]
PEERS = ROOT / "benchmarks" / "peers"


def _timed(fn, repeats: int, barrier=None) -> list[float]:
    times = []
    for _ in range(repeats):
        if barrier:
            barrier()
        start = time.perf_counter()
        fn()
        if barrier:
            barrier()
        times.append(time.perf_counter() - start)
    return times


def _drift_worker(rank: int, size: int, shape, kind: str, repeats: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=size, timeout=datetime.timedelta(minutes=5))
    mesh, placements = drift.grid_mesh((size,) + (1,) * (len(shape) - 1))
    plan = drift.DistributedFFT(shape, mesh, placements, kind=kind)
    dtype = torch.complex64 if kind == "c2c" else torch.float32
    x = torch.randn(plan.local_shape, dtype=dtype)
    with torch.inference_mode():
        y = plan.forward(x)
        plan.inverse(y)
        forward = _timed(lambda: plan.forward(x), repeats, dist.barrier)
        inverse = _timed(lambda: plan.inverse(y), repeats, dist.barrier)
        err = float((plan.inverse(plan.forward(x)) - x).norm() / x.norm())
    if rank == 0:
        Path(out).write_text(json.dumps({"forward": forward, "inverse": inverse, "roundtrip": err}))
    drift.comm.destroy_process_group()


def run_drift(size: int, shape, kind: str, repeats: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "drift.json")
        port = 29500 + (os.getpid() + size) % 400
        mp.start_processes(
            _drift_worker, args=(size, shape, kind, repeats, port, out), nprocs=size, start_method="spawn"
        )
        return json.loads(Path(out).read_text())


def run_peer(size: int, shape, kind: str, repeats: int) -> dict | None:
    python = PEERS / ".venv" / "bin" / "python"
    if not python.exists():
        return None
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "peer.json"
        cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(size), str(python)]
        cmd += [str(PEERS / "mpi4py_fft_bench.py"), "--shape", *map(str, shape), "--kind", kind]
        cmd += ["--repeats", str(repeats), "--json", str(out)]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        subprocess.run(cmd, check=True, capture_output=True, text=True, env=env, timeout=600)
        result = json.loads(out.read_text())
    return {
        "forward": [t / 1e3 for t in result["forward_ms_all"]],
        "inverse_median": result["backward_ms_median"] / 1e3,
        "roundtrip": result["roundtrip_rel_error"],
    }


def single_process(shape, kind: str, repeats: int, rounds: int) -> dict:
    """drift at P = 1 against torch.fft in this process, interleaved."""
    plan = drift.DistributedFFT(shape, kind=kind)
    x = torch.randn(shape, dtype=torch.complex64 if kind == "c2c" else torch.float32)
    reference = torch.fft.fftn if kind == "c2c" else torch.fft.rfftn
    times = {"drift": [], "torch": []}
    with torch.inference_mode():
        plan.forward(x)
        reference(x)
        for _ in range(rounds * repeats):
            times["drift"] += _timed(lambda: plan.forward(x), 1)
            times["torch"] += _timed(lambda: reference(x), 1)
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", type=int, nargs="+", default=[256, 256, 256])
    parser.add_argument("--nproc", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--kinds", nargs="+", default=["c2c", "r2c"])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("results/fft_vs_peers.json"))
    args = parser.parse_args()
    shape = tuple(args.shape)
    rows = []
    for kind in args.kinds:
        for size in args.nproc:
            if size == 1:
                single = single_process(shape, kind, args.repeats, args.rounds)
                rows.append(
                    {
                        "kind": kind,
                        "ranks": 1,
                        "drift_s": single["drift"],
                        "torch_fft_s": single["torch"],
                        "ratio_to_torch_fft": single["drift"] / single["torch"],
                    }
                )
                print(
                    f"{kind} P=1: drift {single['drift'] * 1e3:.0f} ms, torch.fft {single['torch'] * 1e3:.0f} ms "
                    f"({torch.get_num_threads()} threads), ratio {rows[-1]['ratio_to_torch_fft']:.2f}",
                    flush=True,
                )
                continue
            ours, theirs, errors = [], [], {}
            for _ in range(args.rounds):
                result = run_drift(size, shape, kind, args.repeats)
                ours.append(statistics.median(result["forward"]))
                errors["drift_roundtrip"] = result["roundtrip"]
                peer = run_peer(size, shape, kind, args.repeats)
                if peer is not None:
                    theirs.append(statistics.median(peer["forward"]))
                    errors["peer_roundtrip"] = peer["roundtrip"]
            row = {"kind": kind, "ranks": size, "drift_s": statistics.median(ours), **errors}
            line = f"{kind} P={size}: drift {row['drift_s'] * 1e3:.0f} ms"
            if theirs:
                row["mpi4py_fft_s"] = statistics.median(theirs)
                row["ratio_to_mpi4py_fft"] = row["drift_s"] / row["mpi4py_fft_s"]
                line += f", mpi4py-fft {row['mpi4py_fft_s'] * 1e3:.0f} ms, ratio {row['ratio_to_mpi4py_fft']:.2f}"
            else:
                line += " (mpi4py-fft not installed: bash benchmarks/peers/setup.sh)"
            rows.append(row)
            print(line, flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"shape": shape, "precision": "single", "rows": rows}, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
