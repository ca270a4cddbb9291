"""Reading PDEBench data at 128^3: one trajectory's blocks per rank, and the training step's data phase.

The script writes a PDEBench-layout file (``--trajectories`` of ``--frames`` frames at ``--resolution``^3,
random float32 fields) into a temporary folder, which it removes at the end. Then, on 1 and 4 Gloo ranks
(a slab along x, every rank reading its block at once, between barriers), side by side in rounds:

- reads of one trajectory's 21 frames (t_in 5 + t_out 16) per rank, the median of ``--rounds``: ``raw``,
  h5py slicing of the same bytes from the warm page cache (the floor); ``before``, drift's preparation
  before reading straight into the output (a faithful copy, ``old_item``: a read per field, ``np.stack``,
  ``astype``, the normalisation in numpy and two ``.contiguous()`` copies); ``after``, ``Trajectories[i]``;
  and (one rank) the main thread's longest pause while another thread runs ``Trajectories[i]``: whether
  h5py lets Python run during its reads;
- training runs (``drift.train.train``, ``--epochs`` epochs of batches of one trajectory, a plain FNO of
  ``--width`` and ``--layers`` predicting ``--t-out`` frames; every run the same seed and data: their
  losses must agree bit for bit) in three modes one after the other: ``before`` (the old preparation in
  the step), ``after`` (``--no-prefetch``) and ``prefetch`` (the default); per step of the last epoch
  the data phase and the whole step (rank 0's ``drift.train`` clock): the epoch's first step, which
  waits for its read in every mode, and the median of the others; and the epoch's seconds.

    python benchmarks/data.py --json results/data.json
    python benchmarks/data.py --resolution 32 --trajectories 3 --ranks 1 2   # a quick rehearsal
    python benchmarks/data.py --device cuda --ranks 1   # training on a GPU: pinned batches, copies that do not block
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path

import h5py
import numpy as np
import torch

from drift import comm
from drift.data import FIELDS, Stats, Trajectories
from drift.data.pdebench import COORDINATES
from drift.jobs.launch import run_ranks
from drift.train import TrainConfig, model_input, train

T_IN, T_OUT = 5, 16  # the frames one read takes: the paper's
STATS = Stats(FIELDS, (0.1, 0.2, 0.3, 0.4, 0.5), (1.0, 1.1, 1.2, 1.3, 1.4))
MODES = ("before", "after", "prefetch")


def write_file(path: Path, trajectories: int, n: int, frames: int) -> None:
    """PDEBench's 3D layout (``drift.data.write_pdebench3d``'s) written a trajectory at a time: random fields."""
    rng = np.random.default_rng(0)
    with h5py.File(path, "w") as f:
        for key in FIELDS:
            dataset = f.create_dataset(key, (trajectories, frames, n, n, n), dtype=np.float32)
            for t in range(trajectories):
                dataset[t] = rng.standard_normal((frames, n, n, n), dtype=np.float32)
        for key in COORDINATES:
            f.create_dataset(key, data=(np.arange(n, dtype=np.float32) + 0.5) / n)
        f.create_dataset("t-coordinate", data=np.arange(frames + 1, dtype=np.float32) / (frames - 1))


def old_item(file: h5py.File, t: int, slab: tuple, t_in: int, t_out: int, stats: Stats):
    """``Trajectories[i]`` before it read into its output (drift 0617d1f), for the trajectory ``t`` of ``file``."""
    frames = slice(0, t_in + t_out)
    data = np.stack([file[key][(t, frames, *slab)] for key in FIELDS]).astype(np.float32)
    mean = np.asarray(stats.mean, dtype=np.float32).reshape(-1, 1, 1, 1, 1)
    std = np.asarray(stats.std, dtype=np.float32).reshape(-1, 1, 1, 1, 1)
    data = torch.from_numpy((data - mean) / std)
    return data[:, :t_in].contiguous(), data[:, t_in:].contiguous()


def _mesh():
    import drift

    size = comm.world_size()
    return drift.grid_mesh((size, 1, 1)) if size > 1 else (None, None)


def _timed(fn) -> float:
    comm.barrier()
    began = time.perf_counter()
    fn()
    elapsed = time.perf_counter() - began
    comm.barrier()
    return elapsed


def _longest_pause(fn) -> float:
    """The main thread's longest pause between two clock reads while ``fn`` runs in another thread."""
    worker = threading.Thread(target=fn)
    longest, last = 0.0, time.perf_counter()
    worker.start()
    while worker.is_alive():
        now = time.perf_counter()
        longest, last = max(longest, now - last), now
    worker.join()
    return longest


def reads(path: str, rounds: int) -> dict:
    """On every rank: the median seconds of ``raw``, ``before`` and ``after`` reads of its block of one
    trajectory, the methods interleaved in each round; rank 0 alone also the main thread's longest pause."""
    mesh, placements = _mesh()
    ds = Trajectories(path, mesh, placements, t_in=T_IN, t_out=T_OUT, split="test", stats=STATS)
    t, slab = ds.trajectories[0], ds.layout.local_slices
    frames = slice(0, T_IN + T_OUT)
    with h5py.File(path, "r") as f:
        methods = {
            "raw": lambda: [f[key][(t, frames, *slab)] for key in FIELDS],
            "before": lambda: old_item(f, t, slab, T_IN, T_OUT, STATS),
            "after": lambda: ds[0],
        }
        assert all(torch.equal(a, b) for a, b in zip(methods["before"](), ds[0], strict=True))  # the same values
        seconds = {name: [] for name in methods}
        for _ in range(rounds + 1):  # the first round warms the page cache and the allocator
            for name, fn in methods.items():
                seconds[name].append(_timed(fn))
    result = {name: statistics.median(s[1:]) for name, s in seconds.items()}
    result["bytes"] = 4 * len(FIELDS) * (T_IN + T_OUT) * int(np.prod(ds.local_shape))
    if comm.world_size() == 1:
        result["pause_s"] = _longest_pause(lambda: ds[0])
    return result


def _old_read_batch(dataset, indices, sharding, device):
    """``drift.train.sharding.read_batch`` as its step read before (``load_batch``'s stack of items)."""
    if not hasattr(dataset, "_old_file"):
        dataset._old_file = h5py.File(dataset.files.paths[0], "r")
    slab = dataset.layout.local_slices
    pairs = [
        old_item(dataset._old_file, dataset.trajectories[i], slab, dataset.t_in, dataset.t_out, dataset.stats)
        for i in sharding.share(indices)
    ]
    x, y = (torch.stack([p[k] for p in pairs]) for k in (0, 1))
    # As the new read_batch, the model's input is assembled here for the CPU (in the step, since "before"
    # does not read ahead), after the copy for a GPU.
    return (model_input(x, dataset.t_out) if torch.device(device).type == "cpu" else x), y


def training(config: TrainConfig, mode: str) -> dict:
    """On every rank: ``train(config)`` reading as ``mode`` does; rank 0's history and the phases of each
    step of its last epoch (``drift.train``'s own clock, recorded per step)."""
    import drift.train.loop
    import drift.train.sharding
    from drift.train.epoch import PhaseClock

    record: list[tuple[str, float]] = []

    class StepClock(PhaseClock):
        @contextlib.contextmanager
        def __call__(self, name: str):
            before = self.seconds.get(name, 0.0)
            with super().__call__(name):
                yield
            record.append((name, self.seconds[name] - before))

    drift.train.loop.PhaseClock = StepClock
    if mode == "before":
        drift.train.sharding.read_batch = _old_read_batch
    history = train(config)
    last_test = max(i for i, (name, _) in enumerate(record) if name == "test")
    earlier = [i for i, (name, _) in enumerate(record[:last_test]) if name == "test"]
    steps: list[dict] = []
    for name, seconds in record[earlier[-1] + 1 if earlier else 0 : last_test]:
        if name == "data":
            steps.append({})
        steps[-1][name] = seconds
    return dict(history=history, steps=steps, seconds=history[-1]["seconds"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--resolution", type=int, default=128)
    parser.add_argument("--trajectories", type=int, default=4, help="the last one tests, the others train")
    parser.add_argument("--frames", type=int, default=21)
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--rounds", type=int, default=3, help="timed reads per method")
    parser.add_argument("--epochs", type=int, default=1, help="the last one is reported")
    parser.add_argument("--t-out", type=int, default=4, help="predicted frames of the trained model")
    parser.add_argument("--width", type=int, default=8)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where the training runs")
    parser.add_argument("--what", choices=("reads", "training", "both"), default="both")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results = dict(config=vars(args) | dict(json=str(args.json)), reads={}, training={})
    with tempfile.TemporaryDirectory(prefix="drift-data-") as tmp:
        path = Path(tmp) / "cfd.hdf5"
        began = time.perf_counter()
        write_file(path, args.trajectories, args.resolution, args.frames)
        print(f"wrote {path.stat().st_size / 1e9:.2f} GB in {time.perf_counter() - began:.1f} s", flush=True)
        for size in args.ranks if args.what != "training" else ():
            per_rank = run_ranks(size, reads, str(path), args.rounds, timeout_s=1800.0)
            results["reads"][size] = per_rank
            slowest = {k: max(r[k] for r in per_rank) for k in ("raw", "before", "after")}
            print(
                f"P={size}: one trajectory's block ({per_rank[0]['bytes'] / 1e6:.0f} MB) raw {slowest['raw']:.3f} s, "
                f"before {slowest['before']:.3f} s ({slowest['before'] / slowest['raw']:.1f}x), "
                f"after {slowest['after']:.3f} s ({slowest['after'] / slowest['raw']:.2f}x)"
                + (f"; longest main-thread pause {per_rank[0]['pause_s'] * 1e3:.1f} ms" if size == 1 else ""),
                flush=True,
            )
        base = TrainConfig(
            data=str(path), model="plain", width=args.width, modes=(4, 4, 4, 2), layers=args.layers,
            t_in=T_IN, t_out=args.t_out, epochs=args.epochs, batch_size=1, loss="mse", schedule="constant",
            quiet=True, plots=False, device=args.device,
        )  # fmt: skip
        for size in args.ranks if args.what != "reads" else ():
            for mode in MODES:
                config = TrainConfig(
                    **{**vars(base), "out": f"{tmp}/run-{size}-{mode}", "prefetch": mode == "prefetch"}
                )
                run = run_ranks(size, training, config, mode, timeout_s=1800.0, device=args.device)[0]
                step_s = [sum(step.values()) for step in run["steps"]]
                data_s = [step["data"] for step in run["steps"]]
                # The epoch's first step waits for its read whatever the mode; the others show the overlap.
                row = dict(
                    first_data_s=data_s[0],
                    data_s=statistics.median(data_s[1:]),
                    step_s=statistics.median(step_s[1:]),
                    epoch_s=run["seconds"],
                )
                results["training"].setdefault(size, {})[mode] = run | row
                print(
                    f"P={size} {mode:8s}: data {row['data_s']:.3f} s of a {row['step_s']:.2f} s step "
                    f"({100 * row['data_s'] / row['step_s']:.1f}%; the epoch's first: {row['first_data_s']:.3f} s), "
                    f"epoch {row['epoch_s']:.1f} s, loss {run['history'][-1]['train_loss']:.6g}",
                    flush=True,
                )
            losses = {m: [r["train_loss"] for r in results["training"][size][m]["history"]] for m in MODES}
            print(f"P={size}: the losses agree bit for bit: {len({json.dumps(v) for v in losses.values()}) == 1}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
