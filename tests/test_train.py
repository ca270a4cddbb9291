"""drift train / evaluate: distributed training (spatial, pencil, data x spatial) equals one rank,
resume is exact, checkpoints move between meshes, rank counts and methods, evaluation works at a finer
resolution, and bad options fail with one line."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys

import h5py
import pytest
import torch
from reference import rel_err
from runs import (
    DEVICE,
    ROUND_OFF,
    TINY,
    assert_same_metrics,
    fails_with_one_line,
    png_size,
    run_training,
    tiny_data,
    train_config,
    without_times,
)
from torch.distributed.tensor import DTensor, distribute_tensor

from drift import comm
from drift.checkpoint import latest_checkpoint, load_checkpoint, read_meta, save_checkpoint
from drift.cli import main
from drift.data import Stats, Trajectories, generate
from drift.jobs.launch import RankError
from drift.train import (
    LEGACY_OPTIONS,
    ConfigError,
    Sharding,
    TrainConfig,
    build_model,
    check_config,
    evaluate,
    frame_weights,
    learning_rate,
    reduction_shape,
    train,
)
from drift.train.sharding import datasets


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return tiny_data(tmp_path_factory.mktemp("train") / "cfd.hdf5")


def _full(t: torch.Tensor) -> torch.Tensor:
    """A tensor's global value on the CPU (a DTensor's gathered)."""
    return (t.full_tensor() if isinstance(t, DTensor) else t).detach().cpu()


def _model(config: TrainConfig):
    sharding = Sharding.build(config, comm.world_size(), torch.device(DEVICE).type)
    return build_model(config, DEVICE, sharding), sharding


def _train_then_state(config: TrainConfig) -> tuple[list[dict], dict]:
    history = train(config)
    model, _ = _model(config)
    load_checkpoint(latest_checkpoint(os.path.join(config.out, "checkpoints")), model)
    return history, {k: _full(v) for k, v in model.state_dict().items()}


def _losses(history):
    return [(r["train_loss"], r["test_rel_l2"]) for r in history]


def _close(a, b, rtol):
    return all(abs(x - y) <= rtol * abs(y) for pa, pb in zip(a, b, strict=True) for x, y in zip(pa, pb, strict=True))


@pytest.mark.other_host
def test_two_ranks_train_like_one(ranks, data, tmp_path):
    one = ranks.run(1, run_training, train_config(data, tmp_path / "p1"))[0]
    two = ranks.run(2, run_training, train_config(data, tmp_path / "p2", plots=True))
    pencil = ranks.run(4, run_training, train_config(data, tmp_path / "p4", grid=(2, 2, 1)))
    # 2 data ranks x 2 spatial: 3 training trajectories in batches of 2, so the last batch leaves a
    # data rank with none (it still joins the collectives).
    mixed = ranks.run(4, run_training, train_config(data, tmp_path / "dp", data_parallel=2))
    # Exact: every rank reports the same all-reduced sums (a collective's result is the same on each rank).
    assert _losses(two[0]) == _losses(two[1]) and _losses(pencil[0]) == _losses(pencil[3])
    assert all(_losses(r) == _losses(mixed[0]) for r in mixed)
    assert len(one) == 3 and one[-1]["train_loss"] < one[0]["train_loss"]
    assert _close(_losses(two[0]), _losses(one), 1e-5) and _close(_losses(pencil[0]), _losses(one), 1e-5)
    assert _close(_losses(mixed[0]), _losses(one), 1e-5)
    rows = [json.loads(line) for line in (tmp_path / "p2" / "metrics.jsonl").read_text().splitlines()]
    assert _losses(rows) == _losses(two[0])  # exact: JSON keeps a float's every bit
    # The normalisation the run saved is the training set's, as one process reads it from the file.
    saved, stats = Stats.load(tmp_path / "p2" / "stats.json"), Trajectories(data, t_in=2, t_out=4).stats
    assert saved.fields == stats.fields
    assert saved.mean == pytest.approx(stats.mean, rel=1e-6) and saved.std == pytest.approx(stats.std, rel=1e-6)
    # The plots are PNG images of drift.train.plots' figures: 9 x 3.5 and 11 x 7 inches at 120 dpi.
    assert png_size(tmp_path / "p2" / "loss.png") == (1080, 420)
    assert png_size(tmp_path / "p2" / "slice.png") == (1320, 840)
    assert not any((tmp_path / "p1" / name).exists() for name in ("loss.png", "slice.png"))  # plots=False


def _weights_and_targets(config: TrainConfig):
    """``frame_weights`` of this rank's training set, and (on one rank) every training target."""
    sharding = Sharding.build(config, comm.world_size(), torch.device(DEVICE).type)
    train_set, _ = datasets(config, config.data, None, sharding)
    weights = frame_weights(train_set, config.data_parallel, DEVICE).cpu()
    targets = torch.stack([train_set[i][1] for i in range(len(train_set))]) if comm.world_size() == 1 else None
    return weights, targets


def test_frame_weighted_loss(ranks, data, tmp_path):
    """--loss frame-weighted: the weights are the inverse variance of each field and predicted frame over
    the training targets (numpy), the same on any mesh, and training with them is too."""
    config = train_config(data, tmp_path / "w", loss="frame-weighted")
    weights, targets = ranks.run(1, _weights_and_targets, config)[0]
    fields, frames = targets.shape[1:3]
    variance = targets.double().numpy().transpose(1, 2, 0, 3, 4, 5).reshape(fields, frames, -1).var(axis=2)
    expected = torch.from_numpy((1 / variance) / (1 / variance).mean())
    assert weights.shape == (1, fields, 1, 1, 1, frames)
    assert rel_err(weights.flatten().double(), expected.flatten()) <= 2e-6
    for size, changes in ((2, {}), (4, dict(grid=(2, 2, 1))), (4, dict(data_parallel=2))):
        for other, _ in ranks.run(size, _weights_and_targets, dataclasses.replace(config, **changes)):
            assert rel_err(other, weights) <= 2e-6, changes
    flat = tmp_path / "flat.hdf5"
    shutil.copy(data, flat)
    with h5py.File(flat, "r+") as f:
        f["Vy"][:, 3] = 0.25  # the second predicted frame (t_in 2), in every trajectory
    with pytest.raises(
        RankError, match="the normalised field 'Vy' is constant over the training trajectories at predicted frame 2"
    ):
        ranks.run(2, _weights_and_targets, dataclasses.replace(config, data=str(flat)))
    one = ranks.run(1, run_training, config)[0]
    two = ranks.run(2, run_training, train_config(data, tmp_path / "w2", loss="frame-weighted"))[0]
    plain = ranks.run(1, run_training, train_config(data, tmp_path / "mse", loss="mse"))[0]
    assert _close(_losses(two), _losses(one), 1e-5) and one[-1]["train_loss"] < one[0]["train_loss"]
    assert one[0]["train_loss"] != plain[0]["train_loss"]


def test_reduction_trains_like_the_flat_reduction(ranks, data, tmp_path):
    """--reduction 2x2 with --overlap 3 on a slab of 4: the same losses as the flat reduction, and its
    checkpoint evaluates on 1 rank (the weights are stored alike)."""
    flat = ranks.run(4, run_training, train_config(data, tmp_path / "flat"))[0]
    tree = ranks.run(4, run_training, train_config(data, tmp_path / "tree", reduction=(2, 2), overlap=3))[0]
    assert _close(_losses(tree), _losses(flat), 1e-5), (tree, flat)
    result = ranks.run(1, evaluate, str(tmp_path / "tree"))[0]
    assert result["test_rel_l2"] == pytest.approx(tree[-1]["test_rel_l2"], rel=1e-5)


def test_reduction_over_hosts_takes_torchruns_hosts(monkeypatch):
    """--reduction hosts: (hosts, ranks a host) of the spatial ranks, none on one host."""
    config = TrainConfig(reduction="hosts")
    assert reduction_shape(config, 4) is None  # drift train --nproc 4: one host
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert reduction_shape(config, 8) == (4, 2)
    assert reduction_shape(TrainConfig(reduction="hosts", data_parallel=2), 8) == (2, 2)
    assert reduction_shape(TrainConfig(reduction=(8,)), 8) == (8,)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert reduction_shape(TrainConfig(reduction="hosts", data_parallel=2), 8) is None
    assert reduction_shape(TrainConfig(reduction="hosts"), 12) == (3, 4)
    with pytest.raises(ConfigError, match="--reduction hosts: 4 ranks a host do not divide the 6 spatial ranks"):
        reduction_shape(TrainConfig(reduction="hosts"), 6)


def test_drift_and_dfno_train_alike(ranks, data, tmp_path):
    drift = ranks.run(2, run_training, train_config(data, tmp_path / "drift"))[0]
    for method in ("dfno", "dfno-pruned"):
        other = ranks.run(2, run_training, train_config(data, tmp_path / method, method=method))[0]
        assert _close(_losses(other), _losses(drift), 1e-5), (method, other, drift)


@pytest.mark.other_host
@pytest.mark.parametrize("schedule", ["constant", "cosine"])
def test_resume_reproduces_the_uninterrupted_run(ranks, data, tmp_path, schedule):
    whole, state = ranks.run(2, _train_then_state, train_config(data, tmp_path / "whole", schedule=schedule))[0]
    checkpoints = tmp_path / "split" / "checkpoints"
    if schedule == "constant":  # a run of 2 epochs, continued to 3
        ranks.run(2, run_training, train_config(data, tmp_path / "split", epochs=2, schedule=schedule))
    else:  # the cosine runs over --epochs: the 3-epoch run, stopped after its second checkpoint
        shutil.copytree(tmp_path / "whole" / "checkpoints" / "epoch-0002", checkpoints / "epoch-0002")
        (checkpoints / "latest").write_text("epoch-0002\n")
    # A crash while writing the next checkpoint leaves a partial folder; latest still names epoch 2.
    partial = checkpoints / "epoch-0003.partial"
    partial.mkdir()
    (partial / "__0_0.distcp").write_bytes(b"torn")
    assert latest_checkpoint(checkpoints).name == "epoch-0002"
    config = train_config(data, tmp_path / "split", resume=True, schedule=schedule)
    resumed, resumed_state = ranks.run(2, _train_then_state, config)[0]
    assert_same_metrics(without_times(resumed), without_times(whole))
    for name, value in state.items():  # a resumed run: to round-off
        assert rel_err(resumed_state[name], value) <= ROUND_OFF, name
    rows = [json.loads(line) for line in (tmp_path / "split" / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == [1, 2, 3]


def _evaluate(run, method, options=None):
    return evaluate(run, method=method, device=DEVICE, **(options or {}))


def test_checkpoint_from_two_ranks_evaluates_anywhere(ranks, data, tmp_path):
    run = tmp_path / "run"
    history = ranks.run(2, run_training, train_config(data, run))[0]
    last = history[-1]["test_rel_l2"]
    on_one = ranks.run(1, _evaluate, str(run), None)[0]
    assert on_one["ranks"] == 1 and on_one["trained_on"] == 2 and on_one["epoch"] == 3
    assert on_one["resolution"] == on_one["trained_resolution"] == [8, 8, 8]
    assert abs(on_one["test_rel_l2"] - last) <= 1e-5 * last
    for result in ranks.run(3, _evaluate, str(run), "dfno-pruned"):
        assert abs(result["test_rel_l2"] - last) <= 1e-5 * last
    # Zero-shot super-resolution: the same weights on a 16^3 data set, on 1 rank, on a 2 x 2 pencil and
    # on 2 data x 2 spatial ranks with dfno; and read at 8^3 (every other point) with --resolution.
    fine = tmp_path / "fine.hdf5"
    generate(fine, samples=2, resolution=16, frames=7, seed=3, progress=False)
    at16 = ranks.run(1, _evaluate, str(run), None, dict(data=str(fine)))[0]
    assert at16["resolution"] == [16, 16, 16] and at16["test_trajectories"] == 1
    assert 0 < at16["test_rel_l2"] < 10
    for method, options in ((None, dict(grid=(2, 2, 1))), ("dfno", dict(data_parallel=2))):
        for result in ranks.run(4, _evaluate, str(run), method, dict(data=str(fine), **options)):
            assert abs(result["test_rel_l2"] - at16["test_rel_l2"]) <= 1e-5 * at16["test_rel_l2"]
    at8 = ranks.run(2, _evaluate, str(run), None, dict(data=str(fine), resolution=8))
    assert at8[0]["resolution"] == [8, 8, 8] and at8[0]["test_rel_l2"] == at8[1]["test_rel_l2"]
    assert at8[0]["test_rel_l2"] != at16["test_rel_l2"]


def _save_and_moments(config: TrainConfig, root: str) -> dict:
    """One Adam step on a random batch, saved into ``root`` (no checkpoints of its own); the global
    weights, the global Adam moments of every spectral weight and the output after the step."""
    model, sharding = _model(config)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    _output(model, sharding).square().sum().backward()
    optimizer.step()
    save_checkpoint(root, 1, model, optimizer, {"epoch": 1})
    return _global_moments(model, optimizer, sharding)


def _output(model, sharding: Sharding) -> torch.Tensor:
    """The model on a fixed global batch of two (8, 8, 8, 4) fields: this rank's block, a local tensor."""
    # With the grid embedding the lift also sees the 4 coordinates.
    channels = model.lift.weight.shape[1] - (4 if model.positional_embedding == "grid" else 0)
    x = torch.randn(2, channels, 8, 8, 8, 4, generator=torch.Generator().manual_seed(0))
    x = x.to(DEVICE)
    if sharding.mesh is not None:
        x = distribute_tensor(x, sharding.mesh, sharding.placements)
    y = model(x)
    return y.to_local() if isinstance(y, DTensor) else y


def _global_moments(model, optimizer, sharding: Sharding) -> dict:
    out = {k: _full(v) for k, v in model.state_dict().items()}
    for i, layer in enumerate(block.spectral for block in model.blocks):
        for slot in ("exp_avg", "exp_avg_sq"):
            out[f"{i}.{slot}"] = _full(optimizer.state[layer.weight][slot])
    with torch.no_grad():
        y = _output(model, sharding)
    out["output"] = _full(sharding.wrap(y, (2, y.shape[1], 8, 8, 8, 4)))
    return out


def _load_moments(config: TrainConfig, root: str) -> dict:
    model, sharding = _model(config)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    assert load_checkpoint(latest_checkpoint(root), model, optimizer) == {"epoch": 1}
    return _global_moments(model, optimizer, sharding)


@pytest.mark.parametrize(
    ("saved", "loaded"),
    [
        ((3, "drift", 1), (2, "dfno-pruned", 1)),
        ((2, "dfno", 1), (4, "drift", 1)),
        ((4, "drift", 1), (1, "dfno", 1)),  # a plain single-process model loads 4 ranks' DTensors
        ((4, "drift", 1), (2, "dfno-pruned", 1)),
        ((1, "drift", 1), (4, "dfno-pruned", 2)),  # and 2 data x 2 spatial ranks load a plain model's
    ],
)
def test_checkpoint_reshards_between_ranks_and_methods(ranks, tmp_path, saved, loaded):
    root = str(tmp_path / "ck")
    config = train_config(None, tmp_path, modes=(3, 2, 2, 3))
    (size, method, data_parallel), (load_size, load_method, load_data_parallel) = saved, loaded
    want = ranks.run(
        size, _save_and_moments, dataclasses.replace(config, method=method, data_parallel=data_parallel), root
    )[0]
    config = dataclasses.replace(config, method=load_method, data_parallel=load_data_parallel)
    for got in ranks.run(load_size, _load_moments, config, root):
        assert set(got) == set(want)
        for name, value in want.items():
            if name == "output":  # another method or layout: the same function up to float32 round-off
                assert (got[name] - value).abs().max() <= 1e-5 * value.abs().max(), name
            else:  # exact: the checkpoint's stored values read back
                assert torch.equal(got[name], value), name


def _drift(*args):
    return subprocess.run([sys.executable, "-m", "drift", *args], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["--width", "-3"], "--width"),
        (["--modes", "2,2"], "--modes"),
        (["--modes", "5"], "--modes"),
        (["--grid", "3x1x1", "--nproc", "2"], "--grid"),
        (["--grid", "9x1x1", "--nproc", "9"], "--grid"),
        (["--data-parallel", "3", "--nproc", "4"], "--data-parallel"),
        (["--data-parallel", "2", "--nproc", "4", "--grid", "4x1x1"], "--grid"),
        (["--t-out", "9"], "--t-out"),
        (["--method", "fft"], "--method"),
        (["--lr", "0"], "--lr"),
        (["--weight-decay", "-1"], "--weight-decay"),
        (["--model", "tfno"], "--model"),
        (["--schedule", "step"], "--schedule"),
        (["--reduction", "3x1", "--nproc", "2"], "--reduction"),
        (["--reduction", "2", "--nproc", "2", "--method", "dfno"], "--reduction"),
        (["--reduction", "2x0"], "--reduction"),
        (["--reduction", "4", "--nproc", "4", "--grid", "2x2x1"], "--reduction"),
        (["--reduction", "hosts", "--method", "dfno"], "--reduction hosts applies to --method drift"),
        (["--overlap", "2", "--nproc", "2", "--method", "dfno"], "--overlap 2 applies to --method drift"),
        (["--overlap", "0"], "--overlap"),
        (["--factorization", "tt"], "--factorization"),
        (["--factorization", "cp", "--rank", "0.001"], "--rank 0.001: rank = 0.001 rounds to a CP rank of 0"),
    ],
)
def test_bad_train_options_fail_with_one_line(capsys, data, tmp_path, args, names):
    fails_with_one_line(capsys, ["train", "--data", data, "--out", str(tmp_path), *TINY, *args], names)


def test_bad_data_and_resume_fail_with_one_line(capsys, data, tmp_path):
    fails_with_one_line(capsys, ["train", "--data", str(tmp_path / "none.hdf5"), *TINY], "none.hdf5")
    fails_with_one_line(capsys, ["train", "--data", data, "--out", str(tmp_path), "--resume", *TINY], "no checkpoint")
    fails_with_one_line(capsys, ["evaluate", str(tmp_path)], "no checkpoint")


def test_a_failing_rank_fails_with_one_line(capsys, data, tmp_path):
    (tmp_path / "file").touch()  # rank 0 cannot make the run folder inside a file; rank 1 waits for it
    argv = ["train", "--data", data, "--out", str(tmp_path / "file" / "run"), "--nproc", "2", *TINY]
    fails_with_one_line(capsys, argv, "drift train: error: rank 0 failed: NotADirectoryError: [Errno 20]")


def test_train_command_on_two_ranks_then_resume_and_evaluate(capsys, data, tmp_path):
    out = str(tmp_path / "run")
    # Two data-parallel ranks, then one rank without a mesh resumes from their checkpoint.
    first = _drift(
        "train", "--data", data, "--out", out, "--nproc", "2", "--data-parallel", "2", "--epochs", "2", *TINY
    )
    assert first.returncode == 0, first.stderr
    assert "test relative L2" in first.stdout and "outputs in" in first.stdout
    resume = ["train", "--out", out, "--epochs", "3", "--resume", *TINY]  # on the run's own data
    fails_with_one_line(capsys, [*resume, "--layers", "3"], "--layers")
    other = tmp_path / "other.hdf5"
    generate(other, samples=4, resolution=6, frames=7, seed=1, progress=False)
    fails_with_one_line(
        capsys, [*resume, "--data", str(other)], f"(8, 8, 8) grid of {data}; --data {other} has (6, 6, 6)"
    )
    assert main(resume) == 0  # the 2-rank run goes on on one rank
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == [1, 2, 3] and rows[2]["train_loss"] < rows[0]["train_loss"]
    last = rows[-1]["test_rel_l2"]
    report = tmp_path / "eval.json"
    assert main(["evaluate", out, "--json", str(report)]) == 0
    assert f"test relative L2 {last:.4f}" in capsys.readouterr().out
    assert abs(json.loads(report.read_text())["test_rel_l2"] - last) <= 1e-5 * last
    fails_with_one_line(capsys, ["evaluate", out, "--resolution", "3"], "--resolution 3")
    fails_with_one_line(capsys, ["evaluate", out, "--resolution", "2"], "--resolution 2")  # modes do not fit


def test_train_under_torchrun_matches_the_launcher(data, tmp_path):
    out = tmp_path / "torchrun"
    # --standalone: a free port, not torchrun's fixed 29500 that another job on the machine may hold
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    cmd += ["-m", "drift", "train"]
    cmd += ["--data", data, "--out", str(out), "--epochs", "2", "--lr", "0.01", *TINY]
    # Each rank holds itself to --memory-per-rank (drift.budget.MemoryWatch), far above what it uses.
    done = subprocess.run(
        [*cmd, "--memory-per-rank", "4"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, f"{done.stderr}\nstdout:\n{done.stdout[-2000:]}"
    assert done.stdout.count("done: 2 epochs") == 1  # rank 0 reports
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    one = train(train_config(data, tmp_path / "one", epochs=2))
    assert _close(_losses(rows), _losses(one), 1e-5)
    # Options every rank refuses alike: one line from the host, not one a rank.
    bad = subprocess.run([*cmd, "--reduction", "3x1"], capture_output=True, text=True, timeout=300)
    lines = [line for line in bad.stderr.splitlines() if line.startswith("drift train: error:")]
    assert bad.returncode != 0 and len(lines) == 1 and "--reduction 3x1" in lines[0], bad.stderr


def test_method_auto_chooses_by_the_data_grid(ranks, data, tmp_path):
    config = train_config(data, tmp_path / "run", method="auto", epochs=1)
    check_config(config, 1)
    model = build_model(config, DEVICE, None, (8, 8, 8, config.t_out))
    assert [block.spectral.method for block in model.blocks] == ["drift", "drift"]
    assert str(model.blocks[0].spectral.choice).startswith("auto chose drift at 8x8x8x4 on 1x1x1x1 ranks: drift ")
    # On 2 ranks the same losses as drift's: it chose drift there too.
    auto = ranks.run(2, run_training, config)[0]
    explicit = ranks.run(2, run_training, dataclasses.replace(config, method="drift", out=str(tmp_path / "drift")))[0]
    # Exact: the same pool processes, with the same threads, compute both runs (another method differs).
    assert [r["train_loss"] for r in auto] == [r["train_loss"] for r in explicit]


def test_factorized_run_evaluates_and_resumes_only_as_factorized(capsys, data, tmp_path):
    out = tmp_path / "tucker"
    history = train(train_config(data, out, epochs=1, factorization="tucker", rank=0.5))
    # evaluate builds the run's model from its checkpoint's options: factors, no dense weights
    assert abs(evaluate(out)["test_rel_l2"] - history[-1]["test_rel_l2"]) <= 1e-5 * history[-1]["test_rel_l2"]
    resume = ["train", "--data", data, "--out", str(out), "--epochs", "2", "--resume", *TINY]
    fails_with_one_line(capsys, [*resume, "--factorization", "tucker"], "--rank")
    fails_with_one_line(capsys, resume, "--factorization")


def test_cosine_schedule_is_torchs_cosine_annealing():
    config = TrainConfig(lr=3e-3, schedule="cosine")
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=config.lr)
    total = 37
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=total)
    for step in range(total):
        assert learning_rate(config, step, total) == pytest.approx(optimizer.param_groups[0]["lr"], rel=1e-12, abs=0)
        optimizer.step()
        scheduler.step()
    assert learning_rate(dataclasses.replace(config, schedule="constant"), 5, total) == config.lr


def test_a_checkpoint_before_the_model_options_resumes_as_the_plain_fno_with_adam(capsys, data, tmp_path):
    """A run written before --model, --weight-decay and --schedule existed trained Li et al.'s FNO with
    Adam at a constant rate: it evaluates, and resumes only with those options."""
    out = tmp_path / "old"
    old = dict(model="plain", weight_decay=0.0, schedule="constant")
    history = train(train_config(data, out, epochs=1, **old))
    meta_file = latest_checkpoint(out / "checkpoints") / "meta.json"
    meta = read_meta(meta_file.parent)
    assert all(meta["config"].pop(name) == value for name, value in old.items())
    assert {name: LEGACY_OPTIONS[name] for name in old} == old
    meta_file.write_text(json.dumps(meta))
    assert abs(evaluate(out)["test_rel_l2"] - history[-1]["test_rel_l2"]) <= 1e-5 * history[-1]["test_rel_l2"]
    resume = ["train", "--data", data, "--out", str(out), "--epochs", "2", "--resume", "--lr", "0.01", *TINY]
    fails_with_one_line(capsys, resume, "--model is neuralop, the run was trained with plain")
    fails_with_one_line(capsys, [*resume, "--model", "plain"], "--weight-decay is 0.0001, the run was trained with 0")
    fails_with_one_line(
        capsys, [*resume, "--model", "plain", "--weight-decay", "0"], "--schedule is cosine, the run was trained with"
    )
    assert main([*resume, "--model", "plain", "--weight-decay", "0", "--schedule", "constant"]) == 0
