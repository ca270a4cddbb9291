"""``drift bench``: the DRIFT paper's section VI on the ranks this machine has.

``add_parser(commands)`` registers ``bench`` on the ``drift`` command's subparsers, with the subcommands
``scaling``, ``phases``, ``modes``, ``comm`` and ``capacity``; each sets ``run(args) -> int``.
"""

from __future__ import annotations

import argparse
import sys

from drift.bench import capacity, comm, modes, phases, scaling

SUBCOMMANDS = {
    "phases": (phases, "per-phase breakdown of one FNO forward per method and P, with a heat map"),
    "modes": (modes, "sensitivity of one block's forward time to k_max"),
    "scaling": (scaling, "strong and weak scaling of one FNO block, forward and backward, per method"),
    "capacity": (capacity, "largest grid whose FNO forward or training step fits a memory cap, by bisection"),
    "comm": (comm, "collective times, alpha-beta fit, the FNO's collectives and a cluster projection"),
}


def add_parser(commands: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``bench`` and its subcommands to ``commands`` (the ``drift`` parser's subparsers)."""
    bench = commands.add_parser(
        "bench",
        help="rerun the DRIFT paper's evaluation (scaling, phases, modes, comm, capacity) on local ranks",
        description=__doc__.split("\n\n")[0],
    )
    sub = bench.add_subparsers(title="benchmarks", metavar="BENCHMARK")
    for name, (module, text) in SUBCOMMANDS.items():
        module.add_arguments(sub.add_parser(name, help=text, description=module.__doc__.split("\n\n")[0]))
    bench.set_defaults(run=lambda _args: bench.print_help() or 0)
    return bench


def main(argv: list[str] | None = None) -> int:
    """``drift bench ARGV`` on its own (``python -m drift.bench.cli scaling ...``)."""
    parser = argparse.ArgumentParser(prog="drift")
    add_parser(parser.add_subparsers())
    args = parser.parse_args(["bench", *(sys.argv[1:] if argv is None else argv)])
    return args.run(args)


if __name__ == "__main__":
    raise SystemExit(main())
