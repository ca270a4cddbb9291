"""The ``drift`` command. Subcommands: ``info``, ``generate`` (training and benchmarks follow)."""

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


def _generate(args: argparse.Namespace) -> int:
    from drift.data import generate

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
    )
    print(f"wrote {args.out}")
    return 0


def _positive(kind):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {kind.__name__}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{text!r} must be positive")
        return value

    return parse


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
    gen.add_argument("--samples", type=_positive(int), default=4)
    gen.add_argument("--resolution", type=_positive(int), default=32, help="cells per dim")
    gen.add_argument("--frames", type=_positive(int), default=21, help="saved frames, t = 0 included")
    gen.add_argument("--t-end", type=_positive(float), default=1.0)
    gen.add_argument("--mach", type=_positive(float), default=1.0)
    gen.add_argument("--eta", type=float, default=1e-8, help="shear viscosity")
    gen.add_argument("--zeta", type=float, default=1e-8, help="bulk viscosity")
    gen.add_argument("--seed", type=int, default=0)
    gen.set_defaults(run=_generate)
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
