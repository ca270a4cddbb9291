"""Run a function on P ranks of a torch.distributed group, from a pytest test.

A ``RankPool`` spawns P worker processes once, joins them into one process group (Gloo on
127.0.0.1, or NCCL with ``DRIFT_TEST_DEVICE=cuda``) and then runs many cases: ``pool.run(fn, *args)``
calls ``fn(*args)`` on every rank and returns the per-rank results. ``fn`` must be importable (a
module-level function of a test module).

Failures are bounded: an exception on any rank fails the case with that rank's traceback; a rank that
dies or does not answer within ``timeout`` seconds fails it too. After a failure the pool is torn
down (its ranks may be stuck in a collective) and the next case gets a fresh one.
"""

from __future__ import annotations

import contextlib
import datetime
import multiprocessing as mp
import multiprocessing.connection
import os
import socket
import time
import traceback

import pytest
import torch

DEVICE_ENV = "DRIFT_TEST_DEVICE"


def device_for(rank: int = 0) -> torch.device:
    """The device tests run on: ``DRIFT_TEST_DEVICE`` (cpu or cuda), one GPU per rank on CUDA."""
    kind = os.environ.get(DEVICE_ENV, "cpu")
    if kind == "cuda":
        return torch.device("cuda", rank)
    return torch.device(kind)


def attempt(fn, *args) -> tuple[str | None, str, float]:
    """Call ``fn(*args)``: the name and message of what it raised (None, "" if nothing) and the seconds it
    took. For cases that check which error each rank saw, and how soon."""
    start = time.monotonic()
    try:
        fn(*args)
    except Exception as exc:
        return type(exc).__name__, str(exc), time.monotonic() - start
    return None, "", time.monotonic() - start


def short_timeout_group(seconds: float):
    """A new group of every rank whose collectives time out after ``seconds`` (call on every rank)."""
    import torch.distributed as dist

    return dist.new_group(timeout=datetime.timedelta(seconds=seconds))


def check_one_bad_rank(results: list, error: str, match: str) -> None:
    """Rank 0 failed its own check at once with ``error`` naming ``match``; every other rank failed in
    the collective it entered alone, within the group's timeout, instead of waiting for ever."""
    kind, message, elapsed = results[0]
    assert kind == error and match in message and elapsed < 1.0, results[0]
    for kind, _, elapsed in results[1:]:
        assert kind is not None, "a rank finished a collective its peer never joined"
        assert elapsed < 30.0, elapsed


class RankFailure(AssertionError):
    """A case failed on one or more ranks, or did not finish in time."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, size: int, port: int, conn, pg_timeout: float) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    device = device_for(rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    try:
        dist.init_process_group(
            "nccl" if device.type == "cuda" else "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=size,
            timeout=datetime.timedelta(seconds=pg_timeout),
        )
        conn.send(("ok", None))
    except BaseException:
        conn.send(("error", traceback.format_exc()))
        return
    while True:
        try:
            task = conn.recv()
        except EOFError:
            break
        if task is None:
            break
        fn, args, kwargs = task
        try:
            reply = ("ok", fn(*args, **kwargs))
        except BaseException:
            reply = ("error", traceback.format_exc())
        try:
            conn.send(reply)
        except Exception:
            conn.send(("error", traceback.format_exc()))
    from drift import comm

    comm.destroy_process_group()


class RankPool:
    """P live ranks in one process group. Use as a context manager or call ``close()``."""

    def __init__(self, size: int, *, timeout: float = 120.0, pg_timeout: float = 60.0) -> None:
        gpus = torch.cuda.device_count()
        if os.environ.get(DEVICE_ENV, "cpu") == "cuda" and size > gpus:
            # NCCL refuses two ranks on one GPU; these cases run on CPU ranks in the default suite.
            pytest.skip(f"{size} CUDA ranks need {size} GPUs, found {gpus}")
        self.size = size
        self.timeout = timeout
        ctx = mp.get_context("spawn")
        port = _free_port()
        self._conns = []
        self._procs = []
        for rank in range(size):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_worker, args=(rank, size, port, child, pg_timeout), daemon=True)
            proc.start()
            child.close()
            self._conns.append(parent)
            self._procs.append(proc)
        self.alive = True
        self._collect("init_process_group", timeout=max(timeout, 60.0))

    def run(self, fn, *args, timeout: float | None = None, **kwargs) -> list:
        """``[fn(*args, **kwargs) on rank r for r in range(P)]``; raises RankFailure on any failure."""
        if not self.alive:
            raise RankFailure("this pool was torn down by an earlier failure")
        for conn in self._conns:
            conn.send((fn, args, kwargs))
        return self._collect(getattr(fn, "__name__", repr(fn)), timeout=timeout or self.timeout)

    def _collect(self, what: str, timeout: float) -> list:
        deadline = time.monotonic() + timeout
        results: dict[int, tuple[str, object]] = {}
        pending = dict(enumerate(self._conns))
        while pending:
            # After the first failure the others get a short grace: they may be stuck in a collective.
            failed = any(status != "ok" for status, _ in results.values())
            wait = min(deadline, time.monotonic() + 2.0) if failed else deadline
            ready = multiprocessing.connection.wait(list(pending.values()), timeout=max(0.0, wait - time.monotonic()))
            if not ready:
                break
            for rank in [r for r, c in pending.items() if c in ready]:
                try:
                    results[rank] = pending.pop(rank).recv()
                except EOFError:
                    code = self._procs[rank].exitcode
                    results[rank] = ("dead", f"rank {rank} died (exit code {code})")
        if len(results) == self.size and all(status == "ok" for status, _ in results.values()):
            return [results[r][1] for r in range(self.size)]
        self.close(force=True)
        late = "after a peer failed" if failed else f"within {timeout:.0f} s"
        lines = [f"{what} failed on {self.size} ranks:"]
        for rank in range(self.size):
            status, detail = results.get(rank, ("timeout", f"no answer {late}"))
            if status != "ok":
                lines.append(f"--- rank {rank} ({status}) ---\n{detail}")
        raise RankFailure("\n".join(lines))

    def close(self, force: bool = False) -> None:
        """Stop the workers: politely (destroy the process group) unless ``force``."""
        if not self.alive:
            return
        self.alive = False
        if not force:
            for conn in self._conns:
                with contextlib.suppress(OSError):
                    conn.send(None)
            for proc in self._procs:
                proc.join(timeout=10)
        for proc in self._procs:
            if proc.is_alive():
                proc.kill()
            proc.join(timeout=10)
        for conn in self._conns:
            conn.close()

    def __enter__(self) -> RankPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Ranks:
    """Keeps one live pool per world size for a whole test session (``ranks`` fixture)."""

    def __init__(self) -> None:
        self._pools: dict[int, RankPool] = {}

    def run(self, size: int, fn, *args, timeout: float | None = None, **kwargs) -> list:
        pool = self._pools.get(size)
        if pool is None or not pool.alive:
            pool = self._pools[size] = RankPool(size)
        return pool.run(fn, *args, timeout=timeout, **kwargs)

    def close(self) -> None:
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()
