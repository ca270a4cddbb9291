"""``drift.cost.fno_memory`` against measured peaks, for the fitted terms ``tests/test_memory.py`` does not
check: neuraloperator's blocks (``_NEURALOP_EXTRA``), autoregressive unrolls (``_UNROLL_KEPT``) and the
pages a training loop holds beyond its live tensors (``_LOOP_SLACK``).

Each case runs in a fresh process on one rank, one thread. ``live``: ``drift.memory.LiveBytes``'s peak of
the first step (every tensor the step touches, parameters and Adam's moments included), set beside the
estimate less its start-up and slack. ``loop``: the process's private peak (``drift.budget.peak_bytes``,
reset before each step through ``/proc/self/clear_refs``) less its private memory before the model was
built, for each of ``--steps`` training steps, over the first step's live peak; the estimate's
``(total - startup) / (total - startup - slack)`` beside it.

    python benchmarks/memory_model.py --out results/memory_model.json

Linux only (``clear_refs``). Prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

# (name, grid, modes, neuraloperator's blocks, unrolled steps, what is recomputed: drift.nn.set_recompute)
CASES = [
    ("step", (1280, 1280), (8, 8), False, 1, None),
    ("step, neuraloperator's", (1280, 1280), (8, 8), True, 1, None),
    ("step, neuraloperator's, MLPs recomputed", (1280, 1280), (8, 8), True, 1, "mlp"),
    ("step, recomputed", (1280, 1280), (8, 8), False, 1, "blocks"),
    ("step, neuraloperator's, recomputed", (1280, 1280), (8, 8), True, 1, "blocks"),
    ("step, neuraloperator's, MLPs recomputed", (640, 640), (8, 8), True, 1, "mlp"),
    ("step, neuraloperator's, recomputed", (640, 640), (8, 8), True, 1, "blocks"),
    ("unroll of 3", (640, 640), (8, 8), False, 3, None),
    ("unroll of 3, recomputed", (640, 640), (8, 8), False, 3, "blocks"),
    ("unroll of 3, neuraloperator's, MLPs recomputed", (640, 640), (8, 8), True, 3, "mlp"),
    ("unroll of 3, neuraloperator's, recomputed", (640, 640), (8, 8), True, 3, "blocks"),
    ("step", (24, 24, 12, 30), (4, 4, 4, 8), False, 1, None),
    ("step, recomputed", (24, 24, 12, 30), (4, 4, 4, 8), False, 1, "blocks"),
    ("step, neuraloperator's, MLPs recomputed", (24, 24, 12, 30), (4, 4, 4, 8), True, 1, "mlp"),
    ("step, neuraloperator's, recomputed", (24, 24, 12, 30), (4, 4, 4, 8), True, 1, "blocks"),
]
IN_CHANNELS, OUT_CHANNELS, WIDTH, LAYERS = 5, 1, 20, 4


def measure(case: int, steps: int) -> dict:
    """Run ``CASES[case]`` here; return the live peak, the per-step private peaks and the estimate."""
    import torch

    from drift.budget import peak_bytes
    from drift.cost import fno_memory
    from drift.memory import LiveBytes
    from drift.nn import FNO, NEURALOP_DEFAULTS, set_recompute
    from drift.train.budget import STEP_PASS

    torch.set_num_threads(1)
    name, grid, modes, neuralop, unroll, recompute = CASES[case]
    clear_refs = Path("/proc/self/clear_refs")
    clear_refs.write_text("5")  # VmHWM := the resident set now
    before = peak_bytes("cpu")
    torch.manual_seed(0)
    options = NEURALOP_DEFAULTS if neuralop else {}
    model = set_recompute(FNO(IN_CHANNELS, OUT_CHANNELS, WIDTH, modes, LAYERS, **options), recompute)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(1, IN_CHANNELS, *grid)

    def step() -> None:
        window, loss = x, 0.0
        for _ in range(unroll):  # frames as channels, each prediction fed back (the autoregressive recipe)
            y = model(window)
            loss = loss + y.square().mean()
            window = torch.cat([window[:, OUT_CHANNELS:], y], 1)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    with LiveBytes() as live:
        step()
    loops = []
    for _ in range(steps):
        clear_refs.write_text("5")
        step()
        loops.append(peak_bytes("cpu") - before)
    estimate = fno_memory(
        grid, (1,) * len(grid), in_channels=IN_CHANNELS, out_channels=OUT_CHANNELS, width=WIDTH, modes=modes,
        n_layers=LAYERS, pass_=STEP_PASS[recompute], neuralop=neuralop, steps=unroll,
    )  # fmt: skip
    bare = estimate.total - estimate.startup
    return dict(
        case=name,
        grid="x".join(map(str, grid)),
        live_gb=live.peak / 1e9,
        estimate_live_gb=(bare - estimate.slack) / 1e9,
        loop_over_live=[round(b / live.peak, 3) for b in loops],
        estimate_loop_over_live=round(bare / (bare - estimate.slack), 3),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3, help="training steps measured after the first")
    parser.add_argument("--out", type=Path, default=None, help="a JSON file of the rows")
    parser.add_argument("--case", type=int, default=None, help=argparse.SUPPRESS)  # one case, in this process
    args = parser.parse_args()
    if args.case is not None:
        print(json.dumps(measure(args.case, args.steps)))
        return
    rows = []
    print(
        "| case | grid | live peak | estimate (live) | estimate/live | loop peak/live, steps 2.. | estimate's "
        "| estimate/loop peak |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for case in range(len(CASES)):
        command = [sys.executable, __file__, "--case", str(case), "--steps", str(args.steps)]
        row = json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)
        rows.append(row)
        total = row["estimate_live_gb"] * row["estimate_loop_over_live"]  # the estimate less its start-up
        print(
            f"| {row['case']} | {row['grid']} | {row['live_gb']:.3f} GB | {row['estimate_live_gb']:.3f} GB | "
            f"{row['estimate_live_gb'] / row['live_gb']:.2f} | {', '.join(map(str, row['loop_over_live']))} | "
            f"{row['estimate_loop_over_live']} | {total / (max(row['loop_over_live']) * row['live_gb']):.2f} |",
            flush=True,
        )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
