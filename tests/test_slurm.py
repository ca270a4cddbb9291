"""examples/slurm/train.sbatch under a real SLURM (issue 30; ``slurm.py`` runs a private one-node cluster).

A job requeued mid-run (``scontrol requeue``: SIGTERM to every process of the job) checkpoints at a
step boundary and its requeued run continues (``--resume auto``, ``SLURM_RESTART_COUNT``) to the
uninterrupted run's metrics; the time limit's warning (``--signal=B:USR1@N``) goes through the batch
shell, srun and torchrun to the ranks, which checkpoint, the script requeues the job, and its requeued
run finishes the same way; a job cancelled mid-run (``scancel``: SIGTERM) checkpoints and is not
requeued, and ``drift train --resume auto`` continues from its checkpoint. SLURM holds a requeued job for
about two minutes before it starts it again: the tests let it start at once (``scontrol update
StartTime=now``)."""

from __future__ import annotations

import json
import socket
import sys
import time
from pathlib import Path

import pytest
from runs import TINY, assert_same_metrics, metric_rows, tiny_data
from slurm import ENDED, Slurm, require_slurm

from drift.cli import main

SCRIPT = Path(__file__).parent.parent / "examples" / "slurm" / "train.sbatch"
# Long enough (about 15 s on two cores) for a signal sent at epoch 5 or 10 to arrive while it trains.
EPOCHS = 50
TRAIN = ["--epochs", str(EPOCHS), "--batch-size", "4", "--lr", "0.01", "--schedule", "constant", *TINY]
JOB_S = 300  # a generous bound on one job's run: a hang fails the test


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return tiny_data(tmp_path_factory.mktemp("slurm") / "cfd.hdf5")


@pytest.fixture(scope="module")
def whole(tmp_path_factory, data):
    """The uninterrupted run on 2 ranks (one thread each)."""
    out = tmp_path_factory.mktemp("whole") / "run"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OMP_NUM_THREADS", "1")
        assert main(["train", "--data", data, "--out", str(out), "--nproc", "2", *TRAIN]) == 0
    return metric_rows(out)


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    require_slurm()
    with Slurm(tmp_path_factory.mktemp("slurm-cluster")) as cluster:
        yield cluster


def _submit(slurm: Slurm, out: Path, data: str, *options: str) -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(OUT=str(out), NPROC_PER_NODE="2", PORT=str(port), PYTHON=sys.executable, OMP_NUM_THREADS="1")
    slurm.env.update(env)
    log = out.parent / "job-%j.out"
    return slurm.submit(SCRIPT, "--nodes=1", f"--output={log}", *options, args=["--data", data, *TRAIN])


def _requeued(slurm: Slurm, job: int, *changes: str) -> None:
    """Wait until SLURM holds the requeued ``job`` and the node is idle, then let it start (with ``changes``)
    two seconds on: slurmd refuses a job whose credential is no newer, to the second, than the revocation of
    its first run's ("Job credential revoked"; SLURM itself holds a requeued job for the credentials'
    lifetime, which the test cuts short)."""
    deadline = time.monotonic() + JOB_S
    while (fields := slurm.job(job))["JobState"] != "PENDING" or fields["Restarts"] == "0" or not slurm.node_idle():
        assert time.monotonic() < deadline and fields["JobState"] not in ("COMPLETED", "FAILED"), fields
        time.sleep(0.5)
    time.sleep(2)
    slurm.update(job, "StartTime=now", *changes)


def _wait_for(path: Path) -> None:
    deadline = time.monotonic() + JOB_S
    while not path.exists():
        assert time.monotonic() < deadline, f"no {path}"
        time.sleep(0.1)


def test_a_job_requeued_mid_run_continues_to_the_uninterrupted_metrics(slurm, data, whole, tmp_path):
    out = tmp_path / "run"
    job = _submit(slurm, out, data)
    _wait_for(out / "checkpoints" / "epoch-0010")
    slurm.requeue(job)  # SIGTERM to the job's processes: the ranks checkpoint and stop
    _requeued(slurm, job)
    fields = slurm.wait(job, JOB_S)
    log = (tmp_path / f"job-{job}.out").read_text()
    assert fields["JobState"] == "COMPLETED" and fields["Restarts"] == "1", log
    assert "drift train: stopped by SIGTERM" in log and f"done: {EPOCHS} epochs" in log, log
    assert_same_metrics(metric_rows(out), whole)


def test_the_time_limit_warning_checkpoints_and_the_job_requeues_itself(slurm, data, whole, tmp_path):
    """``--signal=B:USR1@N`` sends SIGUSR1 to the batch shell N seconds (give or take SLURM's minute of
    resolution) before the time limit; the test sends that signal itself (``scancel --batch``) once the
    run trains, so that the case does not hang on SLURM's timing: the shell passes it to srun, srun to
    torchrun, torchrun to the ranks, which checkpoint and stop, and the script requeues the job."""
    out = tmp_path / "run"
    job = _submit(slurm, out, data, "--time=10", "--signal=B:USR1@60")
    _wait_for(out / "checkpoints" / "epoch-0005")
    slurm.warn(job)
    _requeued(slurm, job)
    stopped = json.loads((out / "stopped.json").read_text())
    assert stopped["signal"] == "SIGUSR1" and Path(stopped["checkpoint"]).is_dir(), stopped
    fields = slurm.wait(job, JOB_S)
    log = (tmp_path / f"job-{job}.out").read_text()
    assert fields["JobState"] == "COMPLETED" and fields["Restarts"] == "1", log
    assert "drift train: stopped by SIGUSR1" in log and "requeueing job" in log, log
    assert f"done: {EPOCHS} epochs" in log, log
    assert_same_metrics(metric_rows(out), whole)
    assert not (out / "stopped.json").exists()


def _metrics(out: Path) -> list[dict]:
    """``metrics.jsonl``'s rows with their times: a run resumed from a checkpoint keeps the rows it holds."""
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_a_cancelled_job_checkpoints_and_is_not_requeued(slurm, data, whole, tmp_path, monkeypatch):
    """``scancel`` sends SIGTERM to every process of the job: the ranks checkpoint and stop with a
    ``stopped.json`` that says SIGTERM, and the batch shell, which catches SIGTERM and waits for the step,
    does not requeue the job (only the time limit's warning, SIGUSR1, does). The job ends CANCELLED, and
    ``drift train --resume auto`` on its folder continues from its checkpoint to the uninterrupted run's
    metrics."""
    out = tmp_path / "run"
    job = _submit(slurm, out, data)
    _wait_for(out / "checkpoints" / "epoch-0005")
    slurm.cancel(job)
    # Requeued (what the script did before it read the signal), the job would be PENDING or REQUEUED.
    fields = slurm.wait(job, JOB_S, states=(*ENDED, "PENDING", "REQUEUED", "REQUEUE_HOLD"))
    log = (tmp_path / f"job-{job}.out").read_text()
    assert fields["JobState"] == "CANCELLED" and fields["Restarts"] == "0", (fields, log)
    assert "drift train: stopped by SIGTERM" in log and "not requeueing it" in log, log
    assert "requeueing job" not in log, log
    stopped = json.loads((out / "stopped.json").read_text())
    assert stopped["signal"] == "SIGTERM" and Path(stopped["checkpoint"]).is_dir(), stopped
    before = _metrics(out)
    assert 5 <= len(before) < EPOCHS, before
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert main(["train", "--data", data, "--out", str(out), "--nproc", "2", "--resume", "auto", *TRAIN]) == 0
    assert _metrics(out)[: len(before)] == before  # resumed: a fresh run would have timed its epochs anew
    assert_same_metrics(metric_rows(out), whole)
    assert slurm.job(job)["JobState"] == "CANCELLED"  # and it did not run again meanwhile
