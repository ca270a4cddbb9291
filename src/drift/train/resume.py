"""A run folder's checkpoints and the rules for continuing from them: the options a checkpoint was trained
with and which of them must match (``--resume``, a fresh run into an older run's folder, an evaluation),
the checkpoint a run continues from, restarted and requeued jobs, and the folder's lock."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

from drift import comm
from drift.checkpoint import (
    CheckpointError,
    FolderInUse,
    complete_checkpoints,
    folder_lock,
    latest_checkpoint,
    read_meta,
    usable_checkpoint,
)
from drift.data import DataFiles
from drift.train.config import (
    LEGACY_OPTIONS,
    META_KEYS,
    MODEL_OPTIONS,
    OPTIMIZER_OPTIONS,
    UNSET,
    ConfigError,
    TrainConfig,
)


def saved_config(meta: dict) -> dict:
    """The options a checkpoint's run was trained with (``LEGACY_OPTIONS`` for options it predates)."""
    return {**LEGACY_OPTIONS, **meta["config"]}


def check_options(
    config: TrainConfig,
    path: Path,
    meta: dict,
    advice: str = "",
    names: Sequence[str] = (*MODEL_OPTIONS, *OPTIMIZER_OPTIONS),
) -> None:
    """CheckpointError naming the first of ``names`` the checkpoint at ``path`` was trained with otherwise
    (an option left unset, ``UNSET``, takes the checkpoint's)."""
    saved = saved_config(meta)
    for name in names:
        if name in UNSET and getattr(config, name) == UNSET[name]:
            continue
        option = f"--{name.replace('_', '-')}"
        value = getattr(config, name)
        if name == "modes" and value is not None and len(value) == 1 and name in saved:
            value = value * len(saved[name])  # one count for every dim of the model
        if name not in saved:
            raise CheckpointError(f"{path}: the run was trained without {option} (by an older drift){advice}")
        if json.loads(json.dumps(value)) != saved[name]:
            raise CheckpointError(f"{path}: {option} is {value}, the run was trained with {saved[name]}{advice}")


def resumed_data(config: TrainConfig) -> TrainConfig:
    """``config`` with ``--resume``'s data: where ``--data`` is not given, the files the run in ``--out``
    trained on, in their recorded order, and its ``--test-data`` where that is not given either; ConfigError
    naming the first file that is gone or differs in size or modification time from the run's record
    (its numbering, split and statistics come from the files as they were). Other files given as
    ``--data`` (the data moved, or were mended) must have the run's grid, ConfigError otherwise; they are
    read with the run's statistics. CheckpointError as ``resume_point`` when none can be resumed."""
    if not config.resume:
        return config
    _, meta = resume_point(config)
    saved = meta["config"]
    # Options left unset continue as the run resolved them for its data.
    config = dataclasses.replace(config, **_unset_from(config, saved_config(meta)))
    trained_on = saved.get("data")
    # A run trained with a separate test set keeps it: its training set is every trajectory of its data.
    test_data = config.test_data or (tuple(saved["test_data"]) if saved.get("test_data") else None)
    if config.data is None:
        recorded = meta.get("files") or {}  # absent in checkpoints of older drift versions
        changed = DataFiles.changed_since([*recorded.get("data", []), *(recorded.get("test_data") or [])])
        if changed is not None:
            raise ConfigError(
                f"--resume: {changed}; the run numbered, split and normalised its data as they were: give "
                "--data (and --test-data) to continue on the files as they are now"
            )
        return dataclasses.replace(config, data=as_data(trained_on), test_data=test_data)
    grid = DataFiles(config.data).grid
    if grid != tuple(meta["global_shape"]):
        data = " ".join(map(str, config.data)) if isinstance(config.data, tuple) else config.data
        raise ConfigError(
            f"--resume continues the run trained on the {tuple(meta['global_shape'])} grid of {as_data(trained_on)}; "
            f"--data {data} has {grid} (train on it into another --out)"
        )
    return dataclasses.replace(config, test_data=test_data)


def _unset_from(config: TrainConfig, saved: dict) -> dict:
    """The values ``saved`` holds of ``config``'s options that are left unset (``UNSET``)."""
    chosen = {name: saved[name] for name, unset in UNSET.items() if getattr(config, name) == unset and name in saved}
    return {name: tuple(v) if isinstance(v, list) else v for name, v in chosen.items()}


def as_data(recorded: str | Sequence[str] | None) -> str | tuple[str, ...] | None:
    """``--data`` as a run records it (a file, or a list of them) in ``TrainConfig``'s form."""
    return recorded if recorded is None or isinstance(recorded, str) else tuple(recorded)


def resume_point(config: TrainConfig) -> tuple[Path, dict]:
    """The checkpoint ``--resume`` continues from (unless DCP then fails to load it: see ``load_newest``)
    and its meta: ``latest``'s, or the newest older complete one when that one is damaged. CheckpointError
    if none is whole or the run's options differ."""
    path = usable_checkpoint(Path(config.out) / "checkpoints", META_KEYS)
    meta = read_meta(path, META_KEYS)
    check_options(config, path, meta)
    return path, meta


def check_fresh_run(config: TrainConfig) -> None:
    """For ``drift train`` without ``--resume``: CheckpointError naming the option if ``--out`` holds
    checkpoints trained with other options (the fresh run would replace them at its first checkpoint, as
    it replaces those of a run with the same options and damaged ones)."""
    if config.resume:
        return
    root = Path(config.out) / "checkpoints"
    advice = f"; a fresh run would replace its checkpoints: use another --out, or delete {root}"
    for path in complete_checkpoints(root):
        try:
            meta = read_meta(path, META_KEYS)
        except CheckpointError:
            continue
        check_options(config, path, meta, advice)


def slurm_requeued() -> bool:
    """Whether this is a SLURM job that was requeued (``SLURM_RESTART_COUNT`` > 0)."""
    return os.environ.get("SLURM_RESTART_COUNT", "0") not in ("", "0")


def restarted(config: TrainConfig) -> TrainConfig:
    """The config of a restarted job (``drift train --max-restarts``, torchrun's ``--max-restarts``): it
    resumes from the latest checkpoint that looks whole when ``--out`` holds one of this run, else starts
    fresh again (a fresh run marks an older run's checkpoints as not its own: ``mark_fresh``)."""
    if config.resume:
        return config
    try:
        usable_checkpoint(Path(config.out) / "checkpoints", META_KEYS)
    except CheckpointError:
        return config
    return dataclasses.replace(config, resume=True)


@contextlib.contextmanager
def one_writer(out: Path) -> Iterator[None]:
    """Rank 0 holds ``out``'s lock inside the block; FolderInUse on every rank when another run holds it."""
    with contextlib.ExitStack() as stack:
        refused = None
        if comm.rank() == 0:
            try:
                stack.enter_context(folder_lock(out))
            except FolderInUse as exc:
                refused = str(exc)
        refused = comm.broadcast_object(refused)
        if refused is not None:
            raise FolderInUse(refused)
        yield


def checkpoint_root(where: str | Path) -> Path:
    """The folder of checkpoints (or the checkpoint folder) a run folder, its ``checkpoints`` folder or a
    checkpoint folder names."""
    root = Path(where)
    return root / "checkpoints" if (root / "checkpoints").is_dir() else root


def find_checkpoint(where: str | Path) -> Path:
    """The checkpoint a run folder (its latest, or the newest older complete one when that one is
    damaged), its ``checkpoints`` folder or a checkpoint folder names; CheckpointError if none is whole."""
    return usable_checkpoint(checkpoint_root(where), META_KEYS)


def newest_checkpoint(out: Path) -> str:
    """The checkpoint ``latest`` names under ``out``, or ``none``."""
    try:
        return str(latest_checkpoint(out / "checkpoints"))
    except CheckpointError:
        return "none"
