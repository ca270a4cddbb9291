"""Test error of ``drift train`` against neuraloperator 2.0's default FNO on the same data, split and budget.

Runs ``drift train`` (``--nproc`` ranks, its defaults unless more options follow) and then trains
neuraloperator's own ``FNO`` with its default options in this one process, on the same problem as the
drift run recorded it (data file, split, t_in -> t_out, width, modes as neuraloperator's ``n_modes``,
layers, seed): the same trajectories read by drift's ``Trajectories`` loader with the same normalisation,
the same batches in the same order, the same loss (``--loss``: the MSE of the normalised fields, or with
``frame-weighted`` each field and frame weighted as ``drift.train.frame_weights``), optimizer, learning-rate
schedule and number of optimizer steps. Both are scored by drift's test relative L2 and PDEBench's nRMSE
(``drift.metrics``) after the last epoch; the wall-clock of each is recorded next to it.

    python benchmarks/accuracy.py [--nproc 4] [--out results/accuracy] [drift train options ...]
    python benchmarks/accuracy.py --drift-run runs/train   # compare with a finished drift train run

Prints a markdown table and writes ``<out>/accuracy.json``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch
from torch.nn import functional as F

from drift.checkpoint import read_meta
from drift.data import FIELDS, Trajectories, read_layout
from drift.nn import neuralop_n_modes
from drift.train import (
    META_KEYS,
    TEST_METRICS,
    Sharding,
    config_from,
    ensure_default_data,
    find_checkpoint,
    frame_weights,
    make_optimizer,
    model_input,
    model_target,
    pdebench_metrics,
    relative_l2,
    saved_config,
    set_learning_rate,
)


def run_drift(out: Path, nproc: int, options: list[str]) -> dict:
    """``drift train --nproc nproc --out out options``: its history, final metrics, config and wall-clock."""
    began = time.perf_counter()
    command = [sys.executable, "-m", "drift", "train", "--nproc", str(nproc), "--out", str(out), *options]
    subprocess.run(command, check=True)
    return dict(read_drift(out), command=" ".join(["drift", *command[3:]]), wall_s=time.perf_counter() - began)


def read_drift(out: Path) -> dict:
    """A finished ``drift train`` run in ``out``: its history, final metrics, config and ranks."""
    history = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    final = json.loads((out / TEST_METRICS).read_text())
    meta = read_meta(find_checkpoint(out), META_KEYS)
    return dict(
        command=f"drift train (the run in {out})",
        config=saved_config(meta),
        ranks=meta["world_size"],
        wall_s=sum(r["seconds"] for r in history),
        s_per_epoch=sorted(r["seconds"] for r in history)[len(history) // 2],
        test_rel_l2=final["test_rel_l2"],
        nrmse=final["pdebench"]["nrmse"],
        history=history,
    )


def run_neuralop(saved: dict) -> dict:
    """neuraloperator's default ``FNO`` trained on the problem of the drift run whose config is ``saved``."""
    from neuralop.models import FNO

    config = config_from(saved)
    _, _, *extents = read_layout(config.data)
    options = dict(t_in=config.t_in, t_out=config.t_out, split_rule=config.split)
    train_set = Trajectories(config.data, **options)
    test_set = Trajectories(config.data, split="test", stats=train_set.stats, **options)
    torch.manual_seed(config.seed)
    model = FNO(
        n_modes=neuralop_n_modes((*extents, config.t_out), config.modes),
        in_channels=len(FIELDS) * config.t_in + 1,
        out_channels=len(FIELDS),
        hidden_channels=config.width,
        n_layers=config.layers,
    )
    optimizer = make_optimizer(config, model)
    weights = frame_weights(train_set, 1, "cpu") if config.loss == "frame-weighted" else None
    steps = -(-len(train_set) // config.batch_size)
    history, began = [], time.perf_counter()
    for epoch in range(config.epochs):
        start = time.perf_counter()
        # drift train's order of batches (the same generator and seed).
        order = torch.randperm(len(train_set), generator=torch.Generator().manual_seed(config.seed * 100_003 + epoch))
        total = 0.0
        model.train()
        for step, first in enumerate(range(0, len(order), config.batch_size)):
            pairs = [train_set[i] for i in order[first : first + config.batch_size].tolist()]
            x = model_input(torch.stack([p[0] for p in pairs]), config.t_out)
            y = model_target(torch.stack([p[1] for p in pairs]))
            set_learning_rate(optimizer, config, epoch * steps + step, config.epochs * steps)
            pred = model(x)
            loss = F.mse_loss(pred, y) if weights is None else ((pred - y).square() * weights).mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total += float(loss.detach()) * len(pairs)
        model.eval()
        last = epoch == config.epochs - 1
        metrics = pdebench_metrics(test_set, "cpu") if last else None
        test_l2 = relative_l2(model, test_set, Sharding(None, ()), config.batch_size, "cpu", metrics)
        row = dict(
            epoch=epoch + 1,
            train_loss=total / len(train_set),
            test_rel_l2=test_l2,
            seconds=time.perf_counter() - start,
        )
        history.append(row)
        print(
            f"neuraloperator epoch {epoch + 1:3d}/{config.epochs}  loss {row['train_loss']:.5f}  "
            f"test rel L2 {test_l2:.4f}  {row['seconds']:5.1f} s",
            flush=True,
        )
    return dict(
        threads=torch.get_num_threads(),
        parameters=sum(p.numel() * (2 if p.is_complex() else 1) for p in model.parameters()),
        wall_s=time.perf_counter() - began,
        s_per_epoch=sorted(r["seconds"] for r in history)[len(history) // 2],
        test_rel_l2=test_l2,
        nrmse=metrics.compute()["nrmse"],
        history=history,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=4, help="drift's ranks")
    parser.add_argument("--out", type=Path, default=Path("results/accuracy"))
    parser.add_argument("--drift-run", type=Path, help="a finished drift train run to compare with (no new drift run)")
    args, drift_options = parser.parse_known_args()
    if args.drift_run is not None:
        drift = read_drift(args.drift_run)
    else:
        if "--data" not in drift_options:
            ensure_default_data()
        drift = run_drift(args.out / "drift", args.nproc, drift_options)
    theirs = run_neuralop(drift["config"])
    report = dict(drift=drift, neuraloperator=theirs)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "accuracy.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    config = drift["config"]
    print(
        f"\n{drift['command']}: {config['epochs']} epochs, batch {config['batch_size']}, lr {config['lr']} "
        f"({config['schedule']}), weight decay {config['weight_decay']}, split {config['split']}, loss {config['loss']}"
    )
    print("| model | test rel L2 | nRMSE | s/epoch (median) | wall-clock |")
    print("|---|---|---|---|---|")
    print(
        f"| drift `--model {config['model']}`, {drift['ranks']} ranks | {drift['test_rel_l2']:.4f} | "
        f"{drift['nrmse']:.4f} | {drift['s_per_epoch']:.1f} | {drift['wall_s']:.0f} s |"
    )
    print(
        f"| neuraloperator 2.0 `FNO`, defaults, 1 process ({theirs['threads']} threads) | "
        f"{theirs['test_rel_l2']:.4f} | {theirs['nrmse']:.4f} | {theirs['s_per_epoch']:.1f} | "
        f"{theirs['wall_s']:.0f} s |"
    )


if __name__ == "__main__":
    main()
