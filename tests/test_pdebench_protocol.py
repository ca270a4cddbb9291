"""PDEBench's protocol in drift train / evaluate: the split rule, the split recorded in the run and used
again by --resume and evaluate, and PDEBench's metrics of the trained model (on 4 ranks with uneven
shards, and on 1) equal to a numpy computation from the raw file."""

from __future__ import annotations

import dataclasses
import json
import os

import h5py
import numpy as np
import pytest
import torch
from harness import DEVICE_ENV
from reference import pdebench_reference

from drift.checkpoint import CheckpointError, latest_checkpoint, load_checkpoint, read_meta
from drift.cli import main
from drift.data import FIELDS, Stats, Trajectories, held_out_trajectories, write_pdebench3d
from drift.metrics import NAMES
from drift.train import TEST_METRICS, TrainConfig, build_model, evaluate, model_input, resume_point, train

DEVICE = os.environ.get(DEVICE_ENV, "cpu")
TRAJECTORIES, FRAMES, GRID = 12, 6, (7, 6, 5)  # x = 7 over 4 ranks: blocks of 2, 2, 2, 1
T_IN, T_OUT = 2, 4


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Smooth random fields with positive density and pressure (the protocol does not need physics)."""
    rng = np.random.default_rng(5)
    shape = (TRAJECTORIES, FRAMES, *GRID)
    fields = {name: rng.standard_normal(shape) + (2.0 if name in ("density", "pressure") else 0.0) for name in FIELDS}
    path = tmp_path_factory.mktemp("protocol") / "cfd.hdf5"
    write_pdebench3d(path, fields)
    return str(path)


def _config(data, out, **changes) -> TrainConfig:
    base = TrainConfig(
        data=data, t_in=T_IN, t_out=T_OUT, width=4, modes=(2, 2, 2, 2), layers=2, epochs=2, lr=1e-2, plots=False
    )
    return dataclasses.replace(base, out=str(out), device=DEVICE, progress=False, **changes)


@pytest.mark.parametrize("n", [1, 4, 9, 10, 15, 19, 64, 100, 1000])
def test_split_rules(n):
    # PDEBench's loaders: test_idx = int(num_samples * 0.1), test = the first test_idx trajectories.
    assert list(held_out_trajectories(n, "pdebench")) == list(range(int(n * 0.1)))
    last = max(1, round(n * 0.1)) if n > 1 else 0
    assert list(held_out_trajectories(n, "last")) == list(range(n - last, n))
    with pytest.raises(ValueError, match="split rule"):
        held_out_trajectories(n, "first")


def test_pdebench3d_reads_pdebench_split(data):
    train_set = Trajectories(data, t_in=T_IN, t_out=T_OUT, split_rule="pdebench")
    test_set = Trajectories(data, t_in=T_IN, t_out=T_OUT, split="test", split_rule="pdebench", stats=train_set.stats)
    assert test_set.trajectories == [0] and train_set.trajectories == list(range(1, TRAJECTORIES))
    with h5py.File(data) as f:
        raw = np.stack([f[k][1:TRAJECTORIES, : T_IN + T_OUT] for k in FIELDS], 1).astype(np.float64)
    mean = raw.transpose(1, 0, 2, 3, 4, 5).reshape(len(FIELDS), -1).mean(1)
    assert np.allclose(train_set.stats.mean, mean, rtol=1e-6)  # statistics of the training trajectories


def _train(config: TrainConfig) -> list[dict]:
    return train(config)


def _evaluate(run: str, options: dict) -> dict:
    return evaluate(run, device=DEVICE, **options)


def _reference(run, data) -> dict:
    """PDEBench's metrics (numpy) of the run's model on PDEBench's test trajectory 0, read from the raw
    file and normalised with the run's stats.json; the model runs on one device."""
    stats = Stats.load(os.path.join(run, "stats.json"))
    mean, std = (np.reshape(v, (-1, 1, 1, 1, 1)) for v in (stats.mean, stats.std))
    with h5py.File(data) as f:
        raw = np.stack([f[k][0, : T_IN + T_OUT] for k in FIELDS]).astype(np.float64)  # (fields, t, x, y, z)
    x = torch.from_numpy(((raw[:, :T_IN] - mean) / std).astype(np.float32))[None]
    model = build_model(_config(None, run), "cpu")
    load_checkpoint(latest_checkpoint(os.path.join(run, "checkpoints")), model)
    with torch.no_grad():
        pred = model(model_input(x, T_OUT))[0].double().numpy()  # (fields, x, y, z, t)
    pred = pred * std + mean
    true = np.moveaxis(raw[:, T_IN:], 1, -1)
    return pdebench_reference(*(np.moveaxis(a, 0, -1)[None] for a in (pred, true)))


def _close(got: dict, want: dict, rtol: float) -> None:
    for name in NAMES:
        if want[name] is None:
            assert got[name] is None, name
        else:
            assert abs(got[name] - want[name]) <= rtol * abs(want[name]), (name, got[name], want[name])


TINY = ["--t-in", str(T_IN), "--t-out", str(T_OUT), "--width", "4", "--modes", "2", "--layers", "2", "--no-progress"]


def _fails_naming(capsys, argv, names) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert names in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_pdebench_split_is_recorded_used_again_and_measured(ranks, data, tmp_path, capsys):
    run = tmp_path / "run"
    history = ranks.run(4, _train, _config(data, run, split="pdebench", grid=(4, 1, 1), epochs=1))[0]
    record = json.loads((run / TEST_METRICS).read_text())
    assert record["split"] == "pdebench" and record["epoch"] == 1
    assert record["test_rel_l2"] == history[-1]["test_rel_l2"]
    want = _reference(str(run), data)
    assert want["frmse_low"] is not None and want["frmse_mid"] is None  # 7 x 6 x 5: bins 0 and 1 only
    _close(record["pdebench"], want, 1e-5)  # the 4 ranks' float32 forward against one device's
    # A resume with the other split is refused naming the option, before any rank starts.
    with pytest.raises(CheckpointError, match="--split is last, the run was trained with pdebench"):
        resume_point(_config(data, run, split="last", resume=True))
    resume = ["train", "--data", data, "--out", str(run), "--resume", "--epochs", "2", "--lr", "0.01", *TINY]
    _fails_naming(capsys, resume, "--split is last")
    assert main([*resume, "--split", "pdebench"]) == 0
    assert json.loads((run / TEST_METRICS).read_text())["epoch"] == 2
    # Evaluation on one rank and on a 2 x 2 pencil uses the recorded split.
    want = _reference(str(run), data)
    one = ranks.run(1, _evaluate, str(run), {})[0]
    assert one["split"] == "pdebench" and one["test_trajectories"] == 1 and one["epoch"] == 2
    _close(one["pdebench"], want, 1e-5)
    for result in ranks.run(4, _evaluate, str(run), dict(grid=(2, 2, 1))):
        _close(result["pdebench"], one["pdebench"], 1e-5)
    report = tmp_path / "eval.json"
    assert main(["evaluate", str(run), "--json", str(report)]) == 0
    out = capsys.readouterr().out
    assert "pdebench split" in out and "PDEBench metrics" in out and "nRMSE" in out
    assert set(json.loads(report.read_text())["pdebench"]) == {*NAMES, "per_field", "per_frame"}


def test_checkpoints_before_the_option_used_the_last_split(ranks, data, tmp_path):
    run = tmp_path / "old"
    ranks.run(1, _train, _config(data, run, epochs=1))
    meta_file = latest_checkpoint(run / "checkpoints") / "meta.json"
    meta = read_meta(meta_file.parent)
    assert meta["config"].pop("split") == "last"
    meta_file.write_text(json.dumps(meta))
    result = ranks.run(1, _evaluate, str(run), {})[0]
    assert result["split"] == "last" and result["test_trajectories"] == 1
    with pytest.raises(CheckpointError, match="--split is pdebench, the run was trained with last"):
        resume_point(_config(data, run, split="pdebench", resume=True))


def test_a_split_without_test_trajectories_fails_with_one_line(capsys, tmp_path):
    small = tmp_path / "nine.hdf5"
    write_pdebench3d(small, {k: np.ones((9, FRAMES, *GRID)) for k in FIELDS})
    argv = ["train", "--data", str(small), "--out", str(tmp_path / "run"), "--split", "pdebench", *TINY]
    _fails_naming(capsys, argv, "--split pdebench")
