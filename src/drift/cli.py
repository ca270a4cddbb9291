"""The ``drift`` command; its subcommands: info, generate, train, evaluate, predict, export, bench."""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

import drift
from drift import comm, reports
from drift.arguments import extents, indices, positive
from drift.bench.cli import add_parser as add_bench_parser

if TYPE_CHECKING:
    from drift.stopping import Stopped
    from drift.train import TrainConfig


def _info(_: argparse.Namespace) -> int:
    backends = comm.backends_available()
    cuda = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    print(f"drift {drift.__version__}")
    print(f"python {platform.python_version()}, torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"torch.distributed backends: {', '.join(backends) or 'none'}")
    print(f"cuda devices: {', '.join(cuda) or 'none'}")
    return 0


def _generate(args: argparse.Namespace) -> int:
    from drift.data import generate

    if args.device == "cuda" and torch.cuda.device_count() < 1:
        return _fail("generate", "--device cuda: no CUDA device is available")
    try:
        generate(
            args.out,
            samples=args.samples,
            resolution=args.resolution,
            frames=args.frames,
            t_end=args.t_end,
            mach=args.mach,
            eta=args.eta,
            zeta=args.zeta,
            seed=args.seed,
            device=args.device,
        )
    except ValueError as exc:
        return _fail("generate", str(exc))
    print(f"wrote {args.out}")
    return 0


def _fail(command: str, message: str) -> int:
    print(f"drift {command}: error: {message}", file=sys.stderr)
    return 2


def _on_ranks(nproc: int, fn: Callable[[Any], Any], arg: Any, device: str, pool: bool = False) -> Any:
    """Rank 0's ``fn(arg)``: called here for one rank (unless ``pool``), else on ``nproc`` fresh local
    ranks on ``device``."""
    from drift.launch import run_ranks

    return fn(arg) if nproc == 1 and not pool else run_ranks(nproc, fn, arg, device=device)[0]


def _train_restarting(config: TrainConfig, restarts: int, expected: tuple[type, ...]) -> list[dict] | Stopped:
    """``train_rank`` on fresh local ranks, started again up to ``restarts`` times after a failure other
    than one of drift's own ``expected`` errors (which a restart would repeat; a peer that stopped
    answering is worth a restart); a restarted job resumes from the latest complete checkpoint when there
    is one. Raises the last ``RankError``."""
    from drift.cluster import PeersLost
    from drift.launch import RankError
    from drift.train import restarted, train_rank

    pool = restarts > 0  # one rank too runs in a process of its own, which may die
    for attempt in range(1, restarts + 1):
        try:
            return _on_ranks(config.nproc, train_rank, config, config.device, pool)
        except RankError as exc:
            report = exc.reports.get(exc.first, "")
            if exc.first is None or (reports.raised(report, expected) and not reports.raised(report, (PeersLost,))):
                raise
            config = restarted(config)
            how = "resuming from the latest checkpoint" if config.resume else "from the start"
            print(f"drift train: {exc}; restart {attempt} of {restarts}, {how}", file=sys.stderr)
    return _on_ranks(config.nproc, train_rank, config, config.device, pool)


def _train(args: argparse.Namespace) -> int:
    from drift.checkpoint import CheckpointError, CheckpointWriteError, FolderInUse, check_unlocked
    from drift.cluster import ClusterError, PeersLost
    from drift.data import DataError
    from drift.launch import RankError, launched, restart_count
    from drift.stopping import EXIT_STOPPED, Stopped
    from drift.train import (
        ConfigError,
        NonFiniteError,
        check_config,
        check_fresh_run,
        config_from,
        ensure_default_data,
        restarted,
        resumed_data,
        slurm_requeued,
        train_rank,
    )

    config = config_from(vars(args), resume=args.resume is True)
    # The run records absolute paths, for drift evaluate from any folder; one file as itself, not a list.
    if config.data is not None:
        config.data = _absolute(config.data)
    if config.test_data is not None:
        config.test_data = tuple(map(os.path.abspath, config.test_data))
    expected = (
        ConfigError,
        DataError,
        CheckpointError,
        CheckpointWriteError,
        FolderInUse,
        NonFiniteError,
        ClusterError,
        PeersLost,
    )
    try:
        if args.resume == "auto" or (not args.resume and slurm_requeued()):
            config = restarted(config)  # resumes when --out holds a checkpoint that looks whole
        config = resumed_data(config)
        if launched():
            world = int(os.environ["WORLD_SIZE"])
            if args.nproc is not None and args.nproc != world:
                raise ConfigError(f"--nproc {args.nproc} under torchrun, which started {world} ranks")
            config.nproc = world
            if args.max_restarts:
                raise ConfigError("--max-restarts under torchrun: give it to torchrun (torchrun --max-restarts N)")
            rank = int(os.environ["RANK"])
            if restart_count() > 0:  # torchrun restarted the job
                config = restarted(config)
            check_fresh_run(config)
            try:
                history = train_rank(config)  # checks the options on every rank, after the data exist
            except ClusterError as exc:  # every rank knows: one line a host
                if os.environ.get("LOCAL_RANK", "0") != "0":
                    return 2
                leave = isinstance(exc, PeersLost) and reports.stranded()
                if not leave:
                    return _fail("train", str(exc))
                store = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
                _fail("train", f"{exc}; the job's store at {store} is out of reach too: this host leaves the job")
                reports.stop_agent()
                return 2
            except expected:
                raise
            except Exception:
                return _fail("train", reports.own_failure(config.out, rank, restart_count()))
            if rank != 0:
                return EXIT_STOPPED if isinstance(history, Stopped) else 0
        else:
            if config.data is None:
                check_config(config, config.nproc)  # the options, before minutes of generating on the device
                config.data = str(ensure_default_data(device=config.device))
                if config.device == "cuda":  # the ranks' memory, not this launcher's cache
                    torch.cuda.empty_cache()
            check_config(config, config.nproc)
            check_fresh_run(config)
            check_unlocked(config.out)  # rank 0 takes the lock; this refuses before any rank starts
            reports.forget_failure(config.out)
            history = _train_restarting(config, args.max_restarts, expected)
    except RankError as exc:
        return _fail("train", reports.rank_failure(exc, config.out, expected))
    except expected as exc:
        if launched() and not reports.first_on_host(str(exc)):
            return 2
        return _fail("train", str(exc))
    if isinstance(history, Stopped):
        print(f"drift train: {history}", file=sys.stderr)
        return EXIT_STOPPED
    last = history[-1] if history else None
    if last is not None:
        print(f"done: {last['epoch']} epochs, test relative L2 {last['test_rel_l2']:.4f}; outputs in {config.out}")
    return 0


def _absolute(paths: Sequence[str]) -> str | tuple[str, ...]:
    """``--data``'s files and folders as absolute paths: one as a string, several as a tuple."""
    absolute = tuple(os.path.abspath(p) for p in paths)
    return absolute[0] if len(absolute) == 1 else absolute


def _test_set(result: dict) -> str:
    """Which test set ``evaluate``'s ``result`` is of, in a few words."""
    if result["split"] == "test-data":
        files = result["test_files"]
        return f"--test-data {files[0]}" + (f" and {len(files) - 1} more files" if len(files) > 1 else "")
    return f"{result['split']} split"


def _evaluate_rank(kwargs: dict) -> dict:
    from drift.launch import process_group
    from drift.train import evaluate

    with process_group(kwargs["device"]):
        return evaluate(**kwargs)


def _evaluate(args: argparse.Namespace) -> int:
    from drift.checkpoint import CheckpointError
    from drift.data import DataError
    from drift.launch import RankError, launched
    from drift.train import ConfigError, find_checkpoint, format_pdebench

    kwargs = dict(
        checkpoint=args.checkpoint,
        data=_absolute(args.data) if args.data else None,
        test_data=tuple(map(os.path.abspath, args.test_data)) if args.test_data else None,
        resolution=args.resolution,
        method=args.method,
        grid=args.grid,
        data_parallel=args.data_parallel,
        device=args.device,
        batch_size=args.batch_size,
    )
    try:
        find_checkpoint(args.checkpoint)  # no whole checkpoint: fails here, before any rank starts
        if launched():
            result = _evaluate_rank(kwargs)
        else:
            result = _on_ranks(args.nproc or 1, _evaluate_rank, kwargs, args.device)
    except (ConfigError, DataError, CheckpointError, RankError, ValueError) as exc:
        return _fail("evaluate", str(exc))
    if not launched() or int(os.environ.get("RANK", 0)) == 0:
        print(
            f"test relative L2 {result['test_rel_l2']:.4f} over {result['test_trajectories']} trajectories "
            f"at {'x'.join(map(str, result['resolution']))} ({result['method']} on {result['ranks']} ranks; epoch "
            f"{result['epoch']} checkpoint from {result['trained_on']} ranks at "
            f"{'x'.join(map(str, result['trained_resolution']))}; {_test_set(result)})"
        )
        print(f"PDEBench metrics (physical units): {format_pdebench(result['pdebench'])}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=2)
    return 0


def _in_group(call: tuple[Callable[..., Any], dict]) -> Any:
    """``fn(**kwargs)`` of ``call = (fn, kwargs)`` inside this rank's process group on ``kwargs["device"]``."""
    from drift.launch import process_group

    fn, kwargs = call
    with process_group(kwargs["device"]):
        return fn(**kwargs)


def _predict(args: argparse.Namespace) -> int:
    from drift.checkpoint import CheckpointError
    from drift.data.writer import OutputError
    from drift.launch import RankError, launched
    from drift.predict import plan_prediction, predict

    names = ("checkpoint", "data", "out", "trajectories", "resolution", "method", "grid", "data_parallel", "force")
    kwargs = {name: getattr(args, name) for name in names}
    run = dict(device=args.device, batch_size=args.batch_size, progress=args.progress)
    rank = int(os.environ.get("RANK", 0)) if launched() else 0
    try:
        if args.device == "cuda" and torch.cuda.device_count() < 1:
            raise ValueError("--device cuda: no CUDA device is available")
        ranks = int(os.environ["WORLD_SIZE"]) if launched() else args.nproc or 1
        plan_prediction(**kwargs, world_size=ranks)  # the inputs and the output, before any rank starts
        call = (predict, kwargs | run)
        result = _in_group(call) if launched() else _on_ranks(ranks, _in_group, call, args.device)
    except (ValueError, CheckpointError, OutputError, RankError) as exc:
        return 2 if rank != 0 else _fail("predict", str(exc))
    if rank == 0:
        print(
            f"wrote {result['out']}: {result['trajectories']} trajectories of {result['t_in']} input + "
            f"{result['t_out']} predicted frames at {'x'.join(map(str, result['resolution']))}, by "
            f"{result['checkpoint']} (epoch {result['epoch']}) on {result['ranks']} rank(s)"
        )
    return 0


def _export(args: argparse.Namespace) -> int:
    from drift.checkpoint import CheckpointError
    from drift.export import EXPORTERS, ExportError

    try:
        path = EXPORTERS[args.format](args.checkpoint, args.out, force=args.force)
    except (ValueError, CheckpointError, ExportError) as exc:
        return _fail("export", str(exc))
    print(f"wrote {path}")
    return 0


def _count(text: str) -> int:
    """argparse type: a whole number >= 0."""
    if not text.isdecimal():
        raise argparse.ArgumentTypeError(f"{text!r} must be a whole number >= 0")
    return int(text)


def _auto(text: str) -> str:
    """argparse type of ``--resume``'s optional value: only ``auto``."""
    if text != "auto":
        raise argparse.ArgumentTypeError(f"{text!r}: --resume takes no value or auto")
    return text


_grid = extents("a grid", "4x1x1", count=3)
_reduction_shape = extents("a reduction", "8x4")


def _reduction(text: str) -> tuple[int, ...] | str:
    from drift.train import HOSTS

    return text if text == HOSTS else _reduction_shape(text)


def _modes(text: str) -> tuple[int, ...]:
    try:
        modes = tuple(int(p) for p in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a mode count like 4 or 8,8,8,4") from None
    if len(modes) == 1:
        modes *= 4
    if len(modes) != 4 or min(modes) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: need one or four positive counts (x, y, z, t)")
    return modes


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="drift", description="Distributed spectral operators for Fourier neural operators."
    )
    parser.add_argument("--version", action="version", version=f"drift {drift.__version__}")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")
    info = commands.add_parser("info", help="show versions, distributed backends and devices")
    info.set_defaults(run=_info)
    gen = commands.add_parser(
        "generate",
        help="write PDEBench-layout 3D compressible Navier-Stokes trajectories from random initial data",
        description="Finite-volume solver (MUSCL + Rusanov, SSP-RK2) on the periodic unit cube, gamma = 5/3.",
    )
    gen.add_argument("--out", default="data/3D_CFD_generated.hdf5", help="output HDF5 file")
    gen.add_argument("--samples", type=positive(int), default=4)
    gen.add_argument("--resolution", type=positive(int), default=32, help="cells per dim")
    gen.add_argument("--frames", type=positive(int), default=21, help="saved frames, t = 0 included")
    gen.add_argument("--t-end", type=positive(float), default=1.0)
    gen.add_argument("--mach", type=positive(float), default=1.0)
    gen.add_argument("--eta", type=float, default=1e-8, help="shear viscosity")
    gen.add_argument("--zeta", type=float, default=1e-8, help="bulk viscosity")
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument(
        "--device", choices=("cpu", "cuda"), default="cpu", help="where the solver runs (the same data to round-off)"
    )
    gen.set_defaults(run=_generate)
    _add_train(commands)
    _add_evaluate(commands)
    _add_predict(commands)
    _add_export(commands)
    add_bench_parser(commands)
    return parser


def _add_train(commands) -> None:
    from drift.data import SPLITS
    from drift.nn import FACTORIZATIONS, METHODS
    from drift.train import LOSSES, MODELS, ON_NAN, SCHEDULES, TrainConfig

    d = TrainConfig()
    train = commands.add_parser(
        "train",
        help="train a distributed 3D+time FNO on PDEBench-layout Navier-Stokes data",
        description="Adam(W) + MSE; test relative L2 every epoch; a sharded checkpoint per epoch. Runs alone "
        "(--nproc N starts N local ranks) or under torchrun --nproc-per-node N -m drift train.",
    )
    train.add_argument(
        "--data",
        nargs="+",
        metavar="FILE",
        help="PDEBench 3D CFD HDF5 files or folders of them (*.hdf5, *.h5), read as one data set in the order "
        "given, a folder's files by name; --split applies to each file (default: generate a small set into the "
        "cache)",
    )
    train.add_argument(
        "--test-data",
        nargs="+",
        metavar="FILE",
        help="a separate test set: every trajectory of these files or folders (then every trajectory of --data "
        "trains, and --split does not apply)",
    )
    train.add_argument(
        "--grid", type=_grid, help="spatial ranks per spatial dim, like 4x1x1 (default: a slab of all spatial ranks)"
    )
    train.add_argument(
        "--data-parallel",
        type=positive(int),
        default=d.data_parallel,
        metavar="D",
        help="ranks along a data-parallel mesh dim, each taking a share of every batch (--nproc / D spatial ranks)",
    )
    train.add_argument(
        "--reduction",
        type=_reduction,
        help="reduce drift's spectra over the spatial ranks in steps, like 8x4 (8 nodes of 4 ranks on a slab): "
        "one reduce-scatter per entry, the last first; on a grid, consecutive entries split each split dim; "
        "'hosts': within each host, then across (torchrun's hosts)",
    )
    train.add_argument(
        "--overlap",
        type=positive(int),
        default=d.overlap,
        metavar="PIECES",
        help="run drift's spectrum collectives in this many pieces, each overlapping the next piece's transform",
    )
    train.add_argument(
        "--method",
        choices=(*METHODS, "auto"),
        default=d.method,
        help="spectral convolution (auto: the one drift's cost model predicts fastest for the grid and ranks)",
    )
    train.add_argument(
        "--model",
        choices=MODELS,
        default=d.model,
        help="neuralop: neuraloperator 2.0's FNO options (grid embedding, channel MLP, soft-gating skip, "
        "lifting and projection ratios 2; default); plain: Li et al.'s FNO",
    )
    train.add_argument("--width", type=positive(int), default=d.width, help="channels inside the FNO")
    train.add_argument("--modes", type=_modes, default=d.modes, help="modes per dim (x,y,z,t), Li et al.'s k")
    train.add_argument(
        "--factorization",
        choices=FACTORIZATIONS,
        help="hold the spectral weights as Tucker or CP factors (neuraloperator's TFNO; default: dense)",
    )
    train.add_argument(
        "--rank",
        type=positive(float),
        default=d.rank,
        help="with --factorization: the factors' share of the dense spectral parameters, like 0.05",
    )
    train.add_argument("--layers", type=positive(int), default=d.layers, help="Fourier blocks")
    train.add_argument("--epochs", type=positive(int), default=d.epochs)
    train.add_argument("--lr", type=positive(float), default=d.lr, help="(peak) learning rate")
    train.add_argument(
        "--weight-decay",
        type=float,
        default=d.weight_decay,
        help="AdamW's decoupled weight decay (0: Adam)",
    )
    train.add_argument(
        "--schedule",
        choices=SCHEDULES,
        default=d.schedule,
        help="learning rate over the run's steps: cosine-annealed from --lr to 0 over --epochs (default), or constant",
    )
    train.add_argument(
        "--loss",
        choices=LOSSES,
        default=d.loss,
        help="each field and predicted frame weighted by the inverse of its variance over the training "
        "trajectories, so that late frames, whose fluctuations have decayed, count as much as early ones "
        "(default), or the MSE of the normalised fields",
    )
    train.add_argument("--batch-size", type=positive(int), default=d.batch_size)
    train.add_argument("--seed", type=int, default=d.seed, help="weights and shuffling")
    train.add_argument("--device", choices=("cpu", "cuda"), default=d.device, help="cpu (Gloo) or cuda (NCCL)")
    train.add_argument("--out", default=d.out, help="run folder: metrics, checkpoints, plots")
    train.add_argument("--nproc", type=positive(int), help="local ranks to start (default 1)")
    train.add_argument(
        "--resume",
        nargs="?",
        const=True,
        default=False,
        type=_auto,
        metavar="auto",
        help="continue the run in --out from its latest checkpoint; --resume auto: continue when --out holds a "
        "checkpoint of this run, else start fresh (a requeued SLURM job, SLURM_RESTART_COUNT > 0, does so "
        "without it)",
    )
    train.add_argument(
        "--checkpoint-every",
        type=positive(float),
        metavar="MINUTES",
        help="also write a checkpoint at the first step boundary after every MINUTES (bounds the work a kill "
        "without warning loses)",
    )
    train.add_argument(
        "--collective-timeout",
        type=positive(float),
        metavar="SECONDS",
        help="give up on a peer after SECONDS in every phase (default: per phase, from its measured time: "
        "max(60 s, 20x the slowest step), see docs/CLUSTERS.md)",
    )
    train.add_argument(
        "--max-restarts",
        type=_count,
        default=0,
        metavar="N",
        help="after a rank fails (a death or a bug, not a refused option), start the ranks again up to N times; "
        "a restarted job resumes from the latest complete checkpoint",
    )
    train.add_argument("--t-in", type=positive(int), default=d.t_in, help="input frames")
    train.add_argument("--t-out", type=positive(int), default=d.t_out, help="predicted frames")
    train.add_argument(
        "--split",
        choices=SPLITS,
        default=d.split,
        help="the test trajectories: the last 10%% (rounded, at least one; default) or PDEBench's first "
        "int(10%%), as its loaders take them; recorded in the run, used again by --resume and drift evaluate",
    )
    train.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    train.add_argument(
        "--no-prefetch",
        dest="prefetch",
        action="store_false",
        help="read each batch inside its step instead of during the previous one (the same results; at most "
        "one batch of this rank's blocks is read ahead otherwise)",
    )
    train.add_argument(
        "--no-plots",
        dest="plots",
        action="store_false",
        help="no loss.png and slice.png at the end (matplotlib takes a few seconds for them)",
    )
    train.add_argument(
        "--on-nan",
        choices=ON_NAN,
        default=d.on_nan,
        help="on a non-finite loss or gradient norm: stop the run (default) or skip that batch, counted in "
        "metrics.jsonl as skipped_batches",
    )
    train.set_defaults(run=_train)


def _add_evaluate(commands) -> None:
    ev = commands.add_parser(
        "evaluate",
        help="relative L2 and PDEBench's metrics of a trained checkpoint on its run's test split, on any number "
        "of ranks and at any resolution",
    )
    ev.add_argument("checkpoint", help="a run folder (its latest checkpoint) or one checkpoint folder")
    ev.add_argument(
        "--data",
        nargs="+",
        metavar="FILE",
        help="data files or folders whose test split (the run's --split, per file) to evaluate on, at any "
        "resolution (default: the run's test set)",
    )
    ev.add_argument(
        "--test-data",
        nargs="+",
        metavar="FILE",
        help="evaluate on every trajectory of these files or folders instead",
    )
    _add_trained_layout(ev)
    ev.add_argument("--batch-size", type=positive(int), default=2)
    ev.add_argument("--json", help="also write the result to this JSON file")
    ev.set_defaults(run=_evaluate)


def _add_trained_layout(parser: argparse.ArgumentParser) -> None:
    """The options of a command running a trained model on ranks: the resolution it reads the data at,
    the spectral method, the ranks' layout and device."""
    from drift.nn import METHODS

    parser.add_argument(
        "--resolution",
        type=positive(int),
        metavar="R",
        help="read the data at R points per spatial dim (every N/R-th point of its N; default: all of them)",
    )
    parser.add_argument("--method", choices=(*METHODS, "auto"), help="spectral convolution (default: the run's)")
    parser.add_argument("--grid", type=_grid, help="spatial ranks per spatial dim (default: a slab)")
    parser.add_argument("--data-parallel", type=positive(int), default=1, metavar="D", help="data-parallel ranks")
    parser.add_argument("--nproc", type=positive(int), help="local ranks to start (default 1)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")


def _add_predict(commands) -> None:
    pr = commands.add_parser(
        "predict",
        help="write a trained model's predictions for the trajectories of PDEBench-layout files, in that layout",
        description="For each trajectory: the file's first t_in frames, copied, then the t_out frames the model "
        "predicts from them, de-normalised; on any number of ranks, each reading and writing only its block "
        "(they write in turn into one file, renamed into place at the end).",
    )
    pr.add_argument("checkpoint", metavar="RUN", help="a run folder (its latest checkpoint) or one checkpoint folder")
    pr.add_argument(
        "--data",
        required=True,
        nargs="+",
        metavar="FILE",
        help="PDEBench-layout HDF5 files or folders of them with at least t_in frames, their trajectories "
        "numbered across them in the order given (as drift train's)",
    )
    pr.add_argument("--out", required=True, help="the HDF5 file to write")
    pr.add_argument(
        "--trajectories",
        type=indices,
        help="which trajectories of --data, in this order, like 0,3,10-19 (ranges inclusive; default: all)",
    )
    _add_trained_layout(pr)
    pr.add_argument("--batch-size", type=positive(int), help="trajectories a step (default: --data-parallel)")
    pr.add_argument("--force", action="store_true", help="replace --out if it exists")
    pr.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    pr.set_defaults(run=_predict)


def _add_export(commands) -> None:
    from drift.export import EXPORTERS

    ex = commands.add_parser(
        "export",
        help="write a trained model as one file for one device (torch.load(weights_only=True)) or as a "
        "neuraloperator checkpoint",
        description="pt: one file holding the weights, the FNO's options, the normalisation statistics and how "
        'inputs are assembled; drift.load_exported("model.pt")(frames) predicts from raw frames. neuralop: '
        "neuraloperator's save_checkpoint files and drift.json (statistics, inputs), where neuraloperator's "
        "FNO computes the model's function.",
    )
    ex.add_argument("checkpoint", metavar="RUN", help="a run folder (its latest checkpoint) or one checkpoint folder")
    ex.add_argument("out", metavar="OUT", help="the file (--format pt) or folder (--format neuralop) to write")
    ex.add_argument("--format", choices=tuple(EXPORTERS), default="pt", help="pt (default) or neuralop")
    ex.add_argument("--force", action="store_true", help="replace OUT if it exists")
    ex.set_defaults(run=_export)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "run"):
        parser.print_help()
        return 0
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
