"""``drift predict``: a trained model's predictions for the trajectories of data files, written back as a
file of the same layout (any layout drift reads: ``drift.data.formats``), so that drift and the user's
own loaders read it as they read the source.

The output holds, for each trajectory predicted (in the order asked), the source's first ``t_in`` frames
of every channel copied bit for bit (at the resolution read), then the model's ``t_out`` predicted frames,
de-normalised; for a static problem the inputs copied bit for bit and the predicted output. Further source
frames are not copied: the file is the model's trajectory, not the truth's. Its channels keep the source's
dtypes, its coordinates are the source's at the points read, its times the source's first ones (continued
at the spacing of its last two where the source has fewer), its attributes the source's plus
``drift_prediction`` (JSON: the checkpoint, its epoch, the source files and trajectories, t_in and t_out).
What each layout's file holds and where a channel's block goes: ``Format.output``. The source may be
several files (``--data a.hdf5 b.hdf5`` or a folder): their trajectories are numbered across them in the
order given, as ``drift train`` numbers them, and the output's coordinates, times and attributes are the
first file's (per-trajectory ones, the trajectory's own).

Each rank reads, predicts and writes only its block of its share of each batch's trajectories (the
same mesh as ``drift evaluate``: ``--grid``, one count per spatial dim of the data, ``--data-parallel``);
HDF5 outputs are written by the ranks in turn into one file under a temporary name, renamed at the end
(``drift.data.writer``); a ``.pt`` output is gathered to rank 0, which writes and renames it.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from drift import comm
from drift.checkpoint import read_meta
from drift.data import DataError, DataFiles
from drift.data.files import Data
from drift.data.formats.output import Block, Output, Prediction
from drift.data.writer import OutputError
from drift.jobs.console import bars_shown
from drift.layout import Layout
from drift.nn import ACTIVATION_DTYPES
from drift.predict.predictor import Predictor
from drift.recipes import Recipe
from drift.train import META_KEYS, ConfigError, TrainConfig, data_grid, find_checkpoint, load_trained, trained_config
from drift.train.budget import check_memory
from drift.train.checks import spatial_grid
from drift.train.problem import problem_recipe
from drift.train.sharding import saved_channels

ATTRIBUTE = "drift_prediction"  # the output's attribute recording what predicted it


@dataclass(frozen=True)
class Plan:
    """What a prediction does, checked before any rank starts: the run's options with this job's data and
    layout, its recipe, the source files, the output (``out``, in the source's layout: ``output``), the
    source trajectories to predict (in output order), the grid read and the stride that reads it, and
    whether an existing output may be replaced."""

    config: TrainConfig
    recipe: Recipe
    files: DataFiles
    out: Path
    output: Output
    trajectories: tuple[int, ...]
    shape: tuple[int, ...]
    stride: int
    force: bool

    @property
    def frames(self) -> tuple[slice, slice]:
        """The output frames of each trajectory that the input frames and the predicted ones fill (a static
        problem's: its one frame both)."""
        return self.recipe.frames(self.config.t_in, self.config.t_out)


def plan_prediction(
    checkpoint: str | Path,
    data: Data,
    out: str | Path,
    *,
    trajectories: Sequence[int] | None = None,
    resolution: int | None = None,
    method: str | None = None,
    grid: Sequence[int] | None = None,
    data_parallel: int = 1,
    force: bool = False,
    world_size: int = 1,
) -> Plan:
    """Check a prediction on ``world_size`` ranks (see ``predict``) and say what it does. Reads files only,
    no collective: every rank, or the launcher before they start, meets the same error, in one line naming
    the file or option: CheckpointError (no whole checkpoint), DataError (a file drift does not read, or
    whose channels or dims are not the model's, fewer frames than the model's t_in, times too few to
    continue), ConfigError (a resolution, grid or trajectory that does not fit), OutputError (``out``
    exists without ``force``, is a folder or is a source file)."""
    files = DataFiles(data)
    paths = tuple(map(str, files.paths))
    meta = read_meta(find_checkpoint(checkpoint), META_KEYS)
    _check_channels(files, meta)
    config = trained_config(checkpoint, data=paths, method=method, grid=grid, data_parallel=data_parallel)
    recipe = problem_recipe(config)
    data = " ".join(paths)
    needed = recipe.frames(config.t_in, config.t_out)[0].stop
    if files.frames < needed:
        raise DataError(
            f"{data}: {files.fields[0]!r} has {files.frames} frames; the model takes its first t_in = {config.t_in} "
            f"(it was trained with --t-in {config.t_in})"
        )
    shape, stride = data_grid(config, files.grid, resolution, world_size)
    chosen = tuple(range(files.trajectories)) if trajectories is None else tuple(trajectories)
    if bad := [t for t in chosen if not 0 <= t < files.trajectories]:
        raise ConfigError(f"--trajectories {bad[0]}: {data} holds trajectories 0 to {files.trajectories - 1}")
    if len(set(chosen)) != len(chosen) or not chosen:
        raise ConfigError(f"--trajectories: {'a trajectory twice' if chosen else 'none'} (each at most once)")
    out = Path(out)
    if out.is_dir():
        raise OutputError(f"--out {out} is a folder: name the file to write")
    if out.exists() and any(out.resolve() == path.resolve() for path in files.paths):
        raise OutputError(f"--out {out} is a --data file: write the prediction elsewhere")
    if out.exists() and not force:
        raise OutputError(f"--out {out} exists: pass --force to replace it")
    frames = recipe.frames(config.t_in, config.t_out)[1].stop
    output = files.format.output(Prediction(files, chosen, frames, shape, stride))
    return Plan(config, recipe, files, out, output, chosen, shape, stride, force)


def check_prediction_memory(
    plan: Plan, world_size: int, device: str, batch_size: int | None, activations: str = "float32"
) -> None:
    """ConfigError naming the bytes a rank needs and has when ``plan``'s forward on ``world_size`` ranks of
    ``device``, ``batch_size`` trajectories at once (None: one per data-parallel rank), its fields between
    blocks in ``activations``, exceeds a rank's memory (``drift.train.check_memory``: the GPU's, or a
    share of the machine's)."""
    config = dataclasses.replace(plan.config, device=device, memory_per_rank=None)
    parts = spatial_grid(config, world_size, len(plan.shape))
    inputs, fields = len(plan.files.inputs), len(plan.files.fields)
    fields_dtype = ACTIVATION_DTYPES[activations] or torch.float32
    options = dict(forward=True, batch_size=batch_size, activation_bytes=fields_dtype.itemsize)
    check_memory(config, plan.shape, inputs, fields, parts, world_size, **options)


def _check_channels(files: DataFiles, meta: dict) -> None:
    """DataError naming the first file unless it holds the channels and spatial dims the model was trained on."""
    inputs, fields = saved_channels(meta)
    trained = len(meta["global_shape"])
    if (files.inputs, files.fields) != (inputs, fields) or files.dims != trained:
        model = ", ".join(fields) if inputs == fields else f"{', '.join(inputs)} -> {', '.join(fields)}"
        raise DataError(
            f"{files.paths[0]}: holds {files.describe()}; the model was trained on {trained}-D data of {model}"
        )


def _slab(local: Sequence[slice], stride: int) -> tuple[slice, ...]:
    """The source's points of this rank's block (``local``: its slices of the grid read)."""
    return tuple(slice(s.start * stride, s.stop * stride, stride) if s.stop > s.start else slice(0, 0) for s in local)


def _provenance(plan: Plan, checkpoint: Path, epoch: int) -> str:
    record = dict(
        checkpoint=str(checkpoint.resolve()),
        epoch=epoch,
        source=[str(path.resolve()) for path in plan.files.paths],
        trajectories=list(plan.trajectories),
        t_in=plan.config.t_in,
        t_out=plan.config.t_out,
    )
    return json.dumps(record)


def _inputs(plan: Plan, trajectories: Sequence[int], channels: Sequence[str], local: Sequence[slice]) -> np.ndarray:
    """This rank's block of the input frames of ``trajectories``, ``(trajectories, channels, t_in, *block)``
    (a static problem's one frame), in the output's dtype (each channel's stored values exactly)."""
    frames, slab = plan.frames[0], _slab(local, plan.stride)
    block = tuple(s.stop - s.start for s in local)
    out = np.empty((len(trajectories), len(channels), frames.stop, *block), plan.output.dtype)
    for j, trajectory in enumerate(trajectories):
        for k, key in enumerate(channels):
            plan.files.read(key, trajectory, (frames, *slab), out[j, k])
    return out


def _check_finite(plan: Plan, frames: np.ndarray, share: Sequence[int], batch: Sequence[int]) -> None:
    """DataError on every rank when this batch's input frames hold NaN or inf on any rank."""
    bad = torch.zeros(len(batch), dtype=torch.float64)
    for j, i in enumerate(share):
        bad[batch.index(i)] = float(frames[j].size - np.count_nonzero(np.isfinite(frames[j])))
    bad = comm.all_reduce(bad)
    if bool(bad.any()):
        named = [plan.trajectories[batch[j]] for j in bad.nonzero().flatten().tolist()]
        path = plan.files.paths[plan.files.locate(named[0])[0]]
        raise DataError(
            f"{path}: non-finite values (NaN or inf) in the input frames of trajectory "
            f"{', '.join(map(str, named))} (numbered across the --data files)"
        )


@torch.no_grad()
def predict(
    checkpoint: str | Path,
    data: Data,
    out: str | Path,
    *,
    device="cpu",
    batch_size: int | None = None,
    progress: bool | None = None,
    activations: str = "float32",
    **options,
) -> dict:
    """Write ``out``, a file of ``data``'s layout holding the model's predictions for trajectories of
    ``data``: see the module's notes. Call on every rank of the default group (or alone).

    ``checkpoint``: a run folder (its latest checkpoint that loads), its ``checkpoints`` folder or one
    checkpoint. ``options``: ``plan_prediction``'s: ``trajectories`` (default: all; output trajectory i
    is source trajectory ``trajectories[i]``), ``resolution`` (read ``data`` at that many points per
    spatial dim, as ``drift evaluate``), ``method``, ``grid``, ``data_parallel`` (the spectral method and
    the ranks' layout, as ``drift evaluate``) and ``force`` (replace an existing ``out``).
    ``batch_size``: trajectories a step (default ``data_parallel``: one per data-parallel rank);
    ``progress``: a progress bar on rank 0's stderr (None: on a terminal, ``drift.jobs.console.bars_shown``);
    ``activations``: the fields between the model's blocks (``drift.nn.ACTIVATION_DTYPES``: "bfloat16"
    halves them).
    Errors: ``plan_prediction``'s, DataError for non-finite input frames, OutputError (every rank) when
    writing fails: no file is then left at ``out`` (an existing one is kept). Returns a dict: the output,
    its trajectories, t_in, t_out and grid, the checkpoint, its epoch and the ranks."""
    from tqdm import tqdm

    plan = plan_prediction(checkpoint, data, out, world_size=comm.world_size(), **options)
    config = plan.config
    trained = load_trained(checkpoint, config, plan.shape, device)
    trained.model.eval()
    trained.model.activations = ACTIVATION_DTYPES[activations]
    channels, fields = saved_channels(trained.meta)
    predictor = Predictor(trained.model, trained.stats, config.t_in, config.t_out, plan.recipe, channels, fields)
    sharding = trained.sharding
    local = Layout(plan.shape, sharding.mesh, sharding.field_placements()).local_slices
    count = len(plan.trajectories)
    record = {ATTRIBUTE: _provenance(plan, trained.checkpoint, trained.meta["epoch"])}
    writer = plan.output.open(plan.out, record, replace=plan.force)
    step = batch_size or plan.config.data_parallel
    bar = tqdm(total=count, desc="predicting", unit="trajectory", disable=not bars_shown(progress) or comm.rank() != 0)
    given, predicted_frames = plan.frames
    with writer, bar:
        for start in range(0, count, step):
            batch = list(range(start, min(start + step, count)))
            share = sharding.share(batch)
            inputs = _inputs(plan, [plan.trajectories[i] for i in share], channels, local)
            _check_finite(plan, inputs, share, batch)
            frames = torch.from_numpy(inputs.astype(np.float32, copy=False)).to(trained.device)
            predicted = predictor.block(frames, sharding.wrapper(len(batch), plan.shape)).cpu().numpy()
            writer.put(
                [
                    Block(key, i, span, tuple(local), values[j, k])
                    for j, i in enumerate(share)
                    for values, keys, span in ((inputs, channels, given), (predicted, fields, predicted_frames))
                    for k, key in enumerate(keys)
                ]
            )
            bar.update(len(batch))
        writer.commit()
    return dict(
        out=str(plan.out),
        trajectories=count,
        t_in=config.t_in,
        t_out=config.t_out,
        resolution=list(plan.shape),
        checkpoint=str(trained.checkpoint),
        epoch=trained.meta["epoch"],
        ranks=comm.world_size(),
    )
