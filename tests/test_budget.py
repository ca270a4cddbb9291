"""A rank's memory budget (``drift.budget``, ``drift train --memory-per-rank``): where it comes from, a
training step refused by its estimate before any rank starts, and ranks held to it while they run."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time

import h5py
import pytest
import torch
from reference import rel_err
from runs import DEVICE, fails_with_one_line

import drift.train.budget
from drift import budget
from drift.cli import main
from drift.data import DataFiles, write_synthetic
from drift.jobs.launch import MemoryCapExceeded, pooled, run_ranks
from drift.train import TrainConfig
from drift.train.budget import step_memory
from drift.train.loop import memory_watch
from drift.train.problem import resolve_problem

GIB = 2**30


@pytest.mark.parametrize("version", [1, 2])
def test_the_budget_is_a_share_of_the_control_groups_limit(tmp_path, monkeypatch, version):
    group = "jobs/a"
    if version == 1:
        (tmp_path / "proc").write_text(f"5:cpu:/\n4:memory:/{group}\n0::/\n")
        limit = tmp_path / "memory" / group / "memory.limit_in_bytes"
    else:
        (tmp_path / "proc").write_text(f"0::/{group}\n")
        limit = tmp_path / group / "memory.max"
    limit.parent.mkdir(parents=True)
    limit.write_text(f"{8 * GIB}\n")
    monkeypatch.setattr(budget, "PROC_CGROUP", tmp_path / "proc")
    monkeypatch.setattr(budget, "CGROUP_ROOT", tmp_path)
    monkeypatch.setattr(budget, "available_bytes", lambda: 20 * GIB)
    assert budget.cgroup_limit() == 8 * GIB
    assert budget.rank_budget("cpu", 4) == budget.RankBudget(2 * GIB, "the control group's limit shared by 4 ranks")
    assert budget.rank_budget("cpu", 4, 5.0) == budget.RankBudget(5 * GIB, "--memory-per-rank")
    # No limit: the memory available, shared.
    limit.write_text("max\n" if version == 2 else f"{2**63 - 4096}\n")
    assert budget.cgroup_limit() is None
    assert budget.rank_budget("cpu", 2) == budget.RankBudget(10 * GIB, "the memory available shared by 2 ranks")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("budget")
    return write_synthetic(folder / "u512.h5", "scalar", samples=10, resolution=512, frames=4, dims=2, seed=1)


AR = ["--recipe", "autoregressive", "--t-in", "2", "--t-out", "2", "--pushforward", "1", "--batch-size", "1"]


def test_the_step_estimate_follows_ranks_unroll_and_recompute(data):
    files = DataFiles(str(data))

    def estimate(parts=(1, 1), **changes):
        config = TrainConfig(data=str(data), recipe="autoregressive", t_in=2, t_out=2, **changes)
        config = resolve_problem(config, files)
        return step_memory(config, files.grid, len(files.inputs), len(files.fields), parts)

    one, four = estimate(), estimate((4, 1))
    assert 3.9 * four.fields <= one.fields <= 4.1 * four.fields  # a rank holds a quarter of the points
    # The whole unroll keeps both steps' graphs, the pushforward trick one; recomputing keeps less.
    assert estimate(pushforward=1).fields < one.fields
    assert estimate(recompute="blocks").fields < one.fields


def test_a_step_past_the_budget_is_refused_on_one_rank_and_fits_on_four(data, tmp_path, capsys, monkeypatch):
    out = tmp_path / "one"
    start = time.monotonic()
    argv = ["train", "--data", str(data), "--out", str(out), *AR, "--memory-per-rank", "0.5", "--device", DEVICE]
    fails_with_one_line(capsys, [*argv, "--nproc", "1"], "a training step on 1 rank needs about")
    assert time.monotonic() - start < 60 and not out.exists()
    # The line names the budget and where it comes from.
    fails_with_one_line(capsys, [*argv, "--nproc", "1"], "and 0.50 GiB is available (--memory-per-rank)")
    out = tmp_path / "four"
    argv = ["train", "--data", str(data), "--out", str(out), *AR, "--memory-per-rank", "0.5", "--device", DEVICE]
    assert main([*argv, "--nproc", "4", "--epochs", "1", "--no-progress"]) == 0, capsys.readouterr().err
    assert (out / "test_metrics.json").is_file()
    # The ranks record the most they held: under the budget, above the start-up's.
    peak = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])["peak_memory_gib"]
    assert 0.1 < peak <= 0.5
    # --activations bfloat16: the fields between blocks rounded to bfloat16, near the float32 prediction.
    predictions = {}
    for activations in ("float32", "bfloat16"):
        written = tmp_path / f"{activations}.h5"
        argv = ["predict", str(out), "--data", str(data), "--out", str(written), "--trajectories", "0-1"]
        assert main([*argv, "--device", DEVICE, "--activations", activations]) == 0, capsys.readouterr().err
        with h5py.File(written, "r") as f:
            predictions[activations] = torch.from_numpy(f["tensor"][:, 2:])
    assert 1e-5 < rel_err(predictions["bfloat16"], predictions["float32"]) < 2e-2
    # drift predict: a forward past a rank's memory is refused before it starts.
    monkeypatch.setattr(drift.train.budget, "rank_budget", lambda *_: budget.RankBudget(GIB // 4, "a quarter GiB"))
    predicted = tmp_path / "predicted.h5"
    argv = ["predict", str(out), "--data", str(data), "--out", str(predicted), "--device", DEVICE]
    fails_with_one_line(capsys, argv, "the forward on 1 rank needs about")
    assert not predicted.exists()


def _allocate_on_rank_one(gib: float) -> int:
    from drift import comm

    kept = torch.ones(int(gib * GIB) // 4) if comm.rank() == 1 else None
    time.sleep(2.0)
    return 0 if kept is None else int(kept.numel())


def test_ranks_are_held_to_their_budget():
    start = time.monotonic()
    past = r"^rank 1's private memory reached .* past the 0\.50 GiB a rank may use"
    with pytest.raises(MemoryCapExceeded, match=past):
        run_ranks(2, _allocate_on_rank_one, 0.8, rank_memory_bytes=GIB // 2, timeout_s=60)
    assert time.monotonic() - start < 60
    assert run_ranks(2, _allocate_on_rank_one, 0.1, rank_memory_bytes=GIB // 2, timeout_s=60)[1] > 0


WATCHED = """
import time
import torch
import torch.distributed as dist
from drift.budget import MemoryWatch
dist.init_process_group("gloo")
with MemoryWatch(2**30):
    if dist.get_rank() == 1:
        kept = torch.ones(2**31 // 4)  # 2 GiB, past the 1 GiB
    dist.barrier()  # rank 0 waits in a collective for the rank that ends
    time.sleep(60)
"""


def _pooled(_) -> bool:
    return pooled()


@pytest.mark.skipif(DEVICE != "cpu", reason="CPU ranks' private memory")
def test_torchruns_ranks_hold_themselves_to_their_budget(tmp_path, monkeypatch):
    script = tmp_path / "watched.py"
    script.write_text(WATCHED)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script)]
    start = time.monotonic()
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    assert done.returncode != 0 and time.monotonic() - start < 60
    lines = [line for line in done.stderr.splitlines() if "private memory reached" in line]
    assert len(lines) == 1 and lines[0].endswith("past the 1.00 GiB it may use (--memory-per-rank)"), done.stderr
    # drift.train's ranks watch themselves under torchrun only: drift's launcher watches the ranks it starts.
    assert run_ranks(2, _pooled, None) == [True, True] and not pooled()
    config = TrainConfig(memory_per_rank=1.5)
    assert isinstance(memory_watch(config), contextlib.nullcontext)  # one process, no launcher
    with monkeypatch.context() as torchrun:
        torchrun.setenv("RANK", "0")
        torchrun.setenv("WORLD_SIZE", "2")
        assert memory_watch(config).limit_bytes == round(1.5 * GIB)
        assert isinstance(memory_watch(TrainConfig()), contextlib.nullcontext)
        torchrun.setenv("DRIFT_POOL_RANK", "1")
        assert isinstance(memory_watch(config), contextlib.nullcontext)
    # Below its limit a watch leaves the process alone and stops when asked.
    with budget.MemoryWatch(1 << 60) as watch:
        time.sleep(0.2)
    assert not watch._thread.is_alive()
