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

Checkpoints live on the default process group (every rank of the job).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
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


class CheckpointError(ValueError):
    """A missing or incompatible checkpoint; the message names the folder."""


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
        complete = sorted(p for p in root.glob("epoch-*") if p.is_dir() and not p.name.endswith(".partial"))
        for old in complete[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    comm.barrier()
    return final


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
    """The ``meta`` a checkpoint was saved with."""
    return json.loads((Path(path) / "meta.json").read_text())


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
