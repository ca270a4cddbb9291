"""Trajectories: every rank reads its own torch.chunk block (over spatial and data-parallel mesh dims),
normalised, on generated files; bad files fail clearly."""

from __future__ import annotations

import math

import h5py
import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard

import drift
from drift.data import FIELDS, DataError, Stats, Trajectories, write_pdebench3d

SHAPE = (5, 7, 12, 10, 9)  # batch, time, x, y, z


def _fields(seed=0):
    rng = np.random.default_rng(seed)
    return {name: (rng.standard_normal(SHAPE) * (i + 1) + i).astype(np.float32) for i, name in enumerate(FIELDS)}


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("pdebench") / "cfd.hdf5"
    write_pdebench3d(path, _fields(), attrs={"M": 1.0, "eta": 1e-8, "zeta": 1e-8})
    return path


def _normalised(arrays, t, frames, region, stats):
    """Field stack ``(fields, frames, *region)`` of trajectory t, normalised with ``stats``."""
    data = np.stack([arrays[k][(t, slice(0, frames), *region)] for k in FIELDS])
    return (data - np.reshape(stats.mean, (-1, 1, 1, 1, 1))) / np.reshape(stats.std, (-1, 1, 1, 1, 1))


def test_reads_normalised_pairs_on_one_rank(data_file):
    arrays = _fields()
    train = Trajectories(data_file, t_in=2, t_out=4)
    test = Trajectories(data_file, t_in=2, t_out=4, split="test", stats=train.stats)
    assert len(train) == 4 and len(test) == 1 and train.global_shape == (12, 10, 9)
    frames = np.stack([arrays[k][:4, :6] for k in FIELDS]).reshape(len(FIELDS), -1)
    assert np.allclose(train.stats.mean, frames.mean(1), rtol=1e-6)
    assert np.allclose(train.stats.std, frames.std(1), rtol=1e-6)
    for ds, trajectories in ((train, range(4)), (test, [4])):
        for i, t in enumerate(trajectories):
            want = _normalised(arrays, t, 6, (slice(None),) * 3, train.stats)
            x_want, y_want = want[:, :2], want[:, 2:]
            x, y = ds[i]
            assert x.dtype == torch.float32 and x.shape == (5, 2, 12, 10, 9) and y.shape == (5, 4, 12, 10, 9)
            assert np.allclose(x.numpy(), x_want, atol=1e-5) and np.allclose(y.numpy(), y_want, atol=1e-5)


def test_region_and_stride_select_the_grid(data_file):
    arrays = _fields()
    ds = Trajectories(data_file, t_in=3, t_out=2, region=[(2, 11), (1, 10), (0, 9)], stride=(2, 3, 1))
    assert ds.global_shape == (5, 3, 9)
    x, y = ds[1]
    want = _normalised(arrays, 1, 5, (slice(2, 11, 2), slice(1, 10, 3), slice(0, 9)), ds.stats)
    x_want, y_want = want[:, :3], want[:, 3:]
    assert np.allclose(x.numpy(), x_want, atol=1e-5) and np.allclose(y.numpy(), y_want, atol=1e-5)


def _block(shape, mesh_shape, placements, rank) -> tuple[slice, ...]:
    """The slices of ``rank``'s block from first principles: the mesh's ranks are row-major, and dim i,
    split by the mesh dim placed ``Shard(i)``, goes in ``torch.chunk``'s blocks (possibly fewer than the
    ranks: the others hold nothing)."""
    coords = np.unravel_index(rank, mesh_shape)
    out = []
    for dim, n in enumerate(shape):
        axis = next((a for a, p in enumerate(placements) if p == Shard(dim)), None)
        chunks = torch.arange(n).chunk(1 if axis is None else mesh_shape[axis])
        c = 0 if axis is None else coords[axis]
        out.append(slice(int(chunks[c][0]), int(chunks[c][-1]) + 1) if c < len(chunks) else slice(n, n))
    return tuple(out)


def _mesh(spec):
    """A grid (ranks per spatial dim, ``drift.grid_mesh``) or an explicit (mesh shape, placements)."""
    if isinstance(spec[0], int):
        return drift.grid_mesh(spec)
    shape, placements = spec
    return init_device_mesh("cpu", shape), placements


def _rank_reads(path, spec, region, stride):
    mesh, placements = _mesh(spec)
    ds = Trajectories(path, mesh, placements, t_in=2, t_out=3, region=region, stride=stride)
    slices = _block(ds.global_shape, tuple(mesh.shape), placements, dist.get_rank())
    with drift.comm_log() as log:
        again = Trajectories(path, mesh, placements, t_in=2, t_out=3, region=region, stride=stride)
    assert log.kinds() == ["all_reduce"] and again.stats == ds.stats
    items = [tuple(t.numpy() for t in ds[i]) for i in range(len(ds))]
    return ds.stats, slices, items


@pytest.mark.parametrize(
    ("spec", "region", "stride"),
    [
        ((2, 1, 1), None, 1),
        ((1, 3, 1), [(1, 12), (0, 10), (2, 9)], 2),
        ((2, 2, 1), None, (1, 2, 1)),
        # x's 5 points over 4 ranks: torch.chunk blocks of 2, 2, 1 and an empty one
        ((4, 1, 1), [(2, 7), (0, 10), (0, 9)], 1),
        # 2 data-parallel ranks (the field whole along them) x 2 ranks splitting z
        (((2, 2), (Replicate(), Shard(2))), None, 1),
    ],
)
def test_every_rank_reads_its_block(ranks, data_file, spec, region, stride):
    size = math.prod(spec) if isinstance(spec[0], int) else math.prod(spec[0])
    results = ranks.run(size, _rank_reads, data_file, spec, region, stride)
    stats = results[0][0]
    single = Trajectories(data_file, t_in=2, t_out=3, region=region, stride=stride)
    assert np.allclose(stats.mean, single.stats.mean, rtol=1e-9) and np.allclose(stats.std, single.stats.std, rtol=1e-9)
    for rank_stats, slices, items in results:
        assert rank_stats == stats
        for t, (x, y) in enumerate(items):
            whole_x, whole_y = (a.numpy() for a in single[t])
            assert x.shape[2:] == tuple(s.stop - s.start for s in slices)
            assert np.allclose(x, whole_x[(slice(None), slice(None), *slices)], atol=1e-6)
            assert np.allclose(y, whole_y[(slice(None), slice(None), *slices)], atol=1e-6)


def test_big_endian_fields_read_as_native(tmp_path):
    """Fields stored big-endian (``>f4``) are float32 all the same, read as the native ones."""
    native, swapped = tmp_path / "native.hdf5", tmp_path / "big.hdf5"
    write_pdebench3d(native, _fields())
    write_pdebench3d(swapped, _fields())
    with h5py.File(swapped, "a") as f:
        for key in FIELDS:
            values = f[key][...]
            del f[key]
            f.create_dataset(key, data=values.astype(">f4"))
        assert f["density"].dtype == np.dtype(">f4")
    want, got = Trajectories(native, t_in=2, t_out=4), Trajectories(swapped, t_in=2, t_out=4)
    assert got.stats == want.stats
    # Exact: the same values, swapped to native order on reading, then the same arithmetic in this process.
    assert all(torch.equal(a, b) for a, b in zip(got[1], want[1], strict=True))


def test_stats_roundtrip(tmp_path, data_file):
    stats = Trajectories(data_file, t_in=2, t_out=4).stats
    stats.save(tmp_path / "stats.json")
    assert Stats.load(tmp_path / "stats.json") == stats


def test_bad_files_name_the_file_and_key(tmp_path):
    text = tmp_path / "notes.hdf5"
    text.write_text("not hdf5")
    with pytest.raises(DataError, match=r"notes.hdf5: not a readable HDF5 file"):
        Trajectories(text)

    good = tmp_path / "good.hdf5"
    write_pdebench3d(good, _fields())
    truncated = tmp_path / "truncated.hdf5"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(DataError, match=r"truncated.hdf5"):
        ds = Trajectories(truncated, t_in=2, t_out=4)
        ds[0]

    missing = tmp_path / "missing.hdf5"
    arrays = _fields()
    del arrays["Vz"]
    write_pdebench3d(missing, arrays)
    with pytest.raises(DataError, match=r"missing.hdf5: missing dataset 'Vz'"):
        Trajectories(missing)

    wrong = tmp_path / "wrong.hdf5"
    write_pdebench3d(wrong, _fields())
    with h5py.File(wrong, "a") as f:
        del f["pressure"]
        f.create_dataset("pressure", data=np.zeros((5, 7, 12, 10), dtype=np.float32))
    with pytest.raises(DataError, match=r"wrong.hdf5: dataset 'pressure' has shape \(5, 7, 12, 10\)"):
        Trajectories(wrong)

    group = tmp_path / "group.hdf5"
    write_pdebench3d(group, _fields())
    with h5py.File(group, "a") as f:
        del f["Vx"]
        f.create_group("Vx")
    with pytest.raises(DataError, match=r"group.hdf5: 'Vx' is an HDF5 group, not a dataset"):
        Trajectories(group)

    with pytest.raises(DataError, match=r"good.hdf5: 'density' has 7 frames, fewer than t_in \+ t_out = 21"):
        Trajectories(good)
    with pytest.raises(ValueError, match="does not fit extent 12 of dim 0"):
        Trajectories(good, t_in=2, t_out=4, region=[(0, 13), (0, 10), (0, 9)])
    with pytest.raises(ValueError, match="has 2 ranks but the process group has 1"):
        Trajectories(good, *drift.grid_mesh((2, 1, 1)), t_in=2, t_out=4)


def _independent(path, t, frames, stats):
    """Trajectory t's ``frames`` of every field as h5py reads them, made float32 and normalised in numpy:
    ``(fields, frames, x, y, z)``."""
    with h5py.File(path, "r") as f:
        data = np.stack([f[k][t, frames] for k in FIELDS]).astype(np.float32)
    mean, std = (np.asarray(v, dtype=np.float32).reshape(-1, 1, 1, 1, 1) for v in (stats.mean, stats.std))
    return (data - mean) / std


@pytest.mark.parametrize("dtype", ["<f4", ">f4", "<f8"])
def test_items_equal_an_independent_read_bit_for_bit_and_stay_valid(tmp_path, dtype):
    """Items read straight into their tensors equal h5py's read normalised in numpy, bit for bit, for
    float32 of either byte order and float64 files; an item keeps its values after later reads, and a
    batch read in place equals the items stacked."""
    path = tmp_path / "cfd.hdf5"
    write_pdebench3d(path, _fields())
    with h5py.File(path, "a") as f:
        for key in FIELDS:
            values = f[key][...]
            del f[key]
            f.create_dataset(key, data=values.astype(dtype))
    ds = Trajectories(path, t_in=2, t_out=4)
    first = ds[0]
    kept = [t.clone() for t in first]
    for i, t in enumerate(ds.trajectories):
        want = _independent(path, t, slice(0, 6), ds.stats)
        x, y = ds[i]
        # Exact: one subtraction and one division a value, each correctly rounded (IEEE 754) on every CPU.
        assert np.array_equal(x.numpy(), want[:, :2]) and np.array_equal(y.numpy(), want[:, 2:])
        assert x.is_contiguous() and y.is_contiguous()
    assert all(torch.equal(a, b) for a, b in zip(first, kept, strict=True))  # untouched by the reads since
    x, y = (torch.empty(2, *t.shape) for t in first)
    for b, i in enumerate((3, 1)):
        ds.read_into(i, x[b], y[b])
    # Exact: one process reads the same values both ways.
    assert torch.equal(x, torch.stack([ds[3][0], ds[1][0]])) and torch.equal(y, torch.stack([ds[3][1], ds[1][1]]))
    with pytest.raises(ValueError, match=r"x must be a contiguous float32 CPU tensor \(5, 2, 12, 10, 9\)"):
        ds.read_into(0, x[0].double(), y[0])


@pytest.mark.parametrize("how", ["truncated", "replaced"])
def test_a_file_changed_under_a_reader_fails_naming_it(tmp_path, how):
    """A file truncated in place, or replaced by another (a rename over it), after the data set opened it:
    the next read fails naming it instead of returning zeros or the other file's values."""
    path = tmp_path / "cfd.hdf5"
    write_pdebench3d(path, _fields())
    ds = Trajectories(path, t_in=2, t_out=4)
    ds[0]
    if how == "truncated":
        with open(path, "r+b") as f:
            f.truncate(path.stat().st_size // 2)
    else:
        other = tmp_path / "other.hdf5"
        write_pdebench3d(other, _fields(seed=1))
        other.replace(path)
    with pytest.raises(DataError, match=rf"{path}: the file changed \(truncated, replaced or rewritten\)"):
        ds[3]
