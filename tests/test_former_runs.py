"""A run and an export written by commit bab9d58 (tests/fixtures/bab9d58, written by its make.py) work
with today's drift: the run resumes and evaluates, the export loads and predicts what it predicted then
(to float32 round-off: that prediction was computed on another machine)."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from reference import TOL, rel_err
from runs import metric_rows, tiny_data, train_argv

import drift
from drift.cli import main

FIXTURE = Path(__file__).parent / "fixtures" / "bab9d58"

pytestmark = pytest.mark.other_host


def test_a_former_run_resumes_and_evaluates(capsys, tmp_path):
    data, run = tiny_data(tmp_path / "cfd.hdf5"), tmp_path / "run"
    shutil.copytree(FIXTURE / "run", run)
    former = metric_rows(run)
    assert main(["evaluate", str(run), "--data", data, "--json", str(tmp_path / "eval.json")]) == 0
    evaluated = json.loads((tmp_path / "eval.json").read_text())
    # Today's evaluation of its last checkpoint is the error the run recorded (the data regenerated here).
    assert evaluated["epoch"] == 2 and abs(evaluated["test_rel_l2"] - former[1]["test_rel_l2"]) <= 1e-5
    assert main(train_argv(data, run, "--epochs", "3", "--nproc", "2", "--resume")) == 0
    rows = metric_rows(run)
    assert [r["epoch"] for r in rows] == [1, 2, 3] and rows[:2] == former  # its rows kept as written
    assert rows[2]["train_loss"] < rows[0]["train_loss"]
    capsys.readouterr()


def test_a_former_export_loads_and_predicts_as_it_did(tmp_path):
    expected = torch.load(FIXTURE / "expected.pt", weights_only=True)
    model = drift.load_exported(FIXTURE / "model.pt")
    with torch.no_grad():
        assert rel_err(model(expected["frames"]), expected["predicted"]) <= TOL[torch.float32]
    assert main(["export", str(FIXTURE / "run"), str(tmp_path / "again.pt")]) == 0
    with torch.no_grad():
        again = drift.load_exported(tmp_path / "again.pt")(expected["frames"])
    assert rel_err(again, expected["predicted"]) <= TOL[torch.float32]
