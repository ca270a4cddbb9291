"""PDEBench's own FNO recipe, run from a PDEBench source tree in PDEBench's own Python (not drift's).

Two commands, each printing one JSON line:

    python pdebench_fno.py train --src PDEBENCH --data FILE --epochs E --batch-size B --seed S --workdir DIR
    python pdebench_fno.py score --src PDEBENCH --data FILE --pred PRED.hdf5

``train`` calls PDEBench's ``pdebench.models.fno.train.run_training`` unchanged, with the arguments of its
``config_3DCFD.yaml`` (FNO3d, modes 12, width 20, Adam at 1e-3 with weight decay 1e-4, StepLR every 100
epochs by 0.5, ``model_update`` 1) but for the data path, the epochs, the batch size and ``initial_step``
(5), in one process on ``--threads`` threads (``num_workers`` 0). Its epochs are timed by a ``StepLR``
that records the clock at each ``step()`` (run_training steps it once at the end of each epoch, after its
validation pass and checkpoint); nothing in PDEBench's code is changed. PDEBench's training keeps the
checkpoint of the epoch with the lowest validation loss (its validation set is its test set, the first
``int(10%)`` trajectories): that checkpoint is then scored as PDEBench's ``metrics()`` scores it (its
autoregressive rollout from the first ``initial_step`` frames to the last), with ``metric_func`` over every
test trajectory at once (``metrics()`` sums per-batch means and divides by the last batch index).

``score`` reads a prediction file in PDEBench's layout (``drift predict``'s output: the first
``initial_step`` frames copied, then the predicted ones) and the truth with PDEBench's ``FNODatasetSingle``
(the truth's test split: its first ``int(10%)`` trajectories) and scores it with the same ``metric_func``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

INITIAL_STEP = 5


def _metric(pred, target, initial_step: int) -> dict:
    from pdebench.models.metrics import metric_func

    mean = metric_func(pred, target, if_mean=True, initial_step=initial_step)
    full = metric_func(pred, target, if_mean=False, initial_step=initial_step)
    names = ("rmse", "nrmse", "csv", "max", "brmse")
    out = {name: float(value) for name, value in zip(names, mean[:5], strict=True)}
    out["nrmse_per_field"] = full[1].mean(-1).tolist()  # (channels, times) averaged over the times
    return out


def train(args) -> dict:
    import numpy as np
    import torch

    torch.set_num_threads(args.threads)
    marks: list[float] = []

    class TimedStepLR(torch.optim.lr_scheduler.StepLR):
        """PDEBench's StepLR, recording the clock when made (just before the first epoch) and at each
        step (the end of each epoch)."""

        def __init__(self, *a, **k):
            super().__init__(*a, **k)  # steps once itself: not an epoch's end
            self.timed = True
            marks.append(time.perf_counter())

        def step(self, *a, **k):
            if getattr(self, "timed", False):
                marks.append(time.perf_counter())
            return super().step(*a, **k)

    torch.optim.lr_scheduler.StepLR = TimedStepLR
    from pdebench.models.fno import train as fno_train
    from pdebench.models.fno.fno import FNO3d
    from pdebench.models.fno.utils import FNODatasetSingle

    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    data = Path(args.data).resolve()
    os.makedirs(args.workdir, exist_ok=True)
    os.chdir(args.workdir)
    began = time.perf_counter()
    fno_train.run_training(
        if_training=True,
        continue_training=False,
        num_workers=0,
        modes=args.modes,
        width=args.width,
        initial_step=INITIAL_STEP,
        t_train=21,
        num_channels=5,
        batch_size=args.batch_size,
        epochs=args.epochs,
        learning_rate=1e-3,
        scheduler_step=100,
        scheduler_gamma=0.5,
        model_update=1,
        flnm=data.name,
        single_file=True,
        reduced_resolution=1,
        reduced_resolution_t=1,
        reduced_batch=1,
        plot=False,
        channel_plot=0,
        x_min=-1.0,
        x_max=1.0,
        y_min=-1.0,
        y_max=1.0,
        t_min=0,
        t_max=1,
        base_path=str(data.parent),
    )
    wall = time.perf_counter() - began
    epochs_s = [b - a for a, b in zip(marks, marks[1:], strict=False)]

    # The checkpoint run_training kept, scored as its metrics() does, on every test trajectory at once.
    test = FNODatasetSingle(data.name, initial_step=INITIAL_STEP, saved_folder=str(data.parent), if_test=True)
    model = FNO3d(
        num_channels=5,
        modes1=args.modes,
        modes2=args.modes,
        modes3=args.modes,
        width=args.width,
        initial_step=INITIAL_STEP,
    )
    params = sum(p.numel() for p in model.parameters())
    real_params = sum(p.numel() * (2 if p.is_complex() else 1) for p in model.parameters())
    checkpoint = torch.load(data.name[:-5] + "_FNO.pt", map_location="cpu")
    model.load_state_dict(checkpoint["model_state_dict"])
    model.eval()
    preds, targets = [], []
    with torch.no_grad():
        for xx, yy, grid in torch.utils.data.DataLoader(test, batch_size=args.batch_size, shuffle=False):
            pred = yy[..., :INITIAL_STEP, :]
            shape = [*xx.shape[:-2], -1]
            for _ in range(INITIAL_STEP, yy.shape[-2]):
                im = model(xx.reshape(shape), grid)
                pred = torch.cat((pred, im), -2)
                xx = torch.cat((xx[..., 1:, :], im), dim=-2)
            preds.append(pred)
            targets.append(yy)
    metrics = _metric(torch.cat(preds), torch.cat(targets), INITIAL_STEP)
    return dict(
        side="pdebench",
        seed=args.seed,
        epochs_s=epochs_s,
        wall_s=wall,
        best_epoch=int(checkpoint["epoch"]) + 1,
        params=params,
        real_params=real_params,
        test_trajectories=len(test),
        train_trajectories=None,
        **metrics,
    )


def score(args) -> dict:
    import torch
    from pdebench.models.fno.utils import FNODatasetSingle

    torch.set_num_threads(args.threads)
    data, pred = Path(args.data).resolve(), Path(args.pred).resolve()
    truth = FNODatasetSingle(data.name, initial_step=INITIAL_STEP, saved_folder=str(data.parent), if_test=True)
    predicted = FNODatasetSingle(pred.name, initial_step=INITIAL_STEP, saved_folder=str(pred.parent), test_ratio=0.0)
    target = truth.data[:, ..., : predicted.data.shape[-2], :]
    if predicted.data.shape != target.shape:
        raise SystemExit(f"prediction {tuple(predicted.data.shape)} against truth {tuple(target.shape)}")
    return dict(test_trajectories=len(truth), **_metric(predicted.data, target, INITIAL_STEP))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("train", "score"))
    parser.add_argument("--src", required=True, help="a PDEBench source tree (holding pdebench/)")
    parser.add_argument("--data", required=True)
    parser.add_argument("--pred")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=5)
    parser.add_argument("--modes", type=int, default=12)
    parser.add_argument("--width", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--workdir", default=".")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(args.src).resolve()))
    result = train(args) if args.command == "train" else score(args)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
