"""The test metrics: the relative L2 error of a model on a test set and, in the same pass, PDEBench's
metrics (``drift.metrics``) on the physical fields; a run's final metrics (``test_metrics.json``); and
``evaluate``, a checkpoint's metrics on its run's test split at any resolution and on any ranks."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch

from drift import comm
from drift.data import DataFiles, Trajectories
from drift.metrics import PDEBenchMetrics
from drift.nn import ACTIVATION_DTYPES, FNO
from drift.train.sharding import Sharding, batch_input, prefetched_batches, test_dataset
from drift.train.trained import data_grid, load_trained, trained_config


def pdebench_metrics(dataset: Trajectories, device) -> PDEBenchMetrics:
    """An accumulator of PDEBench's metrics over ``dataset``'s trajectories, laid out as its blocks."""
    lengths = dataset.files.lengths
    return PDEBenchMetrics(dataset.layout, dataset.fields, dataset.t_out, len(dataset), lengths=lengths, device=device)


@torch.no_grad()
def relative_l2(
    model: FNO,
    dataset: Trajectories,
    sharding: Sharding,
    batch_size: int,
    device,
    pdebench: PDEBenchMetrics | None = None,
    prefetch: bool = True,
) -> float:
    """Mean over ``dataset``'s trajectories of ``||pred - true|| / ||true||`` over each whole field. The
    same pass gives ``pdebench`` (when given) the physical fields: prediction and truth de-normalised
    with the data set's statistics, in float64. ``prefetch``: read each batch during the previous one's
    forward (``prefetched_batches``)."""
    sums = torch.zeros(len(dataset), 2, dtype=torch.float64, device=device)
    mean, std = dataset.field_tensors(torch.float64, device)
    batches = [range(start, min(start + batch_size, len(dataset))) for start in range(0, len(dataset), batch_size)]
    with prefetched_batches(dataset, batches, sharding, device, prefetch) as reads:
        for indices in batches:
            x, y, wrap = batch_input(dataset, reads.take(), len(indices), sharding, device)
            pred = dataset.recipe.predict(model, x, wrap, dataset.t_out)
            err = (pred - y).square().flatten(1).sum(1, dtype=torch.float64)
            sums[sharding.share(indices)] += torch.stack([err, y.square().flatten(1).sum(1, dtype=torch.float64)], 1)
            if pdebench is not None:
                pdebench.update(pred.double() * std + mean, y.double() * std + mean, sharding.share(indices))
    total = comm.all_reduce(sums)
    return float((total[:, 0] / total[:, 1]).sqrt().mean())


TEST_METRICS = "test_metrics.json"


def write_test_metrics(out: Path, split: str, epoch: int, test_l2: float, pdebench: dict, show: bool) -> None:
    """Rank 0: ``<out>/test_metrics.json`` (the final model's test metrics) and, if ``show``, a line of them."""
    if comm.rank() != 0:
        return
    record = dict(epoch=epoch, split=split, test_rel_l2=test_l2, pdebench=pdebench)
    (out / TEST_METRICS).write_text(json.dumps(record, indent=2) + "\n")
    if show:
        print(f"PDEBench metrics ({split} split): {format_pdebench(pdebench)}", flush=True)


def format_pdebench(metrics: dict) -> str:
    """PDEBench's metrics on one line (``n/a`` for a Fourier band the grid has no bins in)."""

    def value(name: str) -> str:
        v = metrics[name]
        return "n/a" if v is None else f"{v:.4g}"

    return (
        f"RMSE {value('rmse')}  nRMSE {value('nrmse')}  cRMSE {value('crmse')}  max error {value('max_error')}  "
        f"bRMSE {value('brmse')}  fRMSE low {value('frmse_low')} mid {value('frmse_mid')} high {value('frmse_high')}"
    )


def evaluate(
    checkpoint: str | Path,
    *,
    data: str | Sequence[str] | None = None,
    test_data: Sequence[str] | None = None,
    resolution: int | None = None,
    method: str | None = None,
    grid=None,
    data_parallel: int = 1,
    device="cpu",
    batch_size: int = 2,
    activations: str = "float32",
) -> dict:
    """Relative L2 and PDEBench's metrics (``drift.metrics``, on the de-normalised fields) of a checkpoint's
    model on its run's test set, on however many ranks call this.

    ``checkpoint``: a run folder (its latest checkpoint), its ``checkpoints`` folder or one checkpoint.
    The test set: every trajectory of ``test_data`` (files or folders, as ``drift train --test-data``), or
    the test split (the run's ``split``, applied to each file) of ``data`` (a file, folder or sequence of
    them), or by default the run's own: its ``--test-data`` if it had one, else the split of the files it
    trained on. It is read at its own resolution or at ``resolution`` points per spatial dim (every
    (N / resolution)-th point of a file with N points per dim): the same weights at any resolution,
    zero-shot super-resolution above the training one. ``method`` defaults to the run's (any method loads
    any other's checkpoint: the weights are the same global ones); ``grid`` and ``data_parallel`` lay out
    the ranks as for training; ``activations``: the fields between the blocks of the model's streaming
    forward (one of ``drift.nn.ACTIVATION_DTYPES``: "bfloat16" halves them). A damaged latest checkpoint is
    passed over for the newest older one that loads (``load_newest``). Returns a dict: the checkpoint, where
    it was trained, ``split`` (the run's, or ``"test-data"`` for separate test files), ``test_files``,
    ``test_rel_l2`` and ``pdebench`` (``PDEBenchMetrics.compute``'s).
    """
    config = trained_config(
        checkpoint, data=data, test_data=test_data, method=method, grid=grid, data_parallel=data_parallel
    )
    files = DataFiles(config.test_data or config.data)
    shape, stride = data_grid(config, files.grid, resolution, comm.world_size())
    trained = load_trained(checkpoint, config, shape, device)
    trained.model.activations = ACTIVATION_DTYPES[activations]
    test_set = test_dataset(config, files, trained.stats, trained.sharding, stride)
    pdebench = pdebench_metrics(test_set, trained.device)
    l2 = relative_l2(trained.model, test_set, trained.sharding, batch_size, trained.device, pdebench)
    meta = trained.meta
    return dict(
        checkpoint=str(trained.checkpoint),
        epoch=meta["epoch"],
        trained_on=meta["world_size"],
        trained_resolution=meta["global_shape"],
        resolution=list(test_set.global_shape),
        ranks=comm.world_size(),
        method=config.method,
        split="test-data" if config.test_data else config.split,
        test_files=[str(p) for p in files.paths],
        test_rel_l2=l2,
        test_trajectories=len(test_set),
        pdebench=pdebench.compute(),
    )
