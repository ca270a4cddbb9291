"""The options of ``drift train``: their declarations and values (``TrainConfig``), the choices some take,
the options a checkpoint pins, and the default data set."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from drift.arguments import (
    auto_only,
    count,
    extents,
    fourier_modes,
    fractions,
    positive_float,
    positive_int,
    rank_grid,
)
from drift.data import SPLITS, generate
from drift.nn import AUTO, FACTORIZATIONS, METHODS
from drift.nn.fno import RECOMPUTE as NN_RECOMPUTE
from drift.options import at_least, non_negative, option, positive
from drift.recipes import RECIPES, TARGETS

# The small data set `drift train` writes when --data is not given.
DEFAULT_DATA = dict(samples=256, resolution=16, frames=21, seed=0)
# Options that define the model: a resumed run or an evaluation must use the checkpoint's.
MODEL_OPTIONS = (
    "model",
    "recipe",
    "target",
    "width",
    "modes",
    "layers",
    "seed",
    "t_in",
    "t_out",
    "factorization",
    "rank",
)
# Options of the optimisation a resumed run must share with the checkpoint's.
OPTIMIZER_OPTIONS = ("method", "lr", "weight_decay", "schedule", "batch_size", "split", "loss", "pushforward", "noise")
# --model: Li et al.'s plain FNO, or neuraloperator 2.0's default options (FNO.neuralop_defaults).
MODELS = ("plain", "neuralop")
# --schedule: the learning rate over the run's steps, constant or cosine-annealed to 0.
SCHEDULES = ("constant", "cosine")
# What a checkpoint's meta.json holds (one without all of them is passed over as damaged).
META_KEYS = ("epoch", "world_size", "config", "stats", "global_shape", "history")
# --loss: the MSE of the normalised fields, or each (field, predicted frame) weighted by the inverse of its
# variance over the training trajectories (``frame_weights``), so that late, decayed frames count as much, or
# each trajectory's relative L2 error, or each field's in physical units (PDEBench's nRMSE; ``drift.train.losses``).
LOSSES = ("mse", "frame-weighted", "relative-l2", "nrmse")
# What a non-finite loss or gradient norm does: stop the run, or skip that batch.
ON_NAN = ("stop", "skip-batch")
# Options checkpoints written before the option existed were trained with.
LEGACY_OPTIONS = dict(
    split="last",
    factorization=None,
    rank=1.0,
    model="plain",
    weight_decay=0.0,
    schedule="constant",
    loss="mse",
    recipe="one-shot",
    target="state",
    pushforward=None,
    noise=0.0,
    domain_padding=None,
)
# --recipe: how the model learns (drift.recipes); auto: static for static data, else one-shot.
RECIPE_CHOICES = (*RECIPES, AUTO)
# --recompute: what a training step recomputes in its backward pass instead of keeping (drift.nn.set_recompute).
RECOMPUTE = NN_RECOMPUTE
# Options a resumed run or an evaluation takes from its checkpoint when they are left unset.
UNSET = dict(recipe=AUTO, modes=None, domain_padding=None)


class ConfigError(ValueError):
    """An option value that cannot work; the message names the option."""


HOSTS = "hosts"  # --reduction hosts: drift's spectra reduced within each host first, then across hosts
DEVICES = ("cpu", "cuda")  # --device: Gloo ranks on the CPU, or NCCL ranks with one GPU each
METHOD_CHOICES = (*METHODS, AUTO)  # --method: a spectral convolution, or the one the cost model chooses
_reduction_shape = extents("a reduction", "8x4")


def _reduction(text: str) -> tuple[int, ...] | str:
    """argparse type of ``--reduction``: a mesh shape like 8x4, or HOSTS."""
    return text if text == HOSTS else _reduction_shape(text)


@dataclass
class TrainConfig:
    """The options of ``drift train``, each declared once (``drift.options``): its field's ``Option``
    gives its flag, help, choices, parsing and check, from which come ``drift train``'s parser,
    ``check_config``'s check of single values and the option table of docs/TRAINING.md."""

    data: str | tuple[str, ...] | None = option(
        None,
        "data files or folders of them (*.hdf5, *.h5, *.pt: every PDEBench layout, The Well, x -> y tensor "
        "dictionaries), read as one data set in the order given, a folder's files by name; --split applies to "
        "each file",
        metavar="FILE",
        many=True,
        unset="generate a small set into the cache",
    )
    test_data: tuple[str, ...] | None = option(
        None,
        "a separate test set: every trajectory of these files or folders (then every trajectory of --data "
        "trains, and --split does not apply)",
        metavar="FILE",
        many=True,
    )
    grid: tuple[int, ...] | None = option(
        None,
        "spatial ranks per spatial dim of the data, like 4x1x1 (3-D) or 2x2 (2-D)",
        parse=rank_grid,
        unset="a slab of all spatial ranks",
    )
    data_parallel: int = option(
        1,
        "ranks along a data-parallel mesh dim, each taking a share of every batch (--nproc / D spatial ranks)",
        parse=positive_int,
        check=at_least(1),
        metavar="D",
    )
    reduction: tuple[int, ...] | str | None = option(
        None,
        "reduce drift's spectra over the spatial ranks in steps, like 8x4 (8 nodes of 4 ranks on a slab): one "
        "reduce-scatter per entry, the last first; on a grid, consecutive entries split each split dim; "
        "'hosts': within each host, then across (torchrun's hosts)",
        parse=_reduction,
        unset="one step over every spatial rank",
    )
    overlap: int = option(
        1,
        "run drift's spectrum collectives in this many pieces, each overlapping the next piece's transform",
        parse=positive_int,
        check=at_least(1),
        metavar="PIECES",
    )
    method: str = option(
        "drift",
        "spectral convolution (auto: the one drift's cost model predicts fastest for the grid and ranks)",
        choices=METHOD_CHOICES,
    )
    model: str = option(
        "neuralop",
        "neuralop: neuraloperator 2.0's FNO options (grid embedding, channel MLP, soft-gating skip, lifting and "
        "projection ratios 2); plain: Li et al.'s FNO",
        choices=MODELS,
    )
    width: int = option(20, "channels inside the FNO", parse=positive_int, check=at_least(1))
    recipe: str = option(
        AUTO,
        "static: input fields to output fields; one-shot: --t-in frames in, the next --t-out frames at once (time "
        "an FNO dim); autoregressive: --t-in frames in (as channels), the next frame out, fed back --t-out times",
        choices=RECIPE_CHOICES,
        unset="static for static data (Darcy, x -> y dictionaries), else one-shot",
    )
    pushforward: int | None = option(
        None,
        "--recipe autoregressive: unroll the first --t-out - K steps without gradient and count the last K frames "
        "in the loss, their gradients through those K steps only (the pushforward trick)",
        parse=positive_int,
        check=at_least(1),
        metavar="K",
        unset="every frame counts, gradients through the whole unroll",
    )
    noise: float = option(
        0.0,
        "--recipe autoregressive: Gaussian noise of this standard deviation (normalised units) added to each "
        "training step's input",
        parse=float,
        check=non_negative,
        metavar="STD",
    )
    target: str = option(
        "state",
        "--recipe autoregressive: the model predicts the next frame (state) or its change from the last input "
        "frame (increment)",
        choices=TARGETS,
    )
    modes: tuple[int, ...] | None = option(
        None,
        "modes per dim of the model (space, then time for --recipe one-shot), Li et al.'s k: one count for "
        "every dim, or one per dim",
        parse=fourier_modes,
        unset="3,3,3,4 for 3-D one-shot data (the default problem); else min(12, n/2) per spatial dim and "
        "min(4, t/2 + 1) for time",
    )
    domain_padding: tuple[float, ...] | None = option(
        None,
        "zero-pad each spectral convolution's input by this fraction of each model dim (one for every dim, or one "
        "per dim), for non-periodic data",
        parse=fractions,
        metavar="FRACTION",
        unset="0.125 along each non-periodic spatial dim of the data (The Well's walls and open boundaries); "
        "none for periodic data",
    )
    factorization: str | None = option(
        None,
        "hold the spectral weights as Tucker or CP factors (neuraloperator's TFNO)",
        choices=FACTORIZATIONS,
        unset="dense",
    )
    rank: float = option(
        1.0,
        "with --factorization: the factors' share of the dense spectral parameters, like 0.05",
        parse=positive_float,
        check=positive,
    )
    layers: int = option(4, "Fourier blocks", parse=positive_int, check=at_least(1))
    recompute: str | None = option(
        None,
        "blocks: keep only each Fourier block's input and recompute its activations in the backward pass "
        "(torch.utils.checkpoint): less memory a step, more time; the same gradients. mlp: neuraloperator's "
        "blocks recompute their channel MLPs' hidden layers, the MLP, its skip and activation one kernel, "
        "and the two-layer lift its hidden layer: less memory and less time a step; the gradients equal but "
        "for rounding",
        choices=RECOMPUTE,
        unset="keep every activation for the backward pass",
    )
    epochs: int = option(4, "passes over the training trajectories", parse=positive_int, check=at_least(1))
    lr: float = option(3e-3, "(peak) learning rate", parse=positive_float, check=positive)
    weight_decay: float = option(1e-4, "AdamW's decoupled weight decay (0: Adam)", parse=float, check=non_negative)
    schedule: str = option(
        "cosine",
        "learning rate over the run's steps: cosine-annealed from --lr to 0 over --epochs, or constant",
        choices=SCHEDULES,
    )
    loss: str = option(
        "frame-weighted",
        "frame-weighted: each field and predicted frame weighted by the inverse of its variance over the "
        "training trajectories, so that late frames, whose fluctuations have decayed, count as much as early "
        "ones; mse: the MSE of the normalised fields; relative-l2: each trajectory's ||pred - true|| / ||true|| "
        "of the normalised fields (neuraloperator's LpLoss); nrmse: each trajectory's and field's "
        "||pred - true|| / ||true|| of the physical fields, averaged (PDEBench's nRMSE)",
        choices=LOSSES,
    )
    batch_size: int = option(
        2, "trajectories a step, shared among the data-parallel ranks", parse=positive_int, check=at_least(1)
    )
    seed: int = option(0, "weights and shuffling", parse=int)
    device: str = option("cpu", "cpu (Gloo) or cuda (NCCL, one GPU a rank)", choices=DEVICES)
    out: str = option("runs/train", "run folder: metrics, checkpoints, plots")
    nproc: int = option(
        1, "local ranks to start (under torchrun: torchrun's ranks)", parse=positive_int, check=at_least(1)
    )
    resume: bool = option(
        False,
        "continue the run in --out from its latest checkpoint; --resume auto: continue when --out holds a "
        "checkpoint of this run, else start fresh (a requeued SLURM job, SLURM_RESTART_COUNT > 0, does so "
        "without it)",
        parse=auto_only,
        metavar="auto",
        alone=True,
    )
    checkpoint_every: float | None = option(
        None,
        "also write a checkpoint at the first step boundary after every MINUTES (bounds the work a kill "
        "without warning loses)",
        parse=positive_float,
        check=positive,
        metavar="MINUTES",
    )
    collective_timeout: float | None = option(
        None,
        "give up on a peer after SECONDS in every phase",
        parse=positive_float,
        check=positive,
        metavar="SECONDS",
        unset="per phase, from its measured time: max(60 s, 20x the slowest step), see docs/CLUSTERS.md",
    )
    memory_per_rank: float | None = option(
        None,
        "each rank's memory in GiB (a stand-in for an accelerator's): a step whose estimate exceeds it is refused "
        "before any rank starts, and on the CPU a rank whose private memory passes it ends the run",
        parse=positive_float,
        check=positive,
        metavar="GIB",
        unset="the GPU's memory, or an equal share of the machine's (its control group's limit, else the memory "
        "available)",
    )
    max_restarts: int = option(
        0,
        "after a rank fails (a death or a bug, not a refused option), start the ranks again up to N times; a "
        "restarted job resumes from the latest complete checkpoint (under torchrun: torchrun's --max-restarts)",
        parse=count,
        check=at_least(0),
        metavar="N",
    )
    t_in: int = option(5, "input frames (time-dependent data)", parse=positive_int, check=at_least(1))
    t_out: int = option(16, "predicted frames (autoregressive: steps unrolled)", parse=positive_int, check=at_least(1))
    split: str = option(
        "last",
        "the test trajectories: last: the last 10% (rounded, at least one); pdebench: PDEBench's first "
        "int(10%), as its loaders take them; recorded in the run, used again by --resume and drift evaluate",
        choices=SPLITS,
    )
    progress: bool | None = option(
        None,
        "progress bars on stderr: --progress draws them into a log too, --no-progress never (the line per "
        "epoch and the final metrics are printed either way)",
        switch=True,
        unset="on a terminal",
    )
    quiet: bool = option(
        False,
        "print no progress: no bars, no line per epoch, no final metrics (errors and the closing line remain)",
        switch=True,
    )
    prefetch: bool = option(
        True,
        "read each batch inside its step instead of during the previous one (the same results; at most one "
        "batch of this rank's blocks is read ahead otherwise)",
        switch=True,
    )
    plots: bool = option(
        True, "no loss.png and slice.png at the end (matplotlib takes a few seconds for them)", switch=True
    )
    on_nan: str = option(
        "stop",
        "on a non-finite loss or gradient norm: stop the run, or skip that batch, counted in metrics.jsonl as "
        "skipped_batches",
        choices=ON_NAN,
    )


def config_from(options: dict, **changes) -> TrainConfig:
    """A ``TrainConfig`` from parsed command-line options (unknown keys and None values are skipped)."""
    names = {f.name for f in dataclasses.fields(TrainConfig)}
    known = {k: tuple(v) if isinstance(v, list) else v for k, v in options.items() if k in names and v is not None}
    return TrainConfig(**{**known, **changes})


def default_data_path(**changes: int) -> Path:
    """Where the default data set (``DEFAULT_DATA``, with ``changes``) is cached: ``$DRIFT_CACHE`` or
    ``~/.cache/drift``."""
    cache = Path(os.environ.get("DRIFT_CACHE", Path.home() / ".cache" / "drift"))
    d = DEFAULT_DATA | changes
    return cache / f"cfd3d_n{d['resolution']}_b{d['samples']}_f{d['frames']}_seed{d['seed']}.hdf5"


def ensure_default_data(progress: bool | None = None, device: torch.device | str = "cpu", **changes: int) -> Path:
    """The default data set (with ``changes`` to ``DEFAULT_DATA``: ``resolution``, ``samples``, ...),
    generated first if absent (its solver on ``device``, its bar as ``generate``'s ``progress`` says;
    written under a temporary name, then renamed)."""
    path = default_data_path(**changes)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        generate(tmp, **(DEFAULT_DATA | changes), progress=progress, device=device)
        os.replace(tmp, path)
    return path
