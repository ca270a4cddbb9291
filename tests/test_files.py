"""Several PDEBench files read as one data set: trajectories numbered across them in order, statistics over
all of them, the split rule per file, a separate test set (--test-data), mismatched files refused naming
the file, and a run that records its files, resumes on them and refuses when one changed."""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest
from runs import TINY, fails_with_one_line, metric_rows

from drift.checkpoint import latest_checkpoint, read_meta
from drift.cli import main
from drift.data import FIELDS, DataError, PDEBench3D, PDEBenchFiles, Stats, write_pdebench3d
from drift.train import TrainConfig, evaluate
from drift.train.sharding import Sharding, datasets

GRID, FRAMES = (6, 6, 4), 7


def _write(path, trajectories, seed, grid=GRID, frames=FRAMES, fields=FIELDS):
    """Random fields (each field its own scale and offset) in PDEBench's layout at ``path``; returns them."""
    rng = np.random.default_rng(seed)
    arrays = {
        k: (rng.standard_normal((trajectories, frames, *grid)) * (i + 1) + i).astype(np.float32)
        for i, k in enumerate(fields)
    }
    write_pdebench3d(path, arrays)
    return arrays


def _normalised(arrays, t, frames, stats):
    data = np.stack([arrays[k][t, frames] for k in FIELDS])
    return (data - np.reshape(stats.mean, (-1, 1, 1, 1, 1)).astype(np.float32)) / np.reshape(
        stats.std, (-1, 1, 1, 1, 1)
    ).astype(np.float32)


def test_a_folder_reads_as_one_data_set_numbered_in_order(tmp_path):
    folder = tmp_path / "set"
    folder.mkdir()
    parts = [_write(folder / f"part{i}.hdf5", n, seed=i) for i, n in enumerate((4, 3, 5))]
    (folder / "notes.txt").write_text("not data")  # a folder contributes its *.hdf5 and *.h5 files only
    files = PDEBenchFiles(folder)
    assert [p.name for p in files.paths] == ["part0.hdf5", "part1.hdf5", "part2.hdf5"]
    assert files.shape == (12, FRAMES, *GRID) and files.locate(7) == (2, 0)
    train = PDEBench3D(folder, t_in=2, t_out=3)
    test = PDEBench3D(files, t_in=2, t_out=3, split="test", stats=train.stats)
    # --split last on each file: its last trajectory (round(0.1 n), at least one) tests.
    assert test.trajectories == [3, 6, 11] and train.trajectories == [0, 1, 2, 4, 5, 7, 8, 9, 10]
    whole = {k: np.concatenate([p[k] for p in parts]) for k in FIELDS}
    used = np.stack([whole[k][train.trajectories, :5] for k in FIELDS]).reshape(len(FIELDS), -1).astype(np.float64)
    np.testing.assert_allclose(train.stats.mean, used.mean(1), rtol=1e-12)
    np.testing.assert_allclose(train.stats.std, used.std(1), rtol=1e-10)
    for ds in (train, test):
        for i, t in enumerate(ds.trajectories):
            want = _normalised(whole, t, slice(0, 5), train.stats)
            x, y = ds[i]
            # Exact: one subtraction and one division a value, correctly rounded (IEEE 754) on every CPU.
            assert np.array_equal(x.numpy(), want[:, :2]) and np.array_equal(y.numpy(), want[:, 2:]), t
    # Files given one by one read the same as their folder; the order given is the numbering.
    listed = PDEBench3D([folder / "part2.hdf5", folder / "part0.hdf5"], t_in=2, t_out=3, split="all")
    assert listed.trajectories == list(range(9))
    assert np.array_equal(listed[5][0].numpy(), _normalised(parts[0], 0, slice(0, 2), listed.stats))


def test_pdebench_split_applies_to_each_file(tmp_path):
    paths = [tmp_path / "a.hdf5", tmp_path / "b.hdf5"]
    for i, (path, n) in enumerate(zip(paths, (10, 12), strict=True)):
        _write(path, n, seed=i, grid=(4, 4, 4), frames=3)
    files = PDEBenchFiles(paths)
    assert files.held_out("pdebench") == [0, 10]  # int(0.1 n) first of each file
    assert files.held_out("last") == [9, 21]
    assert PDEBench3D(paths, t_in=1, t_out=2, split="test", split_rule="pdebench").trajectories == [0, 10]


def test_mismatched_files_are_refused_naming_the_file(capsys, tmp_path):
    first = tmp_path / "a.hdf5"
    _write(first, 2, 0)
    cases = [
        ("grid.hdf5", dict(grid=(6, 6, 5)), r"grid.hdf5: grid \(6, 6, 5\) differs from .*a.hdf5's \(6, 6, 4\)"),
        ("frames.hdf5", dict(frames=8), r"frames.hdf5: frames 8 differs from .*a.hdf5's 7"),
        ("fields.hdf5", dict(fields=FIELDS[:4]), r"fields.hdf5: missing dataset 'Vz'"),
    ]
    for name, changes, match in cases:
        other = tmp_path / name
        _write(other, 2, 1, **changes)
        with pytest.raises(DataError, match=match):
            PDEBenchFiles([first, other])
        folder = tmp_path / f"folder-{name}"
        folder.mkdir()
        os.link(first, folder / "a.hdf5")
        os.link(other, folder / name)
        out = tmp_path / "run"
        fails_with_one_line(capsys, ["train", "--data", str(folder), "--out", str(out), *TINY], name)
        assert not out.exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    for data, match in (
        (empty, "empty: a folder without *.hdf5 or *.h5 files"),
        (tmp_path / "nothing.hdf5", "nothing.hdf5: no such file or folder"),
        ([first, tmp_path / "." / "a.hdf5"], "a.hdf5: named twice"),
    ):
        with pytest.raises(DataError, match=re.escape(match)):
            PDEBenchFiles(data)


def _argv(out, *args):
    return ["train", "--out", str(out), "--lr", "0.01", "--schedule", "constant", *TINY, *args]


def test_a_run_on_several_files_records_them_and_resumes_on_them(capsys, tmp_path):
    a, b, c = (tmp_path / f"{name}.hdf5" for name in "abc")
    _write(a, 3, 0)
    _write(b, 2, 1)
    _write(c, 2, 2)
    out = tmp_path / "run"
    assert main(_argv(out, "--data", str(a), str(b), "--epochs", "1")) == 0
    meta = read_meta(latest_checkpoint(out / "checkpoints"))
    assert meta["config"]["data"] == [str(a), str(b)] and meta["config"]["test_data"] is None
    assert [(f["path"], f["trajectories"]) for f in meta["files"]["data"]] == [(str(a), 3), (str(b), 2)]
    assert Stats.load(out / "stats.json") == PDEBench3D([a, b], t_in=2, t_out=4).stats
    # One test trajectory of each file (--split last, per file).
    default = evaluate(out)
    assert default["test_trajectories"] == 2 and default["split"] == "last"
    assert evaluate(out, data=[str(a), str(b)])["test_rel_l2"] == default["test_rel_l2"]
    on_c = evaluate(out, test_data=[str(c)])
    assert on_c["split"] == "test-data" and on_c["test_files"] == [str(c)] and on_c["test_trajectories"] == 2

    # --resume without --data reads the recorded files, in their order.
    assert main(_argv(out, "--resume", "--epochs", "2")) == 0
    assert [r["epoch"] for r in metric_rows(out)] == [1, 2]
    assert read_meta(latest_checkpoint(out / "checkpoints"))["config"]["data"] == [str(a), str(b)]
    stat = b.stat()
    os.utime(b, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    fails_with_one_line(capsys, _argv(out, "--resume", "--epochs", "3"), f"{b} was modified since the run recorded it")
    assert [r["epoch"] for r in metric_rows(out)] == [1, 2]


def test_test_data_is_a_separate_test_set(capsys, tmp_path):
    a, b, c = (tmp_path / f"{name}.hdf5" for name in "abc")
    for i, (path, n) in enumerate(zip((a, b, c), (3, 2, 2), strict=True)):
        _write(path, n, i)
    config = TrainConfig(data=(str(a), str(b)), test_data=(str(c),), t_in=2, t_out=4)
    train_set, test_set = datasets(config, config.data, None, Sharding(None, ()))
    assert train_set.trajectories == list(range(5)) and test_set.trajectories == [0, 1]
    assert test_set.files.paths == (c,) and test_set.stats == train_set.stats
    out = tmp_path / "run"
    assert main(_argv(out, "--data", str(a), str(b), "--test-data", str(c), "--epochs", "1")) == 0
    meta = json.loads((latest_checkpoint(out / "checkpoints") / "meta.json").read_text())
    assert meta["config"]["test_data"] == [str(c)] and meta["files"]["test_data"][0]["path"] == str(c)
    assert evaluate(out)["test_files"] == [str(c)]
    wrong = tmp_path / "wrong.hdf5"
    _write(wrong, 2, 3, grid=(6, 6, 6))
    fails_with_one_line(capsys, _argv(tmp_path / "other", "--data", str(a), "--test-data", str(wrong)), "--test-data: ")
