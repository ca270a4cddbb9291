"""Loading a run folder runs no code from it (issue 33): a checkpoint's ``.metadata`` is unpickled with an
allow-list and its non-tensor values with ``torch.load(weights_only=True)``. Crafted files whose
unpickling would run code are refused with one line on every path that loads a checkpoint (``drift
evaluate``, ``--resume``, a restart, the fallback scan), nothing runs, and an intact older checkpoint is
still found; every checkpoint drift writes loads through the restricted reader, and the allow-list is
checked against what the installed torch writes."""

from __future__ import annotations

import importlib
import io
import json
import math
import os
import pickle
import shutil
from pathlib import Path
from unittest import mock

import pytest
import torch
import torch.distributed.checkpoint as dcp
from runs import (
    assert_same_metrics,
    checkpoint_names,
    constant_config,
    fails_with_one_line,
    metric_rows,
    tiny_data,
    train_argv,
)
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)

import drift.train
import drift.train.loop
from drift import comm
from drift.checkpoint import CheckpointError, load_checkpoint, save_checkpoint, usable_checkpoint
from drift.checkpoint_reader import ALLOWED, CheckpointReader, RefusedData, WeightsOnlyLoadPlanner, load_metadata
from drift.cli import main
from drift.train import META_KEYS, Sharding, build_model, make_optimizer, train_rank


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return tiny_data(tmp_path_factory.mktemp("reader") / "cfd.hdf5")


@pytest.fixture(scope="module")
def pristine(tmp_path_factory, data):
    """A 2-epoch run of 2 ranks (checkpoints epoch-0001 and epoch-0002) and its metric rows."""
    out = tmp_path_factory.mktemp("pristine") / "run"
    assert main(train_argv(data, out, "--epochs", "2", "--nproc", "2")) == 0
    return out, metric_rows(out)


class _Payload:
    """Pickles as a call of ``fn(*args)``: what a crafted file's unpickling would run."""

    def __init__(self, fn, *args) -> None:
        self.fn, self.args = fn, args

    def __reduce__(self):
        return self.fn, self.args


def _payloads(marker: Path) -> list[tuple[_Payload, str]]:
    """Crafted objects, each creating ``marker`` when unpickled, and the global each is refused as."""
    return [
        (_Payload(open, str(marker), "w"), "io.open"),
        (_Payload(os.system, f"touch {marker}"), "posix.system"),
        (_Payload(torch.save, {}, str(marker)), "torch.serialization.save"),
    ]


def _craft(path: Path, payload: _Payload) -> None:
    """Replace a checkpoint's ``.metadata`` by a pickle that runs ``payload``, as a stranger could."""
    (path / ".metadata").write_bytes(pickle.dumps(payload))


def test_crafted_metadata_is_refused_by_evaluate_and_the_fallback_scan(capfd, pristine, tmp_path):
    source, rows = pristine
    out, report, marker = tmp_path / "run", tmp_path / "eval.json", tmp_path / "ran"
    root = out / "checkpoints"
    for payload, name in _payloads(marker):
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(source, out)
        _craft(root / "epoch-0002", payload)
        assert usable_checkpoint(root, META_KEYS) == root / "epoch-0001"  # the scan, before any rank starts
        assert main(["evaluate", str(out), "--json", str(report)]) == 0
        err = capfd.readouterr().err
        line = f"drift: checkpoint passed over: {root / 'epoch-0002' / '.metadata'}: not a checkpoint's metadata"
        assert f"{line} (refused to load {name})" in err, err
        assert f"drift: falling back to {root / 'epoch-0001'}" in err and "Traceback" not in err, err
        result = json.loads(report.read_text())
        assert result["epoch"] == 1 and math.isclose(result["test_rel_l2"], rows[0]["test_rel_l2"], rel_tol=1e-5)
        assert not marker.exists()
        # Every checkpoint crafted: one line naming each refusal, before any rank starts.
        _craft(root / "epoch-0001", payload)
        fails_with_one_line(capfd, ["evaluate", str(out)], f"not a checkpoint's metadata (refused to load {name})")
        with pytest.raises(CheckpointError, match="epoch-0001/.metadata: not a checkpoint's metadata"):
            usable_checkpoint(root, META_KEYS)
        assert not marker.exists()


def test_crafted_metadata_is_refused_on_resume(capfd, data, pristine, tmp_path):
    source, rows = pristine
    out, marker = tmp_path / "run", tmp_path / "ran"
    shutil.copytree(source, out)
    _craft(out / "checkpoints" / "epoch-0002", _payloads(marker)[1][0])
    assert main(train_argv(data, out, "--epochs", "2", "--resume", "--nproc", "2")) == 0
    err = capfd.readouterr().err
    assert "epoch-0002/.metadata: not a checkpoint's metadata (refused to load posix.system)" in err, err
    assert not marker.exists()
    again = metric_rows(out)  # epoch 1's row kept as written; epoch 2 trained again from epoch 1's checkpoint
    assert again[0] == rows[0]
    assert_same_metrics(again[1:], rows[1:])
    assert checkpoint_names(out) == (["epoch-0001", "epoch-0002"], "epoch-0002")


def _rank_1_crafts_then_dies(config) -> list[dict]:
    """``train_rank`` with rank 1, once per test folder, replacing epoch 2's ``.metadata`` by a crafted
    pickle right after that checkpoint and then dying: the restarted job must pass it over."""
    crafted, save = Path(config.out).parent / "crafted", drift.train.loop.save_checkpoint

    def save_then_craft(root, epoch: int, *args, **kwargs):
        path = save(root, epoch, *args, **kwargs)
        if epoch == 2 and comm.rank() == 1 and not crafted.exists():
            crafted.touch()
            _craft(path, _payloads(Path(config.out).parent / "ran")[0][0])
            os._exit(1)
        return path

    with mock.patch.object(drift.train.loop, "save_checkpoint", save_then_craft):
        return train_rank(config)


def test_crafted_metadata_is_refused_by_a_restart(capfd, monkeypatch, data, tmp_path):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the same threads in both runs: their sums in one order
    whole = tmp_path / "whole"
    assert main(train_argv(data, whole, "--epochs", "3", "--nproc", "2")) == 0
    monkeypatch.setattr(drift.train, "train_rank", _rank_1_crafts_then_dies)
    out = tmp_path / "job" / "run"
    assert main(train_argv(data, out, "--epochs", "3", "--nproc", "2", "--max-restarts", "1")) == 0
    err = capfd.readouterr().err
    assert "restart 1 of 1, resuming from the latest checkpoint" in err, err
    assert "epoch-0002/.metadata: not a checkpoint's metadata (refused to load io.open)" in err, err
    assert (out.parent / "crafted").exists() and not (out.parent / "ran").exists()
    assert_same_metrics(metric_rows(out), metric_rows(whole))


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_crafted_non_tensor_values_are_refused(tmp_path):
    """An optimizer's hyper-parameters are stored as pickles too: loaded weights-only."""
    path, marker = tmp_path / "ck", tmp_path / "ran"
    dcp.save({"t": torch.ones(3), "lr": _Payload(open, str(marker), "w")}, checkpoint_id=path, no_dist=True)
    state = {"t": torch.zeros(3), "lr": 0.0}
    options = dict(checkpoint_id=path, storage_reader=CheckpointReader(path), no_dist=True)
    with pytest.raises(CheckpointException) as refused:
        dcp.load(state, planner=WeightsOnlyLoadPlanner(), **options)
    assert isinstance(refused.value.failures[0][0], RefusedData)
    assert "lr: not checkpoint data (refused to load io.open)" in str(refused.value)
    assert not marker.exists()
    # The test can fail: DCP's default planner runs it.
    dcp.load(state, **options)
    assert marker.exists()


class _Recorder(pickle.Unpickler):
    """An unpickler that records the globals a pickle names (for the tests' own files only)."""

    def __init__(self, file) -> None:
        super().__init__(file)
        self.names: set[tuple[str, str]] = set()

    def find_class(self, module: str, name: str):
        self.names.add((module, name))
        return super().find_class(module, name)


def _save_a_trained_model(config, root: str) -> None:
    """One optimizer step of the run's model and optimizer (drift's own, as ``drift train`` makes them)
    on this rank's block, saved as epoch 1 under ``root``."""
    sharding = Sharding.build(config, comm.world_size(), "cpu")
    model = build_model(config, "cpu", sharding, (8, 8, 8, config.t_out))
    optimizer = make_optimizer(config, model)
    channels = model.lift.weight.shape[1] - (4 if model.positional_embedding == "grid" else 0)
    x = torch.randn(2, channels, 8, 8, 8, config.t_out, generator=torch.Generator().manual_seed(0))
    if sharding.mesh is not None:
        x = torch.distributed.tensor.distribute_tensor(x, sharding.mesh, sharding.placements)
    y = model(x)
    (y.to_local() if hasattr(y, "to_local") else y).square().sum().backward()
    optimizer.step()
    save_checkpoint(root, 1, model, optimizer, {"epoch": 1})


def _load_on_one(config, root: str) -> None:
    model = build_model(config, "cpu", None, (8, 8, 8, config.t_out))
    load_checkpoint(Path(root) / "epoch-0001", model, make_optimizer(config, model))


@pytest.mark.parametrize(
    ("size", "changes"),
    [
        (1, dict(method="drift")),
        (2, dict(method="dfno", weight_decay=0.0)),  # Adam rather than AdamW
        (3, dict(method="dfno-pruned", factorization="tucker", rank=0.5)),
        (4, dict(method="drift", factorization="cp", rank=0.5, data_parallel=2)),
    ],
)
def test_the_allow_list_covers_what_drift_writes(ranks, tmp_path, size, changes):
    config = constant_config(None, tmp_path, **changes)
    root = tmp_path / "ck"
    ranks.run(size, _save_a_trained_model, config, str(root))
    with open(root / "epoch-0001" / ".metadata", "rb") as file:
        recorder = _Recorder(file)
        recorder.load()
    assert recorder.names <= ALLOWED, recorder.names - ALLOWED
    ranks.run(1, _load_on_one, config, str(root))  # and it loads, through the restricted reader


# What a checkpoint of drift's models and optimizers may hold: every floating, complex and integer dtype
# and bool (written out here, not read from torch), its layouts and a path.
_DTYPES = (
    *(torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.complex128),
    *(torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.bool),
)


def _metadata(dtype: torch.dtype, layout: torch.layout) -> Metadata:
    """A DCP index of one (4, 3) tensor of ``dtype`` in one chunk and one non-tensor value, as DCP writes it."""
    chunk = ChunkStorageMetadata(offsets=torch.Size([0, 0]), sizes=torch.Size([4, 3]))
    tensor = TensorStorageMetadata(TensorProperties(dtype=dtype, layout=layout), torch.Size([4, 3]), [chunk])
    return Metadata(
        state_dict_metadata={"model.w": tensor, "optim.lr": BytesStorageMetadata()},
        storage_data={MetadataIndex("model.w", torch.Size([0, 0]), 0): _StorageInfo("__0_0.distcp", 0, 192)},
        storage_meta=StorageMeta(checkpoint_id=Path("/runs/a/checkpoints/epoch-0001"), save_id="s"),
    )


def test_every_allowed_global_exists_in_this_torch():
    """Each allowed global is an object of the installed torch or standard library, and a pickle naming it
    loads as that very object through the restricted unpickler; DCP indexes of every dtype and layout a
    checkpoint may hold load equal to what was pickled."""
    for module, name in sorted(ALLOWED):
        found = getattr(importlib.import_module(module), name)  # AttributeError: gone from this torch
        kinds = (type, torch.dtype, torch.layout, torch.memory_format)
        assert isinstance(found, kinds) or (module, name) == ("torch.serialization", "_get_layout"), (module, name)
        assert load_metadata(io.BytesIO(f"c{module}\n{name}\n.".encode())) is found, (module, name)
    for dtype in _DTYPES:
        for layout in (torch.strided, torch.sparse_coo):
            written = _metadata(dtype, layout)
            loaded = load_metadata(io.BytesIO(pickle.dumps(written)))
            assert loaded == written and loaded.state_dict_metadata["model.w"].properties.dtype is dtype
    assert load_metadata(io.BytesIO(pickle.dumps(torch.Size([4, 3])))) == (4, 3)
