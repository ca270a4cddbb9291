import os
import time

import pytest
import torch
import torch.distributed as dist
from harness import ended_by_timeout, rank_pool

from drift.jobs.launch import RankError


def _rank_and_size():
    return dist.get_rank(), dist.get_world_size(), torch.get_num_threads()


def _fail_on_rank_one():
    if dist.get_rank() == 1:
        raise ZeroDivisionError("rank one broke on purpose")
    return "fine"


def _fail_everywhere():
    raise ValueError(f"bad input\n  on rank {dist.get_rank() // 2}")


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
        dist.all_reduce(torch.ones(3))
    return "fine"


def _unpicklable_result():
    return lambda: None


@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_runs_on_every_rank(ranks, size):
    assert ranks.run(size, _rank_and_size) == [(r, size, 1) for r in range(size)]


def test_exception_reports_that_ranks_traceback():
    with rank_pool(3) as pool:
        with pytest.raises(RankError) as info:
            pool.run(_fail_on_rank_one)
        assert not pool.alive
        with pytest.raises(RankError, match="torn down by an earlier failure"):
            pool.run(_rank_and_size)
    assert str(info.value) == "rank 1 failed: ZeroDivisionError: rank one broke on purpose"
    assert list(info.value.reports) == [1]
    report = info.value.reports[1]
    assert report.startswith("Traceback") and "ZeroDivisionError: rank one broke on purpose" in report
    assert "_fail_on_rank_one" in str(info.value.__cause__) and "--- rank 1 ---" in str(info.value.__cause__)


def test_ranks_with_one_error_are_named_together_on_one_line():
    with rank_pool(3) as pool, pytest.raises(RankError) as info:
        pool.run(_fail_everywhere)
    message = str(info.value)
    assert "\n" not in message and sorted(info.value.reports) == [0, 1, 2]
    assert "ranks 0, 1 failed: ValueError: bad input on rank 0" in message
    assert "rank 2 failed: ValueError: bad input on rank 1" in message


def test_dead_rank_fails_in_bounded_time():
    call_timeout_s = 60
    with rank_pool(3) as pool:
        start = time.monotonic()
        with pytest.raises(RankError, match=r"rank 2 died \(exit code 3\)"):
            pool.run(_die_on_rank_two, timeout_s=call_timeout_s)
        assert time.monotonic() - start < call_timeout_s  # the death is seen, not waited out


@pytest.mark.parametrize("fn", [_hang_on_rank_zero, _all_reduce_but_rank_one])
def test_stuck_rank_fails_within_the_timeout(fn):
    with rank_pool(2, group_timeout_s=300) as pool:
        start = time.monotonic()
        with pytest.raises(RankError, match="did not answer within 3 s"):
            pool.run(fn, timeout_s=3)
        assert ended_by_timeout(time.monotonic() - start, 3)


def test_unpicklable_result_fails_the_call():
    with rank_pool(2) as pool, pytest.raises(RankError, match="ranks 0, 1 failed: .*pickle"):
        pool.run(_unpicklable_result)


MESH_TIMEOUT_S = 3


def _mesh_peer_missing():
    """Rank 0 skips an all-reduce in its group along mesh dim 1 of a 2 x 2 ``grid_mesh``."""
    import drift

    mesh, _ = drift.grid_mesh((2, 2), timeout_s=MESH_TIMEOUT_S)
    start = time.monotonic()
    try:
        if dist.get_rank() != 0:
            dist.all_reduce(torch.ones(2), group=mesh.get_group(1))
    except RuntimeError:
        return "failed", time.monotonic() - start
    return "finished", time.monotonic() - start


def test_mesh_groups_time_out_as_asked():
    # init_device_mesh's sub-groups would wait 30 minutes for a peer that never comes.
    with rank_pool(4) as pool:
        results = pool.run(_mesh_peer_missing, timeout_s=60)
    assert results[1][0] == "failed" and ended_by_timeout(results[1][1], MESH_TIMEOUT_S), results
    assert [r[0] for r in results[2:]] == ["finished", "finished"], results
