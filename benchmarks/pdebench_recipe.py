"""PDEBench's own FNO recipe against drift's recipes on drift's default 3-D CFD data.

PDEBench's side is its own code (``pdebench/models/fno/train.py``'s ``run_training``, FNO3d, its loader and
``metric_func``) run by ``benchmarks/peers/pdebench_fno.py`` in PDEBench's own Python (``--pdebench-python``,
a separate virtual environment with torch) from a PDEBench source tree (``--pdebench-src``), changed only in
the data path, the epochs and the batch size. drift's side is ``drift train --t-in 5 --t-out 16 --split
pdebench`` with one of ``DRIFT_RECIPES`` (``--drift-recipe``: a model of no more parameters than PDEBench's
FNO3d, checked before it runs), the same batch size and epochs (so the same optimizer steps) and the same
test trajectories (PDEBench's first ``int(10%)``); its final model's predictions (``drift predict``) are
scored by PDEBench's ``FNODatasetSingle`` and ``metric_func``, as PDEBench's are: nRMSE of the physical
fields over frames 5-20.

Both run in one process on ``--threads`` threads, interleaved per seed (the order alternates); drift on
``--beside`` ranks (one thread each) runs after them for the first seed. An epoch's time is the whole
epoch: the training steps, the test pass and the checkpoint (drift: ``metrics.jsonl``'s seconds, which
also count its reads of the data; PDEBench's data are in memory from before its first epoch).

    python benchmarks/pdebench_recipe.py --pdebench-python /work/pdebench-venv/bin/python \
        --pdebench-src /work/pdebench-src --trajectories 20 --epochs 1 --batch-size 2

``--trajectories N`` trains and tests on the first N trajectories of the default data (a file written into
``--out``): PDEBench's FNO3d on CPU is slow enough that the full set does not fit a short run.
Prints a markdown table. Each run is recorded in ``<out>/pdebench_recipe.json`` as it ends, and a later
call with the same settings runs only the seeds and sides not recorded yet (a sweep over several sittings;
PDEBench's runs serve every drift recipe of the same data, epochs and batch).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import h5py
import torch

from drift.cli import build_parser
from drift.nn import FNO
from drift.train import ensure_default_data
from drift.train.config import config_from
from drift.train.model import fno_options
from drift.train.problem import resolve_problem

HERE = Path(__file__).resolve().parent
# drift's recipes beside PDEBench's (each with --t-in 5 --t-out 16 --split pdebench, the batch and epochs of
# the run). autoregressive: PDEBench's own recipe's unroll, the model predicting increments, trained on each
# trajectory's relative L2 error (found best of those tried: docs/benchmarks/problems.md); one-shot: the 16
# frames at once, time an FNO dim zero-padded by half (its frames are not periodic), trained on PDEBench's
# nRMSE itself.
DRIFT_RECIPES = {
    "autoregressive": ["--recipe", "autoregressive", "--target", "increment", "--width", "36", "--modes", "8",
                       "--lr", "1e-2", "--loss", "relative-l2"],
    "one-shot": ["--recipe", "one-shot", "--width", "32", "--modes", "4", "--domain-padding", "0,0,0,0.5",
                 "--lr", "1e-2", "--loss", "nrmse"],
}  # fmt: skip


def subset(source: Path, out: Path, n: int) -> Path:
    """The first ``n`` trajectories of ``source`` (PDEBench's 3-D CFD layout) as a file of their own."""
    if out.exists():
        return out
    with h5py.File(source, "r") as src, h5py.File(out.with_suffix(".tmp"), "w") as dst:
        dst.attrs.update(dict(src.attrs))
        for key, data in src.items():
            dst[key] = data[:n] if data.ndim == 5 else data[...]
    out.with_suffix(".tmp").rename(out)
    return out


def env(threads: int) -> dict:
    return dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))


def run_pdebench(args, data: Path, seed: int) -> dict:
    command = [
        args.pdebench_python, str(HERE / "peers" / "pdebench_fno.py"), "train", "--src", args.pdebench_src,
        "--data", str(data), "--epochs", str(args.epochs), "--batch-size", str(args.batch_size),
        "--seed", str(seed), "--threads", str(args.threads), "--workdir", str(args.out / f"pdebench_{seed}"),
    ]  # fmt: skip
    done = subprocess.run(command, check=True, capture_output=True, text=True, env=env(args.threads))
    return json.loads(done.stdout.strip().splitlines()[-1])


def drift_options(args) -> list[str]:
    """``drift train``'s options for ``--drift-recipe``, with this run's batch and epochs."""
    return [
        *DRIFT_RECIPES[args.drift_recipe], "--t-in", "5", "--t-out", "16", "--split", "pdebench",
        "--batch-size", str(args.batch_size), "--epochs", str(args.epochs), "--no-plots", "--no-progress",
    ]  # fmt: skip


def run_drift(args, data: Path, seed: int, nproc: int, threads: int) -> dict:
    out = args.out / f"drift_{args.drift_recipe}_p{nproc}_{seed}"
    shutil.rmtree(out, ignore_errors=True)  # an interrupted run's: this one is not recorded
    drift = [sys.executable, "-m", "drift"]
    command = [*drift, "train", "--data", str(data), "--nproc", str(nproc), "--seed", str(seed), "--out", str(out)]
    began = time.perf_counter()
    subprocess.run([*command, *drift_options(args)], check=True, capture_output=True, env=env(threads))
    wall = time.perf_counter() - began
    history = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    tests = int(args.trajectories * 0.1)
    pred = out / "pred.hdf5"
    predict = [*drift, "predict", str(out), "--data", str(data), "--out", str(pred), "--force"]
    subprocess.run([*predict, "--trajectories", f"0-{tests - 1}"], check=True, capture_output=True, env=env(threads))
    score = [args.pdebench_python, str(HERE / "peers" / "pdebench_fno.py"), "score", "--src", args.pdebench_src]
    done = subprocess.run(
        [*score, "--data", str(data), "--pred", str(pred)], check=True, capture_output=True, text=True, env=env(threads)
    )
    metrics = json.loads(done.stdout.strip().splitlines()[-1])
    epochs, options = [r["seconds"] for r in history], drift_options(args)
    return dict(side=f"drift P={nproc}", seed=seed, options=options, epochs_s=epochs, wall_s=wall, **metrics)


def drift_parameters(args, data: Path) -> tuple[int, int]:
    """drift's model's parameters: tensor elements (a complex one counts once, as PDEBench's count) and
    real numbers (a complex one counts twice)."""
    options = vars(build_parser().parse_args(["train", "--data", str(data), *drift_options(args)]))
    model = FNO(**fno_options(resolve_problem(config_from(options))))
    params = list(model.parameters())
    return sum(p.numel() for p in params), sum(p.numel() * (2 if p.is_complex() else 1) for p in params)


def spread(values: list[float]) -> str:
    mean = statistics.fmean(values)
    return f"{mean:.4f} ({min(values):.4f}-{max(values):.4f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pdebench-python", required=True)
    parser.add_argument("--pdebench-src", required=True)
    parser.add_argument("--trajectories", type=int, default=20)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--beside", type=int, default=4, help="drift's ranks in the run beside (0: none)")
    parser.add_argument("--drift-recipe", choices=DRIFT_RECIPES, default="autoregressive")
    parser.add_argument("--out", type=Path, default=Path("results/pdebench_recipe"))
    args = parser.parse_args()
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    data = subset(ensure_default_data(False), args.out / f"cfd3d_first{args.trajectories}.hdf5", args.trajectories)

    # Each run is recorded as it ends; a run of the same settings already recorded is not run again, so a
    # sweep longer than one sitting resumes where it stopped.
    record_path = args.out / "pdebench_recipe.json"
    settings = {k: v for k, v in vars(args).items() if k not in ("seeds", "out", "beside", "drift_recipe")}
    settings = json.loads(json.dumps(settings, default=str))
    record = json.loads(record_path.read_text()) if record_path.exists() else {}
    runs = record.get("runs", []) if record.get("settings") == settings else []
    params, real = drift_parameters(args, data)

    def mine(r: dict) -> bool:  # a run of this comparison: PDEBench's, or drift's with this recipe's options
        return r["side"] == "pdebench" or r.get("options") == drift_options(args)

    def run(side: str, seed: int, call) -> None:
        if any(r["side"] == side and r["seed"] == seed and mine(r) for r in runs):
            print(f"{side} seed {seed}: recorded", flush=True)
            return
        theirs = [r["params"] for r in runs if r["side"] == "pdebench"]
        if side != "pdebench" and theirs and params > theirs[0]:
            raise SystemExit(f"drift's {args.drift_recipe} model: {params:,} parameters, PDEBench's {theirs[0]:,}")
        began = time.strftime("%H:%M:%S")
        result = call()
        runs.append(result)
        record_path.write_text(json.dumps(dict(settings=settings, runs=runs), indent=1))
        print(f"{began} {side} seed {seed}: nRMSE {result['nrmse']:.4f}, epochs {result['epochs_s']}", flush=True)

    for i, seed in enumerate(args.seeds):
        sides = ["pdebench", "drift P=1"] if i % 2 == 0 else ["drift P=1", "pdebench"]
        for side in sides:
            if side == "pdebench":
                run(side, seed, lambda seed=seed: run_pdebench(args, data, seed))
            else:
                run(side, seed, lambda seed=seed: run_drift(args, data, seed, 1, args.threads))
    if args.beside:
        seed = args.seeds[0]
        run(f"drift P={args.beside}", seed, lambda: run_drift(args, data, seed, args.beside, 1))
    runs = [r for r in runs if r["seed"] in args.seeds and mine(r)]

    pde = [r for r in runs if r["side"] == "pdebench"]
    one = [r for r in runs if r["side"] == "drift P=1"]
    epoch = {name: statistics.median(s for r in rs for s in r["epochs_s"]) for name, rs in (("pde", pde), ("one", one))}
    nrmse = {name: [r["nrmse"] for r in rs] for name, rs in (("pde", pde), ("one", one))}
    print(f"\n{torch.get_num_threads()} threads available to torch here; each side ran on {args.threads}")
    print(f"data: the first {args.trajectories} trajectories of the default 3-D CFD set; test: PDEBench's first "
          f"{int(args.trajectories * 0.1)}; {args.epochs} epoch(s), batch {args.batch_size}\n")  # fmt: skip
    print(f"| | PDEBench FNO3d (its train.py) | drift {args.drift_recipe} | drift / PDEBench |")
    print("|---|---|---|---|")
    print(f"| parameters (tensor elements; real numbers) | {pde[0]['params']:,}; {pde[0]['real_params']:,} "
          f"| {params:,}; {real:,} | {params / pde[0]['params']:.2f} |")  # fmt: skip
    print(
        f"| nRMSE, frames 5-20, mean of {len(args.seeds)} seeds (min-max) | {spread(nrmse['pde'])} "
        f"| {spread(nrmse['one'])} | {statistics.fmean(nrmse['one']) / statistics.fmean(nrmse['pde']):.3f} |"
    )
    print(f"| epoch, one process, {args.threads} threads (median) | {epoch['pde']:.1f} s | {epoch['one']:.1f} s "
          f"| {epoch['pde'] / epoch['one']:.2f}x faster |")  # fmt: skip
    beside = [r for r in runs if r["side"].startswith("drift P=") and r["side"] != "drift P=1"]
    if beside:
        b = beside[0]
        print(
            f"| drift on {args.beside} ranks (seed {b['seed']}) | | nRMSE {b['nrmse']:.4f}, epoch "
            f"{statistics.median(b['epochs_s']):.1f} s | {epoch['pde'] / statistics.median(b['epochs_s']):.2f}x |"
        )


if __name__ == "__main__":
    main()
