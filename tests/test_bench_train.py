"""drift bench train at a tiny size: both methods train on two ranks to the same losses."""

from __future__ import annotations

import json

from drift.bench.cli import main
from drift.data import generate


def test_bench_train_compares_methods(tmp_path, capsys):
    data = tmp_path / "cfd.hdf5"
    generate(data, samples=3, resolution=8, frames=7, seed=2, progress=False)
    tiny = ["--t-in", "2", "--t-out", "4", "--width", "4", "--modes", "2", "2", "2", "2", "--layers", "2"]
    argv = ["train", "--data", str(data), "--nproc", "2", "--epochs", "2", "--out", str(tmp_path / "out"), *tiny]
    assert main(argv) == 0
    assert "vs drift" in capsys.readouterr().out
    report = json.loads((tmp_path / "out" / "train.json").read_text())
    runs = {r["method"]: r for r in report["runs"]}
    assert set(runs) == {"drift", "dfno"} and report["command"] == "train"
    for run in runs.values():
        assert [r["epoch"] for r in run["history"]] == [1, 2] and run["median_epoch_s"] > 0
        assert run["max_loss_rel_diff_vs_drift"] < 1e-5
    assert runs["drift"]["max_loss_rel_diff_vs_drift"] == 0
    assert (tmp_path / "out" / "train.png").stat().st_size > 0
