import os
import time

import pytest
import torch.distributed as dist
from harness import RankFailure, RankPool


def _rank_and_size():
    return dist.get_rank(), dist.get_world_size()


def _fail_on_rank_one():
    if dist.get_rank() == 1:
        raise ZeroDivisionError("rank one broke on purpose")
    return "fine"


def _die_on_rank_two():
    if dist.get_rank() == 2:
        os._exit(3)
    return "fine"


def _hang_on_rank_zero():
    if dist.get_rank() == 0:
        time.sleep(600)
    return "fine"


def _all_reduce_but_rank_one():
    # Rank one skips the collective: the others must not wait for ever.
    if dist.get_rank() != 1:
        dist.all_reduce(__import__("torch").ones(3))
    return "fine"


@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_runs_on_every_rank(ranks, size):
    assert ranks.run(size, _rank_and_size) == [(r, size) for r in range(size)]


def test_exception_reports_that_ranks_traceback():
    with RankPool(3) as pool:
        with pytest.raises(RankFailure) as info:
            pool.run(_fail_on_rank_one)
        assert not pool.alive
    message = str(info.value)
    assert "rank 1 (error)" in message
    assert "ZeroDivisionError: rank one broke on purpose" in message
    assert "rank 0 (" not in message and "rank 2 (" not in message


def test_dead_rank_fails_in_bounded_time():
    with RankPool(3) as pool:
        start = time.monotonic()
        with pytest.raises(RankFailure, match=r"rank 2 \(dead\)"):
            pool.run(_die_on_rank_two, timeout=60)
        assert time.monotonic() - start < 30


@pytest.mark.parametrize("fn", [_hang_on_rank_zero, _all_reduce_but_rank_one])
def test_stuck_rank_fails_within_the_timeout(fn):
    with RankPool(2, pg_timeout=300) as pool:
        start = time.monotonic()
        with pytest.raises(RankFailure, match=r"\(timeout\)"):
            pool.run(fn, timeout=3)
        assert time.monotonic() - start < 15


def _subgroup_then_destroy():
    from drift import comm

    comm.subgroup([0, 1])
    cached = len(comm._subgroups)
    comm.destroy_process_group()
    return cached, len(comm._subgroups), dist.is_initialized()


def test_destroying_the_group_drops_the_cached_subgroups():
    # A destroyed group's subgroups must not outlive it (their backend threads would run until exit).
    with RankPool(2) as pool:
        assert pool.run(_subgroup_then_destroy) == [(1, 0, False)] * 2
