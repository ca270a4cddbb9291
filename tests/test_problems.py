"""Every layout drift reads trains, evaluates and is refused by name from the command line: 1-D, 2-D and
3-D data, static and time-dependent, each recipe, DRIFT and both baselines, on 4 ranks (slab, pencil,
data x spatial) against the same run on 1 rank."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from reference import rel_err
from runs import DEVICE, assert_same_metrics, fails_with_one_line, metric_rows

from drift.cli import main
from drift.data import write_synthetic

TINY = ["--width", "6", "--layers", "2", "--epochs", "2", "--batch-size", "2", "--lr", "0.01", "--no-progress"]
TINY += ["--device", DEVICE]

# (name, layout, dims, resolution, drift train's options, the 4-rank layout)
CASES = [
    ("cfd-1d-one-shot", "cfd", 1, 24, ["--t-in", "2", "--t-out", "3", "--modes", "4,2"], ["--grid", "4"]),
    (
        "cfd-2d-autoregressive",
        "cfd",
        2,
        12,
        ["--recipe", "autoregressive", "--t-in", "2", "--t-out", "4", "--pushforward", "2", "--target", "increment"]
        + ["--loss", "nrmse"],
        ["--grid", "2x2"],
    ),
    ("scalar-1d-autoregressive", "scalar", 1, 20, ["--recipe", "autoregressive", "--t-in", "3", "--t-out", "3"], []),
    (
        "darcy-2d-static",
        "darcy",
        2,
        12,
        ["--method", "dfno", "--loss", "relative-l2"],
        ["--data-parallel", "2", "--grid", "2x1"],
    ),
    ("groups-2d-one-shot", "groups", 2, 12, ["--t-in", "2", "--t-out", "3"], ["--grid", "1x4"]),
    ("well-3d-one-shot", "well", 3, 8, ["--t-in", "2", "--t-out", "2", "--modes", "2"], ["--grid", "2x2x1"]),
    ("pt-2d-static", "pt", 2, 12, ["--method", "dfno-pruned", "--loss", "relative-l2"], []),
]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("problems")
    made = {}
    for name, layout, dims, resolution, *_ in CASES:
        suffix = "pt" if layout == "pt" else "h5"
        made[name] = write_synthetic(
            folder / f"{name}.{suffix}", layout, samples=10, resolution=resolution, frames=6, dims=dims, seed=3
        )
    return made


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_each_layout_trains_on_four_ranks_as_on_one_and_evaluates(case, files, tmp_path, capsys):
    name, _, _, _, options, layout = case
    data = str(files[name])
    runs = {}
    for ranks, extra in ((1, []), (4, layout)):
        out = tmp_path / f"p{ranks}"
        argv = ["train", "--data", data, "--out", str(out), "--nproc", str(ranks), *TINY, *options, *extra]
        assert main(argv) == 0, capsys.readouterr().err
        runs[ranks] = out
    printed = capsys.readouterr().out
    assert "drift train: " in printed and "recipe " in printed  # what the data hold, said at the start
    # Another rank count sums in another order, which training amplifies: 1e-5 (tests/runs.py).
    assert_same_metrics(metric_rows(runs[4]), metric_rows(runs[1]), rtol=1e-5)
    final = json.loads((runs[4] / "test_metrics.json").read_text())
    frames = 1 if "static" in name else int(options[options.index("--t-out") + 1])
    assert len(final["pdebench"]["per_frame"]["nrmse"]) == frames
    assert (runs[4] / "slice.png").is_file() and (runs[4] / "rollout.png").is_file()
    # drift evaluate of the 4-rank run on 1 rank: its test metrics, as its 4 ranks measured them.
    report = tmp_path / "evaluation.json"
    assert main(["evaluate", str(runs[4]), "--json", str(report), "--device", DEVICE]) == 0
    evaluated = json.loads(report.read_text())
    assert abs(evaluated["test_rel_l2"] - final["test_rel_l2"]) <= 1e-5 * final["test_rel_l2"]
    for key in ("nrmse", "rmse", "max_error"):
        assert abs(evaluated["pdebench"][key] - final["pdebench"][key]) <= 1e-5 * final["pdebench"][key]


def test_bad_input_is_one_line_before_any_rank(files, tmp_path, capsys):
    cfd, darcy, scalar = (
        str(files[n]) for n in ("cfd-2d-autoregressive", "darcy-2d-static", "scalar-1d-autoregressive")
    )
    unknown = tmp_path / "unknown.h5"
    write_synthetic(unknown, "cfd", samples=2, resolution=8, frames=3, dims=2)
    import h5py

    with h5py.File(unknown, "a") as f:
        del f["density"]
    out = tmp_path / "run"
    cases = [
        (["--data", str(unknown)], str(unknown)),
        (["--data", cfd, darcy], "differ"),
        (["--data", cfd, "--t-in", "5", "--t-out", "4"], "--t-in + --t-out"),
        (["--data", darcy, "--recipe", "autoregressive"], "--recipe autoregressive"),
        (["--data", darcy, "--pushforward", "2"], "--pushforward"),
        (["--data", cfd, "--grid", "2x1x1", "--nproc", "2"], "--grid 2x1x1"),
        (["--data", scalar, "--modes", "4,4,4"], "--modes 4,4,4"),
        (["--data", cfd, "--recipe", "static"], "--recipe static"),
        (["--data", darcy, "--t-out", "3"], "--t-out applies to time-dependent data"),
    ]
    for args, named in cases:
        fails_with_one_line(capsys, ["train", "--out", str(out), *TINY, *args], named)
        assert not out.exists(), args  # nothing written to the run folder


def test_open_boundaries_pad_the_model_by_default(files, tmp_path, capsys):
    """The Well's non-periodic dims: the model's spectral convolutions zero-pad along them (0.125), the
    run records it, and --domain-padding overrides it."""
    import shutil

    import h5py

    path = tmp_path / "walls.h5"
    shutil.copy(files["well-3d-one-shot"], path)
    with h5py.File(path, "a") as f:
        f["boundary_conditions/y_periodic"].attrs["bc_type"] = "WALL"
    options = ["--data", str(path), *TINY, "--epochs", "1", "--t-in", "2", "--t-out", "2", "--modes", "2"]
    for extra, padding in (([], [0.0, 0.125, 0.0, 0.0]), (["--domain-padding", "0.25"], [0.25] * 4)):
        out = tmp_path / f"run{len(extra)}"
        assert main(["train", "--out", str(out), *options, "--no-plots", *extra]) == 0, capsys.readouterr().err
        meta = json.loads(next((out / "checkpoints").glob("epoch-0001/meta.json")).read_text())
        assert meta["config"]["domain_padding"] == padding


def test_an_autoregressive_run_resumes_as_it_would_have_gone_on(files, tmp_path, capsys):
    data = str(files["cfd-2d-autoregressive"])
    options = ["--data", data, *TINY, "--recipe", "autoregressive", "--t-in", "2", "--t-out", "3", "--no-plots"]
    options += ["--pushforward", "2", "--noise", "0.01", "--schedule", "constant"]
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    assert main(["train", "--out", str(whole), *options, "--epochs", "3"]) == 0
    assert main(["train", "--out", str(parts), *options, "--epochs", "2"]) == 0
    # Resumed without the options that the run resolved for its data: the checkpoint's are used.
    resumed = [a for a in options if a not in ("--recipe", "autoregressive")]
    assert main(["train", "--out", str(parts), *resumed, "--epochs", "3", "--resume"]) == 0, capsys.readouterr().err
    assert metric_rows(parts) == metric_rows(whole)  # one process computes both: the same bits


def test_drift_generate_layout_writes_each_layout(tmp_path, capsys):
    from drift.data import detect

    layouts = (("darcy", "PDEBench Darcy", ".h5"), ("groups", "PDEBench per-sample groups", ".h5"))
    for layout, name, suffix in (*layouts, ("mat", "Li et al. .mat (FNO)", ".mat")):
        out = tmp_path / f"{layout}{suffix}"
        assert main(["generate", "--layout", layout, "--samples", "3", "--resolution", "8", "--out", str(out)]) == 0
        assert detect(out).name == name and f"wrote {out}" in capsys.readouterr().out


def test_recompute_blocks_trains_as_the_stored_path(files, tmp_path, capsys):
    """--recompute blocks: the same gradients, so the same losses (one process computes both: bit for bit)."""
    options = ["--data", str(files["groups-2d-one-shot"]), *TINY, "--t-in", "2", "--t-out", "3", "--no-plots"]
    rows = []
    for extra in ([], ["--recompute", "blocks"]):
        out = tmp_path / f"run{len(extra)}"
        assert main(["train", "--out", str(out), *options, *extra]) == 0, capsys.readouterr().err
        rows.append(metric_rows(out))
    assert rows[0] == rows[1]
    from drift.train import build_model, config_from

    recorded = json.loads((out / "checkpoints" / "epoch-0002" / "meta.json").read_text())["config"]
    assert recorded["recompute"] == "blocks" and build_model(config_from(recorded), "cpu").recompute


def test_recompute_mlp_trains_as_the_stored_path_but_for_rounding(files, tmp_path, capsys):
    """--recompute mlp: neuraloperator's blocks run their channel-MLP tails as one node, whose gradients
    equal the stored path's but for rounding: the losses agree to float32's, the checkpoint records it."""
    options = ["--data", str(files["groups-2d-one-shot"]), *TINY, "--t-in", "2", "--t-out", "3", "--no-plots"]
    losses = []
    for extra in ([], ["--recompute", "mlp"]):
        out = tmp_path / f"mlp{len(extra)}"
        assert main(["train", "--out", str(out), *options, *extra]) == 0, capsys.readouterr().err
        losses.append(torch.tensor([row["train_loss"] for row in metric_rows(out)], dtype=torch.float64))
    assert rel_err(losses[1], losses[0]) <= 2e-6
    from drift.train import build_model, config_from

    recorded = json.loads((out / "checkpoints" / "epoch-0002" / "meta.json").read_text())["config"]
    model = build_model(config_from(recorded), "cpu")
    assert recorded["recompute"] == "mlp" and model.recompute_mlp and not model.recompute
