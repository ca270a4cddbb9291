"""The ``drift`` command: it parses the command line and dispatches to the job (``drift.jobs.commands``) of its
subcommand: info, generate, train, evaluate, predict, export, bench.

``drift train``'s options are declared once, on ``drift.train.TrainConfig``'s fields (``drift.options``),
and its parser is made from them; ``evaluate`` and ``predict`` share the options of the ranks' layout.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import drift
from drift._moved import moved_names
from drift.arguments import indices, positive, rank_grid
from drift.bench.cli import add_parser as add_bench_parser
from drift.data.synthetic import LAYOUTS
from drift.jobs import commands as jobs
from drift.nn import ACTIVATION_DTYPES
from drift.options import add_options
from drift.train import TrainConfig, config_from
from drift.train.config import DEVICES, METHOD_CHOICES

# drift's names this module imported before its jobs moved to drift.jobs: still found here, with a warning.
__getattr__ = moved_names(__name__, {"drift": ("comm",), "drift.jobs": ("reports",), "drift.arguments": ("extents",)})


def _generate(args: argparse.Namespace) -> int:
    if args.layout is not None:
        names = ("samples", "resolution", "frames", "dims", "seed")  # unset: write_synthetic's defaults
        options = {name: getattr(args, name) for name in names if getattr(args, name) is not None}
        return jobs.generate_layout(args.out, args.layout, **options)
    defaults = PROBLEM_DEFAULTS[args.problem]
    sized = {name: getattr(args, name) or value for name, value in defaults.items()}
    if args.problem == "ns2d":
        names = ("samples", "solve_resolution", "viscosity", "forcing", "record_every", "initial", "seed", "dt")
        names += ("initial_resolution", "cfl", "batch", "progress")
        options = {name: getattr(args, name) for name in names} | sized
        return jobs.generate_ns2d(args.out, nproc=args.nproc, float32=args.float32, force=args.force, **options)
    names = ("samples", "t_end", "mach", "eta", "zeta", "seed", "device", "progress")
    return jobs.generate(args.out, **{name: getattr(args, name) for name in names} | sized)


# drift generate's problems and the grid and frames each writes by default.
PROBLEM_DEFAULTS = {"cfd3d": dict(resolution=32, frames=21), "ns2d": dict(resolution=64, frames=50)}


def _train(args: argparse.Namespace) -> int:
    config = config_from(vars(args), resume=args.resume is True)
    return jobs.train(config, resume_auto=args.resume == "auto", nproc=args.nproc)


def _evaluate(args: argparse.Namespace) -> int:
    names = ("checkpoint", "data", "test_data", "resolution", "method", "grid", "data_parallel", "device", "batch_size")
    names += ("activations",)
    return jobs.evaluate(nproc=args.nproc, json_path=args.json, **{name: getattr(args, name) for name in names})


def _predict(args: argparse.Namespace) -> int:
    names = ("checkpoint", "data", "out", "trajectories", "resolution", "method", "grid", "data_parallel", "force")
    names += ("device", "batch_size", "progress", "activations")
    return jobs.predict(nproc=args.nproc, **{name: getattr(args, name) for name in names})


def _export(args: argparse.Namespace) -> int:
    return jobs.export(args.checkpoint, args.out, kind=args.format, force=args.force)


def build_parser() -> argparse.ArgumentParser:
    """The ``drift`` command's parser: each subcommand sets ``run(args) -> exit code``."""
    parser = argparse.ArgumentParser(
        prog="drift", description="Distributed spectral operators for Fourier neural operators."
    )
    parser.add_argument("--version", action="version", version=f"drift {drift.__version__}")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")
    info = commands.add_parser("info", help="show versions, distributed backends and devices")
    info.set_defaults(run=lambda _args: jobs.info())
    gen = commands.add_parser(
        "generate",
        help="write trajectories of a PDE from random initial data (3D compressible or Li et al.'s 2-D "
        "incompressible Navier-Stokes), or a small synthetic file of any layout drift reads (--layout)",
        description="--problem cfd3d: finite volumes (MUSCL + Rusanov, SSP-RK2) on the periodic unit cube, gamma "
        "= 5/3, PDEBench's 3D CFD layout. --problem ns2d: Li et al.'s vorticity equation on the periodic unit "
        "square, pseudo-spectral (2/3 dealiasing, ETDRK4), solved on --nproc ranks, PDEBench's scalar layout "
        "(drift.data.ns2d). --layout: fields that follow a known linear map (drift.data.write_synthetic).",
    )
    gen.add_argument("--out", default="data/3D_CFD_generated.hdf5", help="output file")
    gen.add_argument("--problem", choices=tuple(PROBLEM_DEFAULTS), default="cfd3d", help="the PDE solved")
    gen.add_argument(
        "--layout",
        choices=LAYOUTS,
        help="a synthetic file in this layout (PDEBench cfd, scalar, darcy, per-sample groups; The Well; x -> y "
        "tensor dictionary .pt; Li et al.'s .mat, 1-D or 2-D) instead of the solver's 3D CFD trajectories",
    )
    gen.add_argument("--dims", type=positive(int), default=2, help="with --layout: spatial dims (1 to 3)")
    gen.add_argument("--samples", type=positive(int), default=4)
    gen.add_argument("--resolution", type=positive(int), help="points per dim (default: cfd3d 32, ns2d 64)")
    gen.add_argument(
        "--frames", type=positive(int), help="saved frames (cfd3d: t = 0 included, default 21; ns2d: default 50)"
    )
    gen.add_argument("--t-end", type=positive(float), default=1.0)
    gen.add_argument("--mach", type=positive(float), default=1.0)
    gen.add_argument("--eta", type=float, default=1e-8, help="shear viscosity")
    gen.add_argument("--zeta", type=float, default=1e-8, help="bulk viscosity")
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument(
        "--device", choices=DEVICES, default="cpu", help="where the solver runs (the same data to round-off)"
    )
    ns = gen.add_argument_group("--problem ns2d")
    ns.add_argument("--solve-resolution", type=positive(int), default=256, help="the solve's points per dim")
    ns.add_argument("--viscosity", type=positive(float), default=1e-3)
    ns.add_argument(
        "--forcing", choices=("li", "none"), default="li", help="0.1 (sin 2pi(x+y) + cos 2pi(x+y)), or none"
    )
    ns.add_argument("--record-every", type=positive(float), default=1.0, help="time units between frames")
    ns.add_argument("--initial", action="store_true", help="frame 0 is the initial field (else t = 1, 2, ...)")
    ns.add_argument(
        "--initial-resolution",
        type=int,
        help="draw the initial fields on this grid (default: the solve's, as Li's generator; a fixed one starts "
        "every --solve-resolution from the same fields)",
    )
    ns.add_argument("--dt", type=positive(float), help="a fixed time step (default: per interval from --cfl)")
    ns.add_argument("--cfl", type=positive(float), default=0.5)
    ns.add_argument("--batch", type=positive(int), default=8, help="trajectories solved together")
    ns.add_argument("--float32", action="store_true", help="solve in float32 (default float64)")
    ns.add_argument("--nproc", type=positive(int), default=1, help="ranks the grid is split over")
    ns.add_argument("--force", action="store_true", help="replace --out if it exists")
    _add_progress(gen)
    gen.set_defaults(run=_generate)
    _add_train(commands)
    _add_evaluate(commands)
    _add_predict(commands)
    _add_export(commands)
    add_bench_parser(commands)
    return parser


def _add_train(commands) -> None:
    train = commands.add_parser(
        "train",
        help="train a distributed FNO on 1-D, 2-D or 3-D data of any layout drift reads (default: generated 3D "
        "compressible Navier-Stokes)",
        description="Adam(W) + MSE; test relative L2 every epoch; a sharded checkpoint per epoch. Runs alone "
        "(--nproc N starts N local ranks) or under torchrun --nproc-per-node N -m drift train.",
    )
    add_options(train, TrainConfig)
    train.set_defaults(run=_train)


def _add_progress(parser: argparse.ArgumentParser) -> None:
    """``--progress``/``--no-progress``: the command's progress bar, by default on a terminal."""
    parser.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        help="a progress bar on stderr (default: on a terminal)",
    )


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
    parser.add_argument(
        "--resolution",
        type=positive(int),
        metavar="R",
        help="read the data at R points per spatial dim (every N/R-th point of its N; default: all of them)",
    )
    parser.add_argument("--method", choices=METHOD_CHOICES, help="spectral convolution (default: the run's)")
    parser.add_argument("--grid", type=rank_grid, help="spatial ranks per spatial dim (default: a slab)")
    parser.add_argument("--data-parallel", type=positive(int), default=1, metavar="D", help="data-parallel ranks")
    parser.add_argument("--nproc", type=positive(int), help="local ranks to start (default 1)")
    parser.add_argument("--device", choices=DEVICES, default="cpu")
    parser.add_argument(
        "--activations",
        choices=tuple(ACTIVATION_DTYPES),
        default="float32",
        help="the fields between the model's blocks (bfloat16: half their memory; each block computes in float32)",
    )


def _add_predict(commands) -> None:
    pr = commands.add_parser(
        "predict",
        help="write a trained model's predictions for the trajectories of data files, in the files' layout",
        description="For each trajectory: the file's first t_in frames (a static problem's inputs), copied, then "
        "the frames the model predicts from them, de-normalised; on any number of ranks, each reading and writing "
        "only its block (into one file, renamed into place at the end).",
    )
    pr.add_argument("checkpoint", metavar="RUN", help="a run folder (its latest checkpoint) or one checkpoint folder")
    pr.add_argument(
        "--data",
        required=True,
        nargs="+",
        metavar="FILE",
        help="data files of any layout drift reads (HDF5 or .pt) or folders of them with at least t_in frames, "
        "their trajectories numbered across them in the order given (as drift train's)",
    )
    pr.add_argument("--out", required=True, help="the file to write (in the source's layout)")
    pr.add_argument(
        "--trajectories",
        type=indices,
        help="which trajectories of --data, in this order, like 0,3,10-19 (ranges inclusive; default: all)",
    )
    _add_trained_layout(pr)
    pr.add_argument("--batch-size", type=positive(int), help="trajectories a step (default: --data-parallel)")
    pr.add_argument("--force", action="store_true", help="replace --out if it exists")
    _add_progress(pr)
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
    """``drift ARGV`` (default: the process's arguments): the exit code of its subcommand's job."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "run"):
        parser.print_help()
        return 0
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
