"""``drift bench train``: DRIFT against DFNO in training (the paper's wall-clock and convergence experiment).

Each method trains the same FNO (the same seed: the same global weights, the same data order) on the
same data, on a fresh group of ``--nproc`` ranks, through ``drift.train`` itself. Reported per method:
seconds per epoch and per phase of it (forward, backward, optimizer step, test pass: rank 0's, median
over epochs, the first included), the loss and test relative L2 curves, and the largest relative
difference of each epoch's loss from drift's (the methods compute the same function, so only float32
rounding separates them). ``--resolution R --samples S`` trains on drift's generated data at R^3
(cached as the default set is): the size where the truncated transform's advantage shows.

JSON (``train.json``), besides the common envelope (``drift.bench.output``): ``runs``, one per method:
``{method, ranks, history: [{epoch, train_loss, test_rel_l2, seconds, phase_seconds}], median_epoch_s,
median_phase_s: {forward, backward, optimizer, test, data}, max_loss_rel_diff_vs_drift}``.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
from pathlib import Path

from drift.arguments import positive_float, positive_int
from drift.bench import output
from drift.data import read_layout
from drift.jobs.launch import RankError, run_ranks
from drift.nn import METHODS
from drift.nn.methods import Drift
from drift.train import MODELS, ConfigError, TrainConfig, check_config, config_from, ensure_default_data, train_rank
from drift.train.problem import DEFAULT_3D_MODES

PHASES = ("forward", "backward", "optimizer", "test", "data")  # seconds per epoch, as drift.train's rows


def _plot(runs: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, ax = plt.subplots(1, 3, figsize=(13, 3.5), constrained_layout=True)
    for run in runs:
        epochs = [r["epoch"] for r in run["history"]]
        ax[0].semilogy(epochs, [r["train_loss"] for r in run["history"]], "o-", label=run["method"])
        ax[1].plot(epochs, [r["test_rel_l2"] for r in run["history"]], "o-", label=run["method"])
    ax[0].set(xlabel="epoch", ylabel="training loss", title="loss")
    ax[1].set(xlabel="epoch", ylabel="relative L2", title="test relative L2")
    ax[2].bar([r["method"] for r in runs], [r["median_epoch_s"] for r in runs], color="C2")
    ax[2].set(ylabel="seconds per epoch (median)", title=f"P = {runs[0]['ranks']}")
    ax[0].legend()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(args: argparse.Namespace) -> int:
    """The ``drift bench train`` subcommand."""
    options = {k: v for k, v in vars(args).items() if k != "out"}
    base = config_from(options, method="drift", quiet=True, plots=False)
    try:
        if base.data is None:
            size = {k: v for k, v in (("resolution", args.resolution), ("samples", args.samples)) if v is not None}
            base.data = str(ensure_default_data(**size))
        elif args.resolution is not None or args.samples is not None:
            raise ConfigError("--resolution and --samples choose generated data: give them or --data, not both")
        check_config(base, args.nproc)
    except (ConfigError, ValueError) as exc:
        print(f"drift bench train: error: {exc}")
        return 2
    runs = []
    for method in output.progress(args.methods, "train: methods"):
        config = dataclasses.replace(base, method=method, out=str(args.out / "runs" / method))
        try:
            history = run_ranks(args.nproc, train_rank, config, device=config.device)[0]
        except RankError as exc:
            print(f"drift bench train: error: {method}: {exc}")
            return 1
        seconds = statistics.median(r["seconds"] for r in history)
        phases = {k: statistics.median(r["phase_seconds"].get(k, 0.0) for r in history) for k in PHASES}
        runs.append(
            dict(method=method, ranks=args.nproc, history=history, median_epoch_s=seconds, median_phase_s=phases)
        )
    reference = next((r for r in runs if r["method"] == Drift.name), runs[0])  # the rows are labelled by name
    for run_ in runs:
        pairs = zip(run_["history"], reference["history"], strict=True)
        run_["max_loss_rel_diff_vs_drift"] = max(abs(a["train_loss"] / b["train_loss"] - 1) for a, b in pairs)
    rows = [
        [
            r["method"],
            r["ranks"],
            r["median_epoch_s"],
            r["median_epoch_s"] / reference["median_epoch_s"],
            *(r["median_phase_s"][k] for k in PHASES),
            r["history"][-1]["train_loss"],
            r["history"][-1]["test_rel_l2"],
            r["max_loss_rel_diff_vs_drift"],
        ]
        for r in runs
    ]
    header = ["method", "ranks", "s/epoch", "vs drift", *(f"{k} s" for k in PHASES)]
    header += ["final loss", "test rel L2", "max loss diff"]
    grid = "x".join(map(str, read_layout(base.data)[2:]))
    title = (
        f"training on {grid}, {args.epochs} epochs, {args.model} FNO, width {args.width}, modes {tuple(args.modes)}, "
        f"{args.layers} layers"
    )
    args.out.mkdir(parents=True, exist_ok=True)
    _plot(runs, args.out / "train.png")
    path = output.finish(args.out, "train", output.config_of(args), [(title, rows, header)], runs=runs)
    print(f"wrote {path} and {args.out / 'train.png'}")
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``drift bench train``."""
    d = TrainConfig()
    parser.add_argument("--nproc", type=positive_int, default=4, help="ranks per run")
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=["drift", "dfno"])
    parser.add_argument("--data", help="PDEBench 3D CFD file (default: drift train's generated set)")
    parser.add_argument("--resolution", type=positive_int, help="generated data at this many points per dim")
    parser.add_argument("--samples", type=positive_int, help="trajectories of the generated data")
    parser.add_argument("--epochs", type=positive_int, default=3)
    parser.add_argument(
        "--model", choices=MODELS, default=d.model, help="neuralop (drift train's default) or plain (the paper's FNO)"
    )
    parser.add_argument("--width", type=positive_int, default=d.width)
    parser.add_argument("--modes", type=positive_int, nargs=4, default=list(DEFAULT_3D_MODES), metavar="K")
    parser.add_argument("--layers", type=positive_int, default=d.layers)
    parser.add_argument("--lr", type=positive_float, default=d.lr)
    parser.add_argument("--batch-size", type=positive_int, default=d.batch_size)
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument("--t-in", type=positive_int, default=d.t_in, help="input frames")
    parser.add_argument("--t-out", type=positive_int, default=d.t_out, help="predicted frames")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--out", type=Path, default=Path("results/bench/train"))
    parser.set_defaults(run=run)
