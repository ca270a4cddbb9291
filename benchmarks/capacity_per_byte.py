"""Issue 42's figures on one process, by ``drift.memory.LiveBytes`` (tensor bytes, no start-up): the FNO
forward's peak against its floor (input, output, one activation, parameters), a training step's peak
stored and recomputed with their times, and bfloat16 activations' error against float32.

    PYTHONPATH=src python benchmarks/capacity_per_byte.py --out results/capacity_per_byte.json

``--live-bytes-only`` (for the tree of an earlier commit, which lacks ``LiveBytes`` and the new options):
the forward's peak alone, with ``LiveBytes`` taken from this file's tree.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
CASES = {"2d": ((1024, 1024), (8, 8)), "3d+time": ((48, 48, 24, 30), (8, 8, 8, 16))}


def _live_bytes():
    spec = importlib.util.spec_from_file_location("_memory", ROOT / "src" / "drift" / "memory.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["_memory"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module.LiveBytes


def _model(modes, **options):
    from drift.nn import FNO

    torch.manual_seed(0)
    return FNO(5, 5, 20, modes, **options)


def forward_peak(shape, modes) -> dict:
    live = _live_bytes()
    model = _model(modes)
    x = torch.randn(1, 5, *shape, generator=torch.Generator().manual_seed(1))
    params = sum(p.nbytes for p in model.parameters())
    floor = 30 * 4 * x[0, 0].numel() + params
    with torch.no_grad(), live() as counted:
        model(x)
    return {"peak_gb": counted.peak / 1e9, "floor_gb": floor / 1e9, "peak_over_floor": counted.peak / floor}


def step(shape, modes, recompute: bool) -> dict:
    from drift.memory import LiveBytes

    model = _model(modes, recompute=recompute)
    x = torch.randn(1, 5, *shape, generator=torch.Generator().manual_seed(1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    with LiveBytes() as counted:
        model(x).square().mean().backward()
        optimizer.step()
    times = []
    for _ in range(3):
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        optimizer.step()
        times.append(time.perf_counter() - start)
    return {"peak_gb": counted.peak / 1e9, "seconds": min(times)}


def bf16_error(shape, modes, method: str) -> float:
    model = _model(modes, method=method)
    x = torch.randn(1, 5, *shape, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        y = model(x)
        model.activations = torch.bfloat16
        y16 = model(x)
    return float((y16 - y).norm() / y.norm())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("results/capacity_per_byte.json"))
    parser.add_argument("--live-bytes-only", action="store_true")
    args = parser.parse_args()
    result = {name: {"forward": forward_peak(*case)} for name, case in CASES.items()}
    if not args.live_bytes_only:
        small = {"2d": ((512, 512), (8, 8)), "3d+time": ((32, 32, 16, 30), (8, 8, 8, 16))}
        for name, case in small.items():
            result[name]["step"] = {"stored": step(*case, False), "recompute": step(*case, True)}
            result[name]["bf16_error"] = {m: bf16_error(*case, m) for m in ("drift", "dfno", "dfno-pruned")}
    print(json.dumps(result, indent=1))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
