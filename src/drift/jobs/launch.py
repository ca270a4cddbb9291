"""Starting ranks: a pool of local ranks drift spawns itself, or the group torchrun describes.

``RankPool(size, device=...)`` spawns ``size`` fresh local processes once, joins them into one process
group on 127.0.0.1 (Gloo; NCCL with one GPU per rank for ``device="cuda"``) and then runs one function
after another on every rank: ``pool.run(fn, *args)`` returns the per-rank results in rank order.
``run_ranks(size, fn, *args)`` is a pool used for one call. Any failure is a ``RankError`` naming every
failed rank, never a hang: an exception, a death, a call past its timeout, or (``memory_cap_gb``) the
ranks' summed private resident memory over the cap (``MemoryCapExceeded``). The pool is then torn down.

Ranks placed by torchrun instead join their group with ``with process_group(device):``.
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing as mp
import os
import pickle
import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from multiprocessing.connection import wait
from typing import Any, NamedTuple

import torch

from drift import comm
from drift._compat import exit_now
from drift.budget import private_bytes
from drift.errors import PlanError

GROUP_TIMEOUT_S = 1800.0  # generous: rank 0 may write the default data set first
GRACE_S = 2.0  # after a rank fails, the others may answer this long (they may be stuck in a collective)
POLL_S = 0.05  # how often the memory cap is checked
_POOL_ENV = "DRIFT_POOL_RANK"  # set in the ranks a RankPool starts
FORWARDED = (signal.SIGTERM, signal.SIGUSR1)  # what a pool passes on to its ranks while they run a task

_device = torch.device("cpu")


class RankError(RuntimeError):
    """A call on ranks failed: a rank raised, died or did not answer in time.

    ``str()`` is one line naming each failed rank and its error; ``reports`` maps each failed rank to its
    traceback (or how it died or timed out), and the exception's cause shows them all; ``first`` is the
    rank that failed first (most often the root cause; None when no rank is to blame).
    """

    def __init__(self, message: str, reports: dict[int, str] | None = None, first: int | None = None) -> None:
        super().__init__(message)
        self.reports = reports or {}
        self.first = first


class MemoryCapExceeded(RankError):
    """The ranks together used more private resident memory than the cap."""


class RankTracebacks(Exception):
    """The failed ranks' tracebacks (the cause of a ``RankError``)."""


def launched() -> bool:
    """Whether this process is one rank of a torchrun group or of a ``RankPool``."""
    return "WORLD_SIZE" in os.environ and "RANK" in os.environ


def pooled() -> bool:
    """Whether this process is a rank of a ``RankPool``, which holds its ranks to a memory limit itself when
    given one (``rank_memory_bytes``)."""
    return os.environ.get(_POOL_ENV) == "1"


def cores() -> int:
    """CPU cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def threads_per_rank(local_ranks: int) -> int:
    """Threads for each of ``local_ranks`` ranks on this machine: ``OMP_NUM_THREADS`` when it is set
    (to one number), else the cores shared among the ranks."""
    value = os.environ.get("OMP_NUM_THREADS", "")
    if value.isdecimal() and int(value) > 0:
        return int(value)
    return max(1, cores() // local_ranks)


@contextlib.contextmanager
def set_rank_threads(count: int | None) -> Iterator[None]:
    """Inside the block, ranks started here (and by torchrun from this environment) get ``count`` threads
    each, through ``OMP_NUM_THREADS`` (None: leave it; unset, each rank gets ``max(1, cores // P)``). On
    a loaded machine one thread per rank avoids stalls of multi-threaded gemms whose threads get
    descheduled."""
    if count is None:
        yield
        return
    before = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = str(count)
    try:
        yield
    finally:
        if before is None:
            del os.environ["OMP_NUM_THREADS"]
        else:
            os.environ["OMP_NUM_THREADS"] = before


def rank_device() -> torch.device:
    """This rank's device, as ``process_group`` or the pool picked it (the CPU before either)."""
    return _device


def _place(device: str) -> torch.device:
    """Take this rank's device (local rank r: GPU ``r % GPUs``) and set its thread count
    (``threads_per_rank`` of the local ranks)."""
    global _device
    if device == "cuda":
        if torch.cuda.device_count() < 1:
            raise PlanError("--device cuda: no CUDA device is available")
        _device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
        torch.cuda.set_device(_device)
    else:
        _device = torch.device("cpu")
    torch.set_num_threads(threads_per_rank(int(os.environ.get("LOCAL_WORLD_SIZE", 1))))
    return _device


def _backend(device: str) -> str:
    """The process-group backend for ranks on ``device``."""
    return "nccl" if device == "cuda" else "gloo"


@contextlib.contextmanager
def process_group(device: str = "cpu") -> Iterator[torch.device]:
    """Inside the block this process is in the group the environment describes (if any: alone
    otherwise); yields this rank's device and leaves the group at the end if it joined it here.

    For ranks placed by torchrun (in a ``RankPool`` rank the group already exists). Sets the thread
    count to ``threads_per_rank(local ranks)``. On CUDA, local rank r takes GPU ``r % GPUs``: each rank's
    own GPU where ranks see all of the machine's, the one GPU it sees where a scheduler shows each rank
    only its own.
    """
    where = _place(device)
    joins = launched() and int(os.environ["WORLD_SIZE"]) > 1 and not comm.is_initialized()
    if joins and restart_count() > 0:
        _join_restarted(_backend(device))
    elif joins:
        comm.init_process_group(_backend(device), timeout_s=GROUP_TIMEOUT_S)
    try:
        yield where
    finally:
        if joins:
            comm.destroy_process_group()


def restart_count() -> int:
    """How often torchrun (``--max-restarts``) restarted this job: 0 for its first attempt or outside it."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def _join_restarted(backend: str) -> None:
    """Join the default group of a job torchrun restarted, on the store at ``MASTER_ADDR:MASTER_PORT``
    under a prefix of its own: the keys the earlier attempt left there would otherwise send Gloo to its
    dead ranks' addresses (``connectFullMesh failed ... Connection refused``)."""
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"  # else rank 0 hosts the store
    address, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    prefixed = comm.store(
        address,
        port,
        timeout_s=GROUP_TIMEOUT_S,
        world_size=size,
        is_master=not agent and rank == 0,
        prefix=f"drift/attempt-{restart_count()}",
    )
    comm.init_process_group(backend, timeout_s=GROUP_TIMEOUT_S, store=prefixed, rank=rank, world_size=size)


def _failure(exc: BaseException) -> tuple[bool, str, str]:
    """A rank's reply for an exception: not ok, its traceback, and one line ``failed: Type: message``."""
    return False, traceback.format_exc(), f"failed: {type(exc).__name__}: {' '.join(str(exc).split())[:500]}"


def _serve(rank: int, size: int, port: int, device: str, threads: int, group_timeout_s: float, conn) -> None:
    """A pool rank: join the group, then run each task ``conn`` brings and send back its reply."""
    os.environ.update(
        {_POOL_ENV: "1"},
        RANK=str(rank),
        WORLD_SIZE=str(size),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        OMP_NUM_THREADS=str(threads),
    )
    try:
        _place(device)
        # Even one rank joins a group, so that barriers and drift.comm behave the same at every size.
        store = comm.store("127.0.0.1", port, timeout_s=group_timeout_s)
        comm.init_process_group(_backend(device), timeout_s=group_timeout_s, store=store, rank=rank, world_size=size)
        conn.send((True, None, ""))
    except BaseException as exc:
        conn.send(_failure(exc))
        _exit()
    with contextlib.suppress(EOFError):  # the parent is gone
        while task := conn.recv_bytes():  # an empty message: stop
            try:
                fn, args = pickle.loads(task)
                reply = (True, fn(*args), "")
            except BaseException as exc:
                reply = _failure(exc)
            try:
                conn.send(reply)
            except Exception as exc:  # an unpicklable result
                conn.send(_failure(exc))
    comm.destroy_process_group()
    _exit()


def _exit() -> None:
    """End a pool rank with exit code 0: the exit handlers run and the standard streams are flushed, but
    the interpreter's teardown of torch's modules, 0.6-0.9 s of one core per rank on a 2-core host, is
    skipped (a rank's tasks have returned; nothing is left for it to finalise)."""
    exit_now(0)


class _Reply(NamedTuple):
    """A rank's answer to a task: ``value`` is the result, or for a failure its report (a traceback) and
    ``line`` the failure in one line."""

    ok: bool
    value: Any
    line: str


def ranks_text(ranks: list[int]) -> str:
    """``rank 3`` or ``ranks 0, 2``."""
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"


class RankPool:
    """``size`` live local ranks in one process group, running one function after another.

    ``device``: "cpu" (Gloo) or "cuda" (NCCL, rank r on GPU r; one GPU per rank, checked before any rank
    starts). ``threads``: threads per rank (default ``threads_per_rank(size)``). ``timeout_s``: the default
    limit of one call (None: none). ``group_timeout_s``: the collectives' timeout. ``memory_cap_gb``: the
    limit of the ranks' summed private resident memory while a call runs, ``rank_memory_bytes`` each
    rank's (``drift train --memory-per-rank``), both polled every 50 ms. Use as a context manager or call
    ``close()``.
    """

    def __init__(
        self,
        size: int,
        *,
        device: str = "cpu",
        threads: int | None = None,
        timeout_s: float | None = None,
        group_timeout_s: float = GROUP_TIMEOUT_S,
        memory_cap_gb: float | None = None,
        rank_memory_bytes: int | None = None,
    ) -> None:
        if device not in ("cpu", "cuda"):
            raise ValueError(f"device must be cpu or cuda, got {device!r}")
        gpus = torch.cuda.device_count() if device == "cuda" else 0
        if device == "cuda" and size > gpus:
            raise RankError(f"{size} ranks on CUDA need {size} GPUs (one each, for NCCL), found {gpus}")
        self.size, self.timeout_s, self.memory_cap_gb = size, timeout_s, memory_cap_gb
        self.rank_memory_bytes = rank_memory_bytes
        self.alive = True
        context = mp.get_context("spawn")
        # The group's store lives here, bound to a free port at once: a port chosen and released for rank 0
        # to bind later could be taken in between (by another job's socket, or Gloo's own listeners).
        self._store = comm.store("127.0.0.1", 0, timeout_s=group_timeout_s, is_master=True)
        entry = (size, self._store.port, device, threads or threads_per_rank(size), group_timeout_s)
        self._conns, self._procs = [], []
        for rank in range(size):
            parent, child = context.Pipe()
            proc = context.Process(target=_serve, args=(rank, *entry, child), daemon=True)
            proc.start()
            child.close()
            self._conns.append(parent)
            self._procs.append(proc)
        self._collect("joining the process group", group_timeout_s + 60.0, None, None)

    def run(self, fn: Callable[..., Any], *args: Any, timeout_s: float | None = None) -> list[Any]:
        """``[fn(*args) on rank r for r in range(size)]`` (``fn`` importable, arguments and results
        picklable); ``timeout_s`` overrides the pool's limit. Raises ``RankError`` on any failure."""
        if not self.alive:
            raise RankError("this pool was torn down by an earlier failure")
        task = pickle.dumps((fn, args))
        for conn in self._conns:
            with contextlib.suppress(OSError):  # a dead rank: the collection reports it
                conn.send_bytes(task)
        name = getattr(fn, "__name__", repr(fn))
        with self._forwarding(FORWARDED):
            return self._collect(name, timeout_s or self.timeout_s, self.memory_cap_gb, self.rank_memory_bytes)

    @contextlib.contextmanager
    def _forwarding(self, signals: tuple[signal.Signals, ...]) -> Iterator[None]:
        """Inside the block ``signals`` sent to this process go to every live rank instead (a scheduler's
        SIGTERM reaches the ranks, which stop at a step with a checkpoint: ``drift.jobs.stopping``). Only from
        the main thread, where Python runs signal handlers."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def forward(number: int, _) -> None:
            for proc in self._procs:
                if proc.is_alive():
                    with contextlib.suppress(OSError):
                        os.kill(proc.pid, number)

        before = {number: signal.signal(number, forward) for number in signals}
        try:
            yield
        finally:
            for number, handler in before.items():
                signal.signal(number, handler)

    def _collect(
        self, what: str, timeout_s: float | None, memory_cap_gb: float | None, rank_cap: int | None
    ) -> list[Any]:
        """Every rank's reply to the last task, or ``RankError`` (the pool torn down); ``memory_cap_gb`` and
        ``rank_cap`` (bytes): the ranks' summed and each rank's private memory limits while it runs."""
        deadline = math.inf if timeout_s is None else time.monotonic() + timeout_s
        replies: dict[int, _Reply] = {}
        pending = dict(enumerate(self._conns))
        failed_at = math.inf
        poll_s = math.inf if memory_cap_gb is None and rank_cap is None else POLL_S
        while pending and (now := time.monotonic()) < (end := min(deadline, failed_at + GRACE_S)):
            left = min(end - now, poll_s)
            ready = wait(list(pending.values()), timeout=None if left == math.inf else left)
            for rank in [r for r, c in pending.items() if c in ready]:
                try:
                    replies[rank] = _Reply(*pending.pop(rank).recv())
                except EOFError:
                    self._procs[rank].join(timeout=1.0)
                    died = f"died (exit code {self._procs[rank].exitcode})"
                    replies[rank] = _Reply(False, f"rank {rank} {died}", died)
                if not replies[rank].ok:
                    failed_at = min(failed_at, time.monotonic())
            if rank_cap is not None:
                for rank, proc in enumerate(self._procs):
                    if (used := private_bytes(proc.pid)) > rank_cap:
                        self._stop([])
                        raise MemoryCapExceeded(
                            f"rank {rank}'s private memory reached {used / 2**30:.2f} GiB, past the "
                            f"{rank_cap / 2**30:.2f} GiB a rank may use"
                        )
            if memory_cap_gb is not None:
                used = sum(private_bytes(p.pid) for p in self._procs) / 1e9
                if used > memory_cap_gb:
                    self._stop([])
                    raise MemoryCapExceeded(f"{self.size} ranks used {used:.2f} GB > cap {memory_cap_gb:.2f} GB")
        if not pending and all(reply.ok for reply in replies.values()):
            return [replies[r].value for r in range(self.size)]
        self._stop(replies, GRACE_S)  # the ranks that answered wait for a task; the others may be stuck
        late = "after a peer failed" if failed_at < math.inf else f"within {timeout_s:g} s"
        for rank in pending:
            replies[rank] = _Reply(False, f"rank {rank}: no answer {late}", f"did not answer {late}")
        raise self._error(what, {r: reply for r, reply in replies.items() if not reply.ok})

    def _error(self, what: str, failed: dict[int, _Reply]) -> RankError:
        """One ``RankError`` for the failed ranks, in the order they failed (the first is most often the
        cause), ranks with the same error named together."""
        by_error: dict[str, list[int]] = {}
        for rank, reply in failed.items():
            by_error.setdefault(reply.line, []).append(rank)
        summary = "; ".join(f"{ranks_text(sorted(ranks))} {line}" for line, ranks in by_error.items())
        reports = {rank: reply.value for rank, reply in sorted(failed.items())}
        details = "\n".join(f"--- rank {rank} ---\n{report.rstrip()}" for rank, report in reports.items())
        error = RankError(summary, reports, next(iter(failed)))
        error.__cause__ = RankTracebacks(f"{what} on {self.size} ranks:\n{details}")
        return error

    def close(self) -> None:
        """Stop the ranks: each leaves the process group and exits."""
        self._stop(range(self.size))

    def _stop(self, idle: Iterable[int], others_s: float = 0.0) -> None:
        """Ask every rank to exit; wait for the ``idle`` ranks (those waiting for a task), then up to
        ``others_s`` seconds for the others (in Gloo, a rank stuck in a collective fails it once its peers
        have left); kill the ranks still alive."""
        if not self.alive:
            return
        self.alive = False
        for conn in self._conns:
            with contextlib.suppress(OSError):
                conn.send_bytes(b"")
        idle = set(idle)
        for rank in idle:
            self._procs[rank].join(timeout=10)
        end = time.monotonic() + others_s
        for rank, proc in enumerate(self._procs):
            if rank not in idle:
                proc.join(timeout=max(0.0, end - time.monotonic()))
        for proc in self._procs:
            if proc.is_alive():
                proc.kill()
            proc.join(timeout=10)
        for conn in self._conns:
            conn.close()
        self._store = None

    def __enter__(self) -> RankPool:
        return self

    def __exit__(self, kind: type | None, *_: Any) -> None:
        self._stop(range(self.size) if kind is None else [])


def run_ranks(size: int, fn: Callable[..., Any], *args: Any, **options: Any) -> list[Any]:
    """``fn(*args)`` on ``size`` fresh local ranks (a ``RankPool`` with ``options`` used for one call);
    the per-rank results in rank order. Raises ``RankError`` on any failure."""
    with RankPool(size, **options) as pool:
        return pool.run(fn, *args)
