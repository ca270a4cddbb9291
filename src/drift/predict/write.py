"""``drift predict``: a trained model's predicted frames for the trajectories of a PDEBench-layout file,
written back as a PDEBench-layout file.

The output holds, for each trajectory predicted (in the order asked), ``t_in + t_out`` frames of every
field: the source's first ``t_in`` frames copied bit for bit (at the resolution read), then the model's
``t_out`` predicted frames, de-normalised. Further source frames are not copied: the file is the model's
trajectory, not the truth's. Its fields keep the source's dtype, its ``x/y/z-coordinate`` are the
source's at the points read, its ``t-coordinate`` the source's first ``t_in + t_out + 1`` entries
(continued at the spacing of its last two where the source has fewer), its attributes the source's plus
``drift_prediction`` (JSON: the checkpoint, its epoch, the source files and trajectories, t_in and t_out).
The source may be several files (``--data a.hdf5 b.hdf5`` or a folder): their trajectories are numbered
across them in the order given, as ``drift train`` numbers them, and the output's coordinates, times and
attributes are the first file's.

Each rank reads, predicts and writes only its block of its share of each batch's trajectories (the
same mesh as ``drift evaluate``: ``--grid``, ``--data-parallel``); the ranks write in turn into one file
under a temporary name, renamed at the end (``drift.data.writer``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np
import torch

from drift import comm
from drift.data import FIELDS, DataError, PDEBenchFiles
from drift.data.files import Data
from drift.data.pdebench import COORDINATES
from drift.data.writer import OutputError, TurnWriter
from drift.jobs.console import bars_shown
from drift.layout import Layout
from drift.predict.predictor import Predictor
from drift.recipes import recipe_named
from drift.train import ConfigError, TrainConfig, data_grid, load_trained, trained_config
from drift.train.sharding import saved_channels

TIMES = "t-coordinate"
ATTRIBUTE = "drift_prediction"  # the output's attribute recording what predicted it


@dataclass(frozen=True)
class Source:
    """The PDEBench-layout files a prediction reads (``drift.data.PDEBenchFiles``: trajectories numbered
    across them in the order given, the same fields, frames and grid in each), their fields stored as
    ``dtype`` in every file. The output's coordinates, times and attributes are the first file's."""

    files: PDEBenchFiles
    dtype: np.dtype

    @classmethod
    def open(cls, data: Data, fields: Sequence[str] = FIELDS) -> Source:
        """The files ``data`` names (a file, a folder, or several of them); DataError naming the file when a
        field or coordinate is missing or misshapen, the files do not fit together, a file's fields are
        stored in another dtype than the first's, or its ``t-coordinate`` is not a 1-D dataset."""
        files = PDEBenchFiles(data, fields)
        dtypes = []
        for path in files.paths:
            with h5py.File(path, "r") as f:
                dtypes.append(f[fields[0]].dtype)
                if not isinstance(f.get(TIMES), h5py.Dataset) or f[TIMES].ndim != 1:
                    raise DataError(f"{path}: no 1-D dataset {TIMES!r} (the frames' times)")
        for path, dtype in zip(files.paths, dtypes, strict=True):
            if dtype != dtypes[0]:
                raise DataError(f"{path}: fields stored as {dtype}, {files.paths[0]}'s as {dtypes[0]}: one dtype")
        return cls(files, dtypes[0])

    @property
    def path(self) -> Path:
        """The first file: the output's coordinates, times and attributes are its."""
        return self.files.paths[0]

    @property
    def trajectories(self) -> int:
        return self.files.trajectories

    @property
    def frames(self) -> int:
        return self.files.frames

    @property
    def extents(self) -> tuple[int, ...]:
        return self.files.grid

    def file_of(self, trajectory: int) -> Path:
        """The file holding ``trajectory``."""
        return self.files.paths[self.files.locate(trajectory)[0]]

    def read(self, out: np.ndarray, trajectory: int, key: str, frames: slice, slab: tuple[slice, ...]) -> None:
        """Read field ``key``'s ``frames`` of ``trajectory`` at the points ``slab`` selects into ``out`` (C
        contiguous, of that shape and the files' dtype) as stored."""
        self.files.read(key, trajectory, (frames, *slab), out)

    def times(self, count: int) -> np.ndarray:
        """The times of the first ``count`` entries of its ``t-coordinate``, continued at the spacing of
        its last two entries where it has fewer. DataError when it has fewer than two to continue from."""
        with h5py.File(self.path, "r") as f:
            times = f[TIMES][:]
        if len(times) >= count:
            return times[:count]
        if len(times) < 2:
            raise DataError(f"{self.path}: {TIMES!r} has {len(times)} entries, {count} needed (or 2 to continue)")
        more = times[-1] + (times[-1] - times[-2]) * np.arange(1, count - len(times) + 1)
        return np.concatenate([times, more.astype(times.dtype)])

    def coordinates(self, stride: int) -> dict[str, np.ndarray]:
        """The cell centres of every ``stride``-th point per dim."""
        with h5py.File(self.path, "r") as f:
            return {key: f[key][::stride] for key in COORDINATES}

    def attrs(self) -> dict:
        """Its root attributes (PDEBench's ``eta``, ``zeta``, ``M``)."""
        with h5py.File(self.path, "r") as f:
            return dict(f.attrs)


@dataclass(frozen=True)
class Plan:
    """What a prediction does, checked before any rank starts: the run's options with this job's data and
    layout, the source, the output, the source trajectories to predict (in output order), the grid read
    and the stride that reads it, and whether an existing output may be replaced."""

    config: TrainConfig
    source: Source
    out: Path
    trajectories: tuple[int, ...]
    shape: tuple[int, ...]
    stride: int
    force: bool

    @property
    def frames(self) -> int:
        """Frames per output trajectory: the input's and the predicted ones."""
        return self.config.t_in + self.config.t_out


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
    the file or option: CheckpointError (no whole checkpoint), DataError (a field, coordinate or the
    t-coordinate missing, fewer frames than the model's t_in), ConfigError (a resolution, grid or
    trajectory that does not fit), OutputError (``out`` exists without ``force``, is a folder or is the
    source)."""
    source = Source.open(data)
    paths = tuple(map(str, source.files.paths))
    config = trained_config(checkpoint, data=paths, method=method, grid=grid, data_parallel=data_parallel)
    data = " ".join(paths)
    if source.frames < config.t_in:
        raise DataError(
            f"{data}: {FIELDS[0]!r} has {source.frames} frames; the model takes its first t_in = {config.t_in} "
            f"(it was trained with --t-in {config.t_in})"
        )
    shape, stride = data_grid(config, source.extents, resolution, world_size)
    chosen = tuple(range(source.trajectories)) if trajectories is None else tuple(trajectories)
    if bad := [t for t in chosen if not 0 <= t < source.trajectories]:
        raise ConfigError(f"--trajectories {bad[0]}: {data} holds trajectories 0 to {source.trajectories - 1}")
    if len(set(chosen)) != len(chosen) or not chosen:
        raise ConfigError(f"--trajectories: {'a trajectory twice' if chosen else 'none'} (each at most once)")
    out = Path(out)
    if out.is_dir():
        raise OutputError(f"--out {out} is a folder: name the file to write")
    if out.exists() and any(out.resolve() == path.resolve() for path in source.files.paths):
        raise OutputError(f"--out {out} is a --data file: write the prediction elsewhere")
    if out.exists() and not force:
        raise OutputError(f"--out {out} exists: pass --force to replace it")
    return Plan(config, source, out, chosen, shape, stride, force)


def _slab(local: Sequence[slice], stride: int) -> tuple[slice, ...]:
    """The source's points of this rank's block (``local``: its slices of the grid read)."""
    return tuple(slice(s.start * stride, s.stop * stride, stride) if s.stop > s.start else slice(0, 0) for s in local)


def _provenance(plan: Plan, checkpoint: Path, epoch: int) -> str:
    record = dict(
        checkpoint=str(checkpoint.resolve()),
        epoch=epoch,
        source=[str(path.resolve()) for path in plan.source.files.paths],
        trajectories=list(plan.trajectories),
        t_in=plan.config.t_in,
        t_out=plan.config.t_out,
    )
    return json.dumps(record)


def _inputs(plan: Plan, trajectories: Sequence[int], fields: Sequence[str], local: Sequence[slice]) -> np.ndarray:
    """This rank's block of the input frames of ``trajectories``, ``(trajectories, fields, t_in, *block)``,
    as stored in the source."""
    block = tuple(s.stop - s.start for s in local)
    out = np.empty((len(trajectories), len(fields), plan.config.t_in, *block), plan.source.dtype)
    frames, slab = slice(0, plan.config.t_in), _slab(local, plan.stride)
    for j, trajectory in enumerate(trajectories):
        for k, key in enumerate(fields):
            plan.source.read(out[j, k], trajectory, key, frames, slab)
    return out


def _check_finite(plan: Plan, frames: np.ndarray, share: Sequence[int], batch: Sequence[int]) -> None:
    """DataError on every rank when this batch's input frames hold NaN or inf on any rank."""
    bad = torch.zeros(len(batch), dtype=torch.float64)
    for j, i in enumerate(share):
        bad[batch.index(i)] = float(frames[j].size - np.count_nonzero(np.isfinite(frames[j])))
    bad = comm.all_reduce(bad)
    if bool(bad.any()):
        named = [plan.trajectories[batch[j]] for j in bad.nonzero().flatten().tolist()]
        raise DataError(
            f"{plan.source.file_of(named[0])}: non-finite values (NaN or inf) in the input frames of trajectory "
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
    **options,
) -> dict:
    """Write ``out``, a PDEBench-layout file of the model's predictions for trajectories of ``data``: see
    the module's notes. Call on every rank of the default group (or alone).

    ``checkpoint``: a run folder (its latest checkpoint that loads), its ``checkpoints`` folder or one
    checkpoint. ``options``: ``plan_prediction``'s: ``trajectories`` (default: all; output trajectory i
    is source trajectory ``trajectories[i]``), ``resolution`` (read ``data`` at that many points per
    spatial dim, as ``drift evaluate``), ``method``, ``grid``, ``data_parallel`` (the spectral method and
    the ranks' layout, as ``drift evaluate``) and ``force`` (replace an existing ``out``).
    ``batch_size``: trajectories a step (default ``data_parallel``: one per data-parallel rank);
    ``progress``: a progress bar on rank 0's stderr (None: on a terminal, ``drift.jobs.console.bars_shown``).
    Errors: ``plan_prediction``'s, DataError for non-finite input frames, OutputError (every rank) when
    writing fails: no file is then left at ``out`` (an existing one is kept). Returns a dict: the output,
    its trajectories, t_in, t_out and grid, the checkpoint, its epoch and the ranks."""
    from tqdm import tqdm

    plan = plan_prediction(checkpoint, data, out, world_size=comm.world_size(), **options)
    config, source = plan.config, plan.source
    trained = load_trained(checkpoint, config, plan.shape, device)
    trained.model.eval()
    channels, fields = saved_channels(trained.meta)
    recipe = recipe_named(config.recipe, config.target)
    predictor = Predictor(trained.model, trained.stats, config.t_in, config.t_out, recipe, channels, fields)
    sharding = trained.sharding
    local = Layout(plan.shape, sharding.mesh, sharding.field_placements()).local_slices
    count = len(plan.trajectories)
    writer = TurnWriter.create(
        plan.out,
        {key: ((count, plan.frames, *plan.shape), source.dtype) for key in fields},
        {**source.coordinates(plan.stride), TIMES: source.times(plan.frames + 1)},
        {**source.attrs(), ATTRIBUTE: _provenance(plan, trained.checkpoint, trained.meta["epoch"])},
        replace=plan.force,
    )
    step = batch_size or plan.config.data_parallel
    bar = tqdm(total=count, desc="predicting", unit="trajectory", disable=not bars_shown(progress) or comm.rank() != 0)
    with writer, bar:
        for start in range(0, count, step):
            batch = list(range(start, min(start + step, count)))
            share = sharding.share(batch)
            inputs = _inputs(plan, [plan.trajectories[i] for i in share], fields, local)
            _check_finite(plan, inputs, share, batch)
            frames = torch.from_numpy(inputs.astype(np.float32, copy=False)).to(trained.device)
            predicted = predictor.block(frames, sharding.wrapper(len(batch), plan.shape))
            predicted = predicted.cpu().numpy().astype(source.dtype, copy=False)
            blocks = [
                (key, (i, slice(*span), *local), values[j, k])
                for j, i in enumerate(share)
                for values, span in ((inputs, (0, config.t_in)), (predicted, (config.t_in, plan.frames)))
                for k, key in enumerate(fields)
            ]
            writer.write(blocks)
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
