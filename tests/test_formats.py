"""The data layouts drift reads (``drift.data.formats``) and ``DataFiles`` over them: each layout read into a
buffer (whole, strided, a sub-block) equals an independent reader's arrays (PDEBench's FNO loaders
re-implemented here, The Well's own ``WellDataset``, ``torch.load`` without mmap); ``detect`` names each
file's layout and refuses what it cannot read in one line; ``write_synthetic`` writes each layout with its
advertised map."""

from __future__ import annotations

import pickle

import h5py
import numpy as np
import pytest
import torch

from drift.data.files import DataFiles, PDEBenchFiles
from drift.data.formats import (
    CFD,
    FORMATS,
    LiMat,
    PDEBenchDarcy,
    PDEBenchGroups,
    PDEBenchScalar,
    TensorDictionary,
    TheWell,
    detect,
)
from drift.data.formats.output import Block, Prediction
from drift.data.pdebench import DataError
from drift.data.synthetic import LAYOUTS, advance, smooth, write_synthetic

SUFFIX = dict(groups=".h5", pt=".pt", mat=".mat")  # the rest: .hdf5
EXPECTED = dict(
    scalar=PDEBenchScalar(),
    darcy=PDEBenchDarcy(),
    groups=PDEBenchGroups(),
    well=TheWell(),
    pt=TensorDictionary(),
    mat=LiMat(),
)


def _synthetic(tmp_path, layout, name=None, **kwargs):
    return write_synthetic(tmp_path / f"{name or layout}{SUFFIX.get(layout, '.hdf5')}", layout, **kwargs)


def _read(files, channel, trajectory, selection, dtype=np.float32):
    """One channel's block through ``DataFiles.read`` into a new buffer."""
    shape = tuple(len(range(n)[s]) for n, s in zip((files.frames, *files.grid), selection, strict=True))
    out = np.full(shape, np.nan, dtype=dtype)
    files.read(channel, trajectory, selection, out)
    return out


def _selections(frames, grid):
    """Whole, strided (downsampled) and a sub-block."""
    return [
        (slice(None),) * (1 + len(grid)),
        (slice(None, None, 2), *(slice(None, None, 2 + i % 2) for i in range(len(grid)))),
        (
            slice(frames - 1, frames) if frames > 1 else slice(0, 1),
            *(slice(1, n - 1, 1 + i) for i, n in enumerate(grid)),
        ),
    ]


# --- PDEBench's FNODatasetSingle / FNODatasetMult, re-implemented: the arrays they build from a file. ---


def _fno_single(path, r=1, rt=1):
    """``FNODatasetSingle``'s ``data`` (its reduced_resolution r, reduced_resolution_t rt): CFD fields stacked
    as ``[batch, x.., t, field]`` (density, pressure, Vx, Vy, Vz), a 1-D ``tensor`` as ``[batch, x, t, 1]``,
    Darcy as ``[batch, x, y, 2, 1]`` (nu, then the solution, on the time axis). Its arrays are sized
    ``n // r`` and filled with ``[::r]``: the same only where r divides n, so the shapes here are the reads'."""
    with h5py.File(path, "r") as f:
        if "tensor" not in f:
            d = f["density"].ndim - 2
            names = ["density", "pressure", "Vx", "Vy", "Vz"][: 2 + d]
            parts = []
            for name in names:
                a = np.array(f[name], dtype=np.float32)[
                    (slice(None), slice(None, None, rt), *[slice(None, None, r)] * d)
                ]
                parts.append(np.transpose(a, (0, *range(2, 2 + d), 1)))
            return np.stack(parts, axis=-1)
        a = np.array(f["tensor"], dtype=np.float32)
        if a.ndim == 3:
            a = a[:, ::rt, ::r]
            return np.transpose(a, (0, 2, 1))[..., None]
        u = np.transpose(a[:, :, ::r, ::r], (0, 2, 3, 1))
        nu = np.transpose(np.array(f["nu"], dtype=np.float32)[:, None, ::r, ::r], (0, 2, 3, 1))
        return np.concatenate([nu, u], axis=-1)[..., None]


def _fno_mult(path):
    """``FNODatasetMult``'s items: per group in sorted order, ``data`` permuted to ``[x.., t, channel]``."""
    with h5py.File(path, "r") as f:
        items = []
        for name in sorted(f.keys()):
            data = np.array(f[name]["data"], dtype="f")
            items.append(np.transpose(data, (*range(1, data.ndim - 1), 0, data.ndim - 1)))
        return np.stack(items)


def _time_last(block):
    """A drift read ``(frames, x..)`` as PDEBench orders it: ``(x.., frames)``."""
    return np.moveaxis(block, 0, -1)


CASES = [("cfd", 1, (13,)), ("cfd", 2, (7, 11)), ("cfd", 3, (5, 7, 3)), ("scalar", 1, (11,))]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize(("layout", "dims", "grid"), CASES)
def test_pdebench_time_dependent_layouts_read_as_fnodatasetsingle(tmp_path, layout, dims, grid, dtype):
    path = _synthetic(tmp_path, layout, dims=dims, resolution=grid, frames=5, samples=3, dtype=dtype)
    files = DataFiles(path)
    assert files.format == (CFD[dims] if layout == "cfd" else PDEBenchScalar()) and files.layout.dtype == dtype
    assert files.grid == grid and files.dims == dims and files.frames == 5 and not files.static
    for r, rt in ((1, 1), (2, 2)):
        reference = _fno_single(path, r, rt)
        selection = (slice(None, None, rt), *[slice(None, None, r)] * dims)
        for t in range(3):
            for c, channel in enumerate(files.fields):
                got = _read(files, channel, t, selection, np.float32)
                np.testing.assert_array_equal(_time_last(got), reference[t, ..., c])
    full = _fno_single(path)
    for selection in _selections(5, grid):
        got = _read(files, files.fields[-1], 2, selection, np.float64)
        want = full[2, ..., -1][(*selection[1:], selection[0])]
        np.testing.assert_array_equal(_time_last(got).astype(np.float32), want)  # PDEBench reads float32
        if dtype == "float64":
            with h5py.File(path) as f:
                np.testing.assert_array_equal(
                    got, f[files.fields[-1] if layout == "cfd" else "tensor"][(2, *selection)][()]
                )


def test_darcy_reads_as_fnodatasetsingle(tmp_path):
    path = _synthetic(tmp_path, "darcy", dims=2, resolution=(11, 7), samples=3)
    files = DataFiles(path)
    assert files.static and files.inputs == ("nu",) and files.fields == ("u",) and files.frames == 1
    assert files.describe() == "PDEBench Darcy, 2-D: nu -> u; 3 x 11 x 7"
    for r in (1, 2):
        reference = _fno_single(path, r)
        for t in range(3):
            for c, channel in enumerate(("nu", "u")):
                got = _read(files, channel, t, (slice(0, 1), slice(None, None, r), slice(None, None, r)))
                np.testing.assert_array_equal(got[0], reference[t, :, :, c, 0])
    block = _read(files, "nu", 1, (slice(0, 1), slice(2, 9), slice(3, 6)))
    np.testing.assert_array_equal(block[0], _fno_single(path)[1, 2:9, 3:6, 0, 0])
    with pytest.raises(DataError, match=r"darcy.hdf5: cannot read 'nu' \(a static channel has one frame"):
        files.read("nu", 0, (slice(0, 2), slice(None), slice(None)), np.empty((2, 11, 7), np.float32))


@pytest.mark.parametrize(("dims", "grid"), [(1, (13,)), (2, (7, 5))])
def test_per_sample_groups_read_as_fnodatasetmult(tmp_path, dims, grid):
    path = _synthetic(tmp_path, "groups", dims=dims, resolution=grid, frames=4, samples=3)
    files = DataFiles(path)
    assert files.format == PDEBenchGroups() and files.fields == ("c0", "c1") and files.trajectories == 3
    reference = _fno_mult(path)
    for selection in _selections(4, grid):
        for t in range(3):
            for c, channel in enumerate(files.fields):
                got = _read(files, channel, t, selection)
                np.testing.assert_array_equal(_time_last(got), reference[t, ..., c][(*selection[1:], selection[0])])


# --- The Well: its own reader is the reference. ---


def _well_reference(folder, frames):
    """Per trajectory of the one file in ``folder``: The Well's ``WellDataset`` time-varying fields ``(frames,
    x.., channels)`` and constant fields ``(x.., channels)``, as it flattens them."""
    WellDataset = pytest.importorskip("the_well.data").WellDataset

    well = WellDataset(
        path=str(folder), n_steps_input=1, n_steps_output=frames - 1, boundary_return_type=None, return_grid=False
    )
    items = [well[i] for i in range(len(well))]
    fields = [torch.cat([s["input_fields"], s["output_fields"]]).numpy() for s in items]
    constant = [s["constant_fields"].numpy() if "constant_fields" in s else None for s in items]
    return fields, constant


def test_the_well_reads_as_its_own_reader_on_its_dummy_file(tmp_path):
    write_dummy_data = pytest.importorskip("the_well.utils.dummy_data").write_dummy_data

    folder = tmp_path / "well"
    folder.mkdir()
    write_dummy_data(str(folder / "dummy.hdf5"))
    files = DataFiles(folder)
    assert files.format == TheWell() and files.grid == (32, 32) and files.frames == 10
    assert files.fields == ("field_x", "field_y", "constant_field") and files.layout.constant == ("constant_field",)
    assert files.periodic == (True, True)  # its boundary_conditions: x_periodic, y_periodic
    fields, constant = _well_reference(folder, 10)
    for t in range(2):
        for c, channel in enumerate(("field_x", "field_y")):
            for selection in _selections(10, (32, 32)):
                got = _read(files, channel, t, selection)
                np.testing.assert_array_equal(got, fields[t][..., c][selection])
        got = _read(files, "constant_field", t, (slice(2, 5), slice(None), slice(None, None, 3)))
        np.testing.assert_array_equal(got, np.broadcast_to(constant[t][..., 0][:, ::3], (3, 32, 11)))


@pytest.mark.parametrize(("dims", "grid"), [(2, (11, 7)), (3, (5, 3, 7))])
def test_the_well_synthetic_files_read_as_its_own_reader(tmp_path, dims, grid):
    folder = tmp_path / "well"
    folder.mkdir()
    _synthetic(folder, "well", dims=dims, resolution=grid, frames=4, samples=2, dtype="float64")
    files = DataFiles(folder)
    names = ("tracer", *(f"velocity_{a}" for a in "xyz"[:dims]))
    assert files.fields == names and files.periodic == (True,) * dims and files.layout.dtype == np.float64
    fields, _ = _well_reference(folder, 4)
    for t in range(2):
        for c, channel in enumerate(names):
            for selection in _selections(4, grid):
                got = _read(files, channel, t, selection, np.float64)
                np.testing.assert_array_equal(got, fields[t][..., c][selection])


def _edit(path, edit):
    with h5py.File(path, "a") as f:
        edit(f)
    return path


def test_the_well_refuses_non_uniform_grids_and_constant_dims_and_records_open_boundaries(tmp_path):
    def stretch(f):
        y = f["dimensions/y"][()]
        f["dimensions/y"][...] = y**2

    path = _edit(_synthetic(tmp_path, "well", "stretched", resolution=7), stretch)
    with pytest.raises(DataError, match=r"stretched.hdf5: dimension 'y' is not uniformly spaced \(spacing"):
        DataFiles(path)

    def flat(f):
        f["t0_fields/tracer"].attrs["dim_varying"] = [True, False]

    path = _edit(_synthetic(tmp_path, "well", "flat", resolution=7), flat)
    with pytest.raises(DataError, match=r"flat.hdf5: field 't0_fields/tracer' is constant along a spatial dim"):
        DataFiles(path)

    def walls(f):
        f["boundary_conditions/x_periodic"].attrs["bc_type"] = "WALL"

    assert DataFiles(_edit(_synthetic(tmp_path, "well", "walls", resolution=7), walls)).periodic == (False, True)

    def short(f):
        del f["t1_fields/velocity"]
        f["t1_fields"].create_dataset("velocity", data=np.zeros((4, 6, 7, 7, 3), np.float32))
        f["t1_fields/velocity"].attrs.update(dim_varying=[True, True], sample_varying=True, time_varying=True)

    path = _edit(_synthetic(tmp_path, "well", "short", resolution=7), short)
    with pytest.raises(DataError, match=r"short.hdf5: field 't1_fields/velocity' has shape \(4, 6, 7, 7, 3\), "):
        DataFiles(path)


# --- neuraloperator's tensor dictionaries. ---


def test_tensor_dictionaries_read_as_torch_load(tmp_path):
    path = _synthetic(tmp_path, "pt", dims=2, resolution=(7, 13), samples=3)
    files = DataFiles(path)
    assert files.format == TensorDictionary() and files.static and files.inputs == ("x",) and files.fields == ("y",)
    data = torch.load(path, weights_only=True)
    for selection in _selections(1, (7, 13)):
        for key in ("x", "y"):
            got = _read(files, key, 2, (slice(0, 1), *selection[1:]))
            np.testing.assert_array_equal(got[0], data[key][2][selection[1:]].numpy())
    # A channel dim: the grid is what x and y share at their end.
    channels = {"x": torch.randn(2, 3, 5, 7, dtype=torch.float64), "y": torch.randn(2, 5, 7)}
    torch.save(channels, tmp_path / "channels.pt")
    files = DataFiles(tmp_path / "channels.pt")
    assert files.inputs == ("x0", "x1", "x2") and files.fields == ("y",) and files.grid == (5, 7)
    got = _read(files, "x1", 1, (slice(0, 1), slice(1, 4), slice(None, None, 2)), np.float64)
    np.testing.assert_array_equal(got[0], channels["x"][1, 1, 1:4, ::2].numpy())
    # Where the rule cannot tell (as many channels in x and y), spatial_dims says.
    torch.save({"x": torch.randn(2, 2, 5, 7), "y": torch.randn(2, 2, 5, 7)}, tmp_path / "ambiguous.pt")
    assert DataFiles(tmp_path / "ambiguous.pt").grid == (2, 5, 7)
    torch.save({"x": torch.randn(2, 2, 5, 7), "y": torch.randn(2, 2, 5, 7), "spatial_dims": 2}, tmp_path / "told.pt")
    assert DataFiles(tmp_path / "told.pt").inputs == ("x0", "x1")


def test_tensor_dictionaries_refuse_what_they_lack(tmp_path):
    cases = [
        (
            "no_y.pt",
            {"x": torch.zeros(2, 4, 4)},
            r"no_y.pt: 'y' is nothing, expected a tensor \(the dict has \['x'\]\)",
        ),
        (
            "grids.pt",
            {"x": torch.zeros(2, 4, 4), "y": torch.zeros(2, 4, 5)},
            r"grids.pt: 'x' \(2, 4, 4\) and 'y' \(2, 4, 5\) share no grid",
        ),
        (
            "ints.pt",
            {"x": torch.zeros(2, 4, dtype=torch.int64), "y": torch.zeros(2, 4)},
            r"ints.pt: 'x' is torch.int64",
        ),
        ("list.pt", [torch.zeros(2)], r"list.pt: holds a list, expected a dict with tensors 'x' and 'y'"),
    ]
    for name, data, match in cases:
        torch.save(data, tmp_path / name)
        with pytest.raises(DataError, match=match):
            DataFiles(tmp_path / name)


# --- Li et al.'s .mat files: h5py's array transposed (v7.3) and scipy.io.loadmat (v5) are the references. ---


def _matlab_v73(path, arrays):
    """A v7.3 file as MATLAB's ``save -v7.3`` writes one, without drift's writer: HDF5 after a 512-byte user
    block holding MATLAB's header (116 bytes of text, 8 of subsystem offset, version 0x0200 and "MI" as
    little-endian 16-bit values), each array (given in MATLAB's order) stored with its dims reversed."""
    with h5py.File(path, "w", userblock_size=512) as f:
        for key, values in arrays.items():
            d = f.create_dataset(key, data=np.asarray(values).transpose())
            d.attrs["MATLAB_class"] = np.bytes_({"f": b"single", "d": b"double"}.get(d.dtype.char, b"int32"))
    text = b"MATLAB 7.3 MAT-file, Platform: GLNXA64, Created on: Mon Jan  1 00:00:00 2024 HDF5 schema 1.00 ."
    with open(path, "r+b") as raw:
        raw.write(text.ljust(116) + b" " * 8 + np.array([0x0200, 0x4D49], "<u2").tobytes())
    return path


def _li(shape, dtype, seed=0):
    """Li's ``u`` of ``shape`` (N x X [x Y] x T) and ``t`` (1 x T)."""
    u = np.random.default_rng(seed).standard_normal(shape).astype(dtype)
    return {"u": u, "a": u[..., 0], "t": np.arange(1.0, shape[-1] + 1)[None]}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("shape", [(3, 7, 5, 4), (3, 11, 4)])
def test_li_mat_v73_reads_as_the_transposed_hdf5_array(tmp_path, shape, dtype):
    path = _matlab_v73(tmp_path / "ns.mat", _li(shape, dtype))
    files = DataFiles(path)
    grid = shape[1:-1]
    assert files.format == LiMat() and detect(path) == LiMat() and files.layout.dtype == dtype
    assert (files.fields, files.inputs, files.static, files.frames, files.grid) == (("u",), ("u",), False, 4, grid)
    assert files.lengths == (1.0,) * len(grid) and files.periodic == (True,) * len(grid)
    assert files.describe() == f"Li et al. .mat (FNO), {len(grid)}-D: u; {' x '.join(map(str, (3, 4, *grid)))}"
    with h5py.File(path, "r") as f:
        reference = np.moveaxis(f["u"][()].transpose(), -1, 1)  # MATLAB's N x X x Y x T, frames second
    for selection in _selections(4, grid):
        for t in range(3):
            got = _read(files, "u", t, selection, np.float64)
            np.testing.assert_array_equal(got, reference[t][selection])  # float64: each stored value exactly
    assert np.array_equal(_read(files, "u", 1, (slice(None),) * (1 + len(grid)), dtype), reference[1])
    with pytest.raises(DataError, match=r"ns.mat: no channel 'a' \(has u\)"):
        files.read("a", 0, (slice(None),) * (1 + len(grid)), np.empty((4, *grid), np.float32))


def test_li_mat_v5_reads_as_scipy_loadmat(tmp_path):
    scipy_io = pytest.importorskip("scipy.io")
    path = tmp_path / "burgers.mat"
    scipy_io.savemat(path, _li((3, 6, 5, 4), "float64", seed=1))
    files = DataFiles(path)
    assert files.format == LiMat() and files.grid == (6, 5) and files.frames == 4 and files.trajectories == 3
    reference = np.moveaxis(scipy_io.loadmat(path)["u"], -1, 1)
    for selection in _selections(4, (6, 5)):
        np.testing.assert_array_equal(_read(files, "u", 2, selection, np.float64), reference[2][selection])


def test_bad_li_mat_files_are_refused_in_one_line(tmp_path):
    scipy_io = pytest.importorskip("scipy.io")
    scipy_io.savemat(tmp_path / "darcy5.mat", {"coeff": np.zeros((2, 4, 4)), "sol": np.zeros((2, 4, 4))})
    (tmp_path / "text.mat").write_text("not a MAT file")
    cases = [
        (_matlab_v73(tmp_path / "darcy.mat", {"coeff": np.zeros((2, 4, 4))}), r"no array 'u' \(holds \['coeff'\]\)"),
        (tmp_path / "darcy5.mat", r"no array 'u' \(holds \['coeff', 'sol'\]\)"),
        (_matlab_v73(tmp_path / "burgers.mat", {"u": np.zeros((2, 8))}), r"array 'u' is 2 x 8 \(MATLAB's order\)"),
        (_matlab_v73(tmp_path / "ints.mat", {"u": np.zeros((2, 4, 3), np.int32)}), r"dataset 'u' is int32; drift"),
        (tmp_path / "text.mat", r"neither HDF5 \(MATLAB v7.3\) nor a MATLAB v5 file"),
    ]
    for path, match in cases:
        assert detect(path) == LiMat()
        with pytest.raises(DataError, match=f"^{path}: {match}") as error:
            DataFiles(path)
        assert "\n" not in str(error.value)
    with pytest.raises(ValueError, match="layout mat holds 1 or 2 spatial dims"):
        write_synthetic(tmp_path / "cube.mat", "mat", dims=3)


def test_li_mat_output_is_matlab_v73_with_times_continued(tmp_path):
    """What a prediction writes (the predict tests write it): MATLAB's header, which scipy recognises as
    v7.3; ``u`` count x X x Y x frames stored reversed; ``t`` continued at its last spacing."""
    from scipy.io.matlab import matfile_version

    source = _matlab_v73(tmp_path / "short.mat", _li((3, 6, 4, 3), "float32"))
    output = LiMat().output(Prediction(DataFiles(source), (2, 0), 5, (3, 2), 2))
    assert (
        output.datasets == {"u": ((5, 2, 3, 2), np.dtype(np.float32))}
        and output.userblock[:20] == b"MATLAB 7.3 MAT-file,"
    )
    assert output.arrays["t"].shape == (5, 1) and np.array_equal(output.arrays["t"].ravel(), np.arange(1.0, 6.0))
    assert output.attrs == {"u": {"MATLAB_class": b"single"}, "t": {"MATLAB_class": b"double"}}
    values = np.arange(2 * 3 * 2, dtype=np.float32).reshape(2, 3, 2)  # 2 frames of trajectory 1's 3 x 2 block
    [(key, selection, stored)] = output.place(Block("u", 1, slice(3, 5), (slice(0, 3), slice(0, 2)), values))
    assert key == "u" and selection == (slice(3, 5), slice(0, 2), slice(0, 3), 1)
    np.testing.assert_array_equal(stored, values.transpose(0, 2, 1))
    assert matfile_version(str(_synthetic(tmp_path, "mat"))) == (2, 0)  # the synthetic file's header too


# --- detect, and the files of one run. ---


def test_detect_names_each_layout(tmp_path):
    for layout in LAYOUTS:
        for dims in (1, 2) if layout == "mat" else (1, 2, 3):  # Li's u: N x X [x Y] x T
            path = _synthetic(tmp_path, layout, f"{layout}{dims}", dims=dims, resolution=5, frames=3, samples=2)
            assert detect(path) == (CFD[dims] if layout == "cfd" else EXPECTED[layout]), path
            assert detect(path).describe(path).grid == (5,) * dims
    assert len(FORMATS) == len(set(FORMATS)) == 9


def test_detect_refuses_a_file_of_no_layout_in_one_line(tmp_path):
    path = tmp_path / "other.hdf5"
    with h5py.File(path, "w") as f:
        f.create_dataset("velocity", data=np.zeros((3, 4)))
        f.create_group("params")
    with pytest.raises(DataError) as error:
        detect(path)
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(
        f"{path}: holds params/ (group), velocity (3, 4); drift reads Li et al. .mat (FNO); PDEBench 1-D "
    )
    assert message.endswith("The Well; tensor dictionary (.pt)")
    text = tmp_path / "notes.hdf5"
    text.write_text("not hdf5")
    with pytest.raises(DataError, match=r"notes.hdf5: not a readable HDF5 file"):
        detect(text)


def test_bad_pdebench_files_are_refused_naming_the_key(tmp_path):
    def no_vy(f):
        del f["Vy"]

    path = _edit(_synthetic(tmp_path, "cfd", "no_vy", dims=2, resolution=5), no_vy)
    with pytest.raises(DataError, match=r"no_vy.hdf5: missing dataset 'Vy' \(has \["):
        DataFiles(path)

    def mismatched(f):
        del f["pressure"]
        f.create_dataset("pressure", data=np.zeros((4, 6, 5, 4), np.float32))

    path = _edit(_synthetic(tmp_path, "cfd", "mismatched", dims=2, resolution=5), mismatched)
    with pytest.raises(DataError, match=r"mismatched.hdf5: dataset 'pressure' has shape \(4, 6, 5, 4\), 'density' has"):
        DataFiles(path)

    def ragged(f):
        del f["0001/data"]
        f["0001"].create_dataset("data", data=np.zeros((6, 4, 5, 2), np.float32))

    path = _edit(_synthetic(tmp_path, "groups", "ragged", resolution=5), ragged)
    with pytest.raises(DataError, match=r"ragged.h5: '0001'/data has shape \(6, 4, 5, 2\), expected \(6, 5, 5, 2\)"):
        DataFiles(path)
    with pytest.raises(DataError, match=r"dataset 'density' has shape \(4, 6, 5, 5\), not \[batch, time, x, y, z\]"):
        PDEBenchFiles(_synthetic(tmp_path, "cfd", "flat", dims=2, resolution=5))


def test_files_of_one_run_must_share_format_fields_frames_and_grid(tmp_path):
    first = _synthetic(tmp_path, "cfd", "first", dims=2, resolution=5)
    cases = [
        (
            "scalar",
            dict(layout="scalar", dims=2),
            r"format PDEBench scalar, 2-D differs from .*first.hdf5's PDEBench 2-D CFD",
        ),
        ("frames", dict(layout="cfd", dims=2, resolution=5, frames=4), r"frames 4 differs from .*first.hdf5's 6"),
        ("grid", dict(layout="cfd", dims=2, resolution=(5, 7)), r"grid \(5, 7\) differs from .*first.hdf5's \(5, 5\)"),
    ]
    for name, kwargs, match in cases:
        other = write_synthetic(tmp_path / f"{name}.hdf5", **kwargs)
        with pytest.raises(DataError, match=f"{name}.hdf5: {match}"):
            DataFiles([first, other])
    groups = [_synthetic(tmp_path, "groups", "g2"), tmp_path / "g1.h5"]
    with h5py.File(groups[1], "w") as f:
        f.create_dataset("0000/data", data=np.zeros((6, 16, 16, 1), np.float32))
        f.create_dataset("0000/grid/x", data=np.arange(16.0))
        f.create_dataset("0000/grid/y", data=np.arange(16.0))
    with pytest.raises(DataError, match=r"g1.h5: fields \('c0',\) differs from .*g2.h5's \('c0', 'c1'\)"):
        DataFiles(groups)


def test_data_files_select_fields_describe_and_pickle(tmp_path):
    paths = [
        _synthetic(tmp_path, "cfd", f"part{i}", dims=2, resolution=(7, 5), samples=2 + i, seed=i) for i in range(2)
    ]
    files = DataFiles(paths, fields=("Vy", "density"))
    assert files.fields == files.inputs == ("Vy", "density") and files.shape == (5, 6, 7, 5)
    assert files.describe() == "PDEBench 2-D CFD: Vy, density; 5 x 6 x 7 x 5 (2 files)"
    assert files.lengths == pytest.approx((1.0, 1.0)) and files.periodic == (True, True) and files.dims == 2
    with pytest.raises(DataError, match=r"part0.hdf5: no field 'Vz' in its PDEBench 2-D CFD layout \(has density, "):
        DataFiles(paths, fields=("Vz",))
    with pytest.raises(DataError, match=r"part0.hdf5: no channel 'u' \(has density, pressure, Vx, Vy\)"):
        files.read("u", 0, (slice(None),) * 3, np.empty((6, 7, 5), np.float32))
    before = _read(files, "Vy", 3, (slice(None),) * 3)
    again = pickle.loads(pickle.dumps(files))
    np.testing.assert_array_equal(_read(again, "Vy", 3, (slice(None),) * 3), before)
    with h5py.File(paths[1]) as f:
        np.testing.assert_array_equal(before, f["Vy"][1])


# --- write_synthetic. ---


@pytest.mark.parametrize("layout", LAYOUTS)
def test_write_synthetic_follows_its_map(tmp_path, layout):
    dims = 1 if layout == "scalar" else 2
    path = _synthetic(tmp_path, layout, dims=dims, resolution=(11, 7)[:dims], frames=4, samples=2, seed=3)
    files = DataFiles(path)
    assert files.format == (CFD[dims] if layout == "cfd" else EXPECTED[layout])
    whole = (slice(None),) * (1 + dims)
    for t in range(2):
        if files.static:
            x, y = (_read(files, c, t, whole, np.float64)[0] for c in (*files.inputs, *files.fields))
            np.testing.assert_allclose(y, smooth(x, dims), rtol=0, atol=2e-6 * np.abs(x).max())
            continue
        for channel in files.fields:
            frames = _read(files, channel, t, whole, np.float64)
            assert np.ptp(frames[0]) > 0.1  # not a constant field
            np.testing.assert_allclose(frames[1:], advance(frames[:-1], dims), rtol=0, atol=2e-6 * np.abs(frames).max())
    again = _synthetic(tmp_path, layout, "again", dims=dims, resolution=(11, 7)[:dims], frames=4, samples=2, seed=3)
    other = _synthetic(tmp_path, layout, "other", dims=dims, resolution=(11, 7)[:dims], frames=4, samples=2, seed=4)
    channel = files.fields[0]
    same, differs = (_read(DataFiles(p), channel, 1, whole) for p in (again, other))
    np.testing.assert_array_equal(same, _read(files, channel, 1, whole))
    assert not np.array_equal(differs, same)


def test_advance_is_a_roll_then_a_damping_of_each_mode():
    rng = np.random.default_rng(0)
    field = rng.standard_normal((3, 8))
    k = np.fft.fftfreq(8, 1 / 8)
    want = np.real(np.fft.ifft(np.fft.fft(np.roll(field, 1, axis=-1)) * np.exp(-0.01 * k**2)))
    np.testing.assert_allclose(advance(field, 1), want, atol=1e-14)
    with pytest.raises(ValueError, match="layout must be one of cfd, scalar, darcy, groups, well, pt, mat, got"):
        write_synthetic("x.hdf5", "netcdf")
