"""Sharded, crash-safe training checkpoints with ``torch.distributed.checkpoint`` (DCP).

A checkpoint is a folder ``<root>/epoch-NNNN`` holding DCP's files (one per rank, each rank writes
its own) and ``meta.json``. It holds the model's state dict and the optimizer's (DCP's
``get_model_state_dict`` / ``get_optimizer_state_dict``: keys are parameter names), each tensor by its
global shape: a parallelized model's spectral weights and their Adam moments are DTensors, each rank
writing its shards; replicated tensors (plain parameters, their moments) are written once. DCP
reshards on load, so a checkpoint loads on any mesh and number of ranks, into any method (drift,
dfno-pruned and dfno store the same global weight with different placements), and into a model on
one process with plain tensors, or the other way round.

Writing is crash-safe: DCP writes into ``epoch-NNNN.partial``; only when every rank has finished
does rank 0 add ``meta.json``, rename the folder and then replace ``<root>/latest`` (a one-line file
naming the folder) atomically. A crash at any moment leaves ``latest`` naming a complete checkpoint.
Pruning then never touches that checkpoint: it deletes the checkpoints of higher epochs (an older,
longer run's: a run writes its epochs in increasing order, so a fresh run clears them at its first
checkpoint), all but the ``keep - 1`` newest of lower epochs, and leftover ``.partial`` folders.

Checkpoints live on the default process group (every rank of the job).

One run folder, one writer: ``folder_lock`` holds ``<run folder>/train.lock`` (an advisory ``flock``,
the file naming the owner's host and pid) for the whole run. The kernel releases it when its owner
dies, so a lock left by a killed run is taken over by the next one.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import socket
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from drift import comm

LATEST = "latest"
LOCK = "train.lock"


class CheckpointError(ValueError):
    """A missing or incompatible checkpoint; the message names the folder."""


class FolderInUse(RuntimeError):
    """Another live process holds a run folder's lock; the message names the folder and the owner."""


def _state(model: nn.Module, optimizer: torch.optim.Optimizer | None) -> dict:
    """The state dict to save, or to load into: the model's and, when given, the optimizer's (whose
    state DCP's helper creates first when the optimizer has taken no step yet)."""
    state = {"model": get_model_state_dict(model)}
    if optimizer is not None:
        state["optim"] = get_optimizer_state_dict(model, optimizer)
    return state


def save_checkpoint(
    root: str | Path, epoch: int, model: nn.Module, optimizer: torch.optim.Optimizer, meta: dict, *, keep: int = 2
) -> Path:
    """Write ``epoch-NNNN`` under ``root`` (call on every rank), point ``root/latest`` at it and delete
    all but the ``keep`` newest checkpoints. ``meta`` (JSON-serialisable) goes to ``meta.json``."""
    root = Path(root)
    name = f"epoch-{epoch:04d}"
    partial, final = root / f"{name}.partial", root / name
    if comm.rank() == 0:
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
    comm.barrier()
    state = _state(model, optimizer)
    with _single_process_quiet():
        dcp.save(state, checkpoint_id=partial, no_dist=comm.world_size() == 1)
    comm.barrier()
    if comm.rank() == 0:
        _write_atomic(partial / "meta.json", json.dumps(meta, indent=2))
        shutil.rmtree(final, ignore_errors=True)
        os.replace(partial, final)
        _write_atomic(root / LATEST, name + "\n")
        _prune(root, epoch, keep)
    comm.barrier()
    return final


def _epoch(path: Path) -> int | None:
    """The epoch of a checkpoint folder's name ``epoch-NNNN`` (None for another name)."""
    number = path.name.removeprefix("epoch-")
    return int(number) if number.isdecimal() else None


def complete_checkpoints(root: str | Path) -> list[Path]:
    """The complete checkpoint folders under ``root`` (those with ``meta.json``), oldest epoch first."""
    found = [p for p in Path(root).glob("epoch-*") if _epoch(p) is not None and (p / "meta.json").is_file()]
    return sorted(found, key=_epoch)


def _prune(root: Path, epoch: int, keep: int) -> None:
    """After writing ``epoch`` (which ``latest`` names): delete the checkpoints of higher epochs (an older
    run's), all but the ``keep - 1`` newest of lower epochs, and leftover ``.partial`` folders."""
    older = [p for p in complete_checkpoints(root) if _epoch(p) < epoch]
    stale = [p for p in complete_checkpoints(root) if _epoch(p) > epoch]
    for old in [*older[: max(0, len(older) - (keep - 1))], *stale, *root.glob("epoch-*.partial")]:
        shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def _single_process_quiet() -> Iterator[None]:
    """DCP warns that it assumes a single process even when told so (``no_dist``): silence that one."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
        yield


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def latest_checkpoint(root: str | Path) -> Path:
    """The checkpoint ``root/latest`` names; ``root`` may also be a checkpoint folder itself."""
    root = Path(root)
    if (root / "meta.json").is_file():
        return root
    pointer = root / LATEST
    if not pointer.is_file():
        raise CheckpointError(f"{root}: no checkpoint here (no {LATEST!r} file)")
    path = root / pointer.read_text().strip()
    if not (path / "meta.json").is_file():
        raise CheckpointError(f"{root}: {LATEST!r} names {path.name}, which is not a complete checkpoint")
    return path


def read_meta(path: str | Path) -> dict:
    """The ``meta`` a checkpoint was saved with (CheckpointError naming the file if it does not parse)."""
    file = Path(path) / "meta.json"
    try:
        return json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{file}: unreadable ({type(exc).__name__}: {exc})") from None


def load_checkpoint(path: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict:
    """Load a checkpoint folder into ``model`` (and ``optimizer``'s state) on every rank, whatever the
    mesh, the number of ranks or the method it was written with; returns its ``meta``."""
    path = Path(path)
    state = _state(model, optimizer)
    try:
        with _single_process_quiet():
            dcp.load(state, checkpoint_id=path, no_dist=comm.world_size() == 1)
    except Exception as exc:
        raise CheckpointError(f"{path}: cannot load into this model ({type(exc).__name__}: {exc})") from None
    set_model_state_dict(model, state["model"])
    if optimizer is not None:
        set_optimizer_state_dict(model, optimizer, state["optim"])
    return read_meta(path)


def _try_lock(path: Path, create: bool) -> int | None:
    """A descriptor holding ``path``'s exclusive flock, or None when another process holds it (or, without
    ``create``, when there is no such file)."""
    while True:
        try:
            fd = os.open(path, os.O_RDWR | (os.O_CREAT if create else 0), 0o644)
        except FileNotFoundError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        try:
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)  # the holder removed the file between our open and flock: try the new one
        if not create:
            return None


def _owner(path: Path) -> str:
    """The owner a lock file names: ``pid P on host H``."""
    try:
        owner = json.loads(path.read_text())
        return f"pid {owner['pid']} on host {owner['host']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "an unknown process"  # it is writing the file right now


def _in_use(folder: Path) -> FolderInUse:
    lock = folder / LOCK
    return FolderInUse(
        f"{folder} is in use by another drift train ({_owner(lock)}, lock {lock}); "
        "wait for it to finish or use another --out"
    )


def check_unlocked(folder: str | Path) -> None:
    """FolderInUse if a live process holds ``folder``'s lock (a probe: takes nothing; a folder that
    cannot be read is left for the run itself to report)."""
    folder = Path(folder)
    try:
        fd = _try_lock(folder / LOCK, create=False)
    except OSError:
        return
    if fd is not None:
        os.close(fd)
    elif (folder / LOCK).exists():
        raise _in_use(folder)


@contextlib.contextmanager
def folder_lock(folder: str | Path) -> Iterator[None]:
    """Hold ``folder``'s lock inside the block (the folder is created first); the lock file names this
    host and pid and is removed at the end. FolderInUse if a live process holds it; a lock whose owner
    died is taken over."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK
    fd = _try_lock(path, create=True)
    if fd is None:
        raise _in_use(folder)
    try:
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps(dict(host=socket.gethostname(), pid=os.getpid())).encode())
        yield
    finally:
        path.unlink(missing_ok=True)
        os.close(fd)
