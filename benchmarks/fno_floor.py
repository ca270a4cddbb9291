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
script also times the whole forward (unrecorded, the fastest of ``--repeats``) in the same run. It reports
the projection's share (its two gemms and its 128-channel GeLU) of the kernels' time and FLOPs.

``--step`` adds the kernels of a training step's backward pass and optimizer step, each alone in the
same way: the transforms' adjoint stages, the channel mixing's two gradients, the pointwise layers' input
and weight gradients and GeLU derivatives, the lift's weight gradient, the projection's backward (its
hidden layer recomputed a piece at a time, as ``chunked_mlp`` does) and the fused Adam step over rank
0's parameters. Their sum with the forward's kernels is a lower bound on the step, and its ratio to the
forward's kernels the least ratio of step to forward these kernels allow. For P = 1 it also times the
whole step (forward, backward and ``drift.optim.Adam``, the fastest of ``--repeats``).
``--rounds R`` lists every kernel R times and keeps each one's fastest.

    python benchmarks/fno_floor.py [--shape 64x64x32x30] [--ranks 1 4] [--cores 2] [--step]
                                   [--json results/fno_floor.json]
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
from drift.optim import Adam
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


def _rank_plan(shape: tuple[int, ...], ranks: int) -> tuple[int, TruncatedFFT, tuple[int, ...]]:
    """Rank 0's points, its plan and its share of the spectrum in a slab over ``ranks``."""
    local = (-(-shape[0] // ranks), *shape[1:])
    plan = TruncatedFFT(local, MODES)
    return math.prod(local), plan, (-(-plan.mode_shape[0] // ranks), *plan.mode_shape[1:])


def _map_kernels(plan: TruncatedFFT, maps, width: int, repeats: int) -> list[dict]:
    """The stage gemms of each ``(name, stages, extents taken)`` in ``maps``, once per block."""
    return [
        dict(k, kernel=f"{name} {k['kernel']}", count=LAYERS)
        for name, stages, start in maps
        for k in _stage_gemms(plan, stages, width, start, repeats)
    ]


def rank_kernels(shape: tuple[int, ...], ranks: int, width: int, in_channels: int, repeats: int) -> list[dict]:
    """The forward's kernels on rank 0's block of a slab over ``ranks`` (x split in torch.chunk blocks)."""
    points, plan, share = _rank_plan(shape, ranks)
    maps = (("transform", plan._forward_stages, plan.local_shape), ("inverse", plan._inverse_stages, plan.mode_shape))
    kernels = _map_kernels(plan, maps, width, repeats)
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
        ("projection: gemm 1", 2 * width * PROJECTION, lambda: torch.mm(w1, piece_in, out=hidden)),
        ("projection: gemm 2", 2 * PROJECTION * OUT_CHANNELS, lambda: torch.mm(w2, hidden, out=piece_out)),
    ):
        kernels.append(dict(kernel=kernel, count=1, flops=flops * points, s=pieces * _fastest(fn, repeats)))
    per_element = _fastest(lambda: activate_(F.gelu, hidden), repeats) / hidden.numel()
    for kernel, elements in (
        ("exact GeLU, blocks", (LAYERS - 1) * width * points),
        ("projection: exact GeLU", PROJECTION * points),
    ):
        kernels.append(dict(kernel=kernel, count=1, flops=0, elements=elements, s=elements * per_element))
    return kernels


def _gelu_rates(repeats: int) -> tuple[float, float]:
    """Seconds per element of exact GeLU and of its derivative times a gradient, on a 1 MiB resident piece."""
    h, g, out = torch.randn(PROJECTION, PIECE), torch.randn(PROJECTION, PIECE), torch.empty(PROJECTION, PIECE)
    forward = _fastest(lambda: torch.ops.aten.gelu.out(h, approximate="none", out=out), repeats)
    backward = _fastest(
        lambda: torch.ops.aten.gelu_backward.grad_input(g, h, approximate="none", grad_input=out), repeats
    )
    return forward / h.numel(), backward / h.numel()


def rank_backward_kernels(shape: tuple[int, ...], ranks: int, width: int, in_channels: int, repeats: int) -> list[dict]:
    """The kernels of a training step after its forward, on rank 0's block: the backward pass and Adam."""
    points, plan, share = _rank_plan(shape, ranks)
    maps = (
        ("inverse adjoint", plan._inverse_adjoint, plan.local_shape),
        ("transform adjoint", plan._forward_adjoint, plan.mode_shape),
    )
    kernels = _map_kernels(plan, maps, width, repeats)
    spec, grad = (torch.randn(1, width, *share, dtype=torch.complex64) for _ in range(2))
    weight = torch.randn(width, width, *share, dtype=torch.complex64)
    grad_w = torch.empty_like(weight)
    mixing = 8 * width * width * math.prod(share)
    kernels.append(
        dict(
            kernel="channel mixing, input gradient",
            count=LAYERS,
            flops=mixing,
            s=_fastest(lambda: mix_channels(grad, weight.transpose(0, 1)), repeats),
        )
    )
    kernels.append(
        dict(
            kernel="channel mixing, weight gradient",
            count=LAYERS,
            flops=mixing,
            s=_fastest(lambda: torch.mul(spec[0].unsqueeze(1), grad[0], out=grad_w), repeats),
        )
    )
    x, g, gx = torch.randn(width, points), torch.randn(width, points), torch.empty(width, points)
    w, gw = torch.randn(width, width), torch.zeros(width, width)
    pointwise = 2 * width * width * points
    kernels.append(
        dict(
            kernel="pointwise W^T g",
            count=LAYERS,
            flops=pointwise,
            s=_fastest(lambda: torch.mm(w.T, g, out=gx), repeats),
        )
    )
    kernels.append(
        dict(
            kernel="pointwise g x^T",
            count=LAYERS,
            flops=pointwise,
            s=_fastest(lambda: gw.addmm_(g, x.T), repeats),
        )
    )
    lift_in, lift_grad = torch.randn(in_channels, points), torch.empty(width, in_channels)
    kernels.append(
        dict(
            kernel="lift weight gradient",
            count=1,
            flops=2 * in_channels * width * points,
            s=_fastest(lambda: torch.mm(g, lift_in.T, out=lift_grad), repeats),
        )
    )
    # The projection's backward a piece at a time: hidden layer recomputed (bias as a column of W1 against
    # a row of ones), the gradient of act(h), the two weight gradients and the input's gradient.
    xs, g_out = torch.randn(width + 1, PIECE), torch.randn(OUT_CHANNELS, PIECE)
    w1_b1, w2 = torch.randn(PROJECTION, width + 1), torch.randn(OUT_CHANNELS, PROJECTION)
    hidden, acts, g_h = (torch.randn(PROJECTION, PIECE) for _ in range(3))
    grad_w1_t, grad_w2 = torch.zeros(width + 1, PROJECTION), torch.zeros(OUT_CHANNELS, PROJECTION)
    piece_gx = torch.empty(width, PIECE)
    pieces = points / PIECE
    for kernel, flops, fn in (
        ("projection: gemm 1 recomputed", 2 * (width + 1) * PROJECTION, lambda: torch.mm(w1_b1, xs, out=hidden)),
        ("projection: W2^T g", 2 * OUT_CHANNELS * PROJECTION, lambda: torch.mm(w2.T, g_out, out=g_h)),
        ("projection: g act(h)^T", 2 * OUT_CHANNELS * PROJECTION, lambda: grad_w2.addmm_(g_out, acts.T)),
        ("projection: x g_h^T", 2 * (width + 1) * PROJECTION, lambda: grad_w1_t.addmm_(xs, g_h.T)),
        ("projection: W1^T g_h", 2 * width * PROJECTION, lambda: torch.mm(w1_b1[:, :width].T, g_h, out=piece_gx)),
    ):
        kernels.append(dict(kernel=kernel, count=1, flops=flops * points, s=pieces * _fastest(fn, repeats)))
    gelu, derivative = _gelu_rates(repeats)
    hidden_elements, block_elements = PROJECTION * points, (LAYERS - 1) * width * points
    kernels.append(
        dict(kernel="exact GeLU recomputed", count=1, flops=0, elements=hidden_elements, s=hidden_elements * gelu)
    )
    derivatives = hidden_elements + block_elements
    kernels.append(dict(kernel="GeLU derivative", count=1, flops=0, elements=derivatives, s=derivatives * derivative))
    # Adam over rank 0's parameters: its share of the spectral weights, the replicated layers whole.
    replicated = (
        in_channels * width
        + width
        + LAYERS * (width * width + width)
        + PROJECTION * (width + 1)
        + OUT_CHANNELS * (PROJECTION + 1)
    )
    params = [torch.zeros(LAYERS * width * width * math.prod(share), dtype=torch.complex64), torch.zeros(replicated)]
    for p in params:
        p.grad = torch.randn_like(p)
    optimizer = Adam(params, lr=1e-3)
    kernels.append(dict(kernel="Adam (fused)", count=1, flops=0, s=_fastest(optimizer.step, repeats)))
    return kernels


def whole_step(shape: tuple[int, ...], width: int, in_channels: int, repeats: int) -> float:
    """The fastest of ``repeats`` training steps (forward, MSE, backward, ``drift.optim.Adam``)."""
    torch.manual_seed(0)
    model = FNO(in_channels, OUT_CHANNELS, width, MODES, n_layers=LAYERS)
    optimizer = Adam(model.parameters(), lr=1e-3)
    x, y = torch.randn(1, in_channels, *shape), torch.randn(1, OUT_CHANNELS, *shape)

    def step() -> None:
        optimizer.zero_grad()
        F.mse_loss(model(x), y).backward()
        optimizer.step()

    return _fastest(step, repeats)


def whole_forward(shape: tuple[int, ...], width: int, in_channels: int, repeats: int) -> float:
    torch.manual_seed(0)
    model = FNO(in_channels, OUT_CHANNELS, width, MODES, n_layers=LAYERS)
    x = torch.randn(1, in_channels, *shape)
    with torch.no_grad():
        return _fastest(lambda: model(x), repeats)


def _matmul_rate(repeats: int) -> float:
    a = torch.randn(2048, 2048)
    return 2 * 2048**3 / _fastest(lambda: a @ a, repeats)


def _fastest_rounds(listing, args: argparse.Namespace, shape: tuple[int, ...], ranks: int) -> list[dict]:
    """``listing``'s kernels, listed ``args.rounds`` times, each with its fastest time of all rounds: a slow
    stretch of a shared host then spoils a kernel only if it lasts through every round."""
    rounds = [listing(shape, ranks, args.width, args.in_channels, args.repeats) for _ in range(args.rounds)]
    return [dict(k, s=min(r[i]["s"] for r in rounds)) for i, k in enumerate(rounds[0])]


def _print_kernels(title: str, kernels: list[dict]) -> float:
    """Print ``kernels`` under ``title``; returns their total seconds."""
    print(f"\n{title}")
    print(f"{'kernel':42s} {'count':>5s} {'GFLOP':>8s} {'s each':>8s} {'GFLOP/s':>8s} {'s total':>8s}")
    for k in kernels:
        rate = f"{k['flops'] / k['s'] / 1e9:8.1f}" if k["flops"] else f"{'-':>8s}"
        print(
            f"{k['kernel']:42s} {k['count']:5d} {k['flops'] / 1e9:8.3f} {k['s']:8.4f} {rate} {k['s'] * k['count']:8.3f}"
        )
    return sum(k["s"] * k["count"] for k in kernels)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="64x64x32x30")
    parser.add_argument("--width", type=int, default=20)
    parser.add_argument("--in-channels", type=int, default=5)
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--cores", type=int, default=2, help="the cores P ranks of one thread share")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=1, help="list the kernels this often, keep each one's fastest")
    parser.add_argument("--step", action="store_true", help="also the kernels of a training step's backward and Adam")
    parser.add_argument("--json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    shape = tuple(int(v) for v in args.shape.split("x"))
    matmul = _matmul_rate(args.repeats)
    report = dict(shape=shape, width=args.width, cores=args.cores, matmul_flops_per_s=matmul, runs=[])
    print(f"FNO {args.in_channels} -> {args.width} -> {OUT_CHANNELS}, {LAYERS} blocks, modes {MODES}, {args.shape}")
    print(f"one thread: float32 matmul {matmul / 1e9:.0f} GFLOP/s (2048^2)")
    for ranks in args.ranks:
        kernels = _fastest_rounds(rank_kernels, args, shape, ranks)
        total = _print_kernels(f"P = {ranks}: rank 0's forward kernels, each alone (one thread)", kernels)
        ranks_per_core = ranks / min(ranks, args.cores)
        projection = [k for k in kernels if k["kernel"].startswith("projection")]
        projection_s = sum(k["s"] * k["count"] for k in projection)
        projection_flops = sum(k["flops"] * k["count"] for k in projection)
        flops = sum(k["flops"] * k["count"] for k in kernels)
        print(
            f"the projection (two gemms and its GeLU): {projection_s:.3f} s of {total:.3f} s "
            f"({100 * projection_s / total:.0f}%), {projection_flops / 1e9:.2f} of {flops / 1e9:.2f} GFLOP "
            f"({100 * projection_flops / flops:.0f}%)"
        )
        line = f"sum {total:.3f} s per rank; {ranks} rank(s) on {args.cores} cores: "
        line += f"forward >= {total * ranks_per_core:.3f} s"
        run = dict(
            ranks=ranks,
            kernels=kernels,
            kernel_s=total,
            floor_s=total * ranks_per_core,
            projection_s=projection_s,
            projection_flops=projection_flops,
            flops=flops,
        )
        if ranks == 1:
            run["forward_s"] = whole_forward(shape, args.width, args.in_channels, args.repeats)
            line += f"; the whole forward {run['forward_s']:.3f} s = {run['forward_s'] / total:.2f}x its kernels"
        print(line)
        if args.step:
            backward = _fastest_rounds(rank_backward_kernels, args, shape, ranks)
            after = _print_kernels(f"P = {ranks}: rank 0's backward and Adam kernels, each alone", backward)
            step = total + after
            line = (
                f"step kernels {step:.3f} s per rank = {step / total:.2f}x the forward's; "
                f"{ranks} rank(s) on {args.cores} cores: step >= {step * ranks_per_core:.3f} s"
            )
            run.update(backward_kernels=backward, step_kernel_s=step, step_floor_s=step * ranks_per_core)
            if ranks == 1:
                run["step_s"] = whole_step(shape, args.width, args.in_channels, args.repeats)
                line += (
                    f"; the whole step {run['step_s']:.3f} s = {run['step_s'] / step:.2f}x its kernels, "
                    f"{run['step_s'] / run['forward_s']:.2f}x the whole forward"
                )
            print(line)
        report["runs"].append(run)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
