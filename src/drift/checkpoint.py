"""Sharded, crash-safe training checkpoints with ``torch.distributed.checkpoint`` (DCP).

A checkpoint is a folder ``<root>/epoch-NNNN`` holding DCP's files (one per rank, each rank writes
its own) and ``meta.json``. Replicated tensors (lift, pointwise and projection parameters, their Adam
moments) are written once. Each spectral weight and its Adam moments are stored in one layout that
does not depend on the method or the grid: the full ``(in, out, M)`` tensor over the row-major
flattened modes, split over ranks along M in ``torch.chunk`` blocks (a ``DTensor`` sharded on dim 2),
so a checkpoint written by P ranks loads on any other number of ranks and into any method.

Writing is crash-safe: DCP writes into ``epoch-NNNN.partial``; only when every rank has finished
does rank 0 add ``meta.json``, rename the folder and then replace ``<root>/latest`` (a one-line file
naming the folder) atomically. A crash at any moment leaves ``latest`` naming a complete checkpoint.

Checkpoints live on the default process group (every rank of the job).
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import shutil
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch import nn

from drift import comm
from drift.nn.spectral import SpectralConv

LATEST = "latest"


class CheckpointError(ValueError):
    """A missing or incompatible checkpoint; the message names the folder."""


@functools.cache
def _mesh(device_type: str, size: int):
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device_type, (size,))


def _chunk(total: int, size: int, rank: int) -> slice:
    """``torch.chunk``'s block of ``rank``: DTensor's convention for uneven shards."""
    step = math.ceil(total / size)
    start = min(rank * step, total)
    return slice(start, min(start + step, total))


def _to_stored(layer: SpectralConv, share: torch.Tensor):
    """A spectral share (shaped like ``layer.weight``) in the stored layout."""
    flat = layer.gather_shares(share).reshape(layer.in_channels, layer.out_channels, -1)
    size = comm.world_size()
    if size == 1:
        return flat
    from torch.distributed.tensor import DTensor, Shard

    local = flat[..., _chunk(flat.shape[-1], size, comm.rank())].contiguous()
    mesh = _mesh(flat.device.type, size)
    return DTensor.from_local(local, mesh, [Shard(2)], run_check=False, shape=flat.shape, stride=flat.stride())


def _from_stored(layer: SpectralConv, stored) -> torch.Tensor:
    """This rank's share of a loaded stored tensor (one all-gather of the chunks on several ranks)."""
    size = comm.world_size()
    if size == 1:
        full = stored
    else:
        local, total = stored.to_local(), stored.shape[-1]
        padded = local.new_zeros(*local.shape[:2], _chunk(total, size, 0).stop)
        padded[..., : local.shape[-1]] = local
        every = comm.all_gather(padded.unsqueeze(0))
        widths = [_chunk(total, size, r).stop - _chunk(total, size, r).start for r in range(size)]
        full = torch.cat([every[r][..., :w] for r, w in enumerate(widths)], dim=-1)
    return layer.share_of(full.view(layer.in_channels, layer.out_channels, *layer.mode_shape))


def _state(model: nn.Module, optimizer: torch.optim.Optimizer | None) -> tuple[dict, dict]:
    """The state dict to save (or to load into) and, per key, the SpectralConv owning a sharded entry."""
    owners = {id(m.weight): m for m in model.modules() if isinstance(m, SpectralConv)}
    state: dict = {}
    sharded: dict[str, SpectralConv] = {}
    for name, p in model.named_parameters():
        entries = {f"model.{name}": p.detach()}
        if optimizer is not None:
            for key, value in optimizer.state.get(p, {}).items():
                entries[f"optim.{name}.{key}"] = value
        for key, value in entries.items():
            layer = owners.get(id(p))
            if layer is not None and value.shape == p.shape and value.dim() > 0:
                sharded[key] = layer
                value = _to_stored(layer, value)
            state[key] = value
    return state, sharded


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
    state, _ = _state(model, optimizer)
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


@torch.no_grad()
def load_checkpoint(path: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict:
    """Load a checkpoint folder into ``model`` (and ``optimizer``'s Adam state) on every rank, whatever
    the number of ranks or the method it was written with; returns its ``meta``."""
    path = Path(path)
    if optimizer is not None:
        # Adam creates its state lazily: give every parameter zero moments of the right shape to load into.
        for group in optimizer.param_groups:
            for p in group["params"]:
                optimizer.state[p] = {
                    "step": torch.zeros((), dtype=torch.float32),
                    "exp_avg": torch.zeros_like(p),
                    "exp_avg_sq": torch.zeros_like(p),
                }
    state, sharded = _state(model, optimizer)
    try:
        with _single_process_quiet():
            dcp.load(state, checkpoint_id=path, no_dist=comm.world_size() == 1)
    except Exception as exc:
        raise CheckpointError(f"{path}: cannot load into this model ({type(exc).__name__}: {exc})") from None
    loaded = {key: _from_stored(sharded[key], value) if key in sharded else value for key, value in state.items()}
    for name, p in model.named_parameters():
        p.copy_(loaded[f"model.{name}"])
        if optimizer is not None:
            for slot in optimizer.state[p]:
                optimizer.state[p][slot] = loaded[f"optim.{name}.{slot}"]
    return read_meta(path)
