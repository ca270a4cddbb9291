"""A redesign against the commit before it: an FNO block's forward, the FNO's forward and its training
step, side by side.

For each case, rounds alternate between the source tree of ``--before`` (extracted with ``git archive``)
and the working tree; each measurement is a fresh ``torchrun`` group of P Gloo ranks (one thread each)
that times ``--repeats`` passes after a warm-up, the slowest rank's time between barriers. A step is
``zero_grad``, the forward, the backward of the mean square of the output and drift's Adam step;
``--neuralop`` builds the FNO with neuraloperator's options (``drift.nn.NEURALOP_DEFAULTS``, ``drift
train``'s default model). Prints the median per version and the ratio after / before, and writes JSON.

    python benchmarks/redesign_overhead.py --before 9ebfdf8 --rounds 5
    python benchmarks/redesign_overhead.py --before 9ebfdf8 --cases fno:64x64x32x30:4 step:32x32x32x30:1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from drift.arguments import shape as shape_arg

ROOT = Path(__file__).resolve().parents[1]
WHAT = ("block", "fno", "step")
CASES = [  # (what, global shape, P, modes, layers)
    ("block", (64, 64, 32, 30), 1, (8, 8, 8, 16), 1),
    ("block", (64, 64, 32, 30), 2, (8, 8, 8, 16), 1),
    ("block", (64, 64, 32, 30), 4, (8, 8, 8, 16), 1),
    ("fno", (32, 32, 32, 30), 1, (8, 8, 8, 16), 4),
    ("fno", (32, 32, 32, 30), 4, (8, 8, 8, 16), 4),
    ("step", (32, 32, 32, 30), 1, (8, 8, 8, 16), 4),
    ("step", (32, 32, 32, 30), 4, (8, 8, 8, 16), 4),
]
WIDTH = 20


def _worker(what: str, shape: tuple, modes: tuple, layers: int, repeats: int, neuralop: bool) -> None:
    """One rank: build the block or model, time its forward or training step."""
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor, Shard

    import drift
    from drift import nn as dnn
    from drift import optim
    from drift.layout import to_dtensor

    torch.set_num_threads(1)
    size = int(os.environ.get("WORLD_SIZE", 1))
    if size > 1:
        dist.init_process_group("gloo")
    x = torch.randn(1, WIDTH if what == "block" else 5, *shape, generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    mesh, placements = drift.grid_mesh((size, 1, 1, 1))
    layout = drift.Layout(shape, mesh, placements)
    x_local = layout.scatter(x)
    if what == "block":
        spectral, pointwise = dnn.SpectralConv(WIDTH, WIDTH, modes), dnn.PointwiseLinear(WIDTH, WIDTH)
        if mesh is not None:
            dnn.parallelize(torch.nn.Sequential(spectral, pointwise), mesh, (Shard(2),))

        def run():
            with torch.no_grad():
                return dnn.fno_block(spectral, pointwise, x_local, layout)
    else:
        model = dnn.FNO(5, 5, WIDTH, modes, n_layers=layers, **(dnn.NEURALOP_DEFAULTS if neuralop else {}))
        xin = x_local
        if mesh is not None:
            dnn.parallelize(model, mesh, (Shard(2),))
            xin = to_dtensor(x_local, mesh, (Shard(2),), x.shape)
        optimizer = optim.Adam(model.parameters(), lr=1e-3)

        def run():
            if what == "fno":
                with torch.no_grad():
                    return model(xin)
            optimizer.zero_grad(set_to_none=True)
            y = model(xin)
            local = y.to_local() if isinstance(y, DTensor) else y
            local.square().mean().backward()
            optimizer.step()

    def barrier():
        if size > 1:
            dist.barrier()

    times = []
    for i in range(repeats + 1):
        barrier()
        start = time.perf_counter()
        run()
        barrier()
        if i:
            times.append(time.perf_counter() - start)
    if size > 1:
        dist.destroy_process_group()
    if int(os.environ.get("RANK", 0)) == 0:
        print("RESULT", json.dumps(times))


def _measure(tree: Path, case: tuple, repeats: int, neuralop: bool) -> list[float]:
    what, shape, size, modes, layers = case
    env = dict(os.environ, PYTHONPATH=str(tree / "src"), OMP_NUM_THREADS="1")
    args = [what, "x".join(map(str, shape)), ",".join(map(str, modes)), str(layers), str(repeats), str(int(neuralop))]
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(size),
        __file__,
        "--worker",
        *args,
    ]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not lines:
        raise RuntimeError(f"{tree} {case} failed:\n{done.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT ") :])


def _case(text: str) -> tuple:
    what, shape, size = text.split(":")
    if what not in WHAT:
        raise argparse.ArgumentTypeError(f"a case is block|fno|step:shape:P, got {text!r}")
    return what, shape_arg(shape), int(size), (8, 8, 8, 16), 1 if what == "block" else 4


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", help="the commit to compare against (required)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="results/redesign_overhead.json")
    parser.add_argument(
        "--cases",
        nargs="+",
        type=_case,
        help="what:shape:P, like step:32x32x32x30:4 (modes (8, 8, 8, 16))",
    )
    parser.add_argument("--neuralop", action="store_true", help="the FNO with neuraloperator's options")
    parser.add_argument("--worker", nargs=6, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        what, shape, modes, layers, repeats, neuralop = args.worker
        parse = lambda s: tuple(int(v) for v in s.split(","))  # noqa: E731
        _worker(what, shape_arg(shape), parse(modes), int(layers), int(repeats), neuralop == "1")
        return
    if not args.before:
        parser.error("--before is required")
    rows = []
    with tempfile.TemporaryDirectory(prefix="drift-before-") as tmp:
        archive = subprocess.run(["git", "archive", args.before], cwd=ROOT, capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        trees = {"before": Path(tmp), "after": ROOT}
        for case in args.cases or CASES:
            samples: dict[str, list[float]] = {"before": [], "after": []}
            for _ in range(args.rounds):
                for name, tree in trees.items():
                    samples[name] += _measure(tree, case, args.repeats, args.neuralop)
            before, after = (statistics.median(samples[k]) for k in ("before", "after"))
            row = dict(what=case[0], shape=case[1], ranks=case[2], before_s=before, after_s=after, ratio=after / before)
            row["samples"] = samples
            rows.append(row)
            shape = "x".join(map(str, case[1]))
            print(
                f"{case[0]:5s} {shape:12s} P={case[2]}  before {before:7.3f} s  after {after:7.3f} s  "
                f"after/before {after / before:.3f}",
                flush=True,
            )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(dict(before=args.before, neuralop=args.neuralop, rows=rows), indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
