"""The FNO projection (width -> 128 -> out, GeLU between): whole tensors against ``FNO._project``'s chunks.

Forward without autograd (``mlp_unrecorded``, resident buffers), and forward + backward (``chunked_mlp``),
on one rank's block. Each variant runs chunks cut into one piece of ``--piece-mib`` MiB of intermediates
per thread (each piece one gemm of a batched gemm, as drift does), or chunks of ``--chunk-mib`` MiB not
cut (one gemm shared by the threads, as before the pieces). Medians (and the fastest) of interleaved
repeats, with the FLOPs, the achieved rate and this machine's measured matmul and copy ceilings in the
same run.

    python benchmarks/projection.py --shape 16x64x32x30 --width 20 --repeats 5 --json results/projection.json
    python benchmarks/projection.py --shape 64x64x32x30 --chunk-mib 16 --piece-mib 1 2 4 --no-whole
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time

import torch
from torch.nn import functional as F

import drift.nn.chunked as chunked
from drift.arguments import shape as shape_arg
from drift.nn import FNO


def _seconds(fn) -> float:
    began = time.perf_counter()
    fn()
    return time.perf_counter() - began


def _ceilings() -> dict:
    a = torch.randn(2048, 2048)
    matmul = min(_seconds(lambda: a @ a) for _ in range(3))
    src = torch.randn(64 * 2**20 // 4)
    dst = torch.empty_like(src)
    copy = min(_seconds(lambda: dst.copy_(src)) for _ in range(5))
    return dict(matmul_gflops=2 * 2048**3 / matmul / 1e9, copy_gbps=2 * src.numel() * 4 / copy / 1e9)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", type=shape_arg, default=shape_arg("16x64x32x30"), help="the block's spatial extents")
    parser.add_argument("--width", type=int, default=20)
    parser.add_argument("--out-channels", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--chunk-mib", type=float, nargs="+", default=[16], help="chunks not cut into pieces")
    parser.add_argument("--piece-mib", type=float, nargs="+", default=[1, 2, 4], help="pieces a thread")
    parser.add_argument("--no-whole", action="store_true", help="leave out the whole-tensor variant")
    parser.add_argument("--json")
    args = parser.parse_args()
    shape = args.shape
    shape_text = "x".join(map(str, shape))
    torch.manual_seed(0)
    model = FNO(1, args.out_channels, args.width, (2,) * len(shape), n_layers=1)
    x = torch.randn(1, args.width, *shape)
    hidden, out = model.project_hidden, model.project_out

    def whole() -> torch.Tensor:
        return out(F.gelu(hidden(x)))

    variants = {} if args.no_whole else {"whole": whole}
    for mib in args.chunk_mib:
        variants[f"chunks {mib:g} MiB"] = lambda mib=mib: _chunked(model, x, mib, cut=False)
    for mib in args.piece_mib:
        variants[f"pieces {mib:g} MiB"] = lambda mib=mib: _chunked(model, x, mib)
    points = math.prod(shape)
    flops = 2 * points * (args.width * hidden.weight.shape[0] + hidden.weight.shape[0] * args.out_channels)
    times = {name: {"forward": [], "train": [], "backward": []} for name in variants}
    ceilings = [_ceilings()]
    for _ in range(args.repeats):
        for name, fn in variants.items():
            with torch.no_grad():
                times[name]["forward"].append(_seconds(fn))
            x.requires_grad_(True)
            began = time.perf_counter()
            y = fn().sum()
            recorded = time.perf_counter()
            y.backward()
            ended = time.perf_counter()
            times[name]["train"].append(ended - began)
            times[name]["backward"].append(ended - recorded)
            x.requires_grad_(False)
            x.grad = None
            model.zero_grad(set_to_none=True)
        ceilings.append(_ceilings())
    matmul = statistics.median(c["matmul_gflops"] for c in ceilings)
    copy = statistics.median(c["copy_gbps"] for c in ceilings)
    print(f"projection {args.width} -> 128 -> {args.out_channels} on {shape_text} ({flops / 1e9:.2f} GFLOP forward)")
    print(f"machine: matmul {matmul:.0f} GFLOP/s, copy {copy:.1f} GB/s (medians over the run); medians (fastest)")
    rows = []
    first = next(iter(variants))
    base = statistics.median(times[first]["forward"])
    for name, t in times.items():
        median = {key: statistics.median(v) for key, v in t.items()}
        fastest = {key: min(v) for key, v in t.items()}
        rate = flops / median["forward"] / 1e9
        rows.append(
            dict(
                variant=name,
                **{f"{k}_s": v for k, v in median.items()},
                forward_gflops=rate,
                **{f"{k}_fastest_s": v for k, v in fastest.items()},
            )
        )
        print(
            f"{name:18s} forward {median['forward']:6.3f} s ({base / median['forward']:4.1f}x {first}, "
            f"{rate:5.1f} GFLOP/s = {rate / matmul:4.0%} of matmul)  forward+backward {median['train']:6.3f} s, "
            f"backward {median['backward']:6.3f} ({fastest['backward']:.3f}) s"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(args=vars(args), flops=flops, matmul_gflops=matmul, copy_gbps=copy, rows=rows), f, indent=2)


def _chunked(model: FNO, x: torch.Tensor, mib: float, cut: bool = True) -> torch.Tensor:
    """The projection with pieces of ``mib`` MiB a thread, or (``cut=False``) chunks of ``mib`` MiB each one
    gemm for all threads, as before the pieces."""
    saved_piece, saved_parts = chunked.PIECE_BYTES, chunked._parts
    chunked.PIECE_BYTES = int(mib * 2**20)
    if not cut:
        chunked._parts = lambda device: 1
    try:
        return model.executor.project(model.project_hidden, model.project_out, model.non_linearity, x)
    finally:
        chunked.PIECE_BYTES, chunked._parts = saved_piece, saved_parts


if __name__ == "__main__":
    main()
