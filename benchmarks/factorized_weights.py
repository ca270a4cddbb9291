"""Spectral weight memory per rank, dense against Tucker and CP factors, for the paper's layer.

Counts the parameter bytes each rank stores for one ``SpectralConv`` (complex64) under each method on
P ranks splitting x (a slab): a dense weight is sharded on K1 (drift), as the mode grid's blocks
(dfno-pruned) or replicated (dfno); factors are replicated. Also the block of the dense weight each
rank rebuilds per forward for drift (its K1 share; freed after the backward) and the complex
multiply-adds of that rebuild. Prints a markdown table.

    python benchmarks/factorized_weights.py [--width 20] [--modes 8,8,8,16] [--rank 0.05] [--ranks 1,4]
"""

from __future__ import annotations

import argparse
import math

import torch

from drift.layout import chunk_sizes
from drift.nn import SpectralConv
from drift.nn.factorized import FactorizedWeight


def rebuild_macs(weight: FactorizedWeight, rows: int) -> int:
    """Complex multiply-adds of rebuilding the block with ``rows`` of K1 (the einsum order drift uses)."""
    shape = list(weight.shape)
    shape[2] = rows
    if weight.factorization == "cp":  # the Khatri-Rao products are small next to their matrix product
        return math.prod(shape) * weight.rank
    ranks = list(weight.rank)
    macs, current = 0, list(ranks)
    for j in sorted(range(len(shape)), key=lambda j: shape[j] / ranks[j]):
        macs += math.prod(current) * shape[j]
        current[j] = shape[j]
    return macs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=20)
    parser.add_argument("--modes", default="8,8,8,16")
    parser.add_argument("--rank", type=float, default=0.05)
    parser.add_argument("--ranks", default="1,4")
    args = parser.parse_args()
    modes = tuple(int(m) for m in args.modes.split(","))
    counts = [int(p) for p in args.ranks.split(",")]
    bytes_per = torch.tensor([], dtype=torch.complex64).element_size()
    layers = {f: SpectralConv(args.width, args.width, modes, factorization=f, rank=args.rank, device="meta")
              for f in (None, "tucker", "cp")}  # fmt: skip
    k1 = layers[None].mode_shape[0]
    dense = layers[None].weight.numel()
    mib = 2**20
    print(f"width {args.width}, modes {modes}: weight {(args.width, args.width, *layers[None].mode_shape)}, "
          f"rank {args.rank}, complex64")  # fmt: skip
    header = "| weight | rank | parameters | " + " | ".join(f"MiB per rank, P = {p}" for p in counts)
    print(header + " | rebuilt block per rank (drift), P = " + "/".join(map(str, counts)) + " |")
    print("|---" * (4 + len(counts)) + "|")
    for f, layer in layers.items():
        held = sum(p.numel() for p in layer.parameters())
        if f is None:
            per_rank = [f"{dense * max(chunk_sizes(k1, p)) / k1 * bytes_per / mib:.2f} (drift), "
                        f"{dense * bytes_per / mib:.2f} (dfno)" for p in counts]  # fmt: skip
            rebuilt, rank = "none", "-"
        else:
            per_rank = [f"{held * bytes_per / mib:.2f}" for _ in counts]
            rows = [max(chunk_sizes(k1, p)) for p in counts]
            rebuilt = " / ".join(
                f"{dense * r / k1 * bytes_per / mib:.1f} MiB, {rebuild_macs(layer.weight, r) / 1e9:.2f} G MACs"
                for r in rows
            )
            rank = str(layer.weight.rank)
        share = f"{held:,} ({held / dense:.3f} of dense)"
        print(f"| {f or 'dense'} | {rank} | {share} | " + " | ".join(per_rank) + f" | {rebuilt} |")


if __name__ == "__main__":
    main()
