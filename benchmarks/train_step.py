"""A training step of the FNO (forward, backward, Adam), or one block's forward and backward, on one
process: time and peak memory, this tree against ``--before``, side by side.

Each measurement is a fresh process (so that its peak resident memory is the step's), rounds alternating
the two source trees (``--before`` extracted with ``git archive``); it reports the fastest of three steps
(the first maps every tensor afresh) with its phases (recorded forward, backward, optimizer) and the
memory it page-faulted, the fastest of three forwards without autograd (after each step, the second of
two: the first makes the resident buffers that a recorded forward releases), the peak RSS and the loss
(which must agree), and the ratios after / before.
``--what block``: one FNO block (``fno_block``, width 20), the fastest of three forwards and backwards,
on one process or (``--ranks P``) on a slab over P Gloo ranks started by torchrun, each with
``--threads`` threads; wall seconds (between barriers) and rank 0's CPU seconds, the steadier figure on a
loaded machine.

    python benchmarks/train_step.py --before e7b7ebe --shape 64x64x32x30 --rounds 2 --json results/train_step.json
    python benchmarks/train_step.py --before e7b7ebe --what block --rounds 2
    python benchmarks/train_step.py --before f6253e6 --what block --ranks 4 --threads 1
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STEPS = 3  # the fastest is reported: the first maps every tensor afresh
PHASES = ("recorded_forward", "backward", "optimizer")
STEP_KEYS = ("step_s", "forward_s", "peak_gb", "base_gb", "loss", "fault_gb", *(f"{p}_s" for p in PHASES))
BLOCK_KEYS = ("forward_s", "backward_s", "forward_cpu_s", "backward_cpu_s")


def _block_worker(shape: tuple[int, ...], threads: int) -> None:
    """One FNO block's forward and backward on this rank's slab (P ranks when torchrun started this);
    each time is the slowest rank's, between barriers."""
    import torch
    import torch.distributed as dist

    import drift
    from drift.nn import PointwiseLinear, SpectralConv, fno_block, parallelize

    torch.set_num_threads(threads)
    size = int(os.environ.get("WORLD_SIZE", 1))
    if size > 1:
        dist.init_process_group("gloo")
    mesh, placements = drift.grid_mesh((size, 1, 1, 1))
    layout = drift.Layout(shape, mesh, placements)
    torch.manual_seed(0)
    spectral, pointwise = SpectralConv(20, 20, (8, 8, 8, 16)), PointwiseLinear(20, 20)
    if mesh is not None:
        from torch.distributed.tensor import Shard

        parallelize(torch.nn.Sequential(spectral, pointwise), mesh, (Shard(2),))
    x = layout.scatter(torch.randn(1, 20, *shape)).requires_grad_(True)
    grad = layout.scatter(torch.randn(1, 20, *shape))

    def timed(fn, into: list):
        """Wall and CPU seconds (this process, all its threads) of ``fn()``, appended to ``into``."""
        if size > 1:
            dist.barrier()
        began, cpu = time.perf_counter(), time.process_time()
        result = fn()
        if size > 1:
            dist.barrier()
        into.append((time.perf_counter() - began, time.process_time() - cpu))
        return result

    forward, backward = [], []
    for _ in range(3):
        y = timed(lambda: fno_block(spectral, pointwise, x, layout), forward)
        timed(lambda out=y: out.backward(grad), backward)
        for leaf in (x, *spectral.parameters(), *pointwise.parameters()):
            leaf.grad = None  # as zero_grad does: each backward makes its gradients afresh
    if int(os.environ.get("RANK", 0)) == 0:
        fastest = {
            f"{name}_{kind}": min(t[i] for t in times)
            for name, times in (("forward", forward), ("backward", backward))
            for i, kind in enumerate(("s", "cpu_s"))
        }
        print("RESULT", json.dumps(dict(fastest, sum=float(y.sum()))))


def _mark() -> tuple[float, int]:
    """Wall seconds and this process's minor page faults so far."""
    return time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _worker(shape: tuple[int, ...], threads: int) -> None:
    import torch

    from drift.nn import FNO

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    try:  # drift's fused step where the tree has it, torch's Adam before
        from drift.optim import Adam
    except ImportError:
        Adam = torch.optim.Adam
    model = FNO(5, 5, 20, (8, 8, 8, 16), n_layers=4)
    optimizer = Adam(model.parameters(), lr=1e-3)
    x, y = torch.randn(1, 5, *shape), torch.randn(1, 5, *shape)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    steps, forwards = [], []
    for _ in range(STEPS):
        marks = [_mark()]
        loss = torch.nn.functional.mse_loss(model(x), y)
        marks.append(_mark())
        optimizer.zero_grad()
        loss.backward()
        marks.append(_mark())
        optimizer.step()
        marks.append(_mark())
        steps.append(marks)
        with torch.no_grad():  # interleaved with the steps, so that a slow stretch of the host hits both
            model(x)  # a recorded forward released the resident buffers: this one makes them again
            began = time.perf_counter()
            model(x)
            forwards.append(time.perf_counter() - began)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    fastest = min(steps, key=lambda marks: marks[-1][0] - marks[0][0])
    (began, faults), *ends = fastest
    phases = {f"{name}_s": end[0] - start[0] for name, start, end in zip(PHASES, fastest[:-1], ends, strict=True)}
    result = dict(
        step_s=ends[-1][0] - began,
        forward_s=min(forwards),
        peak_gb=peak / 1e9,
        base_gb=before / 1e9,
        fault_gb=(ends[-1][1] - faults) * resource.getpagesize() / 1e9,
        **phases,
    )
    print("RESULT", json.dumps(dict(result, loss=loss.item(), optimizer=f"{Adam.__module__}.{Adam.__name__}")))


def _measure(tree: Path, what: str, shape: str, threads: int, ranks: int = 1) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree / "src"), OMP_NUM_THREADS=str(threads))
    launcher = ["-m", "torch.distributed.run", "--nproc-per-node", str(ranks)] if ranks > 1 else []
    command = [sys.executable, *launcher, __file__, "--worker", what, shape, str(threads)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not lines:
        raise RuntimeError(f"{tree} failed:\n{done.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT ") :])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default="e7b7ebe", help="the commit to compare against")
    parser.add_argument("--what", choices=("step", "block"), default="step")
    parser.add_argument("--shape", default="64x64x32x30")
    parser.add_argument("--threads", type=int, default=2, help="threads per process")
    parser.add_argument("--ranks", type=int, default=1, help="--what block: Gloo ranks (torchrun), a slab over x")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json")
    parser.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.ranks > 1 and args.what != "block":
        parser.error(f"--ranks {args.ranks} is for --what block only")
    if args.worker:
        worker = _worker if args.worker[0] == "step" else _block_worker
        worker(tuple(int(v) for v in args.worker[1].split("x")), int(args.worker[2]))
        return
    with tempfile.TemporaryDirectory(prefix="drift-before-") as tmp:
        archive = subprocess.run(["git", "archive", args.before], cwd=ROOT, capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        trees = {"before": Path(tmp), "after": ROOT}
        runs: dict[str, list[dict]] = {name: [] for name in trees}
        for _ in range(args.rounds):
            for name, tree in trees.items():
                runs[name].append(_measure(tree, args.what, args.shape, args.threads, args.ranks))
    if args.what == "block":
        _block_summary(args, runs)
        return
    summary = _medians(runs, STEP_KEYS)
    print(f"training step, FNO 5 -> 5, width 20, 4 blocks, modes (8, 8, 8, 16), {args.shape}, {args.threads} threads")
    for name, s in summary.items():
        peak = f"peak RSS {s['peak_gb']:6.2f} GB (model and data {s['base_gb']:.2f})"
        step = f"step {s['step_s']:6.2f} s ({s['step_s'] / s['forward_s']:.1f}x its forward, {s['forward_s']:.2f} s)"
        parts = ", ".join(f"{p.replace('_', ' ')} {s[f'{p}_s']:.2f}" for p in PHASES)
        print(f"{name:6s} {step}  [{parts}; page faults {s['fault_gb']:.2f} GB]  {peak}  loss {s['loss']:.7f}")
        print(f"       optimizer {runs[name][0]['optimizer']}")
    b, a = summary["before"], summary["after"]
    grown = lambda s: s["peak_gb"] - s["base_gb"]  # noqa: E731
    print(
        f"after / before: step {a['step_s'] / b['step_s']:.2f}, peak {a['peak_gb'] / b['peak_gb']:.2f}, "
        f"peak above model and data {grown(a) / grown(b):.2f}"
    )
    _write_json(args, runs, summary)


def _medians(runs: dict[str, list[dict]], keys: tuple[str, ...]) -> dict[str, dict[str, float]]:
    """Per tree, the median over rounds of each of ``keys``."""
    return {name: {key: statistics.median(r[key] for r in rows) for key in keys} for name, rows in runs.items()}


def _write_json(args: argparse.Namespace, runs: dict[str, list[dict]], summary: dict) -> None:
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(dict(args=vars(args), runs=runs, summary=summary), indent=2))


def _block_summary(args: argparse.Namespace, runs: dict[str, list[dict]]) -> None:
    summary = _medians(runs, BLOCK_KEYS)
    where = f"{args.ranks} Gloo ranks of {args.threads} thread(s)" if args.ranks > 1 else f"{args.threads} threads"
    print(f"FNO block, width 20, modes (8, 8, 8, 16), {args.shape}, {where}")
    for name, s in summary.items():
        ratio, cpu_ratio = s["backward_s"] / s["forward_s"], s["backward_cpu_s"] / s["forward_cpu_s"]
        print(
            f"{name:6s} forward {s['forward_s']:6.3f} s  backward {s['backward_s']:6.3f} s  "
            f"backward/forward {ratio:.2f}  CPU s: forward {s['forward_cpu_s']:.3f} "
            f"backward {s['backward_cpu_s']:.3f} ratio {cpu_ratio:.2f}"
        )
    b, a = summary["before"], summary["after"]
    print(
        f"after / before: forward {a['forward_s'] / b['forward_s']:.2f}, "
        f"backward {a['backward_s'] / b['backward_s']:.2f}"
    )
    _write_json(args, runs, summary)


if __name__ == "__main__":
    main()
