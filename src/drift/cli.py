"""The ``drift`` command. Subcommands: ``info`` (more arrive with training and benchmarks)."""

from __future__ import annotations

import argparse
import platform
import sys
from collections.abc import Sequence

import torch
import torch.distributed as dist

import drift


def _info(_: argparse.Namespace) -> int:
    available = dist.is_available()
    backends = [b for b in ("gloo", "nccl", "mpi") if available and getattr(dist, f"is_{b}_available")()]
    cuda = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    print(f"drift {drift.__version__}")
    print(f"python {platform.python_version()}, torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"torch.distributed backends: {', '.join(backends) or 'none'}")
    print(f"cuda devices: {', '.join(cuda) or 'none'}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="drift", description="Distributed spectral operators for Fourier neural operators."
    )
    parser.add_argument("--version", action="version", version=f"drift {drift.__version__}")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")
    info = commands.add_parser("info", help="show versions, distributed backends and devices")
    info.set_defaults(run=_info)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "run"):
        parser.print_help()
        return 0
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
