"""drift train under faults (issue 14, first part): a fresh run into an older run's folder keeps its own
checkpoints, non-finite data and losses stop the run with one line before a bad checkpoint exists (or
skip the batch), integer and float16 data are refused, a second run on a busy folder is refused, a
damaged latest checkpoint falls back to the newest one that loads, and a failed checkpoint write (a full
disk, a permission) stops the run and keeps the earlier checkpoints; a failing rank prints its traceback
once and logs every rank's report, and a killed rank's job restarts by itself (--max-restarts, the
built-in launcher and torchrun) to the uninterrupted run's metrics. Every case checks the exit code or
exception, the message, how soon it ends and the checkpoints."""

from __future__ import annotations

import errno
import fcntl
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import h5py
import numpy as np
import pytest
import torch
from runs import (
    HANG_S,
    assert_same_metrics,
    checkpoint_names,
    constant_config,
    fails_with_one_line,
    metric_rows,
    run_training,
    tiny_data,
    train_argv,
)
from torch.distributed.checkpoint import filesystem

import drift.train
import drift.train.loop
from drift import comm
from drift.checkpoint import LOCK, FolderInUse, folder_lock
from drift.cli import main
from drift.jobs.launch import RankError
from drift.jobs.reports import FAILURE_LOG
from drift.train import TrainConfig, evaluate, train, train_rank


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return tiny_data(tmp_path_factory.mktemp("faults") / "cfd.hdf5")


# These tests compare runs of different --epochs epoch by epoch: a constant learning rate (not the
# default cosine over --epochs) makes their common epochs equal (runs.train_argv, runs.constant_config).


def _refused_soon(capsys, argv: list[str], names: str) -> None:
    """``drift`` fails with one line naming ``names``, without hanging (what it left on disk, each case
    checks)."""
    began = time.monotonic()
    fails_with_one_line(capsys, argv, names)
    assert time.monotonic() - began < HANG_S


@pytest.mark.other_host
def test_a_fresh_run_into_an_older_longer_run_keeps_its_checkpoints(capsys, data, tmp_path):
    out = tmp_path / "run"
    assert main(train_argv(data, out, "--epochs", "4")) == 0
    longer = metric_rows(out)
    # A fresh run of 2 epochs: its first checkpoint clears the older run's epochs 3 and 4.
    assert main(train_argv(data, out, "--epochs", "2")) == 0
    assert checkpoint_names(out) == (["epoch-0001", "epoch-0002"], "epoch-0002")
    assert_same_metrics(metric_rows(out), longer[:2])
    assert main(["evaluate", str(out)]) == 0
    assert f"test relative L2 {longer[1]['test_rel_l2']:.4f}" in capsys.readouterr().out
    assert main(train_argv(data, out, "--epochs", "3", "--resume")) == 0  # the longer run's epoch 3
    resumed = metric_rows(out)
    assert_same_metrics(resumed, longer[:3])
    assert checkpoint_names(out) == (["epoch-0002", "epoch-0003"], "epoch-0003")
    # A fresh run with another model would replace them: refused, naming the option; the rows untouched.
    _refused_soon(capsys, train_argv(data, out, "--layers", "3"), "--layers is 3, the run was trained with 2")
    assert checkpoint_names(out) == (["epoch-0002", "epoch-0003"], "epoch-0003") and metric_rows(out) == resumed


def _spoiled(data: str, path: Path, trajectory: int, field: str, frame: int, value: float = math.nan) -> str:
    """A copy of ``data`` with ``value`` at one point of a trajectory's field: x = 5, in the second of two
    x slabs, so that one rank of two reads it."""
    shutil.copy(data, path)
    with h5py.File(path, "r+") as f:
        f[field][trajectory, frame, 5, 1, 2] = value
    return str(path)


def test_a_run_records_its_data_by_absolute_path(capsys, data, tmp_path, monkeypatch):
    """``--data`` relative to the working folder: ``drift evaluate`` of the run finds it from elsewhere."""
    monkeypatch.chdir(Path(data).parent)
    out = tmp_path / "run"
    assert main(train_argv(Path(data).name, out, "--epochs", "1")) == 0
    monkeypatch.chdir(tmp_path)
    assert main(["evaluate", str(out)]) == 0
    assert "test relative L2" in capsys.readouterr().out


def test_nonfinite_data_is_refused_naming_trajectories_and_fields(capsys, data, tmp_path):
    out = tmp_path / "run"
    assert main(train_argv(data, out, "--epochs", "1")) == 0
    bad = _spoiled(data, tmp_path / "nan.hdf5", 1, "density", 0)
    with h5py.File(bad, "r+") as f:
        f["Vx"][3, 2, 0, 0, 0] = np.inf  # trajectory 3 is the test split
    names = "non-finite values (NaN or inf) in training trajectory 1 ('density'), test trajectory 3 ('Vx')"
    _refused_soon(capsys, train_argv(bad, out, "--epochs", "1", "--nproc", "2"), names)
    assert checkpoint_names(out) == (["epoch-0001"], "epoch-0001")
    # Data read with the checkpoint's statistics (an evaluation, a resumed run) are checked as well.
    bad = _spoiled(data, tmp_path / "test-nan.hdf5", 3, "Vy", 2)
    names = "non-finite values (NaN or inf) in test trajectory 3 ('Vy')"
    _refused_soon(capsys, ["evaluate", str(out), "--data", bad, "--nproc", "2"], names)
    _refused_soon(capsys, train_argv(bad, out, "--epochs", "2", "--resume", "--nproc", "2"), names)
    assert checkpoint_names(out) == (["epoch-0001"], "epoch-0001") and len(metric_rows(out)) == 1


@pytest.mark.parametrize("dtype", ["int32", "float16"])
def test_integer_and_float16_data_are_refused(capsys, data, tmp_path, dtype):
    path = tmp_path / f"{dtype}.hdf5"
    shutil.copy(data, path)
    with h5py.File(path, "r+") as f:
        pressure = f["pressure"][...]
        del f["pressure"]
        f.create_dataset("pressure", data=pressure.astype(dtype))
    _refused_soon(
        capsys, train_argv(str(path), tmp_path / "run"), f"dataset 'pressure' is {dtype}; drift reads float32"
    )
    assert not (tmp_path / "run").exists()


def _bad_step(epoch: int, trajectory: int) -> tuple[int, list[int]]:
    """The step of ``epoch`` (1-based) whose batch holds ``trajectory`` and that batch, as ``train`` shuffles
    ``constant_config``'s 3 training trajectories (seed 0) in batches of 2."""
    order = torch.randperm(3, generator=torch.Generator().manual_seed(epoch - 1)).tolist()
    step = order.index(trajectory) // 2
    return step + 1, order[2 * step : 2 * step + 2]


def test_a_nonfinite_loss_stops_before_a_checkpoint_or_skips_the_batch(ranks, capsys, data, tmp_path):
    out, weighted = tmp_path / "run", tmp_path / "weighted"
    ranks.run(2, run_training, constant_config(data, out, epochs=1, loss="mse"))
    ranks.run(2, run_training, constant_config(data, weighted, epochs=1))
    # The run goes on on data that changed under it: a finite value whose square overflows float32 (in a
    # target frame, in rank 1's slab alone) passes the data check, and only the guard sees the loss.
    bad = _spoiled(data, tmp_path / "huge.hdf5", 1, "pressure", 4, 3e38)
    step, batch = _bad_step(2, 1)
    # The default loss's frame weights see the overflow before training does, on every rank.
    with pytest.raises(RankError) as refused:
        ranks.run(2, run_training, constant_config(bad, weighted, epochs=2, resume=True))
    message = str(refused.value)
    assert message.startswith("ranks 0, 1 failed: ConfigError: --loss frame-weighted: the normalised field "), message
    assert "'pressure' holds a non-finite value over the training trajectories at predicted frame" in message
    began = time.monotonic()
    with pytest.raises(RankError) as stopped:
        ranks.run(2, run_training, constant_config(bad, out, epochs=2, resume=True, loss="mse"))
    assert time.monotonic() - began < HANG_S
    message = str(stopped.value)
    assert message.startswith("ranks 0, 1 failed: NonFiniteError: non-finite loss"), message
    assert f"at epoch 2, step {step}, training trajectories {batch}" in message and "epoch-0001" in message
    assert checkpoint_names(out) == (["epoch-0001"], "epoch-0001") and len(metric_rows(out)) == 1
    assert not list((out / "checkpoints").glob("epoch-0002*"))
    # The same through the command, on one rank: exit code 2 and one line.
    _refused_soon(
        capsys, train_argv(bad, out, "--epochs", "2", "--resume", "--loss", "mse"), f"at epoch 2, step {step}"
    )
    assert checkpoint_names(out) == (["epoch-0001"], "epoch-0001")
    # --on-nan skip-batch: the bad batch is skipped and counted, the weights stay finite.
    history = ranks.run(
        2, run_training, constant_config(bad, out, epochs=2, resume=True, on_nan="skip-batch", loss="mse")
    )[0]
    assert [r["skipped_batches"] for r in history] == [0, 1] and metric_rows(out)[1]["skipped_batches"] == 1
    assert all(math.isfinite(r["train_loss"]) and math.isfinite(r["test_rel_l2"]) for r in history)
    assert checkpoint_names(out) == (["epoch-0001", "epoch-0002"], "epoch-0002")
    assert math.isfinite(evaluate(out)["test_rel_l2"])


def test_a_second_run_on_a_busy_folder_is_refused_and_a_killed_runs_lock_taken_over(ranks, capsys, data, tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "drift", *train_argv(data, out, "--epochs", "10000")]
    first = subprocess.Popen(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while not (out / "checkpoints" / "latest").exists():
            assert first.poll() is None and time.monotonic() < deadline, first.stderr.read()
            time.sleep(0.2)
        owner = f"pid {first.pid} on host {socket.gethostname()}"
        for nproc in ("1", "2"):
            _refused_soon(capsys, train_argv(data, out, "--nproc", nproc), f"in use by another drift train ({owner}")
        began = time.monotonic()
        with pytest.raises(RankError, match=f"ranks 0, 1 failed: FolderInUse: .*{owner}"):
            ranks.run(2, run_training, constant_config(data, out))  # without the command's check: rank 0 finds the lock
        assert time.monotonic() - began < HANG_S
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    latest = checkpoint_names(out)[1]
    assert (out / LOCK).exists()  # a killed run's lock file stays behind; the next run takes it over
    following = f"epoch-{int(latest.removeprefix('epoch-')) + 1:04d}"
    began = time.monotonic()
    assert main(train_argv(data, out, "--epochs", following.removeprefix("epoch-"), "--resume")) == 0
    assert time.monotonic() - began < HANG_S
    assert not (out / LOCK).exists() and checkpoint_names(out) == ([latest, following], following)


def test_a_folder_without_flock_is_locked_by_a_file_created_exclusively(capfd, monkeypatch, data, tmp_path):
    def unsupported(fd: int, operation: int) -> None:
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(fcntl, "flock", unsupported)
    out = tmp_path / "run"
    assert main(train_argv(data, out, "--epochs", "1")) == 0  # one rank, in this process
    err = capfd.readouterr().err
    assert f"drift: {out}'s filesystem has no flock: {out / LOCK} is created exclusively instead" in err, err
    assert (
        "Traceback" not in err and not (out / LOCK).exists() and checkpoint_names(out) == (["epoch-0001"], "epoch-0001")
    )
    owner = f"pid {os.getpid()} on host {socket.gethostname()}"
    busy = f"in use by another drift train \\({owner}.*delete {out / LOCK}$"
    with folder_lock(out), pytest.raises(FolderInUse, match=busy), folder_lock(out):
        pass
    # A lock left by a dead process of this host is taken over; one of another host is not.
    dead = subprocess.Popen(["true"])
    dead.wait()
    (out / LOCK).write_text(json.dumps(dict(host=socket.gethostname(), pid=dead.pid)))
    assert main(train_argv(data, out, "--epochs", "2", "--resume")) == 0
    assert not (out / LOCK).exists() and checkpoint_names(out) == (["epoch-0001", "epoch-0002"], "epoch-0002")
    (out / LOCK).write_text(json.dumps(dict(host="elsewhere", pid=dead.pid)))
    _refused_soon(capfd, train_argv(data, out, "--epochs", "3", "--resume"), f"pid {dead.pid} on host elsewhere")
    assert checkpoint_names(out) == (["epoch-0001", "epoch-0002"], "epoch-0002")


def _truncate(file: Path) -> None:
    file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])


# Ways to damage a 2-rank run's latest checkpoint (epoch-0002 under the folder given), each with what the
# report of it says.
DAMAGES: list[tuple[Callable[[Path], object], str]] = [
    (lambda root: _truncate(root / "epoch-0002" / ".metadata"), "epoch-0002/.metadata: unreadable"),
    (lambda root: _truncate(root / "epoch-0002" / "__1_0.distcp"), "epoch-0002/__1_0.distcp: truncated"),
    (lambda root: (root / "epoch-0002" / "meta.json").write_text("{garbage"), "epoch-0002/meta.json: unreadable"),
    (
        lambda root: (root / "epoch-0002" / "meta.json").write_text('{"epoch": 2}'),
        "epoch-0002/meta.json: unreadable (no 'world_size', 'config', 'stats', 'global_shape', 'history')",
    ),
    (lambda root: shutil.rmtree(root / "epoch-0002"), "latest names 'epoch-0002', which is not a complete"),
    (lambda root: (root / "epoch-0002" / "meta.json").unlink(), "latest names 'epoch-0002', which is not a complete"),
]


def test_a_damaged_latest_checkpoint_falls_back_to_the_newest_that_loads(ranks, capfd, data, tmp_path):
    pristine, out = tmp_path / "pristine", tmp_path / "run"
    ranks.run(2, run_training, constant_config(data, pristine, epochs=2))
    rows, root, report = metric_rows(pristine), out / "checkpoints", tmp_path / "eval.json"
    for damage, names in DAMAGES:
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(pristine, out)
        damage(root)
        kept = sorted(root.iterdir())
        began = time.monotonic()
        assert main(["evaluate", str(out), "--json", str(report)]) == 0
        assert time.monotonic() - began < HANG_S
        err = capfd.readouterr().err
        assert names in err and f"drift: falling back to {root / 'epoch-0001'}, the newest" in err, err
        assert len(err.splitlines()) == 2 and "Traceback" not in err, err
        result = json.loads(report.read_text())
        assert result["epoch"] == 1 and math.isclose(result["test_rel_l2"], rows[0]["test_rel_l2"], rel_tol=1e-5)
        assert sorted(root.iterdir()) == kept  # evaluating deletes nothing
    # A data file whose size is right but whose bytes are not: only rank 1 reads it, both ranks fall back.
    shutil.rmtree(out)
    shutil.copytree(pristine, out)
    shard = root / "epoch-0002" / "__1_0.distcp"
    shard.write_bytes(bytes(shard.stat().st_size))
    began = time.monotonic()
    assert main(train_argv(data, out, "--epochs", "2", "--resume", "--nproc", "2")) == 0
    assert time.monotonic() - began < HANG_S
    err = capfd.readouterr().err
    assert f"drift: checkpoint passed over: {root / 'epoch-0002'}: cannot load (" in err, err
    assert f"drift: falling back to {root / 'epoch-0001'}" in err and "Traceback" not in err, err
    again = metric_rows(out)
    assert [r["epoch"] for r in again] == [1, 2] and again[0] == rows[0]  # epoch 1's row kept, as written
    assert math.isclose(again[1]["test_rel_l2"], rows[1]["test_rel_l2"], rel_tol=1e-5)
    assert checkpoint_names(out) == (["epoch-0001", "epoch-0002"], "epoch-0002")
    # No checkpoint loads: one line, before any rank starts.
    for name in ("epoch-0001", "epoch-0002"):
        _truncate(root / name / ".metadata")
    _refused_soon(capfd, ["evaluate", str(out)], "no complete checkpoint loads")
    _refused_soon(
        capfd, train_argv(data, out, "--epochs", "3", "--resume", "--nproc", "2"), "no complete checkpoint loads"
    )
    assert sorted(p.name for p in root.iterdir()) == ["epoch-0001", "epoch-0002", "latest"]


def _train_on_a_full_disk(config: TrainConfig, rank: int, epoch: int) -> list[dict]:
    """``train`` with rank ``rank``'s writes into checkpoint ``epoch`` failing as on a full disk (ENOSPC)."""
    write = filesystem._write_item

    def full(transforms, stream, *args):
        if comm.rank() == rank and f"epoch-{epoch:04d}.partial" in str(stream.name):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return write(transforms, stream, *args)

    with mock.patch.object(filesystem, "_write_item", full):
        return train(config)


def test_a_failed_checkpoint_write_stops_the_run_and_keeps_the_earlier_ones(ranks, capsys, data, tmp_path):
    out = tmp_path / "run"
    # A full disk on rank 1 while DCP writes epoch 2: every rank stops, naming the folder and the errno.
    began = time.monotonic()
    with pytest.raises(RankError) as stopped:
        ranks.run(2, _train_on_a_full_disk, constant_config(data, out, epochs=2), 1, 2)
    assert time.monotonic() - began < HANG_S
    partial = out / "checkpoints" / "epoch-0002.partial"
    message = str(stopped.value)
    assert message.startswith(f"ranks 0, 1 failed: CheckpointWriteError: cannot write checkpoint {partial}: "), message
    assert "ENOSPC: [Errno 28] No space left on device" in message
    assert checkpoint_names(out) == (["epoch-0001"], "epoch-0001") and len(metric_rows(out)) == 1
    assert not list((out / "checkpoints").glob("epoch-0002*"))
    # On one rank, through the command: rank 0 may not rename the written folder (a permission).
    replace = os.replace

    def denied(src, dst):
        if Path(src) == partial:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(src))
        replace(src, dst)

    with mock.patch.object(os, "replace", denied):
        _refused_soon(
            capsys,
            train_argv(data, out, "--epochs", "2", "--resume"),
            f"EACCES: [Errno 13] Permission denied: '{partial}'",
        )
    assert checkpoint_names(out) == (["epoch-0001"], "epoch-0001") and len(metric_rows(out)) == 1
    assert not list((out / "checkpoints").glob("epoch-0002*"))
    # Space freed: --resume goes on from the last checkpoint.
    assert main(train_argv(data, out, "--epochs", "2", "--resume")) == 0
    assert checkpoint_names(out) == (["epoch-0001", "epoch-0002"], "epoch-0002") and len(metric_rows(out)) == 2


def _rank_1_raises(config: TrainConfig) -> list[dict]:
    """``train_rank`` with rank 1 failing on a bug of its own (rank 0 waits for it in a collective)."""
    if comm.rank() == 1:
        raise RuntimeError("rank 1 broke")
    return train_rank(config)


def _torchrun_rank_1_raises(config: TrainConfig) -> list[dict]:
    """``_rank_1_raises`` for torchrun's ranks, which join the group inside ``train_rank``."""
    if os.environ["RANK"] == "1":
        raise RuntimeError("rank 1 broke")
    return train_rank(config)


def test_a_failing_rank_prints_its_traceback_once_and_logs_every_rank(capsys, monkeypatch, data, tmp_path):
    out = tmp_path / "run"
    monkeypatch.setattr(drift.train, "train_rank", _rank_1_raises)
    began = time.monotonic()
    assert main(train_argv(data, out, "--nproc", "2")) == 2
    assert time.monotonic() - began < HANG_S
    err = capsys.readouterr().err
    log = out / FAILURE_LOG
    errors = [line for line in err.splitlines() if line.startswith("drift train: error:")]
    assert len(errors) == 1 and errors[0].endswith(f"(every rank's report: {log})"), err
    assert "rank 1 failed: RuntimeError: rank 1 broke" in errors[0], err
    assert err.count("Traceback") == 1 and err.count("RuntimeError: rank 1 broke") == 2, err  # traceback, line
    assert "in _rank_1_raises" in err and "--- rank 0 ---" not in err
    text = log.read_text()
    assert "--- rank 0 ---" in text and "--- rank 1 ---" in text and "in _rank_1_raises" in text, text
    # The next run in the folder removes the earlier job's log.
    monkeypatch.undo()
    assert main(train_argv(data, out, "--epochs", "1")) == 0 and not log.exists()
    # Under torchrun: the failing rank's traceback once, one line naming the log (torchrun's summary follows).
    script = tmp_path / "raises.py"
    script.write_text(
        f"import sys\nsys.path.insert(0, {str(Path(__file__).parent)!r})\nimport drift.train\n"
        "from test_faults import _torchrun_rank_1_raises\ndrift.train.train_rank = _torchrun_rank_1_raises\n"
        "from drift.cli import main\nsys.exit(main(sys.argv[1:]))\n"
    )
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script)]
    began = time.monotonic()
    done = subprocess.run(
        [*cmd, *train_argv(data, out, "--epochs", "2", "--resume")],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode != 0 and time.monotonic() - began < HANG_S
    line = f"drift train: error: rank 1 failed: RuntimeError: rank 1 broke (every failed rank's report: {log})"
    assert done.stderr.count(line) == 1 and done.stderr.count("in _torchrun_rank_1_raises") == 1, done.stderr
    assert "--- rank 1, attempt 0, job " in log.read_text() and "in _torchrun_rank_1_raises" in log.read_text()
    assert checkpoint_names(out) == (["epoch-0001"], "epoch-0001")


def _rank_1_dies_before_its_first_checkpoint(config: TrainConfig) -> list[dict]:
    """``train_rank`` with rank 1 dying (``os._exit``) before the epoch-1 checkpoint, once per test folder."""
    died, save = Path(config.out).parent / "rank-1-died", drift.train.loop.save_checkpoint

    def die_then_save(root, epoch: int, *args, **kwargs):
        if epoch == 1 and comm.rank() == 1 and not died.exists():
            died.touch()
            os._exit(1)
        return save(root, epoch, *args, **kwargs)

    with mock.patch.object(drift.train.loop, "save_checkpoint", die_then_save):
        return train_rank(config)


def test_a_fresh_run_restarted_before_its_first_checkpoint_does_not_resume_an_older_run(
    capsys, monkeypatch, data, tmp_path
):
    out = tmp_path / "run"
    assert main(train_argv(data, out, "--epochs", "3", "--nproc", "2")) == 0
    older = metric_rows(out)
    monkeypatch.setattr(drift.train, "train_rank", _rank_1_dies_before_its_first_checkpoint)
    # No restart: the fresh run wrote no checkpoint; the older run's are kept on disk but are not its own.
    assert main(train_argv(data, out, "--epochs", "2", "--nproc", "2")) == 2
    assert "rank 1 died (exit code 1)" in capsys.readouterr().err
    assert sorted(p.parent.name for p in (out / "checkpoints").glob("epoch-*/meta.json")) == [
        "epoch-0002",
        "epoch-0003",
    ]
    fresh = "no checkpoint yet of the fresh run started here"
    _refused_soon(capsys, ["evaluate", str(out)], fresh)
    _refused_soon(capsys, train_argv(data, out, "--epochs", "2", "--resume"), fresh)
    # One restart allowed: the restarted job starts from the start, not from the older run's epoch 3.
    (out.parent / "rank-1-died").unlink()
    assert main(train_argv(data, out, "--epochs", "2", "--nproc", "2", "--max-restarts", "1")) == 0
    err = capsys.readouterr().err
    assert "rank 1 died (exit code 1)" in err and "restart 1 of 1, from the start" in err, err
    assert_same_metrics(metric_rows(out), older[:2])
    assert checkpoint_names(out) == (["epoch-0001", "epoch-0002"], "epoch-0002")


def _rank_1_dies_once(config: TrainConfig) -> list[dict]:
    """``train_rank`` with rank 1 dying (``os._exit``) right after the epoch-1 checkpoint, once per test
    folder (a marker file beside ``--out`` remembers it)."""
    died, save = Path(config.out).parent / "rank-1-died", drift.train.loop.save_checkpoint

    def save_then_die(root, epoch: int, *args, **kwargs):
        path = save(root, epoch, *args, **kwargs)
        if epoch == 1 and comm.rank() == 1 and not died.exists():
            died.touch()
            os._exit(1)
        return path

    with mock.patch.object(drift.train.loop, "save_checkpoint", save_then_die):
        return train_rank(config)


def test_a_killed_rank_restarts_and_the_job_resumes_to_the_uninterrupted_metrics(capsys, monkeypatch, data, tmp_path):
    # One thread a rank in every run, torchrun's too, whatever the environment says: the runs then sum in
    # one order (gpu_check.sh's test step sets OMP_NUM_THREADS).
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    whole = tmp_path / "whole"
    assert main(train_argv(data, whole, "--epochs", "3", "--nproc", "2")) == 0
    monkeypatch.setattr(drift.train, "train_rank", _rank_1_dies_once)
    # No restart allowed: one line.
    began = time.monotonic()
    assert main(train_argv(data, tmp_path / "once" / "run", "--epochs", "3", "--nproc", "2")) == 2
    assert time.monotonic() - began < HANG_S
    err = capsys.readouterr().err
    # One error line naming the death (rank 0's lost connection may be reported with it, in either order).
    errors = [line for line in err.splitlines() if line.startswith("drift train: error:")]
    assert len(errors) == 1 and "rank 1 died (exit code 1)" in errors[0], err
    # One restart allowed: the job resumes from epoch 1 by itself and ends as the uninterrupted run.
    out = tmp_path / "twice" / "run"
    assert main(train_argv(data, out, "--epochs", "3", "--nproc", "2", "--max-restarts", "1")) == 0
    err = capsys.readouterr().err
    assert "rank 1 died (exit code 1)" in err and "restart 1 of 1, resuming from the latest checkpoint" in err, err
    assert (out.parent / "rank-1-died").exists()
    assert_same_metrics(metric_rows(out), metric_rows(whole))
    assert checkpoint_names(out) == (["epoch-0002", "epoch-0003"], "epoch-0003")
    # The same under torchrun --max-restarts 1: its restarted job resumes by itself.
    out = tmp_path / "torchrun" / "run"
    script = tmp_path / "dies_once.py"
    script.write_text(
        f"import sys\nsys.path.insert(0, {str(Path(__file__).parent)!r})\nimport drift.train\n"
        "from test_faults import _rank_1_dies_once\ndrift.train.train_rank = _rank_1_dies_once\n"
        "from drift.cli import main\nsys.exit(main(sys.argv[1:]))\n"
    )
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    cmd += ["--max-restarts", "1", str(script), *train_argv(data, out, "--epochs", "3")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.count("done: 3 epochs") == 1, f"{done.stderr}\n{done.stdout[-2000:]}"
    assert (out.parent / "rank-1-died").exists()
    assert_same_metrics(metric_rows(out), metric_rows(whole))
