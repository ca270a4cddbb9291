"""``drift bench``: the DRIFT paper's section VI on Gloo CPU ranks of this machine.

``add_parser(commands)`` registers ``bench`` on the ``drift`` command's subparsers, with the subcommands
``scaling``, ``phases``, ``modes``, ``comm``, ``capacity`` and ``train``; each sets ``run(args) -> int``.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys

import torch

from drift.arguments import positive_int
from drift.bench import capacity, comm, modes, phases, scaling, training
from drift.bench.runner import DEVICE_ENV
from drift.jobs.console import progress_asked
from drift.jobs.launch import set_rank_threads

SUBCOMMANDS = {
    "scaling": (scaling, "strong and weak scaling of one FNO block, forward and backward, per method"),
    "phases": (phases, "per-phase breakdown of one FNO forward per method and P, with a heat map"),
    "modes": (modes, "sensitivity of one block's forward time to k_max"),
    "capacity": (capacity, "largest grid whose FNO forward or training step fits a memory cap, by bisection"),
    "comm": (comm, "collective times, alpha-beta fit, the FNO's collectives and a cluster projection"),
    "train": (training, "epoch time and loss curves of drift against dfno on the same data and seed"),
}


def add_parser(commands: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``bench`` and its subcommands to ``commands`` (the ``drift`` parser's subparsers)."""
    bench = commands.add_parser(
        "bench",
        help="rerun the DRIFT paper's evaluation (scaling, phases, modes, comm, capacity, train) on local ranks",
        description="Rerun the DRIFT paper's evaluation (section VI) on Gloo CPU ranks of this machine.",
    )
    sub = bench.add_subparsers(title="benchmarks", metavar="BENCHMARK")
    for name, (module, text) in SUBCOMMANDS.items():
        parser = sub.add_parser(name, help=text, description=module.__doc__.split("\n\n")[0].replace("``", ""))
        module.add_arguments(parser)
        parser.add_argument(
            "--progress",
            action=argparse.BooleanOptionalAction,
            help="progress bars on stderr (default: on a terminal)",
        )
        parser.add_argument(
            "--threads",
            type=positive_int,
            help="threads per rank (default: OMP_NUM_THREADS, else cores // P; 1 on a loaded machine)",
        )
        if name not in ("train", "capacity"):  # train has its own --device; capacity caps host memory
            parser.add_argument(
                "--device", choices=("cpu", "cuda"), default="cpu", help="cpu (Gloo) or one GPU per rank (NCCL)"
            )
        parser.set_defaults(run=functools.partial(_run_with_options, parser.get_default("run")))
    bench.set_defaults(run=lambda _args: bench.print_help() or 0)
    return bench


def _run_with_options(run, args: argparse.Namespace) -> int:
    """Run a subcommand with ``--threads`` per rank, its ranks on ``--device`` (read when it starts them,
    from ``runner.DEVICE_ENV``) and its bars as ``--progress`` asks."""
    where = getattr(args, "device", "cpu")
    needed, gpus = _ranks_needed(args), torch.cuda.device_count()
    if where == "cuda" and gpus < needed:
        print(
            f"drift bench: error: --device cuda: {needed} ranks need {needed} GPUs (one each), found {gpus}",
            file=sys.stderr,
        )
        return 2
    if hasattr(args, "device"):
        os.environ[DEVICE_ENV] = where
    with set_rank_threads(args.threads), progress_asked(args.progress):
        return run(args)


def _ranks_needed(args: argparse.Namespace) -> int:
    """The most ranks any run of the subcommand starts: ``--nproc``, and ``comm``'s ``--fno-ranks`` when
    its sweep runs (some P > 1), since the FNO table needs the sweep's model."""
    nproc = getattr(args, "nproc", 1)
    counts = nproc if isinstance(nproc, list) else [nproc]
    fno = getattr(args, "fno_ranks", 1)
    return max([*counts, fno]) if fno > 1 and max(counts) > 1 else max(counts)


def main(argv: list[str] | None = None) -> int:
    """``drift bench ARGV`` on its own (``python -m drift.bench.cli scaling ...``)."""
    parser = argparse.ArgumentParser(prog="drift")
    add_parser(parser.add_subparsers())
    args = parser.parse_args(["bench", *(sys.argv[1:] if argv is None else argv)])
    return args.run(args)


if __name__ == "__main__":
    raise SystemExit(main())
