"""Sharded, crash-safe training checkpoints with ``torch.distributed.checkpoint`` (DCP).

A checkpoint is a folder ``<root>/epoch-NNNN`` (the end of epoch NNNN) or ``<root>/epoch-NNNN-step-
SSSSS`` (epoch NNNN after its step SSSSS: written when a run is stopped by a signal or by time) holding
DCP's files (one per rank, each rank writes its own) and ``meta.json``. It holds the model's state dict
and the optimizer's (DCP's ``get_model_state_dict`` / ``get_optimizer_state_dict``: keys are parameter
names), each tensor by its global shape: a parallelized model's spectral weights and their Adam moments
are DTensors, each rank writing its shards; replicated tensors (plain parameters, their moments) are
written once. DCP reshards on load, so a checkpoint loads on any mesh and number of ranks, into any
method (drift, dfno-pruned and dfno store the same global weight with different placements), and into a
model on one process with plain tensors, or the other way round.

Writing is crash-safe: DCP writes into ``epoch-NNNN.partial``; only when every rank has finished
does rank 0 add ``meta.json``, rename the folder and then replace ``<root>/latest`` (a one-line file
naming the folder) atomically. A crash at any moment leaves ``latest`` naming a complete checkpoint.
Pruning then never touches that checkpoint: it deletes the checkpoints further on (an older, longer
run's: a run writes its checkpoints in increasing order, so a fresh run clears them at its first
checkpoint), every earlier mid-epoch checkpoint, all but the ``keep - 1`` newest earlier end-of-epoch
ones, and leftover ``.partial`` folders: a run falls back to whole epochs.

A write that fails on any rank (a full disk, a permission, an I/O error) is agreed on by every rank
(``CheckpointWriteError``, naming the folder and the errno): the ``.partial`` folder is deleted and
``latest`` and the earlier checkpoints are left as they were.

Loading runs no code from the folder: DCP's ``.metadata`` is unpickled with an allow-list and the
state's non-tensor values weights-only (``drift.checkpoint_reader``). Loading falls back
(``load_newest``): a checkpoint whose files are damaged (``meta.json`` that does not parse, DCP's
``.metadata`` that does not unpickle or names a global outside the allow-list, a data file missing or
shorter than ``.metadata`` says), or that DCP fails to load on any rank (the ranks agree), is reported in
one line naming the file and the ranks move together to the next older complete one; ``latest``
naming no complete checkpoint falls back the same way. A fresh run (``mark_fresh``) points ``latest``
at ``none`` until its first checkpoint: the older run's checkpoints it will replace are then no longer
loaded, not even by a restart of the fresh run before that checkpoint.

A model whose state-dict entries were renamed since a checkpoint was written offers
``former_name(name)`` (``drift.nn.FNO``: its blocks became modules): an entry the checkpoint lacks is
read under its former name, in the optimizer's state too.

Checkpoints live on the default process group (every rank of the job).

One run folder, one writer: ``folder_lock`` holds ``<run folder>/train.lock`` (an advisory ``flock``,
the file naming the owner's host and pid) for the whole run. The kernel releases it when its owner
dies, so a lock left by a killed run is taken over by the next one. On a filesystem without ``flock``
(Lustre mounted ``noflock``, some NFS) the lock file is created exclusively instead, and said so: a
lock left by a dead process on this host is taken over, one left on another host must be deleted by hand.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import math
import os
import re
import shutil
import socket
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from drift import comm
from drift.checkpoint_reader import CheckpointReader, RefusedGlobal, WeightsOnlyLoadPlanner

LATEST = "latest"
FRESH = "none"  # what ``latest`` names while a fresh run has written no checkpoint yet
LOCK = "train.lock"


class CheckpointError(ValueError):
    """A missing or incompatible checkpoint; the message names the folder."""


class CheckpointWriteError(RuntimeError):
    """Writing a checkpoint failed on some rank (a full disk, a permission, an I/O error); the message
    names the folder and the errno."""


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
    root: str | Path,
    epoch: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    meta: dict,
    *,
    keep: int = 2,
    step: int | None = None,
) -> Path:
    """Write ``epoch-NNNN`` (the end of epoch ``epoch``), or with ``step`` ``epoch-NNNN-step-SSSSS`` (epoch
    ``epoch`` after that step), under ``root`` (call on every rank), point ``root/latest`` at it and prune
    (see the module's notes). ``meta`` (JSON-serialisable) goes to ``meta.json``.
    CheckpointWriteError on every rank when a write fails on any rank; ``latest`` and the earlier
    checkpoints are then untouched and the ``.partial`` folder is deleted."""
    root = Path(root)
    name = f"epoch-{epoch:04d}" if step is None else f"epoch-{epoch:04d}-step-{step:05d}"
    partial, final = root / f"{name}.partial", root / name
    failure = _agreed(_attempt(_prepare, partial) if comm.rank() == 0 else None)
    if failure is None:
        state = _state(model, optimizer)
        failure = _agreed(_attempt(_dcp_save, state, partial))
    if failure is None:
        failure = _agreed(_attempt(_publish, root, name, meta) if comm.rank() == 0 else None)
    if failure is not None:
        if comm.rank() == 0:
            shutil.rmtree(partial, ignore_errors=True)
        raise CheckpointWriteError(
            f"cannot write checkpoint {partial}: {failure}; {root / LATEST} and the earlier checkpoints are "
            "unchanged: free space or fix the folder, then resume"
        )
    if comm.rank() == 0:
        _prune(root, _position(final), keep)
    comm.barrier()
    return final


def _prepare(partial: Path) -> None:
    """Rank 0: an empty ``partial`` folder."""
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)


def _dcp_save(state: dict, partial: Path) -> None:
    with _single_process_quiet():
        dcp.save(state, checkpoint_id=partial, no_dist=comm.world_size() == 1)


def _publish(root: Path, name: str, meta: dict) -> None:
    """Rank 0, once every rank has written its files: add ``meta.json``, rename the folder, point ``latest`` at it."""
    partial = root / f"{name}.partial"
    _write_atomic(partial / "meta.json", json.dumps(meta, indent=2))
    shutil.rmtree(root / name, ignore_errors=True)
    os.replace(partial, root / name)
    _write_atomic(root / LATEST, name + "\n")


def _causes(exc: BaseException) -> list[BaseException]:
    """``exc``, the errors a ``CheckpointException`` gathered from the ranks, and their causes, breadth first."""
    found: list[BaseException] = []
    todo = [exc]
    while todo:
        e = todo.pop(0)
        if any(e is f for f in found):
            continue
        found.append(e)
        if isinstance(e, CheckpointException):
            todo += [failure for failure, _ in e.failures.values()]
        todo += [c for c in (e.__cause__, e.__context__) if c is not None]
    return found


def _why(exc: BaseException) -> str:
    """A failure in one line: the OSError behind it with its errno's name (``ENOSPC: [Errno 28] ...``) when
    there is one, else the first error a rank raised, its type and first line."""
    causes = _causes(exc)
    os_error = next((e for e in causes if isinstance(e, OSError) and e.errno), None)
    if os_error is not None:
        return f"{errno.errorcode.get(os_error.errno, 'errno')}: {os_error}"
    first = causes[1] if isinstance(exc, CheckpointException) and len(causes) > 1 else exc
    lines = str(first).strip().splitlines()
    return f"{type(first).__name__}: {lines[0] if lines else ''}"


def _attempt(fn: Callable[..., None], *args) -> str | None:
    """Call ``fn(*args)``: None, or what it raised in one line (DCP's ``CheckpointException`` included)."""
    try:
        fn(*args)
    except (Exception, CheckpointException) as exc:
        return _why(exc)
    return None


def _agreed(failure: str | None) -> str | None:
    """The failure of the lowest rank that had one, the same on every rank (None when no rank did)."""
    return next((f for f in comm.all_gather_object(failure) if f is not None), None)


def _note(message: str) -> None:
    """One line on rank 0's standard error."""
    if comm.rank() == 0:
        print(f"drift: {message}", file=sys.stderr, flush=True)


_NAME = re.compile(r"epoch-(\d{4,})(?:-step-(\d{5,}))?")


def _position(path: Path) -> tuple[int, float] | None:
    """Where a checkpoint folder's name puts it in a run: ``(epoch, step)`` for ``epoch-NNNN-step-SSSSS``,
    ``(epoch, inf)`` for ``epoch-NNNN`` (after every step of it); None for another name."""
    found = _NAME.fullmatch(path.name)
    if found is None:
        return None
    epoch, step = found.groups()
    return int(epoch), math.inf if step is None else int(step)


def complete_checkpoints(root: str | Path) -> list[Path]:
    """The complete checkpoint folders under ``root`` (those with ``meta.json``), the earliest first."""
    found = [p for p in Path(root).glob("epoch-*") if _position(p) is not None and (p / "meta.json").is_file()]
    return sorted(found, key=_position)


def _prune(root: Path, written: tuple[int, float], keep: int) -> None:
    """After writing the checkpoint at ``written`` (which ``latest`` names): delete the checkpoints further
    on (an older run's), the earlier mid-epoch ones, all but the ``keep - 1`` newest earlier end-of-epoch
    ones, and leftover ``.partial`` folders."""
    complete = complete_checkpoints(root)
    older = [p for p in complete if _position(p) < written and _position(p)[1] == math.inf]
    stale = [p for p in complete if _position(p) > written or (_position(p) < written and p not in older)]
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
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


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


def read_meta(path: str | Path, keys: Sequence[str] = ()) -> dict:
    """The ``meta`` a checkpoint was saved with; CheckpointError naming the file if it does not parse or
    lacks one of ``keys``."""
    file = Path(path) / "meta.json"
    try:
        meta = json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{file}: unreadable ({type(exc).__name__}: {exc})") from None
    if not isinstance(meta, dict):
        raise CheckpointError(f"{file}: unreadable (not a JSON object)")
    if missing := [key for key in keys if key not in meta]:
        raise CheckpointError(f"{file}: unreadable (no {', '.join(map(repr, missing))})")
    return meta


def mark_fresh(root: str | Path) -> None:
    """Rank 0 of a fresh run (not ``--resume``): point ``root/latest`` at none (when there is a ``latest``)
    so that the checkpoints of an older run in ``root``, which the first checkpoint will replace, are no
    longer loaded by a restart of this run or by ``--resume``/``drift evaluate``."""
    pointer = Path(root) / LATEST
    if pointer.is_file():
        _write_atomic(pointer, FRESH + "\n")


def _damage(path: Path, keys: Sequence[str]) -> str | None:
    """What makes the checkpoint folder ``path`` unreadable, in one line naming the file: ``meta.json`` that
    does not parse or lacks one of ``keys``, DCP's ``.metadata`` that does not unpickle, a data file missing
    or shorter than ``.metadata`` says; None when its files look whole."""
    try:
        read_meta(path, keys)
        metadata = CheckpointReader(path).read_metadata()
        ends: dict[str, int] = {}
        for info in metadata.storage_data.values():
            ends[info.relative_path] = max(ends.get(info.relative_path, 0), info.offset + info.length)
    except CheckpointError as exc:
        return str(exc)
    except RefusedGlobal as exc:
        return f"{path / '.metadata'}: not a checkpoint's metadata ({exc})"
    except Exception as exc:
        return f"{path / '.metadata'}: unreadable ({_why(exc)})"
    for name, end in sorted(ends.items()):
        try:
            size = (path / name).stat().st_size
        except OSError as exc:
            return f"{path / name}: unreadable ({_why(exc)})"
        if size < end:
            return f"{path / name}: truncated ({size} bytes, .metadata says {end})"
    return None


def _candidates(root: Path) -> tuple[list[Path], list[str]]:
    """The checkpoints to load under ``root``, newest first, and what is wrong with ``latest``: the one
    ``latest`` names, then the complete ones before it (those further on are an older run's); when it
    names no complete checkpoint or is missing, the complete ones before the one it names (all of them
    if none). ``root`` may also be a checkpoint folder itself (nothing to fall back to)."""
    if (root / "meta.json").is_file():
        return [root], []
    pointer = root / LATEST
    complete = complete_checkpoints(root)[::-1]
    if not pointer.is_file():
        if not complete:
            raise CheckpointError(f"{root}: no checkpoint here (no {LATEST!r} file)")
        return complete, [f"{pointer}: missing"]
    try:
        name = pointer.read_text().strip()
    except (OSError, ValueError) as exc:
        return complete, [f"{pointer}: unreadable ({type(exc).__name__}: {exc})"]
    if name == FRESH:
        message = f"{root}: no checkpoint yet of the fresh run started here ({pointer} names none)"
        if complete:  # newest first
            message += f"; to resume the older run whose checkpoints are here, write {complete[0].name} into {pointer}"
        raise CheckpointError(message)
    named = root / name
    position = _position(named) if name and "/" not in name else None
    if position is not None and (named / "meta.json").is_file():
        return [named, *(p for p in complete if _position(p) < position)], []
    older = [p for p in complete if position is None or _position(p) < position]
    return older, [f"{pointer} names {name!r}, which is not a complete checkpoint"]


def usable_checkpoint(root: str | Path, keys: Sequence[str] = ()) -> Path:
    """The checkpoint ``load_newest`` will try first that is not visibly damaged (its files read and its
    ``meta`` has ``keys``; no DCP load): ``latest``'s, or else the newest older complete one.
    CheckpointError naming every problem found when there is none. Says nothing; for checks before the
    ranks start."""
    root = Path(root)
    paths, problems = _candidates(root)
    for path in paths:
        if (problem := _damage(path, keys)) is None:
            return path
        problems.append(problem)
    raise CheckpointError(_none_loads(root, problems))


def _none_loads(root: Path, problems: list[str]) -> str:
    return f"{root}: no complete checkpoint loads ({'; '.join(problems) or 'none here'})"


def _former_names(state: dict, path: Path, former_name: Callable[[str], str] | None) -> dict[str, str]:
    """The former name of each model entry of ``state`` that the checkpoint at ``path`` stores only under
    it (see the module's notes)."""
    if former_name is None:
        return {}
    stored = CheckpointReader(path).read_metadata().state_dict_metadata
    names = {name: former_name(name) for name in state["model"] if f"model.{name}" not in stored}
    return {name: former for name, former in names.items() if f"model.{former}" in stored}


def _renamed(state: dict, names: dict[str, str]) -> None:
    """``state``'s entries renamed by ``names``, in place: the model's, the optimizer's state and the
    parameter lists of its groups."""
    optim = state.get("optim", {})
    for entries in (state["model"], optim.get("state", {})):
        for name in [name for name in entries if name in names]:
            entries[names[name]] = entries.pop(name)
    for group in optim.get("param_groups", []):
        group["params"] = [names.get(name, name) for name in group["params"]]


def _dcp_load(state: dict, path: Path, former_name: Callable[[str], str] | None = None) -> None:
    names = _former_names(state, path, former_name)
    _renamed(state, names)
    try:
        with _single_process_quiet():
            dcp.load(
                state,
                storage_reader=CheckpointReader(path),
                planner=WeightsOnlyLoadPlanner(),
                no_dist=comm.world_size() == 1,
            )
    finally:
        _renamed(state, {former: name for name, former in names.items()})


def _apply(state: dict, model: nn.Module, optimizer: torch.optim.Optimizer | None) -> None:
    set_model_state_dict(model, state["model"])
    if optimizer is not None:
        set_optimizer_state_dict(model, optimizer, state["optim"])


def load_checkpoint(path: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict:
    """Load a checkpoint folder into ``model`` (and ``optimizer``'s state) on every rank, whatever the
    mesh, the number of ranks or the method it was written with; returns its ``meta``. CheckpointError on
    every rank, in one line, when it fails on any rank."""
    path = Path(path)
    state = _state(model, optimizer)
    failure = _agreed(_attempt(_dcp_load, state, path, getattr(model, "former_name", None)))
    if failure is not None:
        raise CheckpointError(f"{path}: cannot load into this model ({failure})")
    _apply(state, model, optimizer)
    return read_meta(path)


def load_newest(
    root: str | Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    check: Callable[[Path, dict], None] | None = None,
    keys: Sequence[str] = (),
) -> tuple[Path, dict]:
    """Load the newest checkpoint under ``root`` that loads (``latest``'s, else an older complete one)
        into ``model`` (and ``optimizer``) on every rank; returns its folder and ``meta``. Each one passed
        over (damaged files, or a DCP load that failed on any rank: the ranks agree) is reported by rank 0 in
        one line naming the file, and the fallback in one more; a ``meta`` without one of ``keys`` counts as
    damaged. ``check(path, meta)`` may refuse a checkpoint
        before it loads (its error propagates). CheckpointError on every rank when none loads."""
    root = Path(root)
    try:
        found: tuple[list[Path], list[str]] | str | None = _candidates(root) if comm.rank() == 0 else None
    except CheckpointError as exc:
        found = str(exc)
    found = comm.broadcast_object(found)  # every rank tries the same folders
    if isinstance(found, str):
        raise CheckpointError(found)
    paths, problems = found
    for problem in problems:
        _note(f"checkpoint passed over: {problem}")
    for path in paths:
        problem = _agreed(_damage(path, keys))
        if problem is None:
            meta = read_meta(path)
            if check is not None:
                check(path, meta)
            state = _state(model, optimizer)
            problem = _agreed(_attempt(_dcp_load, state, path, getattr(model, "former_name", None)))
            if problem is not None:
                problem = f"{path}: cannot load ({problem})"
        if problem is None:
            _apply(state, model, optimizer)
            if problems:
                _note(f"falling back to {path}, the newest complete checkpoint that loads")
            return path, meta
        _note(f"checkpoint passed over: {problem}")
        problems.append(problem)
    raise CheckpointError(_none_loads(root, problems))


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


def _flock_works(folder: Path) -> bool:
    """Whether ``folder``'s filesystem supports ``flock`` (a shared lock on the folder itself, released at once)."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
            return False
        raise
    finally:
        os.close(fd)
    return True


def _dead_owner(path: Path) -> bool:
    """Whether the lock file ``path`` names a process of this host that no longer runs."""
    try:
        owner = json.loads(path.read_text())
        if owner["host"] != socket.gethostname():
            return False
        os.kill(owner["pid"], 0)
    except ProcessLookupError:
        return True
    except (OSError, ValueError, KeyError, TypeError):
        return False  # being written right now, or not ours to judge
    return False


def _create_lock(path: Path) -> int | None:
    """A descriptor of the lock file ``path``, created exclusively (for filesystems without ``flock``), or
    None when a live process, or one of another host, holds it. A file left by a dead process of this host
    is taken over; two runs taking over the same dead lock at the same instant may both proceed, a window
    ``flock`` does not have."""
    for _ in range(2):
        try:
            return os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            if not _dead_owner(path):
                return None
            path.unlink(missing_ok=True)
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
    died is taken over (on a filesystem without ``flock``: one whose owner was on this host)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK
    flock = _flock_works(folder)
    if not flock:
        _note(
            f"{folder}'s filesystem has no flock: {path} is created exclusively instead; if a run killed on "
            "another host leaves it behind, delete it by hand"
        )
    fd = _try_lock(path, create=True) if flock else _create_lock(path)
    if fd is None:
        error = _in_use(folder)
        raise error if flock else FolderInUse(f"{error}; if that run no longer runs, delete {path}")
    try:
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps(dict(host=socket.gethostname(), pid=os.getpid())).encode())
        yield
    finally:
        path.unlink(missing_ok=True)
        os.close(fd)
