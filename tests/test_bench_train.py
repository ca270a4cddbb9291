"""drift bench train at a tiny size: both methods train on two ranks to the same losses; benchmarks/accuracy.py
at a tiny size."""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from runs import png_size

from drift.bench.cli import main
from drift.data import generate
from drift.train import build_model, config_from


def test_bench_train_compares_methods(tmp_path, capsys):
    data = tmp_path / "cfd.hdf5"
    generate(data, samples=3, resolution=8, frames=7, seed=2, progress=False)
    tiny = ["--t-in", "2", "--t-out", "4", "--width", "4", "--modes", "2", "2", "2", "2", "--layers", "2"]
    argv = ["train", "--data", str(data), "--nproc", "2", "--epochs", "2", "--out", str(tmp_path / "out"), *tiny]
    assert main([*argv, "--model", "plain"]) == 0
    printed = capsys.readouterr().out
    assert "vs drift" in printed and "plain FNO" in printed
    report = json.loads((tmp_path / "out" / "train.json").read_text())
    assert report["config"]["model"] == "plain"
    runs = {r["method"]: r for r in report["runs"]}
    assert set(runs) == {"drift", "dfno"} and report["command"] == "train"
    for run in runs.values():
        history = run["history"]
        assert [r["epoch"] for r in history] == [1, 2] and run["ranks"] == 2
        assert run["median_epoch_s"] == statistics.median(r["seconds"] for r in history)
        # The largest relative difference of an epoch's loss from drift's, as the runs recorded them.
        pairs = zip(history, runs["drift"]["history"], strict=True)
        diffs = [abs(r["train_loss"] / d["train_loss"] - 1) for r, d in pairs]
        assert run["max_loss_rel_diff_vs_drift"] == max(diffs) and max(diffs) < 1e-5
        assert history[-1]["train_loss"] < history[0]["train_loss"]
    assert runs["drift"]["max_loss_rel_diff_vs_drift"] == 0
    # A PNG image of the figure drift.bench.training draws: 13 x 3.5 inches at 120 dpi.
    assert png_size(tmp_path / "out" / "train.png") == (1560, 420)


def test_accuracy_benchmark_trains_drift_and_neuraloperator_on_one_problem(tmp_path):
    """benchmarks/accuracy.py at a tiny size: drift train on two ranks, then neuraloperator's default FNO
    with as many parameters (the same kept modes and width) on the same epochs."""
    pytest.importorskip("neuralop", reason="neuraloperator is not installed")
    data = tmp_path / "cfd.hdf5"
    generate(data, samples=4, resolution=8, frames=7, seed=2, progress=False)
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "accuracy.py"
    tiny = ["--t-in", "2", "--t-out", "4", "--width", "4", "--modes", "2", "--layers", "1", "--epochs", "2"]
    argv = [sys.executable, str(script), "--nproc", "2", "--out", str(tmp_path / "out"), "--data", str(data)]
    done = subprocess.run([*argv, *tiny, "--no-progress"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "| neuraloperator 2.0 `FNO`, defaults" in done.stdout and "loss frame-weighted" in done.stdout
    report = json.loads((tmp_path / "out" / "accuracy.json").read_text())
    drift, theirs = report["drift"], report["neuraloperator"]
    model = build_model(config_from(drift["config"]), "cpu")
    assert theirs["parameters"] == sum(p.numel() * (2 if p.is_complex() else 1) for p in model.parameters())
    for run in (drift, theirs):
        history = run["history"]
        assert [r["epoch"] for r in history] == [1, 2]
        assert math.isfinite(run["test_rel_l2"]) and math.isfinite(run["nrmse"])
        # Both learn: the second epoch's loss is below the first's, and the final model is the last epoch's.
        assert history[1]["train_loss"] < history[0]["train_loss"]
        assert run["test_rel_l2"] == pytest.approx(history[-1]["test_rel_l2"], rel=1e-5)
        # The wall-clock spans the epochs, and the epoch time is their median.
        assert run["wall_s"] >= sum(r["seconds"] for r in history)
        assert run["s_per_epoch"] == sorted(r["seconds"] for r in history)[1]
