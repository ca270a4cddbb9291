"""drift predict on every layout: the output is a file of the source's layout (detected as it, read back by
``DataFiles``, The Well's by its own ``WellDataset``) whose input frames are the source's bit for bit and
whose predicted frames are the exported model's (an independent single-process computation), written on
4 ranks (slab, pencil, data x spatial) as on 1; 1-D, 2-D and 3-D data, static and time-dependent, each
recipe."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from runs import DEVICE, ROUND_OFF, fails_with_one_line

from drift.cli import main
from drift.data import DataFiles, write_synthetic
from drift.data.formats import detect
from drift.data.mat import MatFile
from drift.export import load_exported
from drift.predict import ATTRIBUTE

TINY = ["--width", "4", "--layers", "2", "--epochs", "1", "--batch-size", "2", "--lr", "0.01", "--no-progress"]
TINY += ["--no-plots", "--device", DEVICE]

# (name, layout, dims, resolution, drift train's options, drift predict's on 4 ranks, on both)
CASES = [
    ("cfd-1d-one-shot", "cfd", 1, 16, ["--t-in", "2", "--t-out", "3", "--modes", "4,2"], ["--grid", "4"], []),
    (
        "scalar-2d-autoregressive",
        "scalar",
        2,
        12,
        ["--recipe", "autoregressive", "--t-in", "2", "--t-out", "3", "--modes", "2"],
        ["--grid", "2x2"],
        [],
    ),
    (
        "darcy-2d-static",
        "darcy",
        2,
        12,
        ["--modes", "2"],
        ["--data-parallel", "2", "--grid", "2x1", "--batch-size", "2"],
        ["--trajectories", "3,0,2"],
    ),
    (
        "groups-2d-one-shot",
        "groups",
        2,
        12,
        ["--t-in", "2", "--t-out", "3", "--modes", "2"],
        ["--grid", "2x2"],
        ["--resolution", "6"],
    ),
    ("well-3d-one-shot", "well", 3, 8, ["--t-in", "2", "--t-out", "2", "--modes", "2"], ["--grid", "2x2x1"], []),
    ("pt-2d-static", "pt", 2, 12, ["--modes", "2"], ["--grid", "4x1"], []),
    (
        "mat-2d-autoregressive",
        "mat",
        2,
        12,
        ["--recipe", "autoregressive", "--t-in", "2", "--t-out", "3", "--modes", "2"],
        ["--grid", "2x2"],
        ["--trajectories", "3,1"],
    ),
]
SUFFIX = dict(pt="pt", mat="mat")  # the rest: h5


def _read(files: DataFiles, channels, trajectories, frames: slice, stride: int) -> np.ndarray:
    """``channels``' ``frames`` of ``trajectories`` at every ``stride``-th point, ``(trajectories, channels,
    frames, *grid)``, as float64 (each stored value exactly)."""
    space = tuple(slice(0, n, stride) for n in files.grid)
    shape = (len(range(files.frames)[frames]), *(len(range(n)[s]) for n, s in zip(files.grid, space, strict=True)))
    out = np.empty((len(trajectories), len(channels), *shape))
    for j, t in enumerate(trajectories):
        for k, key in enumerate(channels):
            files.read(key, t, (frames, *space), out[j, k])
    return out


def _close(got: np.ndarray, want: np.ndarray, rtol: float) -> None:
    """Equal to float32 round-off: each channel to ``rtol`` of its largest magnitude."""
    assert got.shape == want.shape
    for k in range(want.shape[1]):
        scale = float(np.abs(want[:, k]).max())
        np.testing.assert_allclose(got[:, k], want[:, k], rtol=0, atol=rtol * scale, err_msg=f"channel {k}")


def _well_fields(path: Path, frames: int) -> np.ndarray:
    """The time-varying fields of the one Well file in ``path``'s folder as The Well's ``WellDataset`` reads
    them: ``(trajectories, frames, *grid, channels)``."""
    WellDataset = pytest.importorskip("the_well.data").WellDataset

    well = WellDataset(
        path=str(path.parent), n_steps_input=1, n_steps_output=frames - 1, boundary_return_type=None, return_grid=False
    )
    items = [well[i] for i in range(len(well))]
    return np.stack([torch.cat([s["input_fields"], s["output_fields"]]).numpy() for s in items])


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_predict_writes_the_source_layout_on_four_ranks_as_on_one(case, tmp_path, capsys):
    name, layout, dims, resolution, train_options, four, both = case
    suffix = SUFFIX.get(layout, "h5")
    data = str(write_synthetic(tmp_path / f"source.{suffix}", layout, samples=4, resolution=resolution, dims=dims))
    run = tmp_path / "run"
    assert main(["train", "--data", data, "--out", str(run), *TINY, *train_options]) == 0, capsys.readouterr().err
    outputs = {}
    for ranks, extra in ((1, []), (4, ["--nproc", "4", *four])):
        (tmp_path / f"p{ranks}").mkdir()
        outputs[ranks] = tmp_path / f"p{ranks}" / f"predicted.{suffix}"
        argv = ["predict", str(run), "--data", data, "--out", str(outputs[ranks]), "--no-progress", *both, *extra]
        assert main([*argv, "--device", DEVICE]) == 0, capsys.readouterr().err
    assert main(["export", str(run), str(tmp_path / "model.pt")]) == 0
    predictor = load_exported(tmp_path / "model.pt")

    source = DataFiles(data)
    picked = [int(t) for t in both[1].split(",")] if "--trajectories" in both else list(range(source.trajectories))
    stride = resolution // int(both[1]) if "--resolution" in both else 1
    given = slice(0, 1 if source.static else predictor.t_in)
    predicted = slice(0, 1) if source.static else slice(predictor.t_in, predictor.t_in + predictor.t_out)
    inputs = _read(source, predictor.inputs, picked, given, stride)
    with torch.no_grad():
        want = predictor(torch.from_numpy(inputs)).numpy()
    written = {}
    for ranks, out in outputs.items():
        assert detect(out) == source.format, ranks
        files = DataFiles(out)
        assert (files.fields, files.inputs, files.trajectories) == (source.fields, source.inputs, len(picked))
        assert files.grid == tuple(n // stride for n in source.grid)
        assert files.layout.dtype == source.layout.dtype
        assert np.array_equal(_read(files, predictor.inputs, range(len(picked)), given, 1), inputs)  # bit for bit
        written[ranks] = _read(files, predictor.fields, range(len(picked)), predicted, 1)
    _close(written[1], want, ROUND_OFF)
    _close(written[4], written[1], ROUND_OFF)  # another rank count sums in another order
    _check_layout(layout, Path(data), outputs[4], written[4], predictor.t_in, picked, stride)
    assert sorted(p.name for p in outputs[4].parent.iterdir()) == [outputs[4].name]  # no partial files
    if layout == "pt":  # refused in one line before any rank starts, nothing written
        other = str(write_synthetic(tmp_path / "darcy.h5", "darcy", samples=2, resolution=12))
        refused = tmp_path / "refused.pt"
        cases = [(["--data", other], "the model was trained on 2-D data of x -> y"), (["--grid", "2x1x1"], "--grid")]
        for args, names in cases:
            argv = ["predict", str(run), "--data", data, "--out", str(refused), "--nproc", "2", "--no-progress", *args]
            fails_with_one_line(capsys, argv, names)
            assert not refused.exists()


def _check_layout(layout: str, source: Path, out: Path, predicted: np.ndarray, t_in: int, picked, stride: int) -> None:
    """What each layout keeps besides the frames: coordinates, times, attributes, the record."""
    if layout == "mat":
        _check_mat(source, out, predicted, t_in, picked)
        return
    if layout == "pt":
        saved, given = torch.load(out, weights_only=True), torch.load(source, weights_only=True)
        assert saved["x"].dtype == given["x"].dtype and saved["x"].shape == given["x"].shape
        assert json.loads(saved[ATTRIBUTE])["trajectories"] == picked
        return
    frames = t_in + predicted.shape[2] if layout not in ("darcy",) else 1
    with h5py.File(source, "r") as src, h5py.File(out, "r") as f:
        assert json.loads(f.attrs[ATTRIBUTE])["trajectories"] == picked
        if layout in ("cfd", "scalar", "darcy"):
            for key in (k for k in ("x-coordinate", "y-coordinate", "z-coordinate") if k in src):
                assert np.array_equal(f[key][:], src[key][::stride])
            if layout != "darcy":
                assert np.array_equal(f["t-coordinate"][:], src["t-coordinate"][: frames + 1])
        elif layout == "groups":
            assert sorted(f.keys()) == [f"{i:04d}" for i in range(len(picked))]
            assert np.array_equal(f["0001/grid/x"][:], src["0001/grid/x"][::stride])
            assert np.array_equal(f["0001/grid/t"][:], src["0001/grid/t"][:frames])
        else:
            assert f.attrs["n_trajectories"] == len(picked) and f.attrs["dataset_name"] == src.attrs["dataset_name"]
            assert np.array_equal(f["dimensions/time"][:], src["dimensions/time"][:frames])
    if layout == "well":
        # The Well's own reader: its flattened channels (tracer, velocity_x, ...) are drift's, in order.
        theirs = np.moveaxis(_well_fields(out, frames), -1, 1)
        np.testing.assert_array_equal(theirs[:, :, t_in:], predicted.astype(theirs.dtype))


def _check_mat(source: Path, out: Path, predicted: np.ndarray, t_in: int, picked) -> None:
    """A MATLAB v7.3 file (its header as scipy reads it), read with h5py alone (``u`` stored reversed, with its
    ``MATLAB_class``) and with ``MatFile``: the source's input frames bit for bit, then the predicted ones."""
    from scipy.io.matlab import matfile_version

    assert matfile_version(str(out)) == (2, 0)
    frames = t_in + predicted.shape[2]
    with h5py.File(source, "r") as src, h5py.File(out, "r") as f:
        assert f.userblock_size == 512 and f["u"].attrs["MATLAB_class"] == src["u"].attrs["MATLAB_class"]
        assert json.loads(f.attrs[ATTRIBUTE])["trajectories"] == picked
        written = f["u"][()].transpose()  # MATLAB's count x X x Y x frames
        given = src["u"][()].transpose()[picked]
        assert np.array_equal(f["t"][()], src["t"][:frames]) and f["t"].attrs["MATLAB_class"] == b"double"
    assert written.dtype == given.dtype and written.shape == (len(picked), *given.shape[1:-1], frames)
    assert np.array_equal(written[..., :t_in], given[..., :t_in])  # bit for bit
    assert np.array_equal(np.moveaxis(written[..., t_in:], -1, 1), predicted[:, 0].astype(written.dtype))
    with MatFile(out) as mat:
        assert mat.keys() == ["t", "u"] and np.array_equal(mat.read("u"), written)
