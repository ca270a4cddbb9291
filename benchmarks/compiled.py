"""drift's FNO eager against ``torch.compile``: forward and training step, side by side in interleaved rounds.

On one device, after an eager call that builds the plans, ``torch.compile(fullgraph=True)`` traces the
model as one graph (the chunk loops and resident buffers of the eager path give way to the compiler's
own). This script times both on the same inputs and weights: the first compiled calls (tracing and code
generation), then ``--rounds`` rounds of eager and compiled forwards (``torch.no_grad``) and training
steps (forward and backward), interleaved, and prints the medians, their ratios and the compiled
output's relative difference from eager. ``--mode reduce-overhead`` uses CUDA graphs on a GPU, where
an eager block is bound by its launches (``benchmarks/dispatch.py``).

    python benchmarks/compiled.py [--shape 32x32x32x16] [--width 20] [--modes 8 8 8 8] [--layers 4]
        [--device cpu] [--mode default] [--rounds 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from drift.arguments import shape as shape_arg
from drift.nn import FNO
from drift.profiling import synchronize_device


def _seconds(fn) -> float:
    synchronize_device()
    began = time.perf_counter()
    fn()
    synchronize_device()
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", type=shape_arg, default=shape_arg("32x32x32x16"))
    parser.add_argument("--width", type=int, default=20)
    parser.add_argument("--modes", type=int, nargs="+", default=[8, 8, 8, 8])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--mode", default="default", help="torch.compile's mode")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json")
    args = parser.parse_args()
    shape = args.shape
    shape_text = "x".join(map(str, shape))
    device = torch.device(args.device)
    torch.manual_seed(0)
    model = FNO(5, 5, args.width, tuple(args.modes), n_layers=args.layers, device=device)
    x = torch.randn(args.batch, 5, *shape, device=device)
    compiled = torch.compile(model, mode=args.mode, fullgraph=True)

    def forward(fn):
        with torch.no_grad():
            return fn(x)

    def step(fn):
        model.zero_grad(set_to_none=True)
        fn(x).square().mean().backward()

    with torch.no_grad():
        eager = model(x)  # builds the plans, so that the compiled model is one graph
    first = {"forward": _seconds(lambda: forward(compiled)), "step": _seconds(lambda: step(compiled))}
    difference = (forward(compiled) - eager).norm().item() / eager.norm().item()
    times: dict[str, list[float]] = {
        k: [] for k in ("eager forward", "compiled forward", "eager step", "compiled step")
    }
    for _ in range(args.rounds):
        times["eager forward"].append(_seconds(lambda: forward(model)))
        times["compiled forward"].append(_seconds(lambda: forward(compiled)))
        times["eager step"].append(_seconds(lambda: step(model)))
        times["compiled step"].append(_seconds(lambda: step(compiled)))
    medians = {k: statistics.median(v) for k, v in times.items()}
    print(
        f"FNO {shape_text}, batch {args.batch}, width {args.width}, modes {tuple(args.modes)}, {args.layers} layers, "
        f"{device}, {torch.get_num_threads()} threads, torch.compile mode {args.mode!r}, torch {torch.__version__}"
    )
    print(
        f"first compiled calls (tracing, code generation): forward {first['forward']:.1f} s, step {first['step']:.1f} s"
    )
    print(f"compiled output against eager: relative difference {difference:.1e}")
    for what in ("forward", "step"):
        e, c = medians[f"eager {what}"], medians[f"compiled {what}"]
        print(f"{what:>8}: eager {e * 1e3:9.2f} ms   compiled {c * 1e3:9.2f} ms   eager / compiled {e / c:5.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "first_s": first, "difference": difference, "seconds": times}, f, indent=2)


if __name__ == "__main__":
    main()
