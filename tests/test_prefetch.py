"""Reading ahead: ``Prefetch`` reads one value ahead, in order, in a background thread, and raises a read's
error on the take that needs it; training with it gives the same losses and checkpoints bit for bit as
reading in the step (--no-prefetch), on one rank and on uneven data-parallel shares; a failed background
read stops the run on the step that needs the batch, with one line; a file truncated during a run stops
it with one line naming the file and keeps the last checkpoint."""

from __future__ import annotations

import os
import shutil
import threading
import time

import pytest
import torch
from harness import device_for
from runs import (
    HANG_S,
    checkpoint_names,
    fails_with_one_line,
    metric_rows,
    tiny_data,
    train_argv,
    train_config,
    without_times,
)
from torch.distributed.tensor import DTensor

import drift.train.loop
import drift.train.sharding
from drift import comm
from drift.checkpoint import latest_checkpoint, load_checkpoint
from drift.data import DataError, Prefetch
from drift.train import Sharding, build_model, train
from drift.train.sharding import datasets, read_batch


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return tiny_data(tmp_path_factory.mktemp("prefetch") / "cfd.hdf5")


def test_prefetch_reads_one_ahead_in_order_and_raises_on_the_take_that_needs_it():
    main, taken, seen = threading.main_thread(), [], []

    def read(key):
        seen.append((key, key - len(taken), threading.current_thread() is main))
        if key == 3:
            raise DataError(f"part{key}.hdf5: cannot read dataset 'Vx' (broken)")
        return [key]

    with Prefetch(read, range(5)) as reads:
        for _ in range(3):
            taken.append(reads.take())
        with pytest.raises(DataError, match=r"part3.hdf5: cannot read dataset 'Vx' \(broken\)"):
            reads.take()
    assert taken == [[0], [1], [2]]
    assert [key for key, _, _ in seen] == [0, 1, 2, 3]  # nothing read after the failed one was asked for
    assert max(ahead for _, ahead, _ in seen) <= 1 and not any(in_main for *_, in_main in seen)
    seen.clear()
    taken.clear()
    with Prefetch(read, range(3), ahead=False) as reads:
        taken += [reads.take() for _ in range(3)]
    assert taken == [[0], [1], [2]] and all(in_main for *_, in_main in seen)
    with pytest.raises(IndexError):
        reads.take()


def test_leaving_a_prefetch_does_not_wait_for_a_hung_read():
    """A read that never returns (a file system that stopped answering) delays leaving by ``close_s`` at most."""
    release = threading.Event()

    def read(key):
        if key == 1:
            release.wait()
        return key

    began = time.monotonic()
    with Prefetch(read, range(2), close_s=0.5) as reads:
        assert reads.take() == 0
    assert time.monotonic() - began < HANG_S
    release.set()


def _run_and_weights(config) -> tuple[list[dict], dict]:
    """Train (on every rank of a pool), then the final checkpoint's weights, whole, on the CPU."""
    history = train(config)
    sharding = Sharding.build(config, comm.world_size(), torch.device(config.device).type)
    model = build_model(config, config.device, sharding)
    load_checkpoint(latest_checkpoint(os.path.join(config.out, "checkpoints")), model)
    whole = {
        k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().cpu() for k, v in model.state_dict().items()
    }
    return history, whole


def _batches_pinned(config) -> bool:
    sharding = Sharding.build(config, comm.world_size(), torch.device(config.device).type)
    train_set, _ = datasets(config, config.data, None, sharding)
    x, y = read_batch(train_set, [0, 1], sharding, config.device)
    return x.is_pinned() and y.is_pinned()


@pytest.mark.parametrize(("size", "changes"), [(1, {}), (2, dict(data_parallel=2))])
def test_prefetch_trains_bit_for_bit_as_reading_in_the_step(ranks, data, tmp_path, size, changes):
    """The same losses, test errors and checkpoint weights with and without reading ahead; on two
    data-parallel ranks the last batch of 3 training trajectories leaves one rank none."""
    runs = {
        prefetch: ranks.run(
            size, _run_and_weights, train_config(data, tmp_path / f"{prefetch}", prefetch=prefetch, **changes)
        )[0]
        for prefetch in (True, False)
    }
    # Exact, here and below: the same pool processes, with the same threads, compute both runs; reading
    # ahead changes when data are read, not what is computed.
    assert without_times(runs[True][0]) == without_times(runs[False][0]) and len(runs[True][0]) == 3
    assert runs[True][1].keys() == runs[False][1].keys()
    for name, value in runs[False][1].items():
        assert torch.equal(runs[True][1][name], value), name
    # Batches bound for a GPU are read into pinned memory (gpu_check.sh runs this on CUDA ranks).
    pinned = ranks.run(size, _batches_pinned, train_config(data, tmp_path / "pin", **changes))
    assert all(p == (device_for().type == "cuda") for p in pinned)


@pytest.mark.parametrize("prefetch", [True, False])
def test_a_failed_read_stops_the_run_on_the_step_that_needs_it(capsys, monkeypatch, data, tmp_path, prefetch):
    """The third batch's read fails: the run trains two steps, then stops in the third with the read's
    line; read ahead, the read ran in the background during the second step."""
    real_read, real_rate = drift.train.sharding.read_batch, drift.train.loop.set_learning_rate
    reads, steps = [], []

    def failing(dataset, indices, *args):
        reads.append(threading.current_thread() is threading.main_thread())
        if len(reads) == 3:
            raise DataError(f"{data}: cannot read dataset 'Vx' (injected)")
        return real_read(dataset, indices, *args)

    def counted(optimizer, config, step, steps_total):
        steps.append(step)
        real_rate(optimizer, config, step, steps_total)

    monkeypatch.setattr(drift.train.sharding, "read_batch", failing)
    monkeypatch.setattr(drift.train.loop, "set_learning_rate", counted)
    out = tmp_path / "run"
    argv = train_argv(data, out, "--batch-size", "1", "--epochs", "1", *([] if prefetch else ["--no-prefetch"]))
    fails_with_one_line(capsys, argv, f"{data}: cannot read dataset 'Vx' (injected)")
    assert steps == [0, 1, 2] and len(reads) == 3
    assert reads == ([False] * 3 if prefetch else [True] * 3)


def test_the_next_epochs_first_batch_is_read_during_an_epochs_end(monkeypatch, data, tmp_path):
    """Epoch 1's checkpoint is written while epoch 2's first batch is read (started during epoch 1's last
    step, in the background), and no training batch is read twice."""
    real_read, real_rate, real_save = (
        drift.train.sharding.read_batch,
        drift.train.loop.set_learning_rate,
        drift.train.loop.save_checkpoint,
    )
    started, steps, at_save = [], [], []

    def read(dataset, indices, *args):
        started.append((dataset, threading.current_thread() is threading.main_thread()))
        if dataset is started[0][0]:  # the training set (the test pass reads its own)
            began[sum(d is dataset for d, _ in started) - 1].set()
        return real_read(dataset, indices, *args)

    def rate(optimizer, config, step, steps_total):
        steps.append(step)
        real_rate(optimizer, config, step, steps_total)

    def save(*args, **kwargs):
        if not at_save:  # epoch 1's: has the read of epoch 2's first batch (read number len(steps) + 1) begun?
            at_save.append((len(steps), began[len(steps)].wait(HANG_S)))
        return real_save(*args, **kwargs)

    began = [threading.Event() for _ in range(64)]
    monkeypatch.setattr(drift.train.sharding, "read_batch", read)
    monkeypatch.setattr(drift.train.loop, "set_learning_rate", rate)
    monkeypatch.setattr(drift.train.loop, "save_checkpoint", save)
    train(train_config(data, tmp_path / "run", batch_size=1, epochs=2))
    (per_epoch, read_ahead), total = at_save[0], len(steps)
    assert read_ahead and per_epoch >= 2 and total == 2 * per_epoch
    assert sum(d is started[0][0] for d, _ in started) == total and not any(in_main for _, in_main in started)


def test_a_file_truncated_during_a_run_stops_it_with_one_line_and_keeps_the_checkpoint(
    capsys, monkeypatch, data, tmp_path
):
    copy = tmp_path / "cfd.hdf5"
    shutil.copy(data, copy)
    real_save = drift.train.loop.save_checkpoint

    def save_then_truncate(*args, **kwargs):
        path = real_save(*args, **kwargs)
        with open(copy, "r+b") as f:  # epoch 2's first batch was read meanwhile: a later read finds it
            f.truncate(copy.stat().st_size // 2)
        return path

    monkeypatch.setattr(drift.train.loop, "save_checkpoint", save_then_truncate)
    out = tmp_path / "run"
    began = time.monotonic()
    fails_with_one_line(capsys, train_argv(str(copy), out, "--epochs", "2"), f"{copy}: the file changed")
    assert time.monotonic() - began < HANG_S
    assert checkpoint_names(out) == (["epoch-0001"], "epoch-0001") and len(metric_rows(out)) == 1
