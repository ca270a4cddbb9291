"""Run a function on P ranks of a torch.distributed group from a pytest test: ``drift.jobs.launch.RankPool``
on the test device, one thread per rank.

``rank_pool(P)`` is a live pool (Gloo on 127.0.0.1, or NCCL with ``DRIFT_TEST_DEVICE=cuda``; skipped when
the CUDA ranks outnumber the GPUs); ``pool.run(fn, *args)`` calls ``fn(*args)`` (a module-level function
of a test module) on every rank and returns the per-rank results. Any failure is a ``RankError`` with
every failed rank's traceback, and tears the pool down; ``Ranks`` (the ``ranks`` fixture) then starts a
fresh one for the next case.
"""

from __future__ import annotations

import datetime
import os
import time

import pytest
import torch

from drift.jobs.launch import RankPool

DEVICE_ENV = "DRIFT_TEST_DEVICE"

# A test of a timeout feature bounds the time by the timeout it configured, plus LATE_S for reporting the
# failure on a loaded machine (other deadlines only catch hangs: runs.HANG_S).
LATE_S = 30.0


def ended_by_timeout(elapsed: float, timeout_s: float) -> bool:
    """Whether a wait that took ``elapsed`` seconds was ended by a timeout of ``timeout_s``: not before it
    (within clock granularity), and not long after."""
    return 0.9 * timeout_s <= elapsed < timeout_s + LATE_S


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


def check_one_bad_rank(results: list, error: str, match: str, timeout_s: float) -> None:
    """Rank 0 failed its own check with ``error`` naming ``match`` before any collective (sooner than the
    group's timeout ``timeout_s``, which a rank waiting in one would have taken); every other rank failed
    in the collective it entered alone, when the group's timeout ended its wait, instead of waiting for
    ever."""
    kind, message, elapsed = results[0]
    assert kind == error and match in message and elapsed < timeout_s, results[0]
    for kind, _, elapsed in results[1:]:
        assert kind is not None, "a rank finished a collective its peer never joined"
        assert ended_by_timeout(elapsed, timeout_s), (elapsed, timeout_s)


def rank_pool(size: int, *, timeout_s: float = 120.0, group_timeout_s: float = 60.0) -> RankPool:
    """A pool of ``size`` test ranks on ``DRIFT_TEST_DEVICE``; each call fails after ``timeout_s`` seconds."""
    device, gpus = os.environ.get(DEVICE_ENV, "cpu"), torch.cuda.device_count()
    if device == "cuda" and size > gpus:
        # NCCL refuses two ranks on one GPU; these cases run on CPU ranks in the default suite.
        pytest.skip(f"{size} CUDA ranks need {size} GPUs, found {gpus}")
    return RankPool(size, device=device, threads=1, timeout_s=timeout_s, group_timeout_s=group_timeout_s)


class Ranks:
    """Keeps one live pool per world size for a whole test session (``ranks`` fixture)."""

    def __init__(self) -> None:
        self._pools: dict[int, RankPool] = {}

    def run(self, size: int, fn, *args) -> list:
        """``fn(*args)`` on every rank of the session's pool of ``size`` ranks (a new one after a failure)."""
        pool = self._pools.get(size)
        if pool is None or not pool.alive:
            pool = self._pools[size] = rank_pool(size)
        return pool.run(fn, *args)

    def close(self) -> None:
        """Stop every pool."""
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()
