"""neuraloperator's ``FNO`` trained by its own ``Trainer`` against ``drift train`` on 2-D problems.

The same files (``drift generate``: Darcy, ``--layout darcy --dims 2``, and a 2-D CFD, ``--layout cfd --dims
2``, whose problem here is the 5 first frames of the four fields to the next frame), the same training and
test trajectories (drift's ``--split last``: the last 10%, rounded), the same architecture (``drift train
--model neuralop`` against ``neuralop.models.FNO`` with its defaults, ``n_modes`` drift's ``--modes`` in
neuraloperator's terms, ``drift.nn.neuralop_n_modes``; the parameter counts are checked
equal), batch size, epochs, optimizer (AdamW, learning rate 3e-3, weight decay 1e-4, cosine-annealed to 0:
drift per step, neuraloperator's Trainer per epoch) and seeds. neuraloperator's side is its usual pipeline:
the data read into tensors, ``UnitGaussianNormalizer`` per channel in a ``DefaultDataProcessor``,
``Trainer`` with ``LpLoss`` (relative L2) to train and ``LpLoss``/``H1Loss`` to evaluate each epoch. drift's
side is ``drift train --nproc 1 --recompute mlp`` (its own loss, normalisation and test pass; the channel
MLPs' tails as one kernel, ``--drift-recompute ''`` for the stored path). Both final models are scored
here by one function on the physical test fields: PDEBench's nRMSE (``metric_func``'s: each trajectory's,
channel's and frame's RMSE over its RMS, averaged); drift's through ``drift export`` and
``drift.load_exported``.

An epoch's time is the whole epoch in one process on ``--threads`` threads: drift's ``metrics.jsonl``
seconds (its reads of the file, the steps, the test pass and the checkpoint); neuraloperator's from the
start of ``Trainer.train_one_epoch`` to the end of ``evaluate_all`` (its data are tensors in memory,
read before: that read is reported beside). The two sides alternate seed by seed, the order swapped
each seed; medians over every epoch.

    python benchmarks/neuralop_trainer.py --problems darcy cfd --epochs 2 --seeds 0 1 2

Prints a markdown table per problem and writes ``<out>/neuralop_trainer.json``.
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

import drift
from drift.nn import FNO, NEURALOP_DEFAULTS, neuralop_n_modes

CFD_FIELDS = ("density", "pressure", "Vx", "Vy")
T_IN = 5


def generate(problem: str, out: Path, resolution: int, samples: int) -> Path:
    path = out / f"{problem}_{resolution}_{samples}.h5"
    if not path.exists():
        command = [sys.executable, "-m", "drift", "generate", "--layout", problem, "--dims", "2", "--no-progress",
                   "--resolution", str(resolution), "--samples", str(samples), "--out", str(path)]  # fmt: skip
        if problem == "cfd":
            command += ["--frames", str(T_IN + 1)]
        subprocess.run(command, check=True, capture_output=True)
    return path


def read(problem: str, path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """Every trajectory's input ``x`` (N, channels, X, Y) and target ``y`` (N, channels, X, Y), physical."""
    with h5py.File(path, "r") as f:
        if problem == "darcy":
            return torch.from_numpy(f["nu"][...]).unsqueeze(1), torch.from_numpy(f["tensor"][...])
        fields = [torch.from_numpy(f[name][:, : T_IN + 1]) for name in CFD_FIELDS]  # N, T, X, Y each
    frames = torch.stack(fields, 1)  # N, C, T, X, Y
    return frames[:, :, :T_IN].flatten(1, 2), frames[:, :, T_IN]


def nrmse(pred: torch.Tensor, true: torch.Tensor) -> float:
    """PDEBench's nRMSE (metric_func's): per trajectory and channel, RMSE over the RMS of the truth; the
    mean over trajectories, then channels."""
    err = (pred - true).double().square().flatten(2).mean(-1).sqrt()
    return float((err / true.double().square().flatten(2).mean(-1).sqrt()).mean())


def env(threads: int) -> dict:
    return dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))


def run_drift(args, problem: str, path: Path, seed: int, x_test: torch.Tensor, y_test: torch.Tensor) -> dict:
    out = args.out / f"drift_{problem}_{seed}"
    shutil.rmtree(out, ignore_errors=True)  # an earlier run's folder: drift train would resume it
    command = [sys.executable, "-m", "drift", "train", "--data", str(path), "--nproc", "1", "--out", str(out),
               "--seed", str(seed), "--width", str(args.width), "--modes", str(args.modes), "--batch-size",
               str(args.batch_size), "--epochs", str(args.epochs), "--lr", str(args.lr), "--no-plots",
               "--no-progress", "--loss", args.drift_loss]  # fmt: skip
    if args.drift_recompute:
        command += ["--recompute", args.drift_recompute]
    if problem == "cfd":
        command += ["--recipe", "autoregressive", "--t-in", str(T_IN), "--t-out", "1"]
    subprocess.run(command, check=True, capture_output=True, env=env(args.threads))
    history = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    exported = out / "model.pt"
    export = [sys.executable, "-m", "drift", "export", str(out), str(exported)]
    subprocess.run(export, check=True, capture_output=True, env=env(args.threads))
    predictor = drift.load_exported(exported)
    with torch.no_grad():
        frames = x_test.unsqueeze(2) if problem == "darcy" else x_test.unflatten(1, (len(CFD_FIELDS), T_IN))
        pred = torch.cat([predictor(frames[i : i + args.batch_size]) for i in range(0, len(frames), args.batch_size)])
    params = sum(p.numel() for p in predictor.model.parameters()) if hasattr(predictor, "model") else None
    return dict(side="drift", seed=seed, epochs_s=[r["seconds"] for r in history], nrmse=nrmse(pred[:, :, 0], y_test),
                params=params)  # fmt: skip


def run_neuralop(args, seed: int, x: torch.Tensor, y: torch.Tensor, n_test: int) -> dict:
    from neuralop import Trainer
    from neuralop.data.transforms.data_processors import DefaultDataProcessor
    from neuralop.data.transforms.normalizers import UnitGaussianNormalizer
    from neuralop.losses import H1Loss, LpLoss
    from neuralop.models import FNO as NeuralopFNO

    marks: list[tuple[float, float]] = []

    class TimedTrainer(Trainer):
        """neuraloperator's Trainer, timing each epoch from its training pass's start to its evaluation's end."""

        def train_one_epoch(self, *a, **k):
            self._began = time.perf_counter()
            return super().train_one_epoch(*a, **k)

        def evaluate_all(self, *a, **k):
            result = super().evaluate_all(*a, **k)
            marks.append((self._began, time.perf_counter()))
            return result

    began = time.perf_counter()
    x_train, y_train, x_test, y_test = x[:-n_test], y[:-n_test], x[-n_test:], y[-n_test:]
    in_norm, out_norm = UnitGaussianNormalizer(dim=[0, 2, 3]), UnitGaussianNormalizer(dim=[0, 2, 3])
    in_norm.fit(x_train)
    out_norm.fit(y_train)
    processor = DefaultDataProcessor(in_norm, out_norm)
    train = [dict(x=a, y=b) for a, b in zip(x_train, y_train, strict=True)]
    test = [dict(x=a, y=b) for a, b in zip(x_test, y_test, strict=True)]
    torch.manual_seed(seed)
    n_modes = neuralop_n_modes(tuple(x.shape[2:]), (args.modes, args.modes))  # drift's modes in its terms
    model = NeuralopFNO(n_modes=n_modes, in_channels=x.shape[1], out_channels=y.shape[1],
                        hidden_channels=args.width)  # fmt: skip
    loader = torch.utils.data.DataLoader(train, batch_size=args.batch_size, shuffle=True)
    test_loader = torch.utils.data.DataLoader(test, batch_size=args.batch_size, shuffle=False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=1e-4)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs)
    l2, h1 = LpLoss(d=2, p=2), H1Loss(d=2)
    prepared = time.perf_counter() - began
    trainer = TimedTrainer(model=model, n_epochs=args.epochs, data_processor=processor, eval_interval=1)
    trainer.train(loader, {"test": test_loader}, optimizer, scheduler, training_loss=l2,
                  eval_losses=dict(l2=l2, h1=h1))  # fmt: skip
    model.eval()
    processor.eval()
    with torch.no_grad():
        pred = torch.cat([processor.postprocess(model(in_norm.transform(x_test[i : i + args.batch_size])), {})[0]
                          for i in range(0, n_test, args.batch_size)])  # fmt: skip
    return dict(side="neuralop", seed=seed, epochs_s=[b - a for a, b in marks], nrmse=nrmse(pred, y_test),
                params=sum(p.numel() for p in model.parameters()), prepare_s=prepared)  # fmt: skip


def drift_parameters(args, channels: tuple[int, int]) -> int:
    model = FNO(in_channels=channels[0], out_channels=channels[1], width=args.width, modes=(args.modes,) * 2,
                n_layers=4, **NEURALOP_DEFAULTS)  # fmt: skip
    return sum(p.numel() for p in model.parameters())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--problems", nargs="+", default=["darcy", "cfd"], choices=["darcy", "cfd"])
    parser.add_argument("--resolution", type=int, nargs="+", default=[128, 64], help="per problem")
    parser.add_argument("--samples", type=int, default=80)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--modes", type=int, default=12)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument(
        "--drift-loss",
        default="relative-l2",
        help="drift train --loss (relative-l2: the loss neuraloperator's LpLoss is)",
    )
    parser.add_argument(
        "--drift-recompute",
        default="mlp",
        help="drift train --recompute ('' for none; mlp: the channel-MLP tails as one kernel, less time a step)",
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("results/neuralop_trainer"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    report = {}
    for problem, resolution in zip(args.problems, args.resolution, strict=False):
        path = generate(problem, args.out, resolution, args.samples)
        began = time.perf_counter()
        x, y = read(problem, path)
        read_s = time.perf_counter() - began
        n_test = max(1, round(0.1 * len(x)))
        runs = []
        for i, seed in enumerate(args.seeds):
            for side in ("drift", "neuralop") if i % 2 == 0 else ("neuralop", "drift"):
                if side == "drift":
                    result = run_drift(args, problem, path, seed, x[-n_test:], y[-n_test:])
                else:
                    result = run_neuralop(args, seed, x, y, n_test)
                runs.append(result)
                print(f"{problem} {side} seed {seed}: nRMSE {result['nrmse']:.4f}, epochs {result['epochs_s']}",
                      flush=True)  # fmt: skip
        report[problem] = dict(runs=runs, read_s=read_s, shape=list(x.shape), n_test=n_test)
        d = [r for r in runs if r["side"] == "drift"]
        n = [r for r in runs if r["side"] == "neuralop"]
        drift_params = drift_parameters(args, (x.shape[1], y.shape[1]))
        ep_d = statistics.median(s for r in d for s in r["epochs_s"])
        ep_n = statistics.median(s for r in n for s in r["epochs_s"])
        nd, nn = [r["nrmse"] for r in d], [r["nrmse"] for r in n]
        print(f"\n{problem}, {resolution}^2: {len(x) - n_test} training and {n_test} test samples, batch "
              f"{args.batch_size}, {args.epochs} epochs, seeds {args.seeds}; {args.threads} threads each "
              f"(this machine: {os.cpu_count()} cores)\n")  # fmt: skip
        print("| | neuraloperator FNO + Trainer | drift train --nproc 1 | ratio |")
        print("|---|---|---|---|")
        print(f"| parameters | {n[0]['params']:,} | {drift_params:,} | {drift_params / n[0]['params']:.3f} |")
        print(f"| test nRMSE, mean (min-max) | {statistics.fmean(nn):.4f} ({min(nn):.4f}-{max(nn):.4f}) | "
              f"{statistics.fmean(nd):.4f} ({min(nd):.4f}-{max(nd):.4f}) | "
              f"{statistics.fmean(nd) / statistics.fmean(nn):.3f} |")  # fmt: skip
        print(f"| epoch (median), data and evaluation included | {ep_n:.2f} s | {ep_d:.2f} s | "
              f"drift {ep_n / ep_d:.2f}x faster |")  # fmt: skip
        print(f"| neuraloperator's one read of the file into tensors, before its epochs | {read_s:.2f} s | | |\n")
    (args.out / "neuralop_trainer.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
