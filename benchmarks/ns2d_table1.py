"""Li et al.'s Table 1, approached: FNO-2D (autoregressive) and FNO-3D (one-shot) on 2-D Navier-Stokes,
drift against neuraloperator's FNO, at several numbers of training trajectories.

The FNO paper's setting (its Table 1, viscosity 1e-3, T = 50): 64^2 vorticity, the first 10 frames in,
the next 40 predicted; FNO-2D rolls one frame out at a time (modes 12, width 20, 4 layers), FNO-3D
predicts the 40 at once with time as a third dim (modes 8). The data are ``drift generate --problem ns2d``
files (``--train`` in order, whose first n trajectories train; ``--test``, every trajectory held out).

drift trains with ``drift train`` (``--model plain``: Li's blocks; the autoregressive recipe's loss counts
every unrolled frame, its gradient through the whole unroll, as Li's ``fourier_2d_time.py``; ``--loss
relative-l2``). neuraloperator's ``FNO`` (its defaults but the paper's sizes) is trained here by the same
recipe: the same frames in, the same unroll and loss (each trajectory's relative L2 over all its
predicted frames, averaged over the batch), AdamW at the same rate, weight decay and per-step cosine,
batch and epochs, inputs and targets normalised per channel by the training trajectories' mean and
standard deviation, as drift does.
Both are scored here by one function on the physical test fields: Li's metric, each test trajectory's
relative L2 over its predicted frames (x, y, t together), averaged. drift's predictions come from ``drift
predict``.

    python benchmarks/ns2d_table1.py --train data/table1/ns_v1e-3_T50_seed{0,1,2,3}.h5 \
        --test data/table1/ns_v1e-3_T50_seed{100,101}.h5 --sizes 100 200 400 --epochs 20

Prints a markdown table and writes ``<out>/ns2d_table1.json`` after every run, its rows under a tag of the
setting (the files, frames, epochs, batch, rate and ranks; the subsets and drift's runs are in
``<out>/<tag>``): run again with the same setting, it skips the runs that file holds (a long sweep can stop
and go on).

The paper's figures at this setting (1,000 training trajectories, 500 epochs; Li et al., Table 1, the
column viscosity 1e-3, T = 50, N = 1000): FNO-3D 0.0086, FNO-2D 0.0128.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import torch

from drift.nn import neuralop_n_modes
from drift.recipes import model_input

MODELS = {"fno2d": dict(recipe="autoregressive", modes=12), "fno3d": dict(recipe="one-shot", modes=8)}


def modes_of(name: str, t_out: int) -> tuple[int, ...]:
    """Li et al.'s k per model dim; FNO-3D's time modes at most what ``t_out`` frames hold."""
    k = MODELS[name]["modes"]
    return (k, k) if name == "fno2d" else (k, k, min(k, t_out // 2 + 1))


def frames(paths: list[str], count: int | None = None) -> torch.Tensor:
    """The first ``count`` trajectories (default all) of ``paths``, in order: ``(N, T, X, Y)`` float32."""
    parts, left = [], count
    for path in paths:
        with h5py.File(path, "r") as f:
            take = f["tensor"].shape[0] if left is None else min(left, f["tensor"].shape[0])
            parts.append(torch.from_numpy(f["tensor"][:take]))
        if left is not None and (left := left - take) == 0:
            break
    return torch.cat(parts)


def subset(paths: list[str], count: int, out: Path, name: str = "train") -> Path:
    """A file of the first ``count`` trajectories of ``paths`` (with the first file's coordinates)."""
    path = out / f"{name}_{count}.h5"
    if not path.exists():
        data, partial = frames(paths, count).numpy(), path.with_suffix(".partial")
        with h5py.File(paths[0], "r") as src, h5py.File(partial, "w") as f:
            f.create_dataset("tensor", data=data)
            for key in ("x-coordinate", "y-coordinate", "t-coordinate"):
                f.create_dataset(key, data=src[key][()])
            f.attrs.update(dict(src.attrs))
        os.replace(partial, path)
    return path


def rel_l2(pred: torch.Tensor, true: torch.Tensor) -> float:
    """Li's metric: each trajectory's relative L2 over all its predicted values, averaged."""
    diff = (pred - true).double().flatten(1).norm(dim=1)
    return float((diff / true.double().flatten(1).norm(dim=1)).mean())


def run(command: list[str]) -> None:
    """``command``, raising with the end of its error output if it fails."""
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command[:4])} ... failed ({done.returncode}):\n{done.stderr[-3000:]}")


def run_drift(args, name: str, train: Path, test: torch.Tensor, seed: int) -> dict:
    out = train.parent / f"drift_{name}_{train.stem}_{seed}"
    spec = MODELS[name]
    monitor = subset(args.test, args.monitor, train.parent, "monitor")  # drift train's own test pass, each epoch
    command = [sys.executable, "-m", "drift", "train", "--data", str(train), "--test-data", str(monitor),
               "--out", str(out), "--nproc", str(args.nproc), "--model", "plain", "--width", "20", "--layers", "4",
               "--recipe", spec["recipe"], "--t-in", str(args.t_in), "--t-out", str(args.t_out),
               "--modes", ",".join(map(str, modes_of(name, args.t_out))), "--batch-size", str(args.batch_size),
               "--epochs", str(args.epochs),
               "--lr", str(args.lr), "--loss", "relative-l2", "--seed", str(seed), "--no-plots",
               "--no-progress"]  # fmt: skip
    if spec["recipe"] == "autoregressive":
        command += ["--target", args.target]
    start = time.perf_counter()
    run(command)
    seconds = time.perf_counter() - start
    predicted = out / "predicted.h5"
    predict = [sys.executable, "-m", "drift", "predict", str(out), "--data", *args.test, "--out", str(predicted),
               "--force", "--no-progress"]  # fmt: skip
    run(predict)
    with h5py.File(predicted, "r") as f:
        pred = torch.from_numpy(f["tensor"][:, args.t_in : args.t_in + args.t_out])
    return dict(side="drift", model=name, seed=seed, train_s=seconds, rel_l2=rel_l2(pred, test))


def run_neuralop(args, name: str, train: torch.Tensor, test: torch.Tensor, seed: int) -> dict:
    from neuralop.models import FNO as NeuralopFNO

    torch.manual_seed(seed)
    spec, t_in, t_out = MODELS[name], args.t_in, args.t_out
    mean, std = train.mean(), train.std()  # one channel: its statistics over the training trajectories
    norm = lambda v: (v - mean) / std  # noqa: E731
    x, y = norm(train[:, :t_in]), norm(train[:, t_in : t_in + t_out])
    one_shot = spec["recipe"] == "one-shot"
    grid = tuple(train.shape[2:]) + ((t_out,) if one_shot else ())
    n_modes = neuralop_n_modes(grid, modes_of(name, t_out))
    model = NeuralopFNO(n_modes=n_modes, in_channels=t_in + one_shot, out_channels=1, hidden_channels=20, n_layers=4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=1e-4)
    steps = args.epochs * -(-len(x) // args.batch_size)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=steps)

    def forward(batch: torch.Tensor) -> torch.Tensor:
        """(b, t_in, X, Y) normalised frames -> (b, t_out, X, Y) predicted ones."""
        if one_shot:
            return model(model_input(batch.unsqueeze(1), t_out))[:, 0].movedim(-1, 1)
        window, out = batch, []
        for _ in range(t_out):
            step = model(window) + (window[:, -1:] if args.target == "increment" else 0)
            out.append(step)
            window = torch.cat([window[:, 1:], step], 1)
        return torch.cat(out, 1)

    def loss_of(pred: torch.Tensor, true: torch.Tensor) -> torch.Tensor:
        return ((pred - true).flatten(1).norm(dim=1) / true.flatten(1).norm(dim=1)).mean()

    start = time.perf_counter()
    for _ in range(args.epochs):
        order = torch.randperm(len(x))
        for i in range(0, len(x), args.batch_size):
            chosen = order[i : i + args.batch_size]
            optimizer.zero_grad()
            loss_of(forward(x[chosen]), y[chosen]).backward()
            optimizer.step()
            schedule.step()
    seconds = time.perf_counter() - start
    with torch.no_grad():
        xs = norm(test[:, :t_in])
        pred = torch.cat([forward(xs[i : i + args.batch_size]) for i in range(0, len(xs), args.batch_size)])
    pred = pred * std + mean
    return dict(side="neuralop", model=name, seed=seed, train_s=seconds, rel_l2=rel_l2(pred, test[:, t_in:]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--train", nargs="+", required=True, help="drift generate --problem ns2d files, in order")
    parser.add_argument("--test", nargs="+", required=True, help="held-out files (every trajectory)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 200, 400], help="training trajectories")
    parser.add_argument("--models", nargs="+", choices=tuple(MODELS), default=list(MODELS))
    parser.add_argument("--t-in", type=int, default=10)
    parser.add_argument("--t-out", type=int, default=40)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=20)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument(
        "--target",
        choices=("state", "increment"),
        default="state",
        help="FNO-2D's output: the next frame (Li's) or its change from the last input frame",
    )
    parser.add_argument(
        "--monitor",
        type=int,
        default=10,
        help="test trajectories drift train scores each epoch (the table scores all of --test)",
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--nproc", type=int, default=1, help="drift's ranks")
    parser.add_argument("--out", type=Path, default=Path("results/ns2d_table1"))
    args = parser.parse_args()
    kept = ("t_in", "t_out", "epochs", "batch_size", "lr", "nproc", "target")
    setting = {k: v for k, v in vars(args).items() if k in kept}
    setting |= {k: [os.path.abspath(p) for p in getattr(args, k)] for k in ("train", "test")}
    tag = hashlib.sha1(json.dumps(setting, sort_keys=True).encode()).hexdigest()[:10]
    work = args.out / tag
    work.mkdir(parents=True, exist_ok=True)
    record_path = args.out / "ns2d_table1.json"
    record = json.loads(record_path.read_text()) if record_path.exists() else {}
    rows = record.setdefault(tag, dict(setting=setting, rows=[]))["rows"]
    if rows:
        print(f"{len(rows)} runs of setting {tag} done before: not run again", flush=True)
    test = frames(args.test)[:, : args.t_in + args.t_out]
    target = test[:, args.t_in :]
    for size in args.sizes:
        train_file = subset(args.train, size, work)
        train = frames([str(train_file)])[:, : args.t_in + args.t_out]
        for name in args.models:
            for seed in args.seeds:
                for side in ("drift", "neuralop"):
                    key = dict(side=side, model=name, seed=seed, trajectories=size)
                    if any(key.items() <= row.items() for row in rows):
                        continue
                    if side == "drift":
                        row = run_drift(args, name, train_file, target, seed)
                    else:
                        row = run_neuralop(args, name, train, test, seed)
                    rows.append(dict(row, trajectories=size))
                    print(json.dumps(rows[-1]), flush=True)
                    partial = record_path.with_suffix(".partial")
                    partial.write_text(json.dumps(record, indent=1))
                    os.replace(partial, record_path)  # whole or not at all, should the sweep be killed
    print("\n| training trajectories | model | drift rel. L2 | neuraloperator rel. L2 | drift / neuraloperator |")
    print("|---|---|---|---|---|")
    for size in args.sizes:
        for name in args.models:
            runs = [r for r in rows if (r["model"], r["trajectories"]) == (name, size) and r["seed"] in args.seeds]
            got = {side: np.mean([r["rel_l2"] for r in runs if r["side"] == side]) for side in ("drift", "neuralop")}
            ratio = got["drift"] / got["neuralop"]
            print(f"| {size} | {name} | {got['drift']:.4f} | {got['neuralop']:.4f} | {ratio:.2f} |")


if __name__ == "__main__":
    main()
