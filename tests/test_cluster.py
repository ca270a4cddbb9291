"""drift train on a cluster, on this host (issue 30): SIGTERM and SIGUSR1 stop every rank at the next step
boundary with a mid-epoch checkpoint (exit code 75, ``<out>/stopped.json``) from which ``--resume``
ends with the uninterrupted run's metrics; ``--checkpoint-every`` writes mid-epoch checkpoints that pruning
clears; ``--resume auto`` (and a requeued SLURM job) resumes or starts fresh; a rank that stops answering
ends the job within its collective timeout with one line naming it; hosts with other versions, or without
a shared run folder, are refused before training."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from functools import partial
from pathlib import Path
from unittest import mock

import pytest
from runs import HANG_S, assert_same_metrics, checkpoint_names, metric_rows, tiny_data, train_argv

import drift
import drift.train
import drift.train.loop
from drift import comm
from drift.cli import main
from drift.jobs.stopping import EXIT_STOPPED, STOPPED
from drift.jobs.timeouts import FIRST_S, PhaseTimeouts
from drift.train import train_rank

TESTS = Path(__file__).parent


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return tiny_data(tmp_path_factory.mktemp("cluster") / "cfd.hdf5")


@pytest.fixture(scope="module")
def whole(tmp_path_factory, data):
    """An uninterrupted 3-epoch run on 2 ranks (one thread each) and its metric rows."""
    out = tmp_path_factory.mktemp("whole") / "run"
    with mock.patch.dict(os.environ, OMP_NUM_THREADS="1"):
        assert main(train_argv(data, out, "--epochs", "3", "--nproc", "2")) == 0
    return metric_rows(out)


def _at_step(config, epoch: int, step: int, rank: int, action):
    """``train_rank`` with rank ``rank`` calling ``action()`` as epoch ``epoch``'s step ``step`` begins."""
    set_rate, steps = drift.train.loop.set_learning_rate, []

    def hooked(*args):
        steps.append(None)
        per_epoch = 2  # the tiny set: 3 training trajectories in batches of 2
        if comm.rank() == rank and len(steps) == (epoch - 1) * per_epoch + step:
            action()
        return set_rate(*args)

    with mock.patch.object(drift.train.loop, "set_learning_rate", hooked):
        return train_rank(config)


def _signalled_at(config, number: int, epoch: int, step: int, rank: int):
    """``train_rank`` with rank ``rank`` sending itself signal ``number`` as epoch ``epoch``'s step ``step`` begins."""
    return _at_step(config, epoch, step, rank, partial(os.kill, os.getpid(), number))


def test_a_signal_stops_every_rank_at_a_step_with_a_checkpoint_that_resumes_exactly(
    capfd, monkeypatch, data, whole, tmp_path
):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    for number, ranks in ((signal.SIGTERM, "2"), (signal.SIGUSR1, "2")):
        out = tmp_path / number.name / "run"
        config_hook = mock.patch.object(
            drift.train, "train_rank", partial(_signalled_at, number=number, epoch=2, step=1, rank=1)
        )
        began = time.monotonic()
        with config_hook:
            assert main(train_argv(data, out, "--epochs", "3", "--nproc", ranks)) == EXIT_STOPPED
        assert time.monotonic() - began < HANG_S
        err = capfd.readouterr().err
        root = out / "checkpoints"
        line = f"drift train: stopped by {number.name} at epoch 2, step 1: checkpoint {root / 'epoch-0002-step-00001'}"
        assert line in err and "Traceback" not in err, err
        assert checkpoint_names(out) == (["epoch-0001", "epoch-0002-step-00001"], "epoch-0002-step-00001")
        stopped = json.loads((out / STOPPED).read_text())
        assert stopped["checkpoint"] == str(root / "epoch-0002-step-00001") and stopped["step"] == 1
        # --resume on as many ranks: the uninterrupted run.
        assert main(train_argv(data, out, "--epochs", "3", "--nproc", "2", "--resume")) == 0
        assert_same_metrics(metric_rows(out), whole)
        assert not (out / STOPPED).exists()
        assert checkpoint_names(out) == (["epoch-0002", "epoch-0003"], "epoch-0003")
    # On another rank count: the same run to float32 round-off of the changed reductions.
    out = tmp_path / "three" / "run"
    hook = partial(_signalled_at, number=signal.SIGTERM, epoch=2, step=2, rank=0)
    with mock.patch.object(drift.train, "train_rank", hook):
        assert main(train_argv(data, out, "--epochs", "3", "--nproc", "2")) == EXIT_STOPPED
    assert "stopped by SIGTERM at epoch 2, step 2" in capfd.readouterr().err
    assert main(train_argv(data, out, "--epochs", "3", "--nproc", "3", "--resume")) == 0
    rows = metric_rows(out)
    assert_same_metrics(rows[:1], whole[:1])
    assert_same_metrics(rows[1:], whole[1:], rtol=1e-5)


def test_sigterm_to_the_command_reaches_its_ranks(data, whole, tmp_path):
    """A scheduler's SIGTERM to ``drift train --nproc 2`` (the process it started): the ranks stop at a
    step or epoch boundary with a checkpoint, exit code 75, and ``--resume`` ends as the uninterrupted run."""
    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "drift", *train_argv(data, out, "--epochs", "3", "--nproc", "2")]
    job = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (out / "checkpoints" / "epoch-0001").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    job.send_signal(signal.SIGTERM)
    _, err = job.communicate(timeout=120)
    assert job.returncode == EXIT_STOPPED, err
    stopped = json.loads((out / STOPPED).read_text())
    assert stopped["signal"] == "SIGTERM" and Path(stopped["checkpoint"]).is_dir(), err
    assert "drift train: stopped by SIGTERM" in err and "Traceback" not in err, err
    done = subprocess.run([*cmd, "--resume"], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert_same_metrics(metric_rows(out), whole)


def test_checkpoint_every_writes_mid_epoch_checkpoints_that_pruning_clears(monkeypatch, data, tmp_path):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    out = tmp_path / "run"
    saved, save = [], drift.train.loop.save_checkpoint

    def recording(root, epoch, *args, step=None, **kwargs):
        saved.append((epoch, step))
        return save(root, epoch, *args, step=step, **kwargs)

    assert main(train_argv(data, tmp_path / "plain", "--epochs", "3")) == 0
    monkeypatch.setattr(drift.train.loop, "save_checkpoint", recording)  # one rank: this process
    # Every step boundary is due (a thousandth of a second): each step writes one.
    assert main(train_argv(data, out, "--epochs", "3", "--checkpoint-every", "0.00001")) == 0
    assert saved == [(e, s) for e in (1, 2, 3) for s in (1, 2, None)]
    assert_same_metrics(metric_rows(out), metric_rows(tmp_path / "plain"))
    assert checkpoint_names(out) == (["epoch-0002", "epoch-0003"], "epoch-0003")


def test_resume_auto_continues_or_starts_fresh(capfd, monkeypatch, data, whole, tmp_path):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    out = tmp_path / "run"
    assert main(train_argv(data, out, "--epochs", "2", "--nproc", "2", "--resume", "auto")) == 0  # nothing there: fresh
    assert_same_metrics(metric_rows(out), whole[:2])
    assert main(train_argv(data, out, "--epochs", "3", "--nproc", "2", "--resume", "auto")) == 0
    assert_same_metrics(metric_rows(out), whole)
    # A requeued SLURM job runs the same command again: it continues without --resume.
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    assert main(train_argv(data, out, "--epochs", "3", "--nproc", "2")) == 0
    assert_same_metrics(metric_rows(out), whole)
    assert checkpoint_names(out) == (["epoch-0002", "epoch-0003"], "epoch-0003")
    capfd.readouterr()
    # Another option is refused, as a fresh run into that folder is.
    code = main(train_argv(data, out, "--epochs", "3", "--layers", "3", "--resume", "auto"))
    assert code == 2 and "--layers is 3, the run was trained with 2" in capfd.readouterr().err


def _stops_answering(config):
    """``train_rank`` with rank 1 stopping itself (SIGSTOP: alive, silent) as epoch 2's first step begins."""
    return _at_step(config, 2, 1, 1, partial(os.kill, os.getpid(), signal.SIGSTOP))


def test_a_rank_that_stops_answering_ends_the_job_within_its_timeout(capfd, monkeypatch, data, tmp_path):
    monkeypatch.setattr(drift.train, "train_rank", _stops_answering)
    out = tmp_path / "run"
    began = time.monotonic()
    assert main(train_argv(data, out, "--epochs", "3", "--nproc", "2", "--collective-timeout", "5")) == 2
    assert time.monotonic() - began < 60
    err = capfd.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("drift train: error:")]
    want = (
        "node 0 (127.0.0.1: rank 1) stopped answering during a training step (epoch 2, step 1; collective timeout 5 s)"
    )
    assert len(errors) == 1 and want in errors[0], err
    assert f"the newest checkpoint: {out / 'checkpoints' / 'epoch-0001'}" in errors[0]
    assert checkpoint_names(out) == (["epoch-0001"], "epoch-0001")


def test_phase_bounds_follow_the_measured_times():
    timeouts = PhaseTimeouts()
    assert timeouts.bound("step") == FIRST_S and timeouts.doing() == "start-up"
    timeouts.slowest |= dict(step=0.5, checkpoint=30.0)
    assert timeouts.bound("step") == 60.0 and timeouts.bound("checkpoint") == 600.0
    timeouts.slowest["step"] = 4.0
    assert timeouts.bound("step") == 80.0
    assert PhaseTimeouts(7.0).bound("checkpoint") == 7.0


def _other_version(config):
    if comm.rank() == 1:
        drift.__version__ = "0.0.0+other"
    return train_rank(config)


def test_hosts_with_other_versions_are_refused(capfd, monkeypatch, data, tmp_path):
    monkeypatch.setattr(drift.train, "train_rank", _other_version)
    out = tmp_path / "run"
    assert main(train_argv(data, out, "--nproc", "2")) == 2
    err = capfd.readouterr().err
    assert "the hosts run different versions: drift 0.0.0+other, torch" in err and "(127.0.0.1: rank 1)" in err, err
    assert not (out / "checkpoints").exists()


def test_sigusr1_to_torchrun_reaches_its_ranks(data, whole, tmp_path):
    """``sbatch --signal=USR1@N``'s signal to the torchrun agent: with ``--signals-to-handle`` it passes it to
    the ranks, which stop with a checkpoint and ``stopped.json``; ``--resume`` ends as the uninterrupted run."""
    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    torchrun += ["--signals-to-handle", "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1", "-m", "drift"]
    agent = subprocess.Popen(
        [*torchrun, *train_argv(data, out, "--epochs", "3")],
        env=env,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not (out / "checkpoints" / "epoch-0001").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    agent.send_signal(signal.SIGUSR1)
    _, err = agent.communicate(timeout=120)
    stopped = json.loads((out / STOPPED).read_text())
    assert stopped["signal"] == "SIGUSR1" and Path(stopped["checkpoint"]).is_dir(), err
    assert "drift train: stopped by SIGUSR1" in err, err
    resumed = [*torchrun, *train_argv(data, out, "--epochs", "3", "--resume")]
    done = subprocess.run(resumed, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert_same_metrics(metric_rows(out), whole)
