"""A training step of the FNO (forward, backward, Adam) on one process: time and peak memory, this tree
against ``--before``, side by side.

Each measurement is a fresh process (so that its peak resident memory is the step's), rounds alternating
the two source trees (``--before`` extracted with ``git archive``); it reports the fastest of two steps,
the peak RSS and the loss (which must agree), and the ratios after / before.

    python benchmarks/train_step.py --before e7b7ebe --shape 64x64x32x30 --rounds 2 --json results/train_step.json
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


def _worker(shape: tuple[int, ...], threads: int) -> None:
    import torch

    from drift.nn import FNO

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = FNO(5, 5, 20, (8, 8, 8, 16), n_layers=4)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.randn(1, 5, *shape), torch.randn(1, 5, *shape)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    steps = []
    for _ in range(2):
        began = time.perf_counter()
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        steps.append(time.perf_counter() - began)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print("RESULT", json.dumps(dict(step_s=min(steps), peak_gb=peak / 1e9, base_gb=before / 1e9, loss=loss.item())))


def _measure(tree: Path, shape: str, threads: int) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree / "src"), OMP_NUM_THREADS=str(threads))
    command = [sys.executable, __file__, "--worker", shape, str(threads)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not lines:
        raise RuntimeError(f"{tree} failed:\n{done.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT ") :])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default="e7b7ebe", help="the commit to compare against")
    parser.add_argument("--shape", default="64x64x32x30")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json")
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(tuple(int(v) for v in args.worker[0].split("x")), int(args.worker[1]))
        return
    with tempfile.TemporaryDirectory(prefix="drift-before-") as tmp:
        archive = subprocess.run(["git", "archive", args.before], cwd=ROOT, capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        trees = {"before": Path(tmp), "after": ROOT}
        runs: dict[str, list[dict]] = {name: [] for name in trees}
        for _ in range(args.rounds):
            for name, tree in trees.items():
                runs[name].append(_measure(tree, args.shape, args.threads))
    summary = {
        name: {key: statistics.median(r[key] for r in rows) for key in ("step_s", "peak_gb", "base_gb", "loss")}
        for name, rows in runs.items()
    }
    print(f"training step, FNO 5 -> 5, width 20, 4 blocks, modes (8, 8, 8, 16), {args.shape}, {args.threads} threads")
    for name, s in summary.items():
        peak = f"peak RSS {s['peak_gb']:6.2f} GB (model and data {s['base_gb']:.2f})"
        print(f"{name:6s} step {s['step_s']:6.2f} s  {peak}  loss {s['loss']:.7f}")
    b, a = summary["before"], summary["after"]
    grown = lambda s: s["peak_gb"] - s["base_gb"]  # noqa: E731
    print(
        f"after / before: step {a['step_s'] / b['step_s']:.2f}, peak {a['peak_gb'] / b['peak_gb']:.2f}, "
        f"peak above model and data {grown(a) / grown(b):.2f}"
    )
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(dict(args=vars(args), runs=runs, summary=summary), indent=2))


if __name__ == "__main__":
    main()
