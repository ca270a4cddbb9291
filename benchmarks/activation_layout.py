"""Exact GeLU on a whole block against a chunk of its points, and a lift's gemm whole against in pieces.

An FNO block's tail ``gelu(y + W x)`` runs a chunk of points at a time; such a chunk of a ``(b, c, n)``
block is a strided view across its channels. This script times, on one process, interleaved, medians of
``--repeats`` rounds:

- torch's exact GeLU and its derivative (``gelu_backward``) per element, on the contiguous block and on
  its chunks of ``--chunk-points`` points;
- the unrecorded block tail: ``y += W x`` a chunk at a time, GeLU on each chunk (before) or once over the
  block after the chunks (``drift.nn.chunked.accumulate_in_place`` now);
- a lift ``W x + b`` from ``--in-channels`` channels: one gemm over the block (before) or a thread's
  piece at a time (``drift.nn.chunked.linear_into`` now).

Inputs are normal, the weights scaled by ``1 / sqrt(in)``, so the pre-activations have the magnitudes of
a trained FNO's (erf's cost depends on nothing else, but values that grow without bound reach denormals).

    python benchmarks/activation_layout.py [--shape 64x64x32x30] [--width 20] [--threads 1] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time

import torch
from torch.nn import functional as F

from drift.nn.chunked import CHUNK_BYTES, accumulate_in_place, linear_into


def _seconds(fn, reset=None) -> float:
    if reset is not None:
        reset()
    began = time.perf_counter()
    fn()
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="64x64x32x30")
    parser.add_argument("--width", type=int, default=20)
    parser.add_argument("--in-channels", type=int, default=5, help="the lift's input channels")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--chunk-points", type=int, help="default: accumulate_in_place's chunk")
    parser.add_argument("--json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    points = math.prod(int(v) for v in args.shape.split("x"))
    width = args.width
    step = args.chunk_points or CHUNK_BYTES["cpu"] // (2 * width * 4)
    x, y0, g = (torch.randn(1, width, points) for _ in range(3))
    y, out = y0.clone(), torch.empty(1, width, points)
    w = torch.randn(width, width) / math.sqrt(width)
    x_in, b_in = torch.randn(1, args.in_channels, points), torch.randn(width)
    w_in = torch.randn(width, args.in_channels)
    chunks = [slice(s, s + step) for s in range(0, points, step)]

    def gelu_chunks() -> None:
        for c in chunks:
            torch.ops.aten.gelu.out(y0[..., c], approximate="none", out=out[..., c])

    def derivative_chunks() -> None:
        for c in chunks:
            torch.ops.aten.gelu_backward.grad_input(g[..., c], y0[..., c], approximate="none", grad_input=out[..., c])

    def tail_before() -> None:
        wb = w.expand(1, -1, -1)
        for c in chunks:
            part = y[..., c]
            torch.baddbmm(part, wb, x[..., c], out=part)
            torch.ops.aten.gelu_(part)

    def lift_before() -> None:
        torch.baddbmm(b_in[None, :, None], w_in.expand(1, -1, -1), x_in, out=out)

    def reset() -> None:
        y.copy_(y0)

    variants = {  # (before, now, elements or None, reset)
        "GeLU": (
            gelu_chunks,
            lambda: torch.ops.aten.gelu.out(y0, approximate="none", out=out),
            y0.numel(),
            None,
        ),
        "GeLU derivative": (
            derivative_chunks,
            lambda: torch.ops.aten.gelu_backward.grad_input(g, y0, approximate="none", grad_input=out),
            y0.numel(),
            None,
        ),
        "block tail y = gelu(y + W x)": (tail_before, lambda: accumulate_in_place(w, None, x, y, F.gelu), None, reset),
        f"lift {args.in_channels} -> {width}": (lift_before, lambda: linear_into(w_in, b_in, x_in, out), None, None),
    }
    times = {name: ([], []) for name in variants}
    for _ in range(args.repeats + 1):  # the first round warms up
        for name, (before, now, _, reset_fn) in variants.items():
            times[name][0].append(_seconds(before, reset_fn))
            times[name][1].append(_seconds(now, reset_fn))
    print(f"block (1, {width}, {points}), chunks of {step} points, {args.threads} thread(s), medians of {args.repeats}")
    print(f"{'':32s} {'before s':>9s} {'now s':>9s} {'now/before':>10s} {'ns/element before, now':>24s}")
    report = dict(shape=args.shape, width=width, threads=args.threads, chunk_points=step, results={})
    for name, (*_, elements, _reset) in variants.items():
        b, n = (statistics.median(t[1:]) for t in times[name])
        per = f"{1e9 * b / elements:10.3f} {1e9 * n / elements:10.3f}" if elements else ""
        print(f"{name:32s} {b:9.4f} {n:9.4f} {n / b:10.2f} {per:>24s}")
        report["results"][name] = dict(before_s=b, now_s=n, ratio=n / b, elements=elements)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
