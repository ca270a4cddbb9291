"""The FNO projection (width -> 128 -> out, GeLU between): whole tensors against ``FNO._project``'s chunks.

Forward without autograd (``mlp_unrecorded``, one resident hidden buffer per chunk), and forward +
backward (``chunked_mlp``), on one rank's block, each variant with chunks of ``--chunk-mib`` MiB of
intermediates; medians of interleaved repeats, with the FLOPs, the achieved rate and this machine's
measured matmul and copy ceilings in the same run.

    python benchmarks/projection.py --shape 16x64x32x30 --width 20 --repeats 5 --json results/projection.json
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
    parser.add_argument("--shape", default="16x64x32x30", help="the block's spatial extents")
    parser.add_argument("--width", type=int, default=20)
    parser.add_argument("--out-channels", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--chunk-mib", type=float, nargs="+", default=[1, 4, 16])
    parser.add_argument("--json")
    args = parser.parse_args()
    shape = tuple(int(n) for n in args.shape.split("x"))
    torch.manual_seed(0)
    model = FNO(1, args.out_channels, args.width, (2,) * len(shape), n_layers=1)
    x = torch.randn(1, args.width, *shape)
    hidden, out = model.project_hidden, model.project_out

    def whole() -> torch.Tensor:
        return out(F.gelu(hidden(x)))

    variants = {"whole": whole}
    for mib in args.chunk_mib:
        variants[f"chunked {mib:g} MiB"] = lambda mib=mib: _chunked(model, x, mib)
    points = math.prod(shape)
    flops = 2 * points * (args.width * hidden.weight.shape[0] + hidden.weight.shape[0] * args.out_channels)
    times: dict[str, dict[str, list[float]]] = {name: {"forward": [], "train": []} for name in variants}
    ceilings = [_ceilings()]
    for _ in range(args.repeats):
        for name, fn in variants.items():
            with torch.no_grad():
                times[name]["forward"].append(_seconds(fn))
            x.requires_grad_(True)
            times[name]["train"].append(_seconds(lambda fn=fn: fn().sum().backward()))
            x.requires_grad_(False)
            x.grad = None
            model.zero_grad(set_to_none=True)
        ceilings.append(_ceilings())
    matmul = statistics.median(c["matmul_gflops"] for c in ceilings)
    copy = statistics.median(c["copy_gbps"] for c in ceilings)
    print(f"projection {args.width} -> 128 -> {args.out_channels} on {args.shape} ({flops / 1e9:.2f} GFLOP forward)")
    print(f"machine: matmul {matmul:.0f} GFLOP/s, copy {copy:.1f} GB/s (medians over the run)")
    rows = []
    base = statistics.median(times["whole"]["forward"])
    for name, t in times.items():
        forward, train = statistics.median(t["forward"]), statistics.median(t["train"])
        rate = flops / forward / 1e9
        rows.append(dict(variant=name, forward_s=forward, train_s=train, forward_gflops=rate))
        print(
            f"{name:18s} forward {forward:7.3f} s ({base / forward:4.1f}x whole, {rate:5.1f} GFLOP/s = "
            f"{rate / matmul:4.0%} of matmul)   forward+backward {train:7.3f} s"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(args=vars(args), flops=flops, matmul_gflops=matmul, copy_gbps=copy, rows=rows), f, indent=2)


def _chunked(model: FNO, x: torch.Tensor, mib: float) -> torch.Tensor:
    saved = dict(chunked.CHUNK_BYTES)
    chunked.CHUNK_BYTES[x.device.type] = int(mib * 2**20)
    try:
        return model._project(x)
    finally:
        chunked.CHUNK_BYTES.update(saved)


if __name__ == "__main__":
    main()
