"""The FNO forward against the time of its own kernels: how far drift is from what this machine's BLAS and
GeLU allow, and the floor that puts under a P-rank forward on this host's cores.

Li et al.'s FNO (``--in-channels`` -> ``--width`` -> 5, 4 blocks, modes (8, 8, 8, 16), projection 128), float32,
one thread. For rank 0's block of a slab over P ranks it lists every kernel of the forward at the shape the
forward runs it: each transform stage's gemm (``TruncatedFFT``'s stages, the whole batch at once, without
the plan's copies), the channel mixing, the pointwise ``W x + b`` gemms, the exact GeLUs (counted, at the
rate measured on a 1 MiB resident buffer), the lift and the projection's two gemms (in 2048-point pieces
held in cache). Each is timed alone (the fastest of ``--repeats``), so their sum is what the kernels
cost with no copies, no allocation and no communication: a lower bound on the rank's forward. With P
ranks on C cores the forward cannot finish before ``P / min(P, C)`` times that sum. For P = 1 the
script also times the whole forward (unrecorded, the fastest of ``--repeats``) in the same run.

    python benchmarks/fno_floor.py [--shape 64x64x32x30] [--ranks 1 4] [--cores 2] [--json results/fno_floor.json]
"""

from __future__ import annotations

import argparse
import json
import math
import time

import torch
from torch.nn import functional as F

from drift.nn import FNO
from drift.nn.chunked import activate_
from drift.nn.spectral import mix_channels
from drift.truncated import TruncatedFFT

MODES = (8, 8, 8, 16)
LAYERS = 4
PROJECTION = 128
OUT_CHANNELS = 5
PIECE = 2048  # points per projection piece: its 128-channel hidden layer (1 MiB) stays in cache


def _fastest(fn, repeats: int) -> float:
    fn()
    best = math.inf
    for _ in range(repeats):
        began = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - began)
    return best


def _stage_gemms(plan: TruncatedFFT, stages, rows: int, start: tuple[int, ...], repeats: int) -> list[dict]:
    """Each stage's gemm alone, at the shapes the map meets, in the plan's chunks of fields (one chunk
    timed into a resident output, times the number of chunks)."""
    chunk = plan.chunk_rows(stages, start, rows)
    sizes, kernels = list(start), []
    for stage in stages:
        matrix = getattr(plan, stage.name)
        pos = stage.dim + 1
        operand = list(sizes)
        if stage.kind == "fold_reduce":  # the gemm takes the folded rows (and 2k real values on its dim)
            operand[stage.fold_dim] = stage.fold.rows
        shape = (chunk, *operand)
        lead, rest = math.prod(shape[:pos]), math.prod(shape[pos + 1 :])
        k = matrix.shape[0] if stage.right else matrix.shape[1]  # the contracted extent (a folded stage's rows)
        out_rows = matrix.shape[1] if stage.right else matrix.shape[0]
        if stage.right:
            a, out = torch.randn(lead, k, dtype=matrix.dtype), torch.empty(lead, out_rows, dtype=matrix.dtype)
            fn = lambda a=a, m=matrix, out=out: torch.matmul(a, m, out=out)  # noqa: E731
        else:
            a = torch.randn(lead, k, rest, dtype=matrix.dtype)
            out = torch.empty(lead, out_rows, rest, dtype=matrix.dtype)
            fn = lambda a=a, m=matrix, out=out: torch.matmul(m, a, out=out)  # noqa: E731
        flops = (8 if matrix.dtype.is_complex else 2) * lead * rest * k * out_rows * -(-rows // chunk)
        seconds = _fastest(fn, repeats) * -(-rows // chunk)
        kernels.append(dict(kernel=f"stage dim {stage.dim} ({stage.kind})", flops=flops, s=seconds))
        sizes = stage.extents(sizes)
    return kernels


def rank_kernels(shape: tuple[int, ...], ranks: int, width: int, in_channels: int, repeats: int) -> list[dict]:
    """The forward's kernels on rank 0's block of a slab over ``ranks`` (x split in torch.chunk blocks)."""
    local = (-(-shape[0] // ranks), *shape[1:])
    points = math.prod(local)
    plan = TruncatedFFT(local, MODES)
    share = (-(-plan.mode_shape[0] // ranks), *plan.mode_shape[1:])
    kernels = []
    for name, stages, start in (
        ("transform", plan._forward_stages, plan.local_shape),
        ("inverse", plan._inverse_stages, plan.mode_shape),
    ):
        for k in _stage_gemms(plan, stages, width, start, repeats):
            kernels.append(dict(k, kernel=f"{name} {k['kernel']}", count=LAYERS))
    spec = torch.randn(1, width, *share, dtype=torch.complex64)
    weight = torch.randn(width, width, *share, dtype=torch.complex64)
    kernels.append(
        dict(
            kernel="channel mixing",
            count=LAYERS,
            flops=8 * width * width * math.prod(share),
            s=_fastest(lambda: mix_channels(spec, weight), repeats),
        )
    )
    x, y = torch.randn(width, points), torch.randn(width, points)
    w = torch.randn(width, width)
    kernels.append(
        dict(
            kernel="pointwise W x + y",
            count=LAYERS,
            flops=2 * width * width * points,
            s=_fastest(lambda: torch.addmm(y, w, x, out=y), repeats),
        )
    )
    lift_in, lift_w = torch.randn(in_channels, points), torch.randn(width, in_channels)
    lift_out = torch.empty(width, points)
    kernels.append(
        dict(
            kernel="lift",
            count=1,
            flops=2 * in_channels * width * points,
            s=_fastest(lambda: torch.mm(lift_w, lift_in, out=lift_out), repeats),
        )
    )
    hidden = torch.randn(PROJECTION, PIECE)
    w1, w2 = torch.randn(PROJECTION, width), torch.randn(OUT_CHANNELS, PROJECTION)
    piece_in, piece_out = torch.randn(width, PIECE), torch.empty(OUT_CHANNELS, PIECE)
    pieces = points / PIECE
    for kernel, flops, fn in (
        ("projection gemm 1", 2 * width * PROJECTION, lambda: torch.mm(w1, piece_in, out=hidden)),
        ("projection gemm 2", 2 * PROJECTION * OUT_CHANNELS, lambda: torch.mm(w2, hidden, out=piece_out)),
    ):
        kernels.append(dict(kernel=kernel, count=1, flops=flops * points, s=pieces * _fastest(fn, repeats)))
    gelu_s = _fastest(lambda: activate_(F.gelu, hidden), repeats)
    per_element = gelu_s / hidden.numel()
    gelus = (LAYERS - 1) * width * points + PROJECTION * points
    kernels.append(dict(kernel="exact GeLU", count=1, flops=0, elements=gelus, s=gelus * per_element))
    return kernels


def whole_forward(shape: tuple[int, ...], width: int, in_channels: int, repeats: int) -> float:
    torch.manual_seed(0)
    model = FNO(in_channels, OUT_CHANNELS, width, MODES, n_layers=LAYERS)
    x = torch.randn(1, in_channels, *shape)
    with torch.no_grad():
        return _fastest(lambda: model(x), repeats)


def _matmul_rate(repeats: int) -> float:
    a = torch.randn(2048, 2048)
    return 2 * 2048**3 / _fastest(lambda: a @ a, repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="64x64x32x30")
    parser.add_argument("--width", type=int, default=20)
    parser.add_argument("--in-channels", type=int, default=5)
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--cores", type=int, default=2, help="the cores P ranks of one thread share")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    shape = tuple(int(v) for v in args.shape.split("x"))
    matmul = _matmul_rate(args.repeats)
    report = dict(shape=shape, width=args.width, cores=args.cores, matmul_flops_per_s=matmul, runs=[])
    print(f"FNO {args.in_channels} -> {args.width} -> {OUT_CHANNELS}, {LAYERS} blocks, modes {MODES}, {args.shape}")
    print(f"one thread: float32 matmul {matmul / 1e9:.0f} GFLOP/s (2048^2)")
    for ranks in args.ranks:
        kernels = rank_kernels(shape, ranks, args.width, args.in_channels, args.repeats)
        total = sum(k["s"] * k["count"] for k in kernels)
        floor = total * ranks / min(ranks, args.cores)
        print(f"\nP = {ranks}: rank 0's kernels, each alone (one thread)")
        print(f"{'kernel':42s} {'count':>5s} {'GFLOP':>8s} {'s each':>8s} {'GFLOP/s':>8s} {'s total':>8s}")
        for k in kernels:
            rate = f"{k['flops'] / k['s'] / 1e9:8.1f}" if k["flops"] else f"{'-':>8s}"
            print(
                f"{k['kernel']:42s} {k['count']:5d} {k['flops'] / 1e9:8.3f} {k['s']:8.4f} {rate} "
                f"{k['s'] * k['count']:8.3f}"
            )
        line = f"sum {total:.3f} s per rank; {ranks} rank(s) on {args.cores} cores: forward >= {floor:.3f} s"
        run = dict(ranks=ranks, kernels=kernels, kernel_s=total, floor_s=floor)
        if ranks == 1:
            run["forward_s"] = whole_forward(shape, args.width, args.in_channels, args.repeats)
            line += f"; the whole forward {run['forward_s']:.3f} s = {run['forward_s'] / total:.2f}x its kernels"
        print(line)
        report["runs"].append(run)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
