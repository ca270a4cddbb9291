"""drift predict / export: a prediction written on 4 ranks equals one written on 1, copies the source's input
frames bit for bit and holds the model's outputs (an independent single-process forward); drift's reader
takes it; bad inputs and outputs fail with one line and leave no output; an exported model loads in a
fresh process with weights_only=True, and into neuraloperator, and gives the model's outputs."""

from __future__ import annotations

import errno
import json
import resource
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from runs import DEVICE, TINY, fails_with_one_line, tiny_data, train_config

from drift.checkpoint import latest_checkpoint, load_checkpoint, read_meta
from drift.cli import main
from drift.data import FIELDS, Stats, Trajectories, write_pdebench3d
from drift.predict import ATTRIBUTE, predict
from drift.train import build_model

T_IN, T_OUT = 2, 4  # TINY's


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> str:
    return tiny_data(tmp_path_factory.mktemp("predict") / "cfd.hdf5")


def _trained(data: str, out: Path, *args: str) -> str:
    assert main(["train", "--data", data, "--out", str(out), "--epochs", "1", *TINY, *args]) == 0
    return str(out)


@pytest.fixture(scope="module")
def run(data, tmp_path_factory) -> str:
    """The tiny model (neuraloperator's options), trained for one epoch."""
    return _trained(data, tmp_path_factory.mktemp("run") / "run")


def _stats(run: str) -> Stats:
    meta = read_meta(latest_checkpoint(Path(run) / "checkpoints"))
    return Stats(**{k: tuple(v) for k, v in meta["stats"].items()})


def _reference(run: str, data: str, frames: np.ndarray) -> np.ndarray:
    """The run's model on one process, no ranks: its checkpoint loaded into the tiny FNO, the raw
    ``frames`` ``(batch, fields, t_in, x, y, z)`` normalised with the run's statistics and assembled into
    the model's input here, its output de-normalised: ``(batch, fields, t_out, x, y, z)`` float32."""
    model = build_model(train_config(data, run), "cpu")
    load_checkpoint(latest_checkpoint(Path(run) / "checkpoints"), model)
    stats = _stats(run)
    mean, std = (np.asarray(v, np.float32).reshape(1, -1, 1, 1, 1, 1) for v in (stats.mean, stats.std))
    x = (frames.astype(np.float32) - mean) / std
    b, f, t_in, *space = x.shape
    repeated = np.repeat(x.reshape(b, f * t_in, *space, 1), T_OUT, axis=-1)
    times = np.broadcast_to(np.arange(1, T_OUT + 1, dtype=np.float32) / T_OUT, (b, 1, *space, T_OUT))
    with torch.no_grad():
        y = model(torch.from_numpy(np.concatenate([repeated, times], 1))).numpy()
    return np.moveaxis(y, -1, 2) * std + mean


def _fields(path, frames=slice(None)) -> np.ndarray:
    """Every field of a PDEBench-layout file, ``(trajectories, fields, frames, x, y, z)``, as stored."""
    with h5py.File(path, "r") as f:
        return np.stack([f[key][:, frames] for key in FIELDS], 1)


def _close(a: np.ndarray, b: np.ndarray) -> None:
    """Equal to float32 round-off: each field to 1e-5 of its largest magnitude."""
    assert a.shape == b.shape
    for k in range(a.shape[1]):
        scale = float(np.abs(b[:, k]).max())
        np.testing.assert_allclose(a[:, k], b[:, k], rtol=0, atol=1e-5 * scale, err_msg=FIELDS[k])


def _predict(run: str, data: str, out: str, options: dict) -> dict:
    return predict(run, data, out, device=DEVICE, progress=False, **options)


def test_predicted_on_four_ranks_equals_one_rank_and_the_model(ranks, run, data, tmp_path):
    one, four, picked = (str(tmp_path / f"{name}.hdf5") for name in ("one", "four", "picked"))
    result = ranks.run(1, _predict, run, data, one, {})[0]
    assert result["trajectories"] == 4 and result["resolution"] == [8, 8, 8] and result["epoch"] == 1
    ranks.run(4, _predict, run, data, four, dict(grid=(2, 2, 1)))
    # 2 data-parallel x 2 spatial ranks with dfno, some trajectories reordered, in batches of 2: the last
    # leaves one data-parallel rank without a trajectory.
    options = dict(data_parallel=2, method="dfno", batch_size=2, trajectories=(3, 0, 2))
    ranks.run(4, _predict, run, data, picked, options)
    source = _fields(data)
    written = _fields(one)
    assert written.shape == (4, 5, T_IN + T_OUT, 8, 8, 8) and written.dtype == np.float32
    assert np.array_equal(written[:, :, :T_IN], source[:, :, :T_IN])  # bit for bit
    _close(written[:, :, T_IN:], _reference(run, data, source[:, :, :T_IN]))
    assert np.array_equal(_fields(four)[:, :, :T_IN], source[:, :, :T_IN])
    _close(_fields(four), written)
    assert np.array_equal(_fields(picked)[:, :, :T_IN], source[[3, 0, 2], :, :T_IN])
    _close(_fields(picked), written[[3, 0, 2]])
    with h5py.File(data, "r") as src, h5py.File(one, "r") as f:
        assert np.array_equal(f["t-coordinate"][:], src["t-coordinate"][: T_IN + T_OUT + 1])
        for key in ("x-coordinate", "y-coordinate", "z-coordinate"):
            assert np.array_equal(f[key][:], src[key][:])
        assert all(f.attrs[key] == src.attrs[key] for key in src.attrs)
        record = json.loads(f.attrs[ATTRIBUTE])
        assert record["trajectories"] == [0, 1, 2, 3] and (record["t_in"], record["t_out"]) == (T_IN, T_OUT)
    # drift's reader takes it: the input frames normalised, the targets the predicted frames.
    stats = _stats(run)
    dataset = Trajectories(one, t_in=T_IN, t_out=T_OUT, split="test", stats=stats)
    x, y = dataset[0]
    mean, std = (np.asarray(v, np.float32).reshape(-1, 1, 1, 1, 1) for v in (stats.mean, stats.std))
    assert np.array_equal(x.numpy(), (source[3, :, :T_IN] - mean) / std)  # exact: correctly rounded - and /
    _close((y.numpy() * std + mean)[None], written[3:, :, T_IN:])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["four.hdf5", "one.hdf5", "picked.hdf5"]  # no partial files


def test_several_files_are_numbered_across_them(ranks, run, data, tmp_path):
    """``--data a b``: b's trajectories follow a's, as drift train numbers them; the prediction equals the
    one from the file they were cut from, input frames bit for bit, and records both sources."""
    source = _fields(data)
    parts = [tmp_path / "a.hdf5", tmp_path / "b.hdf5"]
    for path, picked in zip(parts, (slice(0, 1), slice(1, 4)), strict=True):
        write_pdebench3d(path, {key: source[picked, k] for k, key in enumerate(FIELDS)})
    whole, split = str(tmp_path / "whole.hdf5"), str(tmp_path / "split.hdf5")
    options = dict(trajectories=(3, 0, 1), grid=(2, 1, 1))
    ranks.run(2, _predict, run, data, whole, options)
    ranks.run(2, _predict, run, [str(p) for p in parts], split, options)
    assert np.array_equal(_fields(split)[:, :, :T_IN], source[[3, 0, 1], :, :T_IN])
    _close(_fields(split), _fields(whole))
    with h5py.File(split, "r") as f:
        assert json.loads(f.attrs[ATTRIBUTE])["source"] == [str(p.resolve()) for p in parts]


def test_a_coarser_resolution_from_input_frames_only(ranks, run, tmp_path):
    # A source of 16^3 holding only the t_in input frames, float64, read at 8^3 by 2 ranks along y: the
    # t-coordinate goes on at the source's step, the input frames keep their dtype and bits.
    rng = np.random.default_rng(0)
    stats = _stats(run)
    fields = {
        key: mean + std * rng.standard_normal((2, T_IN, 16, 16, 16))
        for key, mean, std in zip(FIELDS, stats.mean, stats.std, strict=True)
    }
    source, out = tmp_path / "fine.hdf5", str(tmp_path / "pred.hdf5")
    write_pdebench3d(source, fields, t_end=0.1)
    with h5py.File(source, "r+") as f:  # float64 fields, as some users' files
        for key in FIELDS:
            del f[key]
            f[key] = fields[key]
    ranks.run(2, _predict, run, str(source), out, dict(resolution=8, grid=(1, 2, 1)))
    raw = np.stack([fields[key] for key in FIELDS], 1)[..., ::2, ::2, ::2]
    written = _fields(out)
    assert written.dtype == np.float64 and written.shape == (2, 5, T_IN + T_OUT, 8, 8, 8)
    assert np.array_equal(written[:, :, :T_IN], raw)
    _close(written[:, :, T_IN:], _reference(run, str(source), raw))
    with h5py.File(out, "r") as f:
        np.testing.assert_allclose(f["t-coordinate"][:], 0.1 * np.arange(T_IN + T_OUT + 1), rtol=1e-6)
        np.testing.assert_array_equal(f["x-coordinate"][:], (np.arange(0, 16, 2) + 0.5) / 16)  # exact: dyadic


def _bad_source(path: Path, frames: int = 3, extent: int = 8, drop: str | None = None, nan: bool = False) -> str:
    """A PDEBench-layout file of 2 trajectories: ``frames`` frames on ``extent``^3 points, without field
    ``drop``, with a NaN in trajectory 1's pressure when ``nan``."""
    arrays = {key: np.ones((2, max(frames, 2), extent, extent, extent), np.float32) for key in FIELDS if key != drop}
    if nan:
        arrays["pressure"][1, 0, 0, 0, 0] = np.nan
    write_pdebench3d(path, arrays)
    with h5py.File(path, "r+") as f:
        for key, values in arrays.items():
            del f[key]
            f[key] = values[:, :frames]
    return str(path)


def test_predict_command_refuses_to_overwrite_and_names_what_does_not_fit(capsys, run, data, tmp_path):
    out = tmp_path / "pred.hdf5"
    argv = ["predict", run, "--data", data, "--out", str(out), "--no-progress"]
    assert main(argv) == 0
    assert "wrote" in capsys.readouterr().out
    first = _fields(out)
    fails_with_one_line(capsys, argv, f"--out {out} exists: pass --force")
    assert main([*argv, "--force", "--trajectories", "1-2"]) == 0
    assert np.array_equal(_fields(out)[:, :, :T_IN], first[1:3, :, :T_IN])
    _close(_fields(out), first[1:3])  # predicted in other batches: to round-off
    cases = [
        (["--data", _bad_source(tmp_path / "vz.hdf5", drop="Vz")], "missing dataset 'Vz'"),
        (["--data", _bad_source(tmp_path / "short.hdf5", frames=1)], "1 frames; the model takes its first t_in = 2"),
        (["--data", _bad_source(tmp_path / "tiny.hdf5", extent=2)], "--data"),  # the modes do not fit 2^3
        (["--data", _bad_source(tmp_path / "nan.hdf5", nan=True)], "non-finite values"),
        (["--data", data, "--resolution", "3"], "--resolution 3"),
        (["--data", data, "--trajectories", "2,9"], "--trajectories 9"),
        (["--data", data, "--trajectories", "1,1"], "--trajectories"),
        (["--data", data, "--grid", "2x1x1"], "--grid 2x1x1"),  # 2 spatial ranks on 1
        (["--data", data, "--out", data, "--force"], "is a --data file"),
        (["--data", data, "--out", str(tmp_path), "--force"], "is a folder"),
    ]
    for args, names in cases:
        target = tmp_path / "refused.hdf5"
        fails_with_one_line(capsys, ["predict", run, "--out", str(target), "--no-progress", *args], names)
        assert not target.exists()
    assert not list(tmp_path.glob("*.partial"))


def _predict_failing_on(rank: int, run: str, data: str, out: str) -> dict:
    """``predict`` where rank ``rank``'s first turn to write finds the disk full."""
    from drift import comm
    from drift.data import writer

    opened = writer.opened

    def full(path, create=False, **options):
        if not create and comm.rank() == rank:
            raise OSError(errno.ENOSPC, "No space left on device")
        return opened(path, create, **options)

    writer.opened = full
    try:
        return _predict(run, data, out, dict(force=True))
    except writer.OutputError as exc:
        return str(exc)
    finally:
        writer.opened = opened


def test_a_write_error_leaves_no_output(ranks, run, data, tmp_path):
    out = tmp_path / "pred.hdf5"
    out.write_text("an older output\n")
    # Rank 1's write fails in its turn: every rank says so, the partial file goes, the older output stays.
    errors = ranks.run(2, _predict_failing_on, 1, run, data, str(out))
    assert errors[0] == errors[1] and errors[0].startswith(f"cannot write {out}: ENOSPC"), errors
    assert "on rank 1" in errors[0]
    # A real limit of the OS (a file size cap: EFBIG) met while creating it: one line, nothing left.
    limit = 64 * 1024

    def capped() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    argv = ["predict", run, "--data", data, "--out", str(out), "--force", "--no-progress"]
    done = subprocess.run(
        [sys.executable, "-m", "drift", *argv], capture_output=True, text=True, timeout=300, preexec_fn=capped
    )
    assert done.returncode == 2 and done.stderr.startswith(f"drift predict: error: cannot write {out}: EFBIG")
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert out.read_text() == "an older output\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pred.hdf5"]


# A fresh process: the exported file, read with weights_only=True, predicts the source's frames.
FRESH = """
import sys, h5py, numpy as np, torch, drift
record = torch.load(sys.argv[1], weights_only=True)
assert record["format"] == "drift-fno" and isinstance(record["fno"]["non_linearity"], str)
predictor = drift.load_exported(sys.argv[1])
with h5py.File(sys.argv[2]) as f:
    frames = np.stack([f[key][:, :predictor.t_in] for key in predictor.fields], 1)
with torch.no_grad():
    np.save(sys.argv[3], predictor(torch.from_numpy(frames)).numpy())
"""


def test_exported_model_predicts_like_the_model_in_a_fresh_process(capsys, run, data, tmp_path):
    path = tmp_path / "model.pt"
    assert main(["export", run, str(path)]) == 0
    fails_with_one_line(capsys, ["export", run, str(path)], f"{path} exists: pass --force")
    assert main(["export", run, str(path), "--force"]) == 0
    done = subprocess.run(
        [sys.executable, "-c", FRESH, str(path), data, str(tmp_path / "out.npy")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    _close(np.load(tmp_path / "out.npy"), _reference(run, data, _fields(data, slice(0, T_IN))))


def test_neuraloperator_export_loads_into_neuraloperator(capsys, run, data, tmp_path):
    from neuralop.models import FNO as NeuralopFNO

    folder = tmp_path / "neuralop"
    assert main(["export", run, str(folder), "--format", "neuralop"]) == 0
    theirs = NeuralopFNO.from_checkpoint(folder, "model").eval()
    sidecar = json.loads((folder / "drift.json").read_text())
    assert sidecar["inputs"]["t_in"] == T_IN and sidecar["stats"] == json.loads(json.dumps(_stats(run).__dict__))
    # The model's input assembled as drift.json says, from the statistics it holds.
    frames = _fields(data, slice(0, T_IN)).astype(np.float32)
    mean, std = (np.asarray(sidecar["stats"][k], np.float32).reshape(1, -1, 1, 1, 1, 1) for k in ("mean", "std"))
    x = (frames - mean) / std
    b, f, t_in, *space = x.shape
    repeated = np.repeat(x.reshape(b, f * t_in, *space, 1), T_OUT, axis=-1)
    times = np.broadcast_to(np.arange(1, T_OUT + 1, dtype=np.float32) / T_OUT, (b, 1, *space, T_OUT))
    with torch.no_grad():
        y = theirs(torch.from_numpy(np.concatenate([repeated, times], 1))).numpy()
    _close(np.moveaxis(y, -1, 2) * std + mean, _reference(run, data, frames))
    # Li et al.'s plain FNO applies the activation once between blocks, neuraloperator's twice: one line.
    plain = _trained(data, tmp_path / "plain", "--model", "plain")
    fails_with_one_line(capsys, ["export", plain, str(tmp_path / "refused"), "--format", "neuralop"], "--model plain")
    assert not (tmp_path / "refused").exists()
