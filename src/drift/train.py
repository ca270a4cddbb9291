"""Training and evaluating a distributed 3D+time FNO on PDEBench-layout compressible Navier-Stokes data.

The problem: from ``t_in`` frames of the five fields predict the next ``t_out`` frames. The FNO works
on the 4-D grid ``(x, y, z, t)`` with ``t_out`` time points: its input channels are the ``fields x t_in``
input frames, repeated along t, and the normalised time ``t / t_out``; its output channels are the
fields at each of the ``t_out`` times. Space is split over the ranks as ``grid`` (default: a slab
along x), time is never split. Each rank reads, computes and stores only its block.

Loss: the mean squared error over the global field (each rank's loss is its share of the sum, so
their sum is the global loss, torch.distributed's convention). Test metric: the relative L2 error
``||pred - true|| / ||true||`` of each test trajectory over its whole normalised field (every field,
time and point), averaged over the trajectories.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.nn import functional as F
from tqdm import tqdm

from drift import comm
from drift._plan import resolve_device
from drift.checkpoint import CheckpointError, latest_checkpoint, load_checkpoint, read_meta, save_checkpoint
from drift.data import FIELDS, PDEBench3D, Stats, generate, read_layout
from drift.decomposition import check_grid
from drift.launch import launched, process_group
from drift.nn import FNO, METHODS
from drift.truncated import mode_lists

# The small data set `drift train` writes when --data is not given.
DEFAULT_DATA = dict(samples=64, resolution=16, frames=21, seed=0)
# Options that define the model: a resumed run or an evaluation must use the checkpoint's.
MODEL_OPTIONS = ("width", "modes", "layers", "seed", "t_in", "t_out")


class ConfigError(ValueError):
    """An option value that cannot work; the message names the option."""


@dataclass
class TrainConfig:
    """The options of ``drift train`` (see ``drift train --help``)."""

    data: str | None = None
    grid: tuple[int, int, int] | None = None
    method: str = "drift"
    width: int = 20
    modes: tuple[int, int, int, int] = (4, 4, 4, 4)
    layers: int = 4
    epochs: int = 15
    lr: float = 3e-3
    batch_size: int = 2
    seed: int = 0
    device: str = "cpu"
    out: str = "runs/train"
    nproc: int = 1
    resume: bool = False
    t_in: int = 5
    t_out: int = 16
    progress: bool = True


def config_from(options: dict, **changes) -> TrainConfig:
    """A ``TrainConfig`` from parsed command-line options (unknown keys and None values are skipped)."""
    names = {f.name for f in dataclasses.fields(TrainConfig)}
    known = {k: tuple(v) if isinstance(v, list) else v for k, v in options.items() if k in names and v is not None}
    return TrainConfig(**{**known, **changes})


def default_data_path() -> Path:
    """Where the default data set is cached: ``$DRIFT_CACHE`` or ``~/.cache/drift``."""
    cache = Path(os.environ.get("DRIFT_CACHE", Path.home() / ".cache" / "drift"))
    d = DEFAULT_DATA
    return cache / f"cfd3d_n{d['resolution']}_b{d['samples']}_f{d['frames']}_seed{d['seed']}.hdf5"


def ensure_default_data(progress: bool = True) -> Path:
    """The default data set, generated first if absent (written under a temporary name, then renamed)."""
    path = default_data_path()
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        generate(tmp, **DEFAULT_DATA, progress=progress)
        os.replace(tmp, path)
    return path


def check_config(config: TrainConfig, world_size: int) -> None:
    """Reject option values that cannot work, before any rank starts (ConfigError naming the option)."""
    for name in ("width", "layers", "epochs", "batch_size", "nproc", "t_in", "t_out"):
        if getattr(config, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(config, name)}")
    if not config.lr > 0:
        raise ConfigError(f"--lr must be positive, got {config.lr}")
    if config.method not in METHODS:
        raise ConfigError(f"--method must be one of {', '.join(METHODS)}, got {config.method!r}")
    if config.device not in ("cpu", "cuda"):
        raise ConfigError(f"--device must be cpu or cuda, got {config.device!r}")
    if config.device == "cuda":
        gpus = torch.cuda.device_count()
        if gpus < 1:
            raise ConfigError("--device cuda: no CUDA device is available")
        # Ranks this command starts itself see every GPU and need one each (NCCL); under torchrun or a
        # scheduler the launcher has placed them.
        if not launched() and gpus < world_size:
            raise ConfigError(f"--device cuda: {world_size} ranks on this machine need {world_size} GPUs, found {gpus}")
    if config.resume:
        resume_point(config)
    if config.data is None:
        return
    _, frames, *extents = read_layout(config.data)
    if frames < config.t_in + config.t_out:
        raise ConfigError(
            f"--t-in + --t-out = {config.t_in + config.t_out} exceeds the {frames} frames of {config.data}"
        )
    grid = config.grid or (world_size, 1, 1)
    try:
        check_grid(extents, grid, world_size)
    except ValueError as exc:
        raise ConfigError(f"--grid {'x'.join(map(str, grid))}: {exc}") from None
    try:
        mode_lists(config.modes, (*extents, config.t_out), real=True)
    except ValueError as exc:
        raise ConfigError(f"--modes {','.join(map(str, config.modes))}: {exc}") from None


def model_input(x: torch.Tensor, t_out: int) -> torch.Tensor:
    """``(batch, fields, t_in, *block)`` input frames -> the FNO's ``(batch, fields * t_in + 1, *block, t_out)``."""
    b, f, t_in, *block = x.shape
    frames = x.reshape(b, f * t_in, *block, 1).expand(-1, -1, *block, t_out)
    t = torch.arange(1, t_out + 1, dtype=x.dtype, device=x.device) / t_out
    return torch.cat([frames, t.expand(b, 1, *block, t_out)], dim=1)


def model_target(y: torch.Tensor) -> torch.Tensor:
    """``(batch, fields, t_out, *block)`` target frames -> the FNO's ``(batch, fields, *block, t_out)``."""
    return y.movedim(2, -1)


def build_model(config: TrainConfig, global_shape: Sequence[int], grid: Sequence[int], device) -> FNO:
    """The FNO for ``config`` on a 3-D ``grid`` of ranks over ``global_shape`` (x, y, z)."""
    fields = len(FIELDS)
    return FNO(
        fields * config.t_in + 1,
        fields,
        config.width,
        config.modes,
        (*global_shape, config.t_out),
        (*grid, 1),
        n_layers=config.layers,
        method=config.method,
        device=device,
        seed=config.seed,
    )


def _batch(dataset: PDEBench3D, indices: Sequence[int], device) -> tuple[torch.Tensor, torch.Tensor]:
    pairs = [dataset[i] for i in indices]
    x = torch.stack([p[0] for p in pairs]).to(device)
    y = torch.stack([p[1] for p in pairs]).to(device)
    return model_input(x, dataset.t_out), model_target(y)


def _global_sum(t: torch.Tensor) -> torch.Tensor:
    return comm.all_reduce(t) if comm.world_size() > 1 else t


@torch.no_grad()
def relative_l2(model: FNO, dataset: PDEBench3D, batch_size: int, device) -> float:
    """Mean over ``dataset``'s trajectories of ``||pred - true|| / ||true||`` over each whole field."""
    sums = []
    for start in range(0, len(dataset), batch_size):
        x, y = _batch(dataset, range(start, min(start + batch_size, len(dataset))), device)
        err = (model(x) - y).square().flatten(1).sum(1, dtype=torch.float64)
        sums.append(torch.stack([err, y.square().flatten(1).sum(1, dtype=torch.float64)], 1))
    total = _global_sum(torch.cat(sums))
    return float((total[:, 0] / total[:, 1]).sqrt().mean())


def _stats(meta: dict) -> Stats:
    return Stats(**{k: tuple(v) for k, v in meta["stats"].items()})


def _datasets(config: TrainConfig, data: Path, stats: Stats | None) -> tuple[PDEBench3D, PDEBench3D]:
    grid = config.grid or (comm.world_size(), 1, 1)
    options = dict(t_in=config.t_in, t_out=config.t_out)
    train_set = PDEBench3D(data, grid, stats=stats, **options)
    test_set = PDEBench3D(data, grid, split="test", stats=train_set.stats, **options)
    if len(train_set) == 0 or len(test_set) == 0:
        raise ConfigError(f"--data {data}: needs at least two trajectories (one to train on, one to test)")
    return train_set, test_set


def resume_point(config: TrainConfig) -> tuple[Path, dict]:
    """The checkpoint ``--resume`` continues from and its meta; CheckpointError if the run's options
    differ."""
    path = latest_checkpoint(Path(config.out) / "checkpoints")
    meta = read_meta(path)
    saved = meta["config"]
    for name in (*MODEL_OPTIONS, "method", "lr", "batch_size"):
        if json.loads(json.dumps(getattr(config, name))) != saved[name]:
            option = f"--{name.replace('_', '-')}"
            raise CheckpointError(
                f"{path}: {option} is {getattr(config, name)}, the run was trained with {saved[name]}"
            )
    return path, meta


def train(config: TrainConfig) -> list[dict]:
    """Train on this rank's blocks (call on every rank of the default group, or alone); returns the
    per-epoch metrics (the same on every rank). Rank 0 writes ``config.out``: ``metrics.jsonl``,
    ``stats.json``, ``checkpoints/``, and at the end ``loss.png`` and ``slice.png``."""
    device = resolve_device(config.device)
    rank, out = comm.rank(), Path(config.out)
    data = Path(config.data) if config.data is not None else default_data_path()
    resume_from, saved = resume_point(config) if config.resume else (None, None)
    train_set, test_set = _datasets(config, data, _stats(saved) if saved else None)
    model = build_model(config, train_set.global_shape, train_set.grid, device)
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)
    start, history = 0, []
    if resume_from is not None:
        load_checkpoint(resume_from, model, optimizer)
        start, history = saved["epoch"], saved["history"]
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        train_set.stats.save(out / "stats.json")
        (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in history))
    count = math.prod(train_set.global_shape) * len(FIELDS) * config.t_out  # elements per trajectory
    bar = tqdm(
        range(start, config.epochs),
        desc=f"{config.method} P={comm.world_size()}",
        unit="epoch",
        disable=rank != 0 or not config.progress,
        initial=start,
        total=config.epochs,
    )
    for epoch in bar:
        began = time.perf_counter()
        # The same permutation on every rank: each reads its block of the same trajectories.
        order = torch.randperm(len(train_set), generator=torch.Generator().manual_seed(config.seed * 100_003 + epoch))
        total = torch.zeros((), dtype=torch.float64, device=device)
        for first in range(0, len(order), config.batch_size):
            x, y = _batch(train_set, order[first : first + config.batch_size].tolist(), device)
            loss = F.mse_loss(model(x), y, reduction="sum") / (count * x.shape[0])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total += loss.detach() * x.shape[0]
        train_loss = float(_global_sum(total)) / len(train_set)
        test_l2 = relative_l2(model, test_set, config.batch_size, device)
        seconds = time.perf_counter() - began
        row = dict(epoch=epoch + 1, train_loss=train_loss, test_rel_l2=test_l2, seconds=seconds)
        history.append(row)
        meta = dict(
            epoch=epoch + 1,
            world_size=comm.world_size(),
            config=dataclasses.asdict(config) | dict(data=str(data)),
            stats=dataclasses.asdict(train_set.stats),
            global_shape=list(train_set.global_shape),
            history=history,
        )
        save_checkpoint(out / "checkpoints", epoch + 1, model, optimizer, meta)
        if rank == 0:
            with open(out / "metrics.jsonl", "a") as f:
                f.write(json.dumps(row) + "\n")
            bar.set_postfix(loss=f"{train_loss:.4g}", test_l2=f"{test_l2:.4f}", s_per_epoch=f"{seconds:.1f}")
            if config.progress:
                bar.write(
                    f"epoch {epoch + 1:3d}/{config.epochs}  loss {train_loss:.5f}  "
                    f"test rel L2 {test_l2:.4f}  {seconds:5.1f} s"
                )
    bar.close()
    if history:
        _plots(out, history, model, test_set, device, config.method)
    return history


def train_rank(config: TrainConfig) -> list[dict]:
    """One rank of ``drift train`` (an entry point for ``drift.launch.run_ranks`` or torchrun): join the
    process group, make sure the data exist (rank 0 generates the default set), check, train."""
    with process_group(config.device):
        if config.data is None:
            if comm.rank() == 0:
                ensure_default_data(config.progress)
            comm.barrier()
            config = dataclasses.replace(config, data=str(default_data_path()))
        check_config(config, comm.world_size())
        return train(config)


def find_checkpoint(where: str | Path) -> Path:
    """The checkpoint a run folder (its latest), its ``checkpoints`` folder or a checkpoint folder names."""
    root = Path(where)
    return latest_checkpoint(root / "checkpoints" if (root / "checkpoints").is_dir() else root)


def evaluate(
    checkpoint: str | Path,
    *,
    data: str | None = None,
    method: str | None = None,
    grid=None,
    device="cpu",
    batch_size: int = 2,
) -> dict:
    """Relative L2 on the test split of a checkpoint's model, on however many ranks call this.

    ``checkpoint``: a run folder (its latest checkpoint), its ``checkpoints`` folder or one checkpoint.
    ``data`` defaults to the file the run trained on, ``method`` to the run's (any method loads any
    other's checkpoint: the weights are the same global ones).
    """
    path = find_checkpoint(checkpoint)
    meta = read_meta(path)
    config = config_from(meta["config"], grid=grid)
    config.method = method or config.method
    config.data = data or config.data
    where = resolve_device(device)
    _, test_set = _datasets(config, Path(config.data), _stats(meta))
    model = build_model(config, test_set.global_shape, test_set.grid, where)
    load_checkpoint(path, model)
    l2 = relative_l2(model, test_set, batch_size, where)
    return dict(
        checkpoint=str(path),
        epoch=meta["epoch"],
        trained_on=meta["world_size"],
        ranks=comm.world_size(),
        method=config.method,
        test_rel_l2=l2,
        test_trajectories=len(test_set),
    )


def _plots(out: Path, history: list[dict], model: FNO, test_set: PDEBench3D, device, method: str) -> None:
    """Rank 0: ``loss.png`` (loss and test relative L2 per epoch) and ``slice.png`` (density on the
    mid-z plane at the last predicted time, first test trajectory: prediction, truth, difference)."""
    from drift.decomposition import gather

    with torch.no_grad():
        x, y = _batch(test_set, [0], device)
        pred = model(x)[0, 0, ..., -1]
        true = y[0, 0, ..., -1]
    pred, true = (gather(t, test_set.global_shape, test_set.grid) for t in (pred, true))
    if comm.rank() != 0:
        return
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    epochs = [r["epoch"] for r in history]
    fig, ax = plt.subplots(1, 2, figsize=(9, 3.5), constrained_layout=True)
    ax[0].semilogy(epochs, [r["train_loss"] for r in history], "o-")
    ax[0].set(xlabel="epoch", ylabel="training loss (MSE, normalised)", title=f"{method}: loss")
    ax[1].plot(epochs, [r["test_rel_l2"] for r in history], "o-", color="C1")
    ax[1].set(xlabel="epoch", ylabel="relative L2", title="test relative L2")
    fig.savefig(out / "loss.png", dpi=120)
    plt.close(fig)
    z = true.shape[2] // 2
    panels = [("predicted", pred[:, :, z]), ("true", true[:, :, z]), ("difference", (pred - true)[:, :, z])]
    fig, ax = plt.subplots(1, 3, figsize=(11, 3.5), constrained_layout=True)
    lo, hi = float(true[:, :, z].min()), float(true[:, :, z].max())
    for a, (title, image) in zip(ax, panels, strict=True):
        limits = dict(vmin=lo, vmax=hi) if title != "difference" else {}
        shown = a.imshow(image.cpu().numpy().T, origin="lower", cmap="viridis", **limits)
        a.set(title=f"density, {title}", xlabel="x", ylabel="y")
        fig.colorbar(shown, ax=a, shrink=0.8)
    fig.savefig(out / "slice.png", dpi=120)
    plt.close(fig)
